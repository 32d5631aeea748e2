"""How the simulated burst dispatcher honours ``trigger.spare_room``: the jobs the last decision
kept for on-prem (:mod:`orchestrator.planner.spare_room`) start on a burst node only where they
lengthen its bill by at most their share.

The ordinary burst fill (:meth:`orchestrator.sim.burstfill.BurstFill._fill`) starts, of the first
pending job of each width, the best in scheduling order, on the best-fit node. Here a kept job is
passed over unless some node with room for it is busy long enough: on a node of ``N`` GPUs whose
running jobs end ``busy`` seconds from now, a kept job of ``gpus`` GPUs and runtime ``d`` adds
``max(0, d - busy)`` of node time, allowed up to ``max_extension x gpus / N x d``; of the nodes
that allow it, the best fit takes it. A kept job wider than one node takes whole free nodes (its
whole runtime added) only where :func:`~orchestrator.planner.spare_room.wide_allowed` says so. A
passed-over job keeps its place in the queue (on-prem starts it as before); the next job of its
width in order is looked at instead, as for a job held for staging. A job submitted since the last
plan is kept too, until a plan has looked at it (at most a tick): else a new job would take spare
room before the rule could judge it.

Only the fill without admission applies it: where budgets or project quotas admit each start
(``_fill_admitted``) the kept jobs are not told apart (the decision still lists them).

:class:`SpareFill` is a part of :class:`orchestrator.sim.world.World` (a mixin): the state it
reads (the burst pool, the burst queues, the node's jobs) is the world's.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator

from orchestrator.planner.spare_room import allowed_extension_s, wide_allowed
from orchestrator.sim.pool import Allocation
from orchestrator.sim.simjob import PENDING, SimJob


def _in_order(heap: list) -> Iterator[tuple]:
    """The entries of a per-width queue in order, sorting only as far as they are read."""
    shown = 0
    k = 8
    while shown < len(heap):
        entries = heapq.nsmallest(k, heap)
        yield from entries[shown:]
        shown = len(entries)
        k *= 8


class SpareFill:
    """The burst fill under ``trigger.spare_room`` (module docstring)."""

    def keep_spare(self, kept: frozenset[str], now: float) -> None:
        """The kept jobs of the plan made at ``now`` (a job submitted since is kept as well
        until the next plan has looked at it)."""
        self.spare_kept = kept
        self.spare_planned_at = now

    def _kept(self, job: SimJob) -> bool:
        return job.trace.job_id in self.spare_kept or job.trace.submit_s > self.spare_planned_at

    def _fill_sparing(self, now: float, started: list[SimJob]) -> None:
        pool = self.burst
        queues = self._burst_q
        while pool.free_total:
            best: tuple[tuple, Allocation | None] | None = None
            reach: dict[int, float] = {}  # (per width, while the pool is as it is now)
            for width, heap in queues.items():
                if not pool.fits_job(width):
                    continue
                head = self._burst_head(heap)
                if head is None:
                    continue
                alloc = None
                if self._kept(head[2]):
                    found = self._first_allowed(heap, now, reach)
                    if found is None:
                        continue
                    head, alloc = found
                if best is None or head[0] < best[0][0]:
                    best = (head, alloc)
            if best is None:
                return
            entry, alloc = best
            job = entry[2]
            if queues[job.gpus][0] is entry:
                heapq.heappop(queues[job.gpus])  # (else its entry goes stale: live_head drops it)
            if alloc is None:
                alloc = self._take_burst(job.gpus)
            else:
                pool.take(alloc)
            self._start(job, alloc, "burst", now)
            started.append(job)

    def _first_allowed(self, heap: list, now: float, reach: dict[int, float]
                       ) -> tuple[tuple, Allocation | None] | None:
        """The first job of a width queue, in order, that may start on burst nodes now: one not
        kept (placed as usual), or a kept one with its allowed room. ``reach``: the longest
        runtime a kept job of each width may have and still find room (:meth:`_reach`), filled
        as read, so most kept jobs are passed over without looking at the nodes."""
        held = self.staging_held
        for entry in _in_order(heap):
            job = entry[2]
            if job.state != PENDING or entry[1] != job.attempt or job.trace.job_id in held:
                continue
            if not self._kept(job):
                return entry, None
            runtime = job.domain.duration_s
            if job.gpus not in reach:
                reach[job.gpus] = self._reach(job.gpus, now)
            # (a hair of slack for rounding: _spare_room's exact test decides)
            if runtime is not None and float(runtime) <= reach[job.gpus] * (1 + 1e-9) + 1e-6:
                alloc = self._spare_room(job, now)
                if alloc is not None:
                    return entry, alloc
            self.spare_passed_over += 1
        return None

    def _reach(self, gpus: int, now: float) -> float:
        """The longest runtime a kept job of ``gpus`` GPUs (at most a node) may have and still
        be allowed on some node with room for it: on a node of ``N`` GPUs busy for ``b``,
        ``max(0, d - b) <= share x gpus / N x d`` holds exactly for ``d <= b / (1 - share x gpus
        / N)`` (every ``d`` where that divisor is not positive). Wider jobs: inf (judged by
        :meth:`_spare_room`)."""
        pool = self.burst
        if gpus > pool.max_size:
            return math.inf
        share = self.policy.trigger.spare_room.max_extension
        best = -math.inf
        for index in pool.with_room(gpus):
            divisor = 1.0 - share * gpus / pool.size[index]
            if divisor <= 0:
                return math.inf
            best = max(best, self._busy_s(index, now) / divisor)
        return best

    def _spare_room(self, job: SimJob, now: float) -> Allocation | None:
        """Where a kept job may start (module docstring), or None."""
        pool = self.burst
        share = self.policy.trigger.spare_room.max_extension
        runtime = job.domain.duration_s
        if runtime is None:
            return None
        if job.gpus > pool.max_size:
            alloc = pool.find_job(job.gpus)
            if not alloc or not wide_allowed(job.gpus, len(alloc), pool.size[alloc[0][0]], share):
                return None
            return alloc
        for index in pool.with_room(job.gpus):  # best fit first
            allowed = allowed_extension_s(job.gpus, runtime, pool.size[index], share)
            if allowed is None:
                continue
            if max(0.0, float(runtime) - self._busy_s(index, now)) <= allowed:
                return ((index, job.gpus),)
        return None

    def _busy_s(self, index: int, now: float) -> float:
        """How long burst node ``index``'s running jobs keep it busy from ``now`` (0: idle)."""
        runs = self.node_jobs.get(self._burst_ids[index], ())
        return max((j.start_s + j.run_s for j in runs), default=now) - now
