"""Metrics of a run, the same for every policy and baseline, as a JSON-ready dict.

Definitions (``docs/simulator.md`` has the prose):

* **wait** of a job: time spent pending, from submit to start (plus any time pending again after
  its node went away). A job that never started is counted with the time it had waited when the
  run ended (``jobs_unfinished`` says how many).
* percentiles: nearest rank over all jobs (p50/p95/p99), and the maximum.
* **SLO attainment**: the fraction of jobs whose wait is at most the SLO; ``..._gpu_hours``: the
  same weighted by each job's GPU-hours (GPUs x duration), so a few huge jobs waiting a day show.
* **cloud cost**: what the sim provider billed (per second, its offering's minimum), summed in
  integer micro-dollars; **idle burst cost**: the part of it paying for burst GPUs that ran no job
  (boot, idle time before scale-down, unpacked GPUs, billing minimums).
* **GPU-hours**: job work done on-prem and in the cloud (they add up to the trace's GPU-hours when
  every job finished); ``cloud_billed_gpu_hours`` is what the cloud nodes were paid for;
  ``lost_gpu_hours`` is work redone after a node went away mid-job.
* **burst utilisation**: GPU-seconds burst nodes spent running jobs over GPU-seconds billed.
* **node churn**: nodes launched plus nodes terminated, per simulated day.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Outcome:
    """One job's fate in a run."""

    project: str
    gpu_s: float  # GPUs x duration: its weight
    wait_s: float
    where: str | None  # "onprem" | "burst" | "cloud" (clairvoyant) | None (never ran)


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    rank = max(math.ceil(p / 100.0 * len(sorted_values)), 1)
    return sorted_values[rank - 1]


def usd(micro: int) -> float:
    return round(micro / 1_000_000, 2)


def _r(value: float, digits: int = 3) -> float:
    return round(float(value), digits)


def wait_summary(outcomes: Iterable[Outcome], slo_s: float) -> dict:
    outcomes = list(outcomes)
    waits = sorted(o.wait_s for o in outcomes)
    weight = sum(o.gpu_s for o in outcomes)
    within = [o for o in outcomes if o.wait_s <= slo_s]
    return {
        "jobs": len(outcomes),
        "wait_p50_s": _r(percentile(waits, 50), 1),
        "wait_p95_s": _r(percentile(waits, 95), 1),
        "wait_p99_s": _r(percentile(waits, 99), 1),
        "wait_max_s": _r(waits[-1] if waits else 0.0, 1),
        "slo_attainment": _r(len(within) / len(outcomes), 5) if outcomes else 1.0,
        "slo_attainment_gpu_hours": _r(sum(o.gpu_s for o in within) / weight, 5) if weight else 1.0,
        "jobs_over_3x_slo": sum(1 for o in outcomes if o.wait_s > 3 * slo_s),
    }


def summarize(name: str, kind: str, slo_s: float, outcomes: list[Outcome], *, cost_micro: int,
              billed_gpu_s: float, busy_gpu_s: float, idle_micro: int, lost_gpu_s: float,
              span_s: float, launches: int | None, terminations: int | None, extra: dict) -> dict:
    """The run's JSON object: the fields the issue pins first, then the rest."""
    overall = wait_summary(outcomes, slo_s)
    projects: dict[str, list[Outcome]] = {}
    for outcome in outcomes:
        projects.setdefault(outcome.project, []).append(outcome)
    onprem_s = sum(o.gpu_s for o in outcomes if o.where == "onprem")
    cloud_s = sum(o.gpu_s for o in outcomes if o.where in ("burst", "cloud"))
    days = max(span_s / 86400.0, 1e-9)
    run = {
        "name": name,
        "kind": kind,
        "slo_s": _r(slo_s, 1),
        "cloud_cost_usd": usd(cost_micro),
        "cloud_gpu_hours": _r(cloud_s / 3600.0),
        "wait_p50_s": overall["wait_p50_s"],
        "wait_p95_s": overall["wait_p95_s"],
        "wait_p99_s": overall["wait_p99_s"],
        "wait_max_s": overall["wait_max_s"],
        "slo_attainment": overall["slo_attainment"],
        "slo_attainment_gpu_hours": overall["slo_attainment_gpu_hours"],
        "jobs": overall["jobs"],
        "jobs_finished": sum(1 for o in outcomes if o.where is not None),
        "jobs_unfinished": sum(1 for o in outcomes if o.where is None),
        "jobs_over_3x_slo": overall["jobs_over_3x_slo"],
        "onprem_gpu_hours": _r(onprem_s / 3600.0),
        "cloud_billed_gpu_hours": _r(billed_gpu_s / 3600.0),
        "lost_gpu_hours": _r(lost_gpu_s / 3600.0),
        "burst_utilisation": _r(busy_gpu_s / billed_gpu_s, 4) if billed_gpu_s else None,
        "idle_burst_cost_usd": usd(idle_micro),
        "launches": launches,
        "terminations": terminations,
        "node_churn_per_day": (None if launches is None or terminations is None
                               else _r((launches + terminations) / days, 2)),
    }
    run.update(extra)
    run["projects"] = {p: wait_summary(projects[p], slo_s) for p in sorted(projects)}
    return run
