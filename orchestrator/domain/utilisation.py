"""Measured GPU use: the values a heartbeat's GPU readings become, and the maths of their aggregates.

A node agent reads each GPU's utilisation and memory at every heartbeat (NVML, else nvidia-smi:
:mod:`orchestrator.fabric.gpu_sampler`) and names the job holding each GPU. The controller never
keeps those readings: it folds each into compact aggregates (per job, per node and hour) whose
arithmetic lives here, so the store, the reports and the tests share one definition:

* every reading stands for ``interval_s`` seconds (the time since the agent's previous reading);
* a GPU-second is *sampled* when a reading covered it, *measured* when the reading had a
  utilisation, and *used* in proportion to that utilisation (90 % for 10 s is 9 used GPU-seconds);
* the time-weighted mean utilisation is used / measured; the median (p50) comes from a fixed
  histogram of measured GPU-seconds in ``HISTOGRAM_BUCKETS`` buckets of equal width over 0-100 %,
  so it is known to a bucket's width (5 points) whatever the number of readings;
* where nothing was measured the utilisation is **unknown** (None), never 0.

Idle GPUs: a job's (or node's) allocated GPUs whose mean utilisation stays under
``utilisation.idle_below_percent`` keep a ``low since`` time; once that is ``utilisation.idle_for``
old the job or node is flagged (:func:`low_utilisation`). An unknown reading clears it: what cannot
be measured is never called idle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

HISTOGRAM_BUCKETS = 20
BUCKET_WIDTH = 100.0 / HISTOGRAM_BUCKETS


class UsageSource(StrEnum):
    """Where a job's measured use came from."""

    AGENT = "agent"  # burst node agent readings (NVML or nvidia-smi), time-weighted
    SACCT = "sacct"  # Slurm accounting TRES usage (gres/gpuutil, gres/gpumem) of an on-prem job


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One GPU's reading in a heartbeat, and the job holding that GPU (None: unallocated)."""

    index: int
    utilisation_percent: float | None  # None: the device or the sampler did not say
    memory_used_mib: float | None
    memory_total_mib: float | None
    job_id: str | None = None


def empty_histogram() -> list[float]:
    return [0.0] * HISTOGRAM_BUCKETS


def bucket_of(percent: float) -> int:
    """The histogram bucket of a utilisation (100 % falls in the last bucket)."""
    return min(max(int(percent // BUCKET_WIDTH), 0), HISTOGRAM_BUCKETS - 1)


def add_reading(histogram: list[float], percent: float, seconds: float) -> None:
    histogram[bucket_of(percent)] += seconds


def histogram_median(histogram: Sequence[float]) -> float | None:
    """The median utilisation of a histogram of GPU-seconds, linear within the bucket holding
    it; None when the histogram is empty (nothing measured)."""
    total = float(sum(histogram))
    if total <= 0:
        return None
    half, seen = total / 2.0, 0.0
    for i, weight in enumerate(histogram):
        if weight > 0 and seen + weight >= half:
            return round(i * BUCKET_WIDTH + BUCKET_WIDTH * (half - seen) / weight, 2)
        seen += weight
    return 100.0  # unreachable: the weights sum to total


def mean_percent(used_gpu_s: float, measured_gpu_s: float) -> float | None:
    """Time-weighted mean utilisation (%), None when nothing was measured."""
    if measured_gpu_s <= 0:
        return None
    return round(min(max(100.0 * used_gpu_s / measured_gpu_s, 0.0), 100.0), 2)


def mean_of(uses: Sequence[GpuUse]) -> float | None:
    """Mean utilisation of ``uses``; None when any of them is unknown (or there is none)."""
    values = [u.utilisation_percent for u in uses]
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None) / len(values)


def next_low_since(current: float | None, below_percent: float, low_since: datetime | None,
                   now: datetime) -> datetime | None:
    """The new ``low since`` of allocated GPUs whose mean utilisation is ``current`` now."""
    if current is None or current >= below_percent:
        return None
    return low_since or now


def node_reading(uses: Sequence[GpuUse], below_percent: float, low_since: datetime | None,
                 now: datetime) -> tuple[float | None, datetime | None]:
    """A node's (utilisation, low since) after one reading of its GPUs: the mean of the GPUs
    jobs hold (all of them when none is held) and, while some are held, since when they are
    under ``below_percent``. No held GPU: not low (an idle node is the idle rule's)."""
    held = [u for u in uses if u.job_id is not None]
    current = mean_of(held) if held else mean_of(uses)
    low = next_low_since(mean_of(held), below_percent, low_since, now) if held else None
    return (None if current is None else round(current, 2)), low


def low_utilisation(low_since: datetime | None, idle_for: timedelta, now: datetime) -> bool:
    """Flagged: allocated GPUs under the threshold for at least ``idle_for``."""
    return low_since is not None and now - low_since >= idle_for


__all__ = [
    "BUCKET_WIDTH", "GpuUse", "HISTOGRAM_BUCKETS", "UsageSource", "add_reading", "bucket_of",
    "empty_histogram", "histogram_median", "low_utilisation", "mean_of", "mean_percent",
    "next_low_since", "node_reading",
]
