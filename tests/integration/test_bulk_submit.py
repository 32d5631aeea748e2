"""Bulk submission to the built-in queue on SQLite and PostgreSQL: a batch is one transaction
(all or none), a keyed batch queues once, and the bounds are refused before anything is written."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestrator.domain.jobs import JobState
from orchestrator.store import Store
from orchestrator.store.bulk import MAX_BATCH, BatchExists, JobSpec
from orchestrator.store.jobqueue import JobIdConflict
from tests.builders import POOL, T0


def _specs(n: int, **extra) -> list[JobSpec]:
    return [JobSpec(project=f"p{i % 3}", pool=POOL, gpus=1 + i % 4, priority=i % 2,
                    duration_s=600.0, command=f"run {i}", **extra) for i in range(n)]


def test_a_batch_is_queued_whole_in_order(store: Store) -> None:
    early = T0 - timedelta(minutes=5)
    specs = [*_specs(1200), JobSpec(project="cv", pool=POOL, gpus=8, submitted_at=early,
                                    user="ana")]
    jobs = store.submit_jobs(specs, submitted_at=T0)
    assert [(j.project, j.gpus, j.command) for j in jobs] == [
        (s.project, s.gpus, s.command) for s in specs]
    assert len({j.id for j in jobs}) == len(specs)
    stored = {j.id: j for j in store.jobs(states=[JobState.PENDING])}
    assert stored == {j.id: j for j in jobs}
    assert stored[jobs[-1].id].submitted_at == early and stored[jobs[-1].id].user == "ana"


def test_a_keyed_batch_queues_once_and_refuses_another_batch(store: Store) -> None:
    first = store.submit_jobs(_specs(3), submitted_at=T0, key="ab" * 32)
    with pytest.raises(BatchExists) as repeat:
        store.submit_jobs(_specs(3), submitted_at=T0 + timedelta(minutes=1), key="ab" * 32)
    assert repeat.value.jobs == first
    with pytest.raises(JobIdConflict):
        store.submit_jobs(_specs(4), submitted_at=T0, key="ab" * 32)
    with pytest.raises(JobIdConflict):
        store.submit_jobs(_specs(2), submitted_at=T0, key="ab" * 32)
    with pytest.raises(JobIdConflict):
        store.submit_jobs([*_specs(2), JobSpec("other", POOL, 1)], submitted_at=T0, key="ab" * 32)
    assert len(store.jobs()) == 3


def test_a_bad_batch_writes_nothing(store: Store) -> None:
    with pytest.raises(ValueError, match="job 3 of the batch"):
        store.submit_jobs([*_specs(2), JobSpec("cv", POOL, 0)], submitted_at=T0)
    with pytest.raises(ValueError, match=f"at most {MAX_BATCH}"):
        store.submit_jobs([JobSpec("cv", POOL, 1)] * (MAX_BATCH + 1), submitted_at=T0)
    with pytest.raises(ValueError, match="at least one job"):
        store.submit_jobs([], submitted_at=T0)
    assert store.jobs() == []
