"""The built-in queue as one tick reads it: one query for the pending jobs, one for the running.

A tick of the control loop needs the queue twice (on-prem dispatch, then the snapshot) and the
running jobs four times (what ends on-prem, on-prem capacity, node usage, whose work runs on which
burst node). :meth:`QueueReads.queue_read` reads it once, in one transaction, and the queue source
shares that read between dispatch and observe (:mod:`orchestrator.sources.builtin`).

Pending jobs are read as plain tuples of the columns the planner and the dispatcher use
(:data:`PENDING_COLUMNS`), never as records: at 100k pending jobs a record per row costs more
than reading the row. Running jobs are few (bounded by the GPUs there are) and are read as full
records, since the dispatcher ends them by compare-and-set. :meth:`QueueReads.start_onprem` starts
a pending job from its tuple with a compare-and-set that writes only the columns a start changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from orchestrator.domain.jobs import Job, JobState, Placement
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.jobqueue import job_from_row
from orchestrator.store.records import JobRecord

# The columns of a pending job a tick uses, in the order of a PendingRow tuple.
PENDING_COLUMNS = ("id", "project", "pool", "gpus", "priority", "duration_s", "submitted_at",
                   "attempts", "version", "user")
PendingRow = tuple[str, str | None, str, int, int, float | None, datetime, int, int, str | None]
ID, PROJECT, POOL, GPUS, PRIORITY, DURATION, SUBMITTED, ATTEMPTS, VERSION, USER = range(10)
_IN_CHUNK = 500  # ids per IN (...) list: well under every driver's bound on parameters
_ENDED = (JobState.DONE.value, JobState.FAILED.value, JobState.CANCELLED.value)


@dataclass(slots=True)
class QueueRead:
    """The queue at ``at``: pending rows in service order, running records by id, and what a tick
    changed of it since (``started``: records of jobs it started on-prem)."""

    at: datetime
    pending: list[PendingRow]
    running: list[JobRecord]
    started: list[JobRecord] = field(default_factory=list)
    _jobs: dict[str, tuple[Job, ...]] | None = None

    def pending_jobs(self) -> dict[str, tuple[Job, ...]]:
        """Pending jobs per pool as the planner's ``Job`` values, built once per read."""
        if self._jobs is None:
            by_pool: dict[str, list[Job]] = {}
            pending = JobState.PENDING
            for r in self.pending:
                by_pool.setdefault(r[POOL], []).append(
                    Job(r[ID], r[PROJECT], r[POOL], r[GPUS], r[SUBMITTED], r[PRIORITY],
                        r[DURATION], pending, None, r[USER]))
            self._jobs = {pool: tuple(jobs) for pool, jobs in by_pool.items()}
        return self._jobs

    def take(self, ids: set[str], started: list[JobRecord], ended: set[str]) -> None:
        """Record what dispatch did: ``ids`` left the pending rows, ``started`` (their records)
        joined the running ones, and running jobs ``ended`` (finished on-prem) left them."""
        if ids:
            self.pending = [r for r in self.pending if r[ID] not in ids]
            if self._jobs is not None:  # keep the Job values of the jobs left
                self._jobs = {pool: tuple(j for j in jobs if j.id not in ids)
                              for pool, jobs in self._jobs.items()}
        if ended:
            self.running = [j for j in self.running if j.id not in ended]
        if started:
            self.running = sorted([*self.running, *started], key=_record_id)  # as read: by id
        self.started.extend(started)


