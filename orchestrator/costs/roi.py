"""The return on burst spend: per project and month, what the burst spend bought in waiting
avoided (``burst report --roi``, ``GET /v1/roi``).

For each (project, UTC month):

* ``burst_cost_usd``, ``burst_gpu_hours``: the cost ledger's burst lines (usage, idle, minimum)
  whose hour bucket falls in the month, as ``burst report`` sums them;
* ``burst_jobs``: jobs whose first start on a burst node fell in the month; ``predicted_jobs``
  those of them the planner predicted an on-prem start for when it launched for them
  (:mod:`orchestrator.planner.forecast`, kept per job by :mod:`orchestrator.store.burstwaits`);
* ``hours_avoided``: researcher-hours of waiting avoided, the sum over the predicted jobs of
  *predicted on-prem start minus actual burst start*, **floored at 0 per job**. A job that
  started on burst later than on-prem was predicted to free up (a slow boot, a prediction made
  early) cost waiting; counted negative it would make one slow boot cancel out hours another
  job gained, and the sum would no longer read as "waiting avoided". The jobs whose burst start
  came later than the prediction are counted (``late_jobs``), so the floor hides nothing;
* ``usd_per_hour_avoided``: ``burst_cost_usd / hours_avoided`` (None when nothing was avoided).

A job the model never starts on-prem (wider than the pool, queued behind a job without an
expected runtime) has no finite prediction and counts in ``burst_jobs`` only. Money is summed
exactly (micro-dollars) and rounded to the cent per row.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from orchestrator.costs.report import cents
from orchestrator.store import Store
from orchestrator.store.burstwaits import BurstWait
from orchestrator.store.ledger import CostSums

COLUMNS = ("project", "month", "burst_cost_usd", "burst_gpu_hours", "burst_jobs",
           "predicted_jobs", "late_jobs", "hours_avoided", "usd_per_hour_avoided")


@dataclass(frozen=True)
class RoiRow:
    """One project's month (see the module docstring)."""

    project: str | None  # None: work of no project (its own bucket, "(no project)" in tables)
    month: str  # YYYY-MM, UTC
    burst_cost_micros: int = 0
    burst_gpu_seconds: float = 0.0
    burst_jobs: int = 0
    predicted_jobs: int = 0
    late_jobs: int = 0
    avoided_s: float = 0.0

    @property
    def hours_avoided(self) -> float:
        return self.avoided_s / 3600

    @property
    def usd_per_hour_avoided(self) -> Decimal | None:
        if self.avoided_s <= 0:
            return None
        return cents(round(self.burst_cost_micros / self.hours_avoided))

    def as_json(self) -> dict:
        per_hour = self.usd_per_hour_avoided
        return {
            "project": self.project, "month": self.month,
            "burst_cost_usd": str(cents(self.burst_cost_micros)),
            "burst_gpu_hours": round(self.burst_gpu_seconds / 3600, 4),
            "burst_jobs": self.burst_jobs, "predicted_jobs": self.predicted_jobs,
            "late_jobs": self.late_jobs,
            "hours_avoided": round(self.hours_avoided, 4),
            "usd_per_hour_avoided": None if per_hour is None else str(per_hour),
        }


@dataclass(frozen=True)
class RoiReport:
    since: datetime | None
    until: datetime | None
    rows: tuple[RoiRow, ...]
    total: RoiRow

    def as_json(self) -> dict:
        return {"from": _iso(self.since), "to": _iso(self.until), "currency": "USD",
                "rows": [r.as_json() for r in self.rows], "total": self.total.as_json()}

    def as_csv(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(COLUMNS)
        for row in self.rows:
            values = row.as_json()
            writer.writerow(["" if values[c] is None else values[c] for c in COLUMNS])  # no project: ""
        return buffer.getvalue()


def month_of(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m")


def roi_rows(costs: Iterable[CostSums], first_starts: Iterable[tuple[str, str | None, datetime]],
             waits: Iterable[BurstWait]) -> tuple[tuple[RoiRow, ...], RoiRow]:
    """Fold the ledger's sums by (project, day), the jobs' first burst starts (job, project,
    start) and their burst waits into rows by (project, month), ordered, and their total."""
    acc: dict[tuple[str | None, str], dict] = {}

    def slot(project: str | None, month: str) -> dict:
        return acc.setdefault((project, month), {"cost": 0, "gpu_s": 0.0, "jobs": 0,
                                                 "predicted": 0, "late": 0, "avoided": 0.0})

    for s in costs:
        project, day = s.keys
        if s.cost_micros or s.gpu_seconds:
            row = slot(project, str(day)[:7])
            row["cost"] += s.cost_micros
            row["gpu_s"] += s.gpu_seconds
    for _job, project, started in first_starts:
        slot(project, month_of(started))["jobs"] += 1
    for wait in waits:
        avoided = wait.avoided_s
        if avoided is None or wait.started_at is None:
            continue
        row = slot(wait.project, month_of(wait.started_at))
        row["predicted"] += 1
        row["avoided"] += avoided
        if wait.predicted_start is not None and wait.predicted_start < wait.started_at:
            row["late"] += 1
    rows = tuple(RoiRow(p, m, v["cost"], v["gpu_s"], v["jobs"], v["predicted"], v["late"],
                        v["avoided"])
                 for (p, m), v in sorted(acc.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or "", kv[0][1])))
    total = RoiRow("total", "", sum(r.burst_cost_micros for r in rows),
                   sum(r.burst_gpu_seconds for r in rows), sum(r.burst_jobs for r in rows),
                   sum(r.predicted_jobs for r in rows), sum(r.late_jobs for r in rows),
                   sum(r.avoided_s for r in rows))
    return rows, total


def roi_report(store: Store, *, since: datetime | None = None, until: datetime | None = None,
               projects: frozenset[str] | None = None) -> RoiReport:
    """The ROI rows of burst work in [since, until) (None: unbounded), of ``projects`` only
    (None: every project; auth scoping)."""
    costs = store.cost_sums(["project", "day"], since=since, until=until, projects=projects)
    starts = store.first_burst_starts(since=since, until=until, projects=projects)
    waits = store.burst_waits(since=since, until=until, projects=projects)
    rows, total = roi_rows(costs, starts, waits)
    return RoiReport(since, until, rows, total)


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z") if moment else None


__all__ = ["COLUMNS", "RoiReport", "RoiRow", "month_of", "roi_report", "roi_rows"]
