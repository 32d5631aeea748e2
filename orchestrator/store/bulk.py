"""Bulk submission to the built-in queue: a batch of jobs in one transaction.

``burst submit --count N``, ``burst submit --from-file jobs.csv`` and ``POST /v1/jobs`` with a
list queue their jobs here: one multi-row INSERT in one transaction, so a batch is queued whole
or not at all (10,000 jobs are one statement, not 10,000 transactions). A batch with a key (the
API's Idempotency-Key) gets ids derived from the key, so a retried batch queues nothing twice: a
repeat with the same jobs returns the batch as it is now (:class:`BatchExists`), a repeat with
other jobs is refused (:class:`~orchestrator.store.jobqueue.JobIdConflict`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from orchestrator.domain.jobs import JobState
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.jobqueue import JobIdConflict, job_from_row, job_values, new_job_id
from orchestrator.store.records import JobRecord

MAX_BATCH = 10_000  # jobs in one batch: what one request or one transaction may queue
_ROWS_PER_INSERT = 500  # rows per INSERT statement (SQLite binds at most 32,766 parameters)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job of a batch: what a submission says about it."""

    project: str
    pool: str
    gpus: int
    priority: int = 0
    duration_s: float | None = None
    command: str | None = None
    user: str | None = None
    submitted_at: datetime | None = None  # None: the batch's submission time


class BatchExists(Exception):  # noqa: N818 - an outcome, not a failure
    """A keyed batch repeated: ``jobs`` are the jobs queued the first time, as they are now."""

    def __init__(self, jobs: list[JobRecord]):
        super().__init__(f"batch of {len(jobs)} job(s) exists")
        self.jobs = jobs


def batch_ids(key: str, count: int) -> list[str]:
    """The job ids of a keyed batch (``key`` is a digest, made by the caller per tenant)."""
    return [f"j-b{key[:20]}-{i:x}" for i in range(count)]


class BulkSubmit(StoreBase):
    """The bulk-submission method of the Store (see the module docstring)."""

    def submit_jobs(self, specs: Sequence[JobSpec], submitted_at: datetime,
                    key: str | None = None) -> list[JobRecord]:
        """Queue every job of ``specs`` (PENDING), in one transaction; their records, in order.

        ``key``: the batch's idempotency key (a hex digest): see the module docstring.
        """
        if not specs:
            raise ValueError("a batch needs at least one job")
        if len(specs) > MAX_BATCH:
            raise ValueError(f"a batch holds at most {MAX_BATCH} jobs, got {len(specs)}")
        require_aware(submitted_at, "submitted_at")
        for i, spec in enumerate(specs):
            if spec.gpus < 1:
                raise ValueError(f"job {i + 1} of the batch needs at least one GPU, got {spec.gpus}")
            if spec.submitted_at is not None:
                require_aware(spec.submitted_at, f"job {i + 1}'s submitted_at")
        for _ in range(8):
            ids = batch_ids(key, len(specs)) if key is not None else [
                new_job_id() for _ in specs]
            records = [_record(job_id, spec, submitted_at) for job_id, spec in zip(ids, specs,
                                                                                    strict=True)]
            try:
                with self._write() as conn:
                    if key is not None:  # one id past the batch: a longer first batch shows
                        existing = _existing(conn, batch_ids(key, len(ids) + 1))
                        if existing:
                            raise _repeat(existing, records)
                    values = [job_values(r) for r in records]
                    for i in range(0, len(values), _ROWS_PER_INSERT):
                        conn.execute(sa.insert(T.jobs), values[i:i + _ROWS_PER_INSERT])
                return records
            except sa.exc.IntegrityError:
                if key is not None:  # a concurrent repeat of the batch won the race
                    with self._read() as conn:
                        raise _repeat(_existing(conn, batch_ids(key, len(ids) + 1)),
                                      records) from None
                # 40 random bits per id: a clash is rare, but retry with new ids, not fail
        raise RuntimeError("could not allocate unique job ids for the batch")


def _record(job_id: str, spec: JobSpec, submitted_at: datetime) -> JobRecord:
    return JobRecord(
        id=job_id, project=spec.project, pool=spec.pool, gpus=spec.gpus, priority=spec.priority,
        duration_s=spec.duration_s, command=spec.command, state=JobState.PENDING, placement=None,
        node_id=None, submitted_at=spec.submitted_at or submitted_at, started_at=None,
        finished_at=None, exit_code=None, attempts=0, version=0, user=spec.user)


def _existing(conn: sa.Connection, ids: list[str]) -> dict[str, JobRecord]:
    found: dict[str, JobRecord] = {}
    for i in range(0, len(ids), _ROWS_PER_INSERT):
        query = sa.select(T.jobs).where(T.jobs.c.id.in_(ids[i:i + _ROWS_PER_INSERT]))
        found.update((r.id, r) for r in map(job_from_row, conn.execute(query)))
    return found


def _repeat(existing: dict[str, JobRecord], wanted: list[JobRecord]) -> Exception:
    """BatchExists if ``existing`` is the whole batch with the same jobs; JobIdConflict else."""
    def fields(r: JobRecord) -> tuple:
        return (r.project, r.pool, r.gpus, r.priority, r.duration_s, r.command, r.user)

    same = len(existing) == len(wanted) and all(
        w.id in existing and fields(existing[w.id]) == fields(w) for w in wanted)
    if not same:
        return JobIdConflict("this batch key was used for another batch of jobs")
    return BatchExists([existing[w.id] for w in wanted])
