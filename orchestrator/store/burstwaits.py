"""Burst waits in the store: per burst job, the on-prem start the planner predicted and the
job's actual start on a burst node (the inputs of ``burst report --roi``, :mod:`orchestrator.costs.roi`).

Two writes, each inside a transaction the store opens anyway:

* :func:`record_predictions`, with the decision that launched burst nodes for the jobs
  (``Store.add_decision``): one row per job of ``inputs.burst_wait``. A newer prediction replaces
  an older one while the job has not started on a burst node (a node launched for it failed and
  the planner launched again: the newer decision is the one the job's burst start answers);
* :func:`mark_burst_start`, with the job's first run on a burst node (:func:`.jobruns.open_run`,
  built-in and Slurm runs alike): its start, node, project and GPUs, once. A later run (the job
  requeued) changes nothing: the wait avoided is the one its first burst start avoided.

A job that starts on a burst node without a prediction (its decision had no queue to predict
from, or it was burst before this table existed) has no row; the ROI report counts its GPU-hours
and dollars, not its wait.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.domain.plan import Decision
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.codec import parse_time

_w = T.burst_waits.c


@dataclass(frozen=True, slots=True)
class BurstWait:
    """One burst job's predicted on-prem start and actual burst start (None: not started)."""

    job_id: str
    policy: str
    decision_id: str
    predicted_at: datetime
    predicted_start: datetime | None  # None: the model never started it on-prem
    started_at: datetime | None = None
    node_id: str | None = None
    project: str | None = None
    gpus: int | None = None

    @property
    def avoided_s(self) -> float | None:
        """Seconds of waiting the burst start avoided: predicted on-prem start minus actual
        start, floored at 0 (a job that started later on burst than on-prem was predicted lost
        no waiting to bursting, it waited for a node); None without a prediction or a start."""
        if self.predicted_start is None or self.started_at is None:
            return None
        return max((self.predicted_start - self.started_at).total_seconds(), 0.0)


def record_predictions(conn: Connection, insert: Any, decision: Decision) -> int:
    """Record ``decision``'s predicted on-prem starts (``inputs.burst_wait``) in the caller's
    transaction; rows of jobs already started on burst are kept. ``insert``:
    ``Store._insert(burst_waits)``. Returns the jobs it carried."""
    starts = (decision.inputs.get("burst_wait") or {}).get("predicted_onprem_start_s") or {}
    at = require_aware(decision.at, "decision.at")
    for job_id in sorted(starts):
        offset = starts[job_id]
        values = {"job_id": job_id, "policy": decision.policy, "decision_id": decision.id,
                  "predicted_at": at,
                  "predicted_start": None if offset is None else at + timedelta(seconds=offset)}
        conn.execute(insert.values(**values).on_conflict_do_update(
            index_elements=["job_id"],
            set_={k: v for k, v in values.items() if k != "job_id"},
            where=sa.and_(T.burst_waits.c.started_at.is_(None),
                          T.burst_waits.c.predicted_at <= at)))
    return len(starts)


def mark_burst_start(conn: Connection, job_id: str, node_id: str, project: str | None, gpus: int,
                     at: datetime) -> bool:
    """Record the first burst start of ``job_id`` in the caller's transaction (nothing when it has
    no prediction or started before). True if it wrote."""
    stmt = (sa.update(T.burst_waits)
            .where(_w.job_id == job_id, _w.started_at.is_(None))
            .values(started_at=require_aware(at, "at"), node_id=node_id, project=project,
                    gpus=gpus))
    return conn.execute(stmt).rowcount == 1


def _from_row(row: sa.Row[Any]) -> BurstWait:
    m = row._mapping
    return BurstWait(job_id=m["job_id"], policy=m["policy"], decision_id=m["decision_id"],
                     predicted_at=m["predicted_at"], predicted_start=m["predicted_start"],
                     started_at=m["started_at"], node_id=m["node_id"], project=m["project"],
                     gpus=m["gpus"])


class BurstWaits(StoreBase):
    """Burst-wait methods of the Store."""

    def burst_wait(self, job_id: str) -> BurstWait | None:
        with self._read() as conn:
            row = conn.execute(sa.select(T.burst_waits).where(_w.job_id == job_id)).first()
        return _from_row(row) if row is not None else None

    def burst_waits(self, *, since: datetime | None = None, until: datetime | None = None,
                    projects: Collection[str] | None = None) -> list[BurstWait]:
        """The burst jobs that started on a burst node in [since, until) (None: unbounded), of
        ``projects`` only (None: every project), by start then job id."""
        if projects is not None and not projects:
            return []
        query = (sa.select(T.burst_waits).where(_w.started_at.is_not(None))
                 .order_by(_w.started_at, _w.job_id))
        if since is not None:
            query = query.where(_w.started_at >= require_aware(since, "since"))
        if until is not None:
            query = query.where(_w.started_at < require_aware(until, "until"))
        if projects is not None:
            query = query.where(_w.project.in_(sorted(projects)))
        with self._read() as conn:
            return [_from_row(r) for r in conn.execute(query)]

    def first_burst_starts(self, *, since: datetime | None = None, until: datetime | None = None,
                           projects: Collection[str] | None = None
                           ) -> list[tuple[str, str | None, datetime]]:
        """(job, project, first start on a burst node) of the jobs whose first burst run (of
        ``job_runs``, every source) started in [since, until), by start then job."""
        if projects is not None and not projects:
            return []
        r = T.job_runs.c
        first = sa.func.min(r.started_at).label("first")
        query = sa.select(r.job_id, r.project, first).group_by(r.job_id, r.project)
        if projects is not None:
            query = query.where(r.project.in_(sorted(projects)))
        if since is not None:
            query = query.having(first >= require_aware(since, "since"))
        if until is not None:
            query = query.having(first < require_aware(until, "until"))
        with self._read() as conn:
            rows = [(str(j), p, _aware(f)) for j, p, f in conn.execute(query)]
        return sorted(rows, key=lambda row: (row[2], row[0]))


def _aware(moment: datetime) -> datetime:
    # An aggregate comes back without the column's type on SQLite: make it UTC-aware again.
    return parse_time(moment) if isinstance(moment, str) else (
        moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC))


__all__ = ["BurstWait", "BurstWaits", "mark_burst_start", "record_predictions"]
