"""Measured GPU use in the store: per-job aggregates and per-node-hour roll-ups, never raw readings.

Writers:

* :meth:`Utilisation.record_gpu_readings`: one heartbeat's readings of a burst node (the API's
  heartbeat handler). Each reading stands for ``interval_s`` seconds; it is folded, in one
  transaction, into the ``job_usage`` row of the job holding that GPU and into the node's
  ``node_usage_hours`` row of the reading's UTC hour (a reading straddling an hour boundary
  counts in the hour it was taken). A reading without a utilisation adds sampled GPU-seconds
  only: it stays unmeasured.
* :meth:`Utilisation.record_job_accounting`: what Slurm accounting says of an on-prem job
  (:mod:`orchestrator.sources.slurm_usage`); written once per job (idempotent), with its
  allocated GPU-seconds, and a mean utilisation but no histogram (its median is unknown).

Readers (the reports build on these; every figure that could not be measured is None, never 0):

* :meth:`Utilisation.job_utilisation` -> :class:`JobUtilisation` per job that has a row:
  allocated GPU-seconds (its runs in ``job_runs``, or sacct's elapsed x GPUs), sampled, measured
  and used GPU-seconds, time-weighted mean and p50 utilisation, peak memory, source and
  ``low_since``. A job with runs but no row here was never measured: allocation only.
* :meth:`Utilisation.node_utilisation_hours` -> :class:`NodeHourUtilisation` per node and hour.
* :meth:`Utilisation.prune_utilisation`: drops rows older than a retention (bounded growth).

Growth: one ``job_usage`` row per job and one ``node_usage_hours`` row per node-hour, whatever
the heartbeat rate (bench/usage_store_growth.py measures it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.domain.nodes import Node
from orchestrator.domain.utilisation import (
    GpuUse,
    UsageSource,
    add_reading,
    empty_histogram,
    histogram_median,
    mean_of,
    mean_percent,
    next_low_since,
)
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

_CHUNK = 500
_u = T.job_usage.c
_h = T.node_usage_hours.c


@dataclass(frozen=True, slots=True)
class JobUtilisation:
    """A job's measured GPU use. ``measured`` False: nothing could be measured (unknown)."""

    job_id: str
    project: str | None
    node_id: str | None
    source: UsageSource
    first_at: datetime
    last_at: datetime
    allocated_gpu_s: float | None  # None: the job has no recorded run
    sampled_gpu_s: float
    measured_gpu_s: float
    used_gpu_s: float
    mean_utilisation_percent: float | None
    p50_utilisation_percent: float | None
    peak_memory_mib: float | None
    memory_total_mib: float | None
    low_since: datetime | None

    @property
    def measured(self) -> bool:
        return self.measured_gpu_s > 0


@dataclass(frozen=True, slots=True)
class NodeHourUtilisation:
    """One burst node's GPU use in one UTC hour."""

    node_id: str
    hour: datetime
    pool: str
    provider: str
    gpus: int
    gpu_s: float
    allocated_gpu_s: float
    measured_gpu_s: float
    used_gpu_s: float
    mean_utilisation_percent: float | None
    p50_utilisation_percent: float | None
    peak_memory_mib: float | None


def hour_of(at: datetime) -> datetime:
    return at.replace(minute=0, second=0, microsecond=0)


