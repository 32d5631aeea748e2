"""The built-in queue as one tick reads it: one query for the pending jobs, one for the running.

A tick of the control loop needs the queue twice (on-prem dispatch, then the snapshot) and the
running jobs four times (what ends on-prem, on-prem capacity, node usage, whose work runs on which
burst node). :meth:`QueueReads.queue_read` reads it once, in one transaction, and the queue source
shares that read between dispatch and observe (:mod:`orchestrator.sources.builtin`).

Pending jobs are read as plain tuples of the columns the planner and the dispatcher use
(:data:`PENDING_COLUMNS`), never as records, and turned straight into the planner's columns
(:func:`pending_by_pool`: one transpose, one parse of the submit times; no object per row): at
100k pending jobs a record, or a ``Job``, per row costs more than reading the row. Running jobs
(bounded by the GPUs there are, but 11,000 of them at 10,000 burst nodes) are read the same way,
as light rows (:class:`RunningJob`) of the columns on-prem capacity, node usage and burst runs
read; the few that dispatch ends on-prem are re-read as full records for their compare-and-set.
A running job whose row is the one the store's last read found is that read's ``RunningJob``
(frozen; :mod:`orchestrator.kept`): at 11,000 running jobs most rows do not change between ticks.
:meth:`QueueReads.start_onprem` starts a pending job from its id and read version with a
compare-and-set that writes only the columns a start changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any

import sqlalchemy as sa

import numpy as np

from orchestrator.domain.jobs import JobState, Placement
from orchestrator.domain.pending import PendingColumns
from orchestrator.kept import Kept
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.jobqueue import job_from_row
from orchestrator.store.rawread import driver_rows, epoch_us_column, utc
from orchestrator.store.records import JobRecord

# The columns of a pending job a tick uses, in the order the query selects them.
PENDING_COLUMNS = ("id", "project", "pool", "gpus", "priority", "duration_s", "submitted_at",
                   "attempts", "version", "user")
# The columns of a running job a tick uses (RunningJob's fields, in order).
RUNNING_COLUMNS = ("id", "project", "pool", "gpus", "duration_s", "placement", "node_id",
                   "started_at")
_IN_CHUNK = 500  # ids per IN (...) list: well under every driver's bound on parameters
_ENDED = (JobState.DONE.value, JobState.FAILED.value, JobState.CANCELLED.value)


@dataclass(slots=True)
class PoolPending:
    """One pool's pending jobs as the read found them: the planner's columns, and per row the
    two integers a compare-and-set start needs (``version``, ``attempts``), row ``i`` of each
    being row ``i`` of ``columns``."""

    columns: PendingColumns
    version: np.ndarray
    attempts: np.ndarray

    def select(self, rows: np.ndarray) -> PoolPending:
        return PoolPending(self.columns.select(rows), self.version[rows], self.attempts[rows])


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A running job as a tick reads it: where it runs, how wide, since when and for how long
    (a ``JobRecord`` has these same fields; the rest of it a tick does not read)."""

    id: str
    project: str
    pool: str
    gpus: int
    duration_s: float | None
    placement: Placement | None
    node_id: str | None
    started_at: datetime | None

    @classmethod
    def of(cls, record: JobRecord) -> RunningJob:
        return cls(record.id, record.project, record.pool, record.gpus, record.duration_s,
                   record.placement, record.node_id, record.started_at)


# No ORDER BY: given one on id, SQLite walks the primary key over every job, ended ones
# included, to skip a sort (240 ms at 111,000 jobs, where the state index finds the 11,000
# running in 33 ms); the rows are sorted by id here instead (_running_rows).
# The start comes as rawread.epoch_us_column reads it (on PostgreSQL whole microseconds).
_RUNNING_SQL: dict[str, str] = {}  # dialect -> the statement, compiled once


def _running_sql(dialect: sa.Dialect) -> str:
    sql = _RUNNING_SQL.get(dialect.name)
    if sql is None:
        columns = [epoch_us_column(T.jobs.c[name], dialect.name) if name == "started_at"
                   else T.jobs.c[name] for name in RUNNING_COLUMNS]
        query = sa.select(*columns).where(T.jobs.c.state == JobState.RUNNING.value)
        sql = _RUNNING_SQL[dialect.name] = str(query.compile(
            dialect=dialect, compile_kwargs={"literal_binds": True}))
    return sql

_ID = itemgetter(0)  # a running row's id
_PLACEMENTS: dict[str | None, Placement | None] = {p.value: p for p in Placement}
_PLACEMENTS[None] = None


