"""Bounded decision history as the control plane runs it: beat's ``burst.decisions.prune`` on a
real worker (the public-task fixtures) and its schedule entry. The embedded loop's side is in
tests/e2e/test_decision_history_cli.py."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from orchestrator.automation.app import beat_schedule
from orchestrator.domain.plan import Decision, Rule
from orchestrator.store import Store
from orchestrator.tick import PRUNE_EVERY
from orchestrator.wiring import Settings
from tests.integration.test_public_tasks import app, call, env  # noqa: F401 - fixtures


def _decision(i: int, at: datetime, policy: str = "fast") -> Decision:
    return Decision(id=f"d-old-{i}", policy=policy, at=at, rule=Rule.NO_DEMAND,
                    summary=f"nothing pending {i}")


@pytest.fixture
def store(env: str) -> Iterator[Store]:  # noqa: F811 - the worker's store, decisions emptied
    with Store(env) as s:
        with s.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM decisions")
        yield s


def test_prune_task_drops_decisions_past_the_retention(app: Celery, store: Store) -> None:  # noqa: F811
    now = datetime.now(UTC)
    store.add_decision(_decision(1, now - timedelta(days=31)))
    store.add_decision(_decision(2, now - timedelta(days=29)))
    result = call(app, "burst.decisions.prune")
    assert result["pruned"] == 1
    assert [d.id for d in store.decisions()] == ["d-old-2"]
    assert call(app, "burst.decisions.prune")["pruned"] == 0  # a second beat: nothing left to do


def test_beat_schedules_the_prune_hourly() -> None:
    entry = beat_schedule(Settings(), ["fast"])["decision-prune"]
    assert entry == {"task": "burst.decisions.prune", "schedule": PRUNE_EVERY}
    assert PRUNE_EVERY == timedelta(hours=1)
    assert Settings().decision_retention == timedelta(days=30)
