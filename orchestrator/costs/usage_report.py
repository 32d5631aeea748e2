"""The usage report: who used how many GPU-hours, on-prem and burst side by side, how much of it
was measurably used, what it cost, and how long the jobs queued (``burst report --usage``,
``GET /v1/usage``).

Per group of ``user``, ``project``, ``provider`` (``onprem`` for on-prem work), ``pool`` and
``day`` (any combination):

* ``onprem_gpu_hours``, ``burst_gpu_hours``: GPU-hours *allocated* to jobs, from the cost ledger
  (on-prem lines, and burst usage lines; a burst node's idle GPUs are no one's allocation but
  their cost is in ``burst_cost_usd``), lines whose hour bucket starts in the window;
* ``measured_gpu_hours``: the part of the allocation whose utilisation was measured (the node
  agent's NVML readings, or Slurm accounting; :mod:`orchestrator.store.usage`). A job's measured
  share (measured over allocated GPU-seconds) and mean utilisation are spread over the groups in
  proportion to its allocation in each; ``used_gpu_hours``: measured GPU-hours weighted by
  utilisation; ``utilisation_percent``: used over measured. A group with nothing measured has
  ``null`` there (*unknown*, never 0), and ``measured_share`` says how much of each row rests on
  measurement;
* ``onprem_cost_usd``, ``burst_cost_usd``: the ledger's money, to the cent;
* ``jobs``, ``wait_p50_s``, ``wait_p95_s``: the built-in queue's jobs that started in the window
  and their queue wait (submit to start; nearest-rank percentiles). Slurm jobs are in the
  allocation and cost columns but not here (the controller does not see their submit time).

An unknown user or project is an empty report; a viewer's report holds its projects' rows only
(the ledger and jobs are filtered before grouping). ``project``/``user`` null is the bucket of
work of no project / no known user.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime

from orchestrator.costs.report import cents
from orchestrator.store import Store
from orchestrator.store.usage_reads import USAGE_KEYS

COLUMNS = ("onprem_gpu_hours", "burst_gpu_hours", "gpu_hours", "measured_gpu_hours",
           "measured_share", "used_gpu_hours", "utilisation_percent", "onprem_cost_usd",
           "burst_cost_usd", "jobs", "wait_p50_s", "wait_p95_s")


def parse_usage_group_by(text: str) -> tuple[str, ...]:
    """``"project,user"`` -> ("project", "user"); ValueError naming the allowed keys."""
    allowed = ", ".join(USAGE_KEYS)
    names = [part.strip() for part in str(text).split(",")]
    if not str(text).strip() or any(not n for n in names):
        raise ValueError(f"needs one or more keys, comma-separated: {allowed} (got {text!r})")
    unknown = [n for n in names if n not in USAGE_KEYS]
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; choose from {allowed}")
    if len(set(names)) != len(names):
        raise ValueError(f"names a key twice (got {text!r})")
    return tuple(names)


@dataclass
class UsageRow:
    """One group (see the module docstring); GPU figures in GPU-seconds, money in micro-dollars."""

    keys: dict[str, str | None]
    onprem_gpu_s: float = 0.0
    burst_gpu_s: float = 0.0
    measured_gpu_s: float = 0.0
    used_gpu_s: float = 0.0
    onprem_micros: int = 0
    burst_micros: int = 0
    waits: list[float] = field(default_factory=list)

    @property
    def gpu_s(self) -> float:
        return self.onprem_gpu_s + self.burst_gpu_s

    @property
    def utilisation_percent(self) -> float | None:
        """Used over measured GPU-seconds; None when nothing was measured (unknown)."""
        return None if self.measured_gpu_s <= 0 else 100.0 * self.used_gpu_s / self.measured_gpu_s

    def as_json(self) -> dict:
        waits = sorted(self.waits)
        util = self.utilisation_percent
        return {
            **self.keys,
            "onprem_gpu_hours": round(self.onprem_gpu_s / 3600, 4),
            "burst_gpu_hours": round(self.burst_gpu_s / 3600, 4),
            "gpu_hours": round(self.gpu_s / 3600, 4),
            "measured_gpu_hours": round(self.measured_gpu_s / 3600, 4),
            "measured_share": round(self.measured_gpu_s / self.gpu_s, 4) if self.gpu_s > 0 else None,
            "used_gpu_hours": round(self.used_gpu_s / 3600, 4) if util is not None else None,
            "utilisation_percent": None if util is None else round(util, 2),
            "onprem_cost_usd": str(cents(self.onprem_micros)),
            "burst_cost_usd": str(cents(self.burst_micros)),
            "jobs": len(waits),
            "wait_p50_s": _percentile(waits, 50),
            "wait_p95_s": _percentile(waits, 95),
        }


@dataclass(frozen=True)
class UsageReport:
    since: datetime | None
    until: datetime | None
    group_by: tuple[str, ...]
    rows: tuple[UsageRow, ...]
    total: UsageRow

    def as_json(self) -> dict:
        return {"from": _iso(self.since), "to": _iso(self.until), "group_by": list(self.group_by),
                "rows": [r.as_json() for r in self.rows], "total": self.total.as_json()}

    def as_csv(self) -> str:
        """One line per row: the keys (null: empty), then :data:`COLUMNS` (unknown: empty)."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([*self.group_by, *COLUMNS])
        for row in self.rows:
            data = row.as_json()
            writer.writerow([row.keys[k] or "" for k in self.group_by]
                            + ["" if data[c] is None else data[c] for c in COLUMNS])
        return buffer.getvalue()