def _running_rows(conn: sa.Connection, kept: Kept[RunningJob]) -> list[RunningJob]:
    """Every running job as a light row, by id: the one made from an equal row by the last
    read (``kept``) where there is one (a running job's row rarely changes from tick to tick)."""
    rows = driver_rows(conn, _running_sql(conn.dialect))
    rows.sort(key=_ID)
    kept.round()
    get, put = kept.get, kept.put
    out = []
    for r in rows:
        job = get(r[0], r)
        out.append(job if job is not None else put(r[0], r, _running_job(r)))
    return out


def _running_job(row: Sequence[Any]) -> RunningJob:
    job_id, project, pool, gpus, duration, placement, node_id, started = row
    return RunningJob(job_id, project, pool, gpus, duration, _PLACEMENTS[placement], node_id,
                      utc(started))


@dataclass(slots=True)
class QueueRead:
    """The queue at ``at``: pending jobs per pool in service order, as columns; running jobs
    (light rows) by id; and what a tick changed of it since (``started``: full records of jobs it
    started on-prem)."""

    at: datetime
    pending: dict[str, PoolPending]
    running: list[RunningJob]
    started: list[JobRecord] = field(default_factory=list)

    def pending_jobs(self) -> dict[str, PendingColumns]:
        """Pending jobs per pool as the planner's columns (a read-only sequence of jobs)."""
        return {pool: rows.columns for pool, rows in self.pending.items()}

    def take(self, ids: set[str], started: list[JobRecord], ended: set[str]) -> None:
        """Record what dispatch did: ``ids`` left the pending rows, ``started`` (their records)
        joined the running ones, and running jobs ``ended`` (finished on-prem) left them."""
        if ids:
            for pool, rows in list(self.pending.items()):
                keep = [i for i, job_id in enumerate(rows.columns.ids) if job_id not in ids]
                if len(keep) < len(rows.columns):
                    self.pending[pool] = rows.select(np.array(keep, dtype=np.int64))
            self.pending = {pool: rows for pool, rows in self.pending.items() if rows.columns}
        if ended:
            self.running = [j for j in self.running if j.id not in ended]
        if started:
            self.running = sorted([*self.running, *map(RunningJob.of, started)],
                                  key=_record_id)  # as read: by id
        self.started.extend(started)


def pending_by_pool(raw: Sequence[Sequence[Any]], dialect: str) -> dict[str, PoolPending]:
    """The pending rows of the query (:data:`PENDING_COLUMNS`, as the driver returns them) as
    columns per pool, in the rows' order: one transpose, one parse of the submit times (SQLite's
    naive UTC text by ``numpy.datetime64``, PostgreSQL's aware datetimes by ``timestamp()``),
    and no object per row."""
    if not raw:
        return {}
    # One C-level pass per column (itemgetter): four times cheaper than zip(*raw), which steps
    # 100,000 row iterators for each of the ten columns.
    ids, projects, pools, gpus, priority, duration, submitted, attempts, version, users = (
        list(map(itemgetter(i), raw)) for i in range(len(PENDING_COLUMNS)))
    fields = {"id": ids, "project": projects, "gpus": gpus, "priority": priority,
              "duration_s": duration, "submitted_at": _submitted_us(submitted, dialect),
              "user": users}
    first = pools[0]
    if pools.count(first) == len(pools):  # one pool: the whole read is its columns
        return {first: PoolPending(PendingColumns.from_fields(first, fields),
                                   np.asarray(version, dtype=np.int64),
                                   np.asarray(attempts, dtype=np.int64))}
    whole = PendingColumns.from_fields("", fields)
    versions, runs = np.asarray(version, dtype=np.int64), np.asarray(attempts, dtype=np.int64)
    names = list(dict.fromkeys(pools))
    code = np.fromiter(map({name: i for i, name in enumerate(names)}.__getitem__, pools),
                       dtype=np.int64, count=len(pools))
    by_pool = {}
    for i, name in enumerate(names):
        rows = np.flatnonzero(code == i)
        by_pool[name] = PoolPending(whole.select(rows, name), versions[rows], runs[rows])
    return by_pool


def _submitted_us(values: Sequence[Any], dialect: str) -> np.ndarray | Sequence[Any]:
    """Microseconds since the epoch of the driver's submit times (SQLite: naive UTC text, which
    ``numpy.datetime64`` reads in one call, text it cannot read parsed per value; PostgreSQL:
    the integers :func:`_pending_select` asked the server for)."""
    if isinstance(values[0], int):
        return np.asarray(values, dtype=np.int64)
    if dialect != "sqlite" or not isinstance(values[0], str):
        return values  # datetimes: PendingColumns reads them (aware ones by timestamp())
    try:
        return np.array(values, dtype="datetime64[us]").astype(np.int64)
    except ValueError:
        return [utc(v) for v in values]


