"""Job runs in the store: the append-only history of which job ran on which burst node, when.

The built-in queue's ``jobs`` row keeps only a job's latest run; the cost ledger needs every run,
including those of jobs handed back or requeued since, and of jobs other queues (Slurm) run on
burst nodes. So each run is a ``job_runs`` row:

* built-in jobs open a run when they start on a burst node and close it when they finish, are
  handed back or lose their node, in the same transaction as the job's own compare-and-set
  (:mod:`orchestrator.store.jobqueue` calls :func:`open_run` / :func:`close_run`). The key is
  ``builtin:<job>:<attempt>``, so a retried start opens one run per attempt;
* the Slurm source reports what it observes (:meth:`JobRuns.observe_slurm_runs`): runs are keyed
  by (cluster scope, Slurm job id, burst node, start time), so a requeued job gets a new run, and
  the open runs of a cluster it no longer sees running are closed.

Writes are idempotent (insert or do nothing on ``run_key``; a closed run is never reopened or
closed again), so duplicate deliveries and racing observers converge.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.domain.costs import JobUsage
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.burstwaits import mark_burst_start

_CHUNK = 500  # keys per IN (...) list: well inside every driver's parameter limit
_r = T.job_runs.c


class RunSource(StrEnum):
    """Who reported a run."""

    BUILTIN = "builtin"
    SLURM = "slurm"


class RunOutcome(StrEnum):
    """How a run ended (Slurm runs carry Slurm's own final state in lower case instead)."""

    DONE = "done"
    FAILED = "failed"
    HANDED_BACK = "handed-back"  # the node's agent gave the job back (a drain)
    NODE_GONE = "node-gone"  # the node went away with the job on it
    REQUEUED = "requeued"  # put back in the queue for another reason
    GONE = "gone"  # an observed run no longer seen, its end not reported
    SUPERSEDED = "superseded"  # another run of the job reported it finished meanwhile
    CANCELLED = "cancelled"  # a user cancelled the job while it ran


#: Ends recorded for a run by the controller, not by its node: a late report from the node (it
#: finished while the controller thought it gone) replaces them with the node's own outcome.
PRESUMED_ENDS = (RunOutcome.NODE_GONE.value, RunOutcome.REQUEUED.value, RunOutcome.GONE.value)


@dataclass(frozen=True, slots=True)
class JobRun:
    """One run of a job on a burst node (``ended_at`` None: still running)."""

    run_key: str
    job_id: str
    project: str | None  # None: a job of no project
    node_id: str
    gpus: int
    started_at: datetime
    ended_at: datetime | None = None
    outcome: str | None = None
    source: RunSource = RunSource.BUILTIN
    user: str | None = None  # who submitted the job; None: not known

    def usage(self) -> JobUsage:
        return JobUsage(self.job_id, self.project, self.gpus, self.started_at, self.ended_at,
                        self.user)


def builtin_run_key(job_id: str, attempt: int) -> str:
    return f"{RunSource.BUILTIN}:{job_id}:{attempt}"


def slurm_run_key(scope: str, job_id: str, node_id: str, started_at: datetime) -> str:
    return f"{RunSource.SLURM}:{scope}:{job_id}:{node_id}:{int(started_at.timestamp())}"


def _values(run: JobRun) -> dict[str, Any]:
    return {
        "run_key": run.run_key, "job_id": run.job_id, "project": run.project, "user": run.user,
        "node_id": run.node_id, "gpus": run.gpus,
        "started_at": require_aware(run.started_at, "started_at"),
        "ended_at": None if run.ended_at is None else require_aware(run.ended_at, "ended_at"),
        "outcome": run.outcome, "source": RunSource(run.source).value,
    }


def _run_from_row(row: sa.Row[Any]) -> JobRun:
    m = row._mapping
    return JobRun(run_key=m["run_key"], job_id=m["job_id"], project=m["project"],
                  node_id=m["node_id"], gpus=m["gpus"], started_at=m["started_at"],
                  ended_at=m["ended_at"], outcome=m["outcome"], source=RunSource(m["source"]),
                  user=m["user"])


def open_run(conn: Connection, insert: Any, run: JobRun) -> bool:
    """Record ``run`` in the caller's transaction unless its key is recorded already (then it
    changes nothing: a closed run is never reopened). ``insert``: ``Store._insert(job_runs)``.
    True if it was new."""
    if run.ended_at is not None and run.ended_at < run.started_at:
        raise ValueError(f"run {run.run_key} ends {run.ended_at.isoformat()} before it starts "
                         f"{run.started_at.isoformat()}")
    stmt = insert.values(**_values(run)).on_conflict_do_nothing(index_elements=["run_key"])
    if conn.execute(stmt).rowcount != 1:
        return False
    # The wait the burst avoided: the job's first burst start answers its prediction.
    mark_burst_start(conn, run.job_id, run.node_id, run.project, run.gpus, run.started_at)
    return True


def close_run(conn: Connection, run_key: str, at: datetime, outcome: str) -> bool:
    """Close the open run ``run_key`` at ``at`` (never before it started) in the caller's
    transaction. False if there is no such open run (closed already, or never opened)."""
    require_aware(at, "at")
    ended = sa.case((_r.started_at > at, _r.started_at), else_=at)
    stmt = (sa.update(T.job_runs).where(_r.run_key == run_key, _r.ended_at.is_(None))
            .values(ended_at=ended, outcome=outcome))
    return conn.execute(stmt).rowcount == 1


def amend_presumed_end(conn: Connection, run_key: str, outcome: str) -> bool:
    """Replace the presumed end (node-gone, ...) of closed run ``run_key`` with ``outcome``, the
    end its node reported late; its end time is kept. False if the run has no presumed end."""
    stmt = (sa.update(T.job_runs)
            .where(_r.run_key == run_key, _r.ended_at.is_not(None), _r.outcome.in_(PRESUMED_ENDS))
            .values(outcome=outcome))
    return conn.execute(stmt).rowcount == 1


def run_usages(conn: Connection, node_ids: Collection[str], since: datetime | None = None
               ) -> dict[str, list[JobUsage]]:
    """Per node, the runs on it (every source) still running at ``since`` or started after it
    (None: all), as the cost ledger's job usages."""
    out: dict[str, list[JobUsage]] = {}
    ids = sorted(node_ids)
    if since is not None and len(ids) > _CHUNK:
        # Many nodes (a tick's roll-up asks for every launched node): one read of the runs that
        # moved after ``since``, kept for the nodes asked about, costs less than an IN (...) list
        # of 500 ids per chunk (compiling each was most of the read at 10,000 nodes).
        wanted = set(ids)
        return {node: runs for node, runs in runs_moved_after(conn, since).items()
                if node in wanted}
    for i in range(0, len(ids), _CHUNK):
        query = (sa.select(T.job_runs).where(_r.node_id.in_(ids[i:i + _CHUNK]))
                 .order_by(_r.started_at, _r.run_key))
        if since is not None:
            query = query.where(sa.or_(_r.ended_at.is_(None),
                                       _r.ended_at > require_aware(since, "since")))
        for row in conn.execute(query):
            run = _run_from_row(row)
            out.setdefault(run.node_id, []).append(run.usage())
    return out


def runs_moved_after(conn: Connection, since: datetime) -> dict[str, list[JobUsage]]:
    """Per node, every run (of any source, on any node) still running at ``since`` or started
    after it, by start time then key, as the cost ledger's job usages: one query, whatever the
    number of nodes."""
    out: dict[str, list[JobUsage]] = {}
    query = (sa.select(T.job_runs)
             .where(sa.or_(_r.ended_at.is_(None), _r.ended_at > require_aware(since, "since")))
             .order_by(_r.started_at, _r.run_key))
    for row in conn.execute(query):
        run = _run_from_row(row)
        out.setdefault(run.node_id, []).append(run.usage())
    return out


class JobRuns(StoreBase):
    """Job-run methods of the Store."""

    def job_runs(self, *, job_id: str | None = None, node_id: str | None = None,
                 source: RunSource | None = None) -> list[JobRun]:
        """Runs by start time (then key), of a job, a node, a source or all."""
        query = sa.select(T.job_runs).order_by(_r.started_at, _r.run_key)
        if job_id is not None:
            query = query.where(_r.job_id == job_id)
        if node_id is not None:
            query = query.where(_r.node_id == node_id)
        if source is not None:
            query = query.where(_r.source == RunSource(source).value)
        with self._read() as conn:
            return [_run_from_row(r) for r in conn.execute(query)]

    def runs_moved_after(self, since: datetime) -> dict[str, list[JobUsage]]:
        """Per node, every run still running at ``since`` or started after it (see
        :func:`runs_moved_after`): the runs a roll-up from ``since`` on can see."""
        with self._read() as conn:
            return runs_moved_after(conn, since)

    def job_run(self, run_key: str) -> JobRun | None:
        with self._read() as conn:
            row = conn.execute(sa.select(T.job_runs).where(_r.run_key == run_key)).first()
        return _run_from_row(row) if row is not None else None

    def observe_slurm_runs(self, scope: str, observed: Iterable[JobRun], now: datetime
                           ) -> tuple[int, int]:
        """Record what one observation of a Slurm cluster (``scope``) showed, in one
        transaction: every run in ``observed`` is recorded if new (a run observed already ended
        closes the open one with its end and outcome), and every open run of ``scope`` not in
        ``observed`` that started by ``now`` is closed at ``now`` (``gone``), or at the start of
        the job's newer observed run if it was requeued and started again. Returns (runs opened,
        runs closed)."""
        require_aware(now, "now")
        prefix = f"{RunSource.SLURM}:{scope}:"
        runs: dict[str, JobRun] = {}
        for run in observed:
            if run.source is not RunSource.SLURM or not run.run_key.startswith(prefix):
                raise ValueError(f"run {run.run_key} is not a Slurm run of scope {scope}")
            runs[run.run_key] = run
        opened = closed = 0
        with self._write() as conn:
            for key in sorted(runs):
                run = runs[key]
                if open_run(conn, self._insert(T.job_runs), run):
                    opened += 1
                elif run.ended_at is not None:
                    closed += close_run(conn, key, run.ended_at, run.outcome or RunOutcome.GONE)
            # Open runs of this cluster it no longer shows. Only those started by ``now``: an
            # older observation committing late must not close a run a newer one opened. A run
            # the same job started again since (requeued) ended by that new start at the latest.
            stale = conn.execute(
                sa.select(_r.run_key, _r.job_id, _r.started_at)
                .where(_r.ended_at.is_(None), _r.source == RunSource.SLURM.value,
                       _r.run_key.startswith(prefix, autoescape=True), _r.started_at <= now)
                .order_by(_r.run_key)).all()
            for row in stale:
                if row.run_key in runs:
                    continue
                later = [r.started_at for r in runs.values()
                         if r.job_id == row.job_id and r.started_at > row.started_at]
                closed += close_run(conn, row.run_key, min([now, *later]), RunOutcome.GONE)
        return opened, closed


__all__ = [
    "PRESUMED_ENDS", "JobRun", "JobRuns", "RunOutcome", "RunSource", "amend_presumed_end",
    "builtin_run_key", "close_run", "open_run", "run_usages", "slurm_run_key",
]
