"""The on-prem start the planner predicts for the jobs it bursts: the wait a burst avoids.

When the planner bursts jobs, the decision records, per job, when that job would have started had
it stayed on-prem (``inputs.burst_wait``): the jobs it launches burst nodes for, and the jobs about
to start on burst nodes already ready or booting (absorbed there instead of queueing on-prem; the
latest prediction before a job's burst start is the one kept). The cost
ledger keeps it next to the job's actual start on its burst node, and ``burst report --roi``
turns the difference into researcher-hours of waiting avoided per project and month.

The model is the one :mod:`.wait` uses, carried to the end instead of stopping at a deadline: the
pool's on-prem GPUs, free now (less what the jobs absorbed this tick take), free up at the running
on-prem jobs' expected ends; every pending job not starting on-prem this tick, in scheduling order
(the counterfactual keeps them all on-prem, so the ones ahead of a job queue before it), is placed at the first
moment its GPUs stay free for its expected runtime. GPUs are pooled (node fragmentation is
ignored) and future arrivals are unknown, so the prediction tends to be early; the simulator
checks it against the exact on-prem-only replay (``docs/utilisation.md``).

A job gets no prediction (``None``) when the model never starts it: it is wider than all the
on-prem GPUs, or a job ahead of it without an expected runtime holds GPUs for ever, or it is
beyond the first :data:`MAX_JOBS` queued jobs (a bound on the work of one tick: placing a job
walks the free-GPU profile, so a tick costs O(jobs x breakpoints)).

The profile is piecewise constant: ``times`` (seconds from now, increasing, the first 0) and
``free`` (GPUs free from that time to the next). Pure: ``now`` is an argument.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate

import numpy as np

from orchestrator.domain.jobs import Job
from orchestrator.domain.pending import to_us
from orchestrator.domain.snapshot import OnPremRelease, PoolQueue
from orchestrator.planner.backfill import INF, earliest_window, split_step
from orchestrator.planner.node_shape import diff

_EXACT = 2 ** 53  # integers below this in magnitude are floats exactly

MAX_JOBS = 500  # unmet jobs placed per tick at most; later ones get no prediction


class _Profile:
    """Free on-prem GPUs over time from now (see the module docstring)."""

    __slots__ = ("free", "times")

    def __init__(self, free_now: int) -> None:
        self.times: list[float] = [0.0]
        self.free: list[int] = [free_now]

    @classmethod
    def build(cls, free_now: int, taken: list[tuple[int, float]],
              freed: list[tuple[float, int]]) -> _Profile:
        """The profile :meth:`add` gives for ``(gpus, end)`` in ``taken`` taken from 0 to
        ``end`` and ``(start, gpus)`` in ``freed`` freed from ``start`` for ever, with the same
        steps, in one sort instead of one pass over the steps per call (hundreds of releases
        at every tick that bursts made that quadratic)."""
        deltas: dict[float, int] = {0.0: 0}
        for start, gpus in freed:
            deltas[start] = deltas.get(start, 0) + gpus
        return cls._of(free_now, taken, deltas)

    @classmethod
    def _of(cls, free_now: int, taken: list[tuple[int, float]], deltas: dict[float, int]
            ) -> _Profile:
        """:meth:`build` from the GPUs freed at each instant (``deltas``: changed here)."""
        deltas[0.0] = deltas.get(0.0, 0)
        for gpus, end in taken:
            deltas[0.0] -= gpus
            if end != INF:
                deltas[end] = deltas.get(end, 0) + gpus
        profile = cls(free_now)
        times = sorted(deltas)
        profile.times = times
        profile.free = list(accumulate(map(deltas.__getitem__, times), initial=free_now))[1:]
        return profile

    def add(self, gpus: int, start: float, end: float) -> None:
        """``gpus`` more free (negative: fewer) from ``start`` to ``end`` (INF: for ever)."""
        i = split_step(self.times, self.free, start)
        j = len(self.times) if end == INF else split_step(self.times, self.free, end)
        for k in range(i, j):
            self.free[k] += gpus

    def first_fit(self, gpus: int, length: float) -> float | None:
        """The earliest time from which ``gpus`` stay free for ``length`` seconds (INF: for
        ever), or None if there is none."""
        return earliest_window(self.times, self.free, gpus, length)


def predict_onprem_starts(unmet: Iterable[Job], onprem_absorbed: Iterable[Job], queue: PoolQueue,
                          now: datetime, wanted: Collection[str]) -> dict[str, float | None]:
    """For each job id in ``wanted`` (jobs of ``unmet``), the seconds from ``now`` at which the
    model starts it on-prem, or None where it does not (see the module docstring). ``unmet``:
    the tick's unmet jobs in scheduling order; ``onprem_absorbed``: those that start on free
    on-prem GPUs this tick."""
    left = set(wanted)
    out: dict[str, float | None] = {}
    if not left:
        return out
    # The absorbed jobs start now, on GPUs counted free above; the releases free theirs for ever.
    profile = _Profile._of(queue.onprem.free_gpus,
                           [(job.gpus, _length(job)) for job in onprem_absorbed],
                           _freed(queue.onprem_releases, now))
    for placed, job in enumerate(unmet):
        if placed >= MAX_JOBS:
            break
        start = profile.first_fit(job.gpus, _length(job))
        if start is not None:
            profile.add(-job.gpus, start, start + _length(job))
        if job.id in left:
            out[job.id] = None if start is None else round(start, 1)
            left.discard(job.id)
            if not left:
                break
    for job_id in left:  # beyond MAX_JOBS, or not among the unmet jobs
        out[job_id] = None
    return out


@dataclass(frozen=True, slots=True)
class _Ends:
    """The releases' ends (µs since the epoch) and GPUs, by end, of the tuple read."""

    releases: tuple[OnPremRelease, ...]  # as read (kept alive: the diff compares identities)
    ends: list[int]
    gpus: list[int]
    exact: bool  # every end within 2**53 µs of the epoch (a float exactly)