def _peak(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None else max(current, value)


def _fold(row: dict[str, Any], uses: Sequence[GpuUse], seconds: float,
          sampled: str = "sampled_gpu_s") -> None:
    """Add ``uses`` (each standing for ``seconds``) to an aggregate row's figures; ``sampled``
    names the row's column of sampled GPU-seconds."""
    histogram = list(row.get("histogram") or empty_histogram())
    for use in uses:
        row[sampled] = row.get(sampled, 0.0) + seconds
        if use.utilisation_percent is not None:
            row["measured_gpu_s"] = row.get("measured_gpu_s", 0.0) + seconds
            row["used_gpu_s"] = row.get("used_gpu_s", 0.0) + seconds * use.utilisation_percent / 100
            add_reading(histogram, use.utilisation_percent, seconds)
        row["peak_memory_mib"] = _peak(row.get("peak_memory_mib"), use.memory_used_mib)
    row["histogram"] = histogram


class Utilisation(StoreBase):
    """Measured GPU use of the Store (see the module docstring)."""

    def record_gpu_readings(self, node: Node, at: datetime, interval_s: float,
                            uses: Sequence[GpuUse], *, below_percent: float) -> None:
        """Fold one heartbeat's readings of ``node`` into the job and node-hour aggregates;
        ``below_percent`` is the node's policy threshold (a job's ``low_since``)."""
        require_aware(at, "at")
        seconds = float(interval_s)
        if not 0 <= seconds < float("inf"):
            raise ValueError(f"interval_s must be a non-negative number, got {interval_s!r}")
        by_job: dict[str, list[GpuUse]] = defaultdict(list)
        for use in uses:
            if use.job_id is not None:
                by_job[use.job_id].append(use)
        with self._write() as conn:
            projects = self._projects(conn, list(by_job))
            for job_id, held in sorted(by_job.items()):
                self._fold_job(conn, job_id, projects.get(job_id) or node.project, node, at,
                               seconds, held, below_percent)
            self._fold_node_hour(conn, node, at, seconds, uses, by_job)

    def _projects(self, conn: Connection, job_ids: list[str]) -> dict[str, str]:
        if not job_ids:
            return {}
        j = T.jobs.c
        return dict(conn.execute(sa.select(j.id, j.project).where(j.id.in_(job_ids))).all())

    def _locked(self, conn: Connection, query: Any) -> Any:
        return conn.execute(query.with_for_update() if self.dialect == "postgresql"
                            else query).mappings().first()

    def _fold_job(self, conn: Connection, job_id: str, project: str | None, node: Node,
                  at: datetime, seconds: float, held: Sequence[GpuUse],
                  below_percent: float) -> None:
        found = self._locked(conn, sa.select(T.job_usage).where(_u.job_id == job_id))
        row: dict[str, Any] = dict(found) if found is not None else {
            "job_id": job_id, "project": project, "source": UsageSource.AGENT.value,
            "first_at": at, "sampled_gpu_s": 0.0, "measured_gpu_s": 0.0, "used_gpu_s": 0.0,
            "histogram": None, "peak_memory_mib": None, "memory_total_mib": None,
            "low_since": None, "allocated_gpu_s": None}
        _fold(row, held, seconds)
        row["node_id"], row["last_at"] = node.id, max(at, row.get("last_at") or at)
        totals = [u.memory_total_mib for u in held if u.memory_total_mib is not None]
        row["memory_total_mib"] = _peak(row.get("memory_total_mib"), max(totals, default=None))
        row["low_since"] = next_low_since(mean_of(held), below_percent, row.get("low_since"), at)
        if found is None:
            conn.execute(self._insert(T.job_usage).values(**row)
                         .on_conflict_do_nothing(index_elements=["job_id"]))
        else:
            conn.execute(sa.update(T.job_usage).where(_u.job_id == job_id).values(**row))

    def _fold_node_hour(self, conn: Connection, node: Node, at: datetime, seconds: float,
                        uses: Sequence[GpuUse], by_job: dict[str, list[GpuUse]]) -> None:
        hour = hour_of(at)
        key = (_h.node_id == node.id) & (_h.hour == hour)
        found = self._locked(conn, sa.select(T.node_usage_hours).where(key))
        row: dict[str, Any] = dict(found) if found is not None else {
            "node_id": node.id, "hour": hour, "pool": node.pool, "provider": node.provider,
            "gpu_s": 0.0, "allocated_gpu_s": 0.0, "measured_gpu_s": 0.0, "used_gpu_s": 0.0,
            "histogram": None, "peak_memory_mib": None}
        row["gpus"] = max(node.gpus, len(uses))
        row["allocated_gpu_s"] += seconds * sum(len(held) for held in by_job.values())
        _fold(row, uses, seconds, sampled="gpu_s")
        if found is None:
            conn.execute(self._insert(T.node_usage_hours).values(**row)
                         .on_conflict_do_nothing(index_elements=["node_id", "hour"]))
        else:
            conn.execute(sa.update(T.node_usage_hours).where(key).values(**row))

    def record_job_accounting(self, job_id: str, project: str | None, *, started_at: datetime,
                              ended_at: datetime, gpus: int, mean_utilisation_percent: float | None,
                              peak_memory_mib: float | None,
                              source: UsageSource = UsageSource.SACCT) -> bool:
        """Record what accounting says of a finished job (once: False when it is already
        recorded). Without a utilisation the job is allocation only (measured 0, unknown)."""
        require_aware(started_at, "started_at")
        require_aware(ended_at, "ended_at")
        allocated = max((ended_at - started_at).total_seconds(), 0.0) * max(gpus, 0)
        measured = allocated if mean_utilisation_percent is not None else 0.0
        used = measured * (mean_utilisation_percent or 0.0) / 100.0
        values = {"job_id": job_id, "project": project, "node_id": None,
                  "source": UsageSource(source).value, "first_at": started_at,
                  "last_at": ended_at, "allocated_gpu_s": allocated, "sampled_gpu_s": measured,
                  "measured_gpu_s": measured, "used_gpu_s": used, "histogram": None,
                  "peak_memory_mib": peak_memory_mib, "memory_total_mib": None,
                  "low_since": None}
        with self._write() as conn:
            done = conn.execute(self._insert(T.job_usage).values(**values)
                                .on_conflict_do_nothing(index_elements=["job_id"]))
        return bool(done.rowcount)

    def job_utilisation(self, job_ids: Iterable[str] | None = None, *,
                        since: datetime | None = None, until: datetime | None = None,
                        project: str | None = None) -> list[JobUtilisation]:
        """Jobs' measured use, by job id; ``since``/``until`` select jobs measured in that
        window (their last reading at or after ``since``, their first before ``until``)."""
        query = sa.select(T.job_usage).order_by(_u.job_id)
        if since is not None:
            query = query.where(_u.last_at >= require_aware(since, "since"))
        if until is not None:
            query = query.where(_u.first_at < require_aware(until, "until"))
        if project is not None:
            query = query.where(_u.project == project)
        wanted = None if job_ids is None else sorted(set(job_ids))
        with self._read() as conn:
            if wanted is None:
                rows = list(conn.execute(query).mappings())
            else:
                rows = []
                for i in range(0, len(wanted), _CHUNK):
                    chunk = wanted[i:i + _CHUNK]
                    rows += conn.execute(query.where(_u.job_id.in_(chunk))).mappings().all()
            allocated = self._allocated(conn, [r["job_id"] for r in rows if
                                               r["allocated_gpu_s"] is None])
        return [_job_from_row(r, allocated) for r in rows]

    def _allocated(self, conn: Connection, job_ids: list[str]) -> dict[str, float]:
        """GPU-seconds of the jobs' runs (a run still open counts up to its last reading)."""
        r, u = T.job_runs.c, _u
        totals: dict[str, float] = defaultdict(float)
        for i in range(0, len(job_ids), _CHUNK):
            chunk = job_ids[i:i + _CHUNK]
            query = (sa.select(r.job_id, r.gpus, r.started_at, r.ended_at, u.last_at)
                     .select_from(T.job_runs.join(T.job_usage, u.job_id == r.job_id))
                     .where(r.job_id.in_(chunk)))
            for job_id, gpus, started, ended, last in conn.execute(query):
                end = ended or max(last, started)
                totals[job_id] += max((end - started).total_seconds(), 0.0) * gpus
        return dict(totals)

    def node_utilisation_hours(self, *, since: datetime | None = None,
                               until: datetime | None = None,
                               node_ids: Iterable[str] | None = None) -> list[NodeHourUtilisation]:
        """Node-hour roll-ups with ``since <= hour < until``, by node then hour."""
        query = sa.select(T.node_usage_hours).order_by(_h.node_id, _h.hour)
        if since is not None:
            query = query.where(_h.hour >= hour_of(require_aware(since, "since")))
        if until is not None:
            query = query.where(_h.hour < require_aware(until, "until"))
        if node_ids is not None:
            query = query.where(_h.node_id.in_(sorted(set(node_ids))))
        with self._read() as conn:
            return [_hour_from_row(r) for r in conn.execute(query).mappings()]

    def prune_utilisation(self, before: datetime) -> int:
        """Delete node-hours before ``before`` and jobs last measured before it; the count."""
        require_aware(before, "before")
        with self._write() as conn:
            hours = conn.execute(sa.delete(T.node_usage_hours).where(_h.hour < before)).rowcount
            jobs = conn.execute(sa.delete(T.job_usage).where(_u.last_at < before)).rowcount
        return int(hours or 0) + int(jobs or 0)


def _job_from_row(row: Any, allocated: dict[str, float]) -> JobUtilisation:
    histogram = row["histogram"] or ()
    return JobUtilisation(
        job_id=row["job_id"], project=row["project"], node_id=row["node_id"],
        source=UsageSource(row["source"]), first_at=row["first_at"], last_at=row["last_at"],
        allocated_gpu_s=(row["allocated_gpu_s"] if row["allocated_gpu_s"] is not None
                         else allocated.get(row["job_id"])),
        sampled_gpu_s=row["sampled_gpu_s"], measured_gpu_s=row["measured_gpu_s"],
        used_gpu_s=row["used_gpu_s"],
        mean_utilisation_percent=mean_percent(row["used_gpu_s"], row["measured_gpu_s"]),
        p50_utilisation_percent=histogram_median(histogram),
        peak_memory_mib=row["peak_memory_mib"], memory_total_mib=row["memory_total_mib"],
        low_since=row["low_since"])


def _hour_from_row(row: Any) -> NodeHourUtilisation:
    return NodeHourUtilisation(
        node_id=row["node_id"], hour=row["hour"], pool=row["pool"], provider=row["provider"],
        gpus=row["gpus"], gpu_s=row["gpu_s"], allocated_gpu_s=row["allocated_gpu_s"],
        measured_gpu_s=row["measured_gpu_s"], used_gpu_s=row["used_gpu_s"],
        mean_utilisation_percent=mean_percent(row["used_gpu_s"], row["measured_gpu_s"]),
        p50_utilisation_percent=histogram_median(row["histogram"] or ()),
        peak_memory_mib=row["peak_memory_mib"])


__all__ = ["JobUtilisation", "NodeHourUtilisation", "Utilisation", "hour_of"]