def _pending_select(dialect: str) -> sa.Select:
    """The pending rows' query, in service order. On PostgreSQL the submit time comes as whole
    microseconds since the epoch, worked out by the server (exact: ``EXTRACT`` gives a numeric):
    making 100,000 aware datetimes in the driver and reading each back by ``timestamp()`` cost a
    third of the read."""
    c = T.jobs.c
    columns: list[Any] = [c[name] for name in PENDING_COLUMNS]
    if dialect == "postgresql":
        at = PENDING_COLUMNS.index("submitted_at")
        columns[at] = sa.cast(sa.func.round(sa.extract("epoch", c.submitted_at) * 1_000_000),
                              sa.BigInteger).label("submitted_us")
    return (sa.select(*columns).where(c.state == JobState.PENDING.value)
            .order_by(c.priority.desc(), c.submitted_at, c.id))


class QueueReads(StoreBase):
    """The one-read methods of the Store (see the module docstring)."""

    def queue_read(self, at: datetime) -> QueueRead:
        """Pending jobs (service order: priority highest first, then submission, then id) and
        running jobs (light rows, by id), in one transaction."""
        require_aware(at, "at")
        with self._read() as conn:
            pending_q = _pending_select(conn.dialect.name)
            # Straight through the driver: the statement's typed result processing costs more
            # per row than reading the row (the one typed pending column, the submit time, is
            # parsed as a whole column: SQLite gives naive UTC text, PostgreSQL an aware
            # datetime).
            pending = pending_by_pool(driver_rows(conn, pending_q), conn.dialect.name)
            running = _running_rows(conn, self._kept_running())
        return QueueRead(at, pending, running)

    def running_jobs(self) -> list[RunningJob]:
        """Every running job of the built-in queue as a light row, by id (what on-prem
        capacity, node usage and burst runs read; ``burst status`` at 10,000 nodes)."""
        with self._read() as conn:
            return _running_rows(conn, self._kept_running())

    def _kept_running(self) -> Kept[RunningJob]:
        kept = self._kept.get("running")
        if kept is None:
            kept = self._kept["running"] = Kept()
        return kept

    def start_onprem(self, job_id: str, version: int, attempts: int, node_id: str,
                     at: datetime) -> bool:
        """PENDING -> RUNNING on-prem for job ``job_id``, if it is still as read (its
        ``version``, with ``attempts`` runs so far); writes only what a start changes. False:
        someone changed it first."""
        require_aware(at, "at")
        c = T.jobs.c
        stmt = (sa.update(T.jobs)
                .where(c.id == job_id, c.version == version, c.state == JobState.PENDING.value)
                .values(state=JobState.RUNNING.value, placement=Placement.ONPREM.value,
                        node_id=node_id, started_at=at, finished_at=None, exit_code=None,
                        attempts=attempts + 1, version=version + 1))
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

    def pending_that_fit(self, pool: str, max_gpus: int, project_priority: Mapping[str, int],
                         default_priority: int, *, offset: int = 0, limit: int = 100
                         ) -> list[JobRecord]:
        """Records of ``pool``'s pending jobs of at most ``max_gpus`` GPUs, in the planner's
        scheduling order (:func:`orchestrator.planner.order.scheduling_order`: the project's
        priority, ``project_priority`` or ``default_priority``, highest first; then the job's;
        then oldest; then id), rows ``offset`` to ``offset + limit`` of it: what a burst node
        asking for work may be given, read a page at a time rather than the whole queue."""
        c = T.jobs.c
        rank: sa.ColumnElement[int] = sa.literal(int(default_priority))
        if project_priority:
            rank = sa.case({name: int(p) for name, p in project_priority.items()},
                           value=c.project, else_=int(default_priority))
        query = (sa.select(T.jobs)
                 .where(c.state == JobState.PENDING.value, c.pool == pool, c.gpus <= max_gpus)
                 .order_by(rank.desc(), c.priority.desc(), c.submitted_at, c.id)
                 .offset(offset).limit(limit))
        with self._read() as conn:
            return [job_from_row(r) for r in conn.execute(query)]

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


def _record_id(record: RunningJob) -> str:
    return record.id


def _chunks(ids: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(ids), _IN_CHUNK):
        yield ids[i:i + _IN_CHUNK]


def _aware(value: datetime | str) -> datetime:
    """max() over a UtcDateTime column comes back untyped on SQLite (text): parse it as UTC."""
    return utc(value)  # type: ignore[return-value]  # never None here