# The last answer of _ends: a plan follows each job event, so between two reads of the releases
# a few jobs started and ended (found by node_shape's diff), not all of them.
_last_ends: list[_Ends | None] = [None]


def _ends(releases: tuple[OnPremRelease, ...]) -> _Ends:
    last = _last_ends[0]
    if last is not None and last.releases is releases:
        return last
    if last is None:
        gone, came = [], list(releases)
    else:
        gone, came = diff(last.releases, releases)
    if last is None or len(gone) + len(came) > len(releases) // 2:
        pairs = sorted((to_us(r.ends_at), r.gpus) for r in releases)
        ends = [e for e, _ in pairs]
        gpus = [g for _, g in pairs]
        made = _Ends(releases, ends, gpus, not ends or -_EXACT < ends[0] and ends[-1] < _EXACT)
    else:
        ends, gpus = list(last.ends), list(last.gpus)
        exact = last.exact
        for release in gone:
            at = bisect_left(ends, to_us(release.ends_at))
            while gpus[at] != release.gpus:  # (among those with its end)
                at += 1
            del ends[at]
            del gpus[at]
        for release in came:
            end = to_us(release.ends_at)
            at = bisect_right(ends, end)
            ends.insert(at, end)
            gpus.insert(at, release.gpus)
            exact = exact and -_EXACT < end < _EXACT
        made = _Ends(releases, ends, gpus, exact)
    _last_ends[0] = made
    return made


def _freed(releases: tuple[OnPremRelease, ...], now: datetime) -> dict[float, int]:
    """The GPUs the releases free at each instant, in seconds from now (at or before now: 0.0),
    as ``max((ends_at - now).total_seconds(), 0.0)`` (the exact microseconds over 10**6, one
    correctly rounded division either way), from the ends kept across plans (:func:`_ends`)."""
    kept = _ends(releases)
    now_us = to_us(now)
    if not kept.exact or not -_EXACT < now_us < _EXACT:
        freed: dict[float, int] = {}
        for release in releases:
            start = max((release.ends_at - now).total_seconds(), 0.0)
            freed[start] = freed.get(start, 0) + release.gpus
        return freed
    if not kept.ends:
        return {}
    at = np.maximum((np.array(kept.ends, dtype=np.float64) - now_us) / 1e6, 0.0)
    # (by end, so equal instants are runs: one sum per run)
    starts = np.flatnonzero(np.concatenate(([True], at[1:] != at[:-1])))
    sums = np.add.reduceat(np.array(kept.gpus, dtype=np.int64), starts)
    return dict(zip(at[starts].tolist(), sums.tolist()))


def _length(job: Job) -> float:
    return INF if job.duration_s is None else max(float(job.duration_s), 1.0)


__all__ = ["MAX_JOBS", "predict_onprem_starts"]
