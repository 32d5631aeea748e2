"""``burst.jobs.cancel`` on a real worker (the public-task fixtures: Redis, a solo worker in this
process, a temporary SQLite store): pending and running jobs cancelled, a redelivery harmless,
finished and unknown ids reported, bad arguments refused by name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from orchestrator.automation.public import InvalidTaskArguments
from orchestrator.domain.jobs import JobState
from orchestrator.store import Store
from tests.integration.test_public_tasks import app, call, env, store  # noqa: F401 - fixtures


def test_cancel_task_cancels_pending_and_running_jobs_once(app: Celery, store: Store) -> None:  # noqa: F811
    now = datetime.now(UTC)
    pending = store.submit_job("research", "gpu", 2, 0, 600.0, None, now - timedelta(minutes=1))
    running = store.submit_job("research", "gpu", 4, 0, 600.0, None, now - timedelta(minutes=2))
    store.start_job(running, placement="onprem", node_id=None, at=now)
    done = store.submit_job("vision", "gpu", 1, 0, 60.0, None, now - timedelta(minutes=3))
    started = store.start_job(done, placement="onprem", node_id=None, at=now)
    store.finish_job(started, state=JobState.DONE, exit_code=0, at=now)

    result = call(app, "burst.jobs.cancel", jobs=[pending.id, running.id, done.id, "j-nope",
                                                  pending.id])
    assert result["cancelled"] == 2
    assert [(r["id"], r["state"], r["result"]) for r in result["jobs"]] == [
        (pending.id, "cancelled", "cancelled"), (running.id, "cancelled", "cancelled"),
        (done.id, "done", "finished"), ("j-nope", None, "unknown")]
    assert {store.get_job(j.id).state for j in (pending, running)} == {JobState.CANCELLED}

    again = call(app, "burst.jobs.cancel", jobs=pending.id)  # a redelivery, one id as a string
    assert again == {"jobs": [{"id": pending.id, "state": "cancelled",
                               "result": "already-cancelled", "node": None}], "cancelled": 0}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "jobs: is required"),
    ({"jobs": []}, "jobs: "),
    ({"jobs": [7]}, "jobs: "),
    ({"jobs": ["j-1"], "job": "j-2"}, "job: is not a known argument"),
])
def test_cancel_task_refuses_bad_arguments_by_name(app: Celery, kwargs: dict, message: str) -> None:  # noqa: F811
    with pytest.raises(InvalidTaskArguments, match=message):
        call(app, "burst.jobs.cancel", **kwargs)