def usage_report(store: Store, group_by: tuple[str, ...], *, since: datetime | None = None,
                 until: datetime | None = None, projects: frozenset[str] | None = None,
                 users: frozenset[str] | None = None, pool: str | None = None) -> UsageReport:
    """The usage report of the window (see the module docstring)."""
    window = {"since": since, "until": until, "projects": projects, "users": users, "pool": pool}
    allocations = store.allocation_by_job(group_by, **window)
    starts = store.job_starts(group_by, **window)
    job_ids = {a.job_id for a in allocations if a.job_id is not None and a.gpu_seconds > 0}
    measured = {u.job_id: u for u in store.job_utilisation(job_ids)} if job_ids else {}
    return fold_usage(group_by, allocations, starts, measured, since, until)


def fold_usage(group_by: tuple[str, ...], allocations, starts, measured, since=None,
               until=None) -> UsageReport:
    """The pure part of :func:`usage_report`: ledger sums by (group, job), job starts and the
    jobs' measured use (``JobUtilisation`` by job id) folded into rows and a total."""
    rows: dict[tuple, UsageRow] = {}

    def row(keys: tuple) -> UsageRow:
        if keys not in rows:
            rows[keys] = UsageRow(dict(zip(group_by, keys, strict=True)))
        return rows[keys]

    for a in allocations:
        r = row(a.keys)
        if a.onprem:
            r.onprem_gpu_s += a.gpu_seconds
            r.onprem_micros += a.cost_micros
        else:
            r.burst_gpu_s += a.gpu_seconds
            r.burst_micros += a.cost_micros
        use = measured.get(a.job_id) if a.job_id is not None else None
        if use is None or not use.measured or a.gpu_seconds <= 0:
            continue
        allocated = use.allocated_gpu_s or use.sampled_gpu_s
        share = 1.0 if not allocated else min(use.measured_gpu_s / allocated, 1.0)
        r.measured_gpu_s += a.gpu_seconds * share
        r.used_gpu_s += a.gpu_seconds * share * (use.used_gpu_s / use.measured_gpu_s)
    for s in starts:
        row(s.keys).waits.append(s.wait_s)
    ordered = tuple(rows[k] for k in sorted(rows, key=lambda keys: tuple(
        (v is None, v or "") for v in keys)))
    total = UsageRow({})
    for r in ordered:
        total.onprem_gpu_s += r.onprem_gpu_s
        total.burst_gpu_s += r.burst_gpu_s
        total.measured_gpu_s += r.measured_gpu_s
        total.used_gpu_s += r.used_gpu_s
        total.onprem_micros += r.onprem_micros
        total.burst_micros += r.burst_micros
        total.waits.extend(r.waits)
    return UsageReport(since, until, group_by, ordered, total)


def _percentile(sorted_values: list[float], p: float) -> float | None:
    if not sorted_values:
        return None
    rank = max(math.ceil(p / 100.0 * len(sorted_values)), 1)
    return round(sorted_values[rank - 1], 1)


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z") if moment else None


__all__ = ["COLUMNS", "UsageReport", "UsageRow", "fold_usage", "parse_usage_group_by",
           "usage_report"]