class QueueReads(StoreBase):
    """The one-read methods of the Store (see the module docstring)."""

    def queue_read(self, at: datetime) -> QueueRead:
        """Pending jobs (service order: priority highest first, then submission, then id) and
        running jobs, in one transaction."""
        require_aware(at, "at")
        c = T.jobs.c
        pending_q = (sa.select(*(c[name] for name in PENDING_COLUMNS))
                     .where(c.state == JobState.PENDING.value)
                     .order_by(c.priority.desc(), c.submitted_at, c.id))
        running_q = sa.select(T.jobs).where(c.state == JobState.RUNNING.value).order_by(c.id)
        with self._read() as conn:
            # Straight through the driver: the statement's typed result processing costs more
            # per row than reading the row (the one typed column, the submit time, is converted
            # here: SQLite gives naive UTC text, PostgreSQL an aware datetime).
            sql = str(pending_q.compile(dialect=conn.dialect,
                                        compile_kwargs={"literal_binds": True}))
            utc = _utc_converter(conn.dialect.name)
            cursor = conn.connection.cursor()  # the DBAPI cursor, in this transaction
            try:
                cursor.execute(sql)
                raw = cursor.fetchall()
            finally:
                cursor.close()
            pending: list[Any] = [(i, pr, po, g, p, d, utc(s), a, v, u)
                                  for i, pr, po, g, p, d, s, a, v, u in raw]
            running = [job_from_row(r) for r in conn.execute(running_q)]
        return QueueRead(at, pending, running)

    def start_onprem(self, row: PendingRow, node_id: str, at: datetime) -> bool:
        """PENDING -> RUNNING on-prem for the job of ``row``, if it is still as read (its
        version); writes only what a start changes. False: someone changed it first."""
        require_aware(at, "at")
        c = T.jobs.c
        stmt = (sa.update(T.jobs)
                .where(c.id == row[ID], c.version == row[VERSION],
                       c.state == JobState.PENDING.value)
                .values(state=JobState.RUNNING.value, placement=Placement.ONPREM.value,
                        node_id=node_id, started_at=at, finished_at=None, exit_code=None,
                        attempts=row[ATTEMPTS] + 1, version=row[VERSION] + 1))
        with self._write() as conn:
            return conn.execute(stmt).rowcount == 1

    def queue_counts(self) -> dict[tuple[str, JobState, Placement | None], tuple[int, int]]:
        """Jobs and GPUs of the pending and running jobs per (pool, state, placement): one
        grouped query, for the summaries that need counts, not the jobs (``burst status``)."""
        c = T.jobs.c
        query = (sa.select(c.pool, c.state, c.placement, sa.func.count(), sa.func.sum(c.gpus))
                 .where(c.state.in_([JobState.PENDING.value, JobState.RUNNING.value]))
                 .group_by(c.pool, c.state, c.placement))
        with self._read() as conn:
            return {(pool, JobState(state), Placement(placement) if placement else None):
                    (int(jobs), int(gpus or 0))
                    for pool, state, placement, jobs, gpus in conn.execute(query)}

    def jobs_by_id(self, ids: Sequence[str]) -> list[JobRecord]:
        """The records of ``ids`` (unknown ones left out), in no particular order."""
        found: list[JobRecord] = []
        with self._read() as conn:
            for chunk in _chunks(ids):
                found.extend(job_from_row(r) for r in
                             conn.execute(sa.select(T.jobs).where(T.jobs.c.id.in_(chunk))))
        return found

    def last_finished_by_node(self, node_ids: Iterable[str]) -> dict[str, datetime]:
        """When each of ``node_ids`` last saw a job of the built-in queue end (nodes that never
        did are left out): one grouped query per few hundred nodes, not one per node."""
        c = T.jobs.c
        last: dict[str, datetime] = {}
        with self._read() as conn:
            for chunk in _chunks(list(node_ids)):
                query = (sa.select(c.node_id, sa.func.max(c.finished_at))
                         .where(c.node_id.in_(chunk), c.state.in_(_ENDED),
                                c.finished_at.is_not(None))
                         .group_by(c.node_id))
                for node_id, finished in conn.execute(query):
                    if finished is not None:
                        last[node_id] = _aware(finished)
        return last


def _record_id(record: JobRecord) -> str:
    return record.id


def _utc_converter(dialect: str) -> Callable[[Any], datetime]:
    if dialect == "sqlite":
        fromisoformat = datetime.fromisoformat
        return lambda text: fromisoformat(text + "+00:00")  # naive UTC text
    return lambda moment: moment if moment.tzinfo is UTC else moment.astimezone(UTC)


def _chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(ids), _IN_CHUNK):
        yield ids[i:i + _IN_CHUNK]


def _aware(value: datetime | str) -> datetime:
    """max() over a UtcDateTime column comes back untyped on SQLite (text): parse it as UTC."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return T.UtcDateTime().process_result_value(value, None)  # type: ignore[arg-type,return-value]
