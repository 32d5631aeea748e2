"""How the simulated on-prem scheduler starts jobs: priority then FIFO with backfill.

Jobs are taken in the planner's scheduling order (project priority, job priority, submit time;
:func:`orchestrator.planner.demand.scheduling_order`). Multi-GPU jobs need GPUs of one node; jobs
wider than a node need whole nodes (:mod:`orchestrator.sim.pool`). How a job that does not fit
affects the jobs behind it is the :class:`Backfill` rule:

* ``easy`` (the default; what Slurm's backfill scheduler does for its top job): the first job in
  order that does not fit holds a *reservation*: the nodes that free up for it first (by the
  running jobs' time limits, here their trace durations) and the time ``S`` they are all free. A
  job behind it may start now only if it ends by ``S`` or uses none of the reserved nodes, so
  small jobs cannot overtake a wide job indefinitely.
* ``first-fit`` (the built-in queue's rule, :mod:`orchestrator.sources.builtin`): a job that does
  not fit is skipped and never delays smaller ones (the world's first-fit scan,
  :mod:`orchestrator.sim.burstfill`).
* ``slurm``: Slurm's main scheduler at every event, and its backfill pass (the shared model,
  :mod:`orchestrator.planner.backfill`) at most every ``bf_interval_s``.

Under ``easy``, the jobs the last plan kept for on-prem in its order (``trigger.onprem_order:
longest-first``, handed over as the fabric's :meth:`OnPremFill.keep_onprem`) come first, in that order, as
Slurm starts them once burst has raised their priority (:mod:`orchestrator.fabric.onprem_order`):
their heap's keys sort ahead of every other job's. A new order replaces the last; an empty one
changes nothing. ``slurm`` and ``first-fit`` do not read it.

Doing the easy scan job by job would cost O(queue) per event. Whether a job can start depends
only on its width (and, under a reservation, on whether it ends by ``S``), so the scan looks only
at the first pending job of each width: the best such head that can start is started, and that
repeats, in O(widths) per start. Under a reservation this is slightly stricter than a full scan:
a job is not considered while an older job of its width waits.

:class:`OnPremFill` is a part of :class:`orchestrator.sim.world.World` (a mixin): the state it
reads (the pool, the per-width queues, the per-node runs) is the world's, set in its ``__init__``.
"""

from __future__ import annotations

import heapq
import math
from enum import StrEnum

from orchestrator.planner.backfill import NodeSpace, PendingJob, backfill_pass
from orchestrator.policy.models import Policy
from orchestrator.sim.simjob import PENDING, SimJob, live_head


class Backfill(StrEnum):
    """How the on-prem scheduler lets jobs start past one that does not fit (module docstring)."""

    EASY = "easy"
    FIRST_FIT = "first-fit"
    SLURM = "slurm"



def _entry_key(item: tuple) -> tuple:
    """The scheduling key of a (queue entry, its heap) pair."""
    return item[0][0]


class OnPremFill:
    """The on-prem fills of the world (module docstring)."""

    def keep_onprem(self, policy: Policy, ids: tuple[str, ...], kept: object = None) -> int:
        """The fabric's part of the kept jobs: their on-prem order, as Slurm's
        (:mod:`orchestrator.fabric.onprem_order`): the jobs the last plan kept for on-prem
        (``trigger.onprem_order: longest-first``; module docstring) are taken first under
        ``easy``, in that order. Returns the jobs ordered. (``kept``, the jobs kept off burst
        nodes: the policy controller hands them to the burst dispatcher, ``sim.sparefill``.)"""
        if not ids or ids == self._order_ids:
            return 0  # (an empty order changes nothing: raised priorities stay until jobs start)
        self._order_ids = ids
        by_id = self._by_id
        kept = []
        for rank, job_id in enumerate(ids):
            job = by_id.get(job_id)
            if job is not None and job.state == PENDING:
                kept.append(((-math.inf, rank), job.attempt, job))
        self._order_heap = kept  # already in heap order (ranks ascending)
        return len(kept)

    def _fill_reserving(self, now: float, started: list[SimJob]) -> None:
        """Fill on-prem under the ``easy`` rule (module docstring)."""
        pool = self.onprem
        queues = list(self._all.values())
        if self._order_heap:
            queues.append(self._order_heap)  # the kept order's jobs, ahead of every other key
        blocked = None  # the first job in order that does not fit: (its key, S, reserved nodes)
        while pool.free_total:
            heads = []
            for heap in queues:
                head = live_head(heap)
                if head is not None:
                    heads.append((head, heap))
            if not heads:
                return
            if blocked is None:
                first, heap = min(heads, key=_entry_key)
                job = first[2]
                alloc = pool.place(job.gpus)
                if alloc is not None:
                    heapq.heappop(heap)
                    self._start(job, alloc, "onprem", now)
                    started.append(job)
                    continue
                blocked = (first[0], *self._reservation(job, now))
            key, until, reserved = blocked
            best = None
            for entry, heap in heads:
                job = entry[2]
                if (entry[0] == key or job.gpus > pool.free_total
                        or (best is not None and entry[0] >= best[0][0])):
                    continue
                ends_in_time = now + job.run_s <= until
                alloc = pool.find(job.gpus, frozenset() if ends_in_time else reserved)
                if alloc is not None:
                    best = (entry, alloc, heap)
            if best is None:
                return
            entry, alloc, heap = best
            job = entry[2]
            heapq.heappop(heap)
            pool.take(alloc)
            self._start(job, alloc, "onprem", now)
            started.append(job)

    def _fill_slurm(self, now: float, started: list[SimJob]) -> None:
        """Fill on-prem as Slurm does: the main scheduler (priority order, stopping at the first
        job that does not fit), then, at most every ``bf_interval_s`` and only when the pool or
        the queue changed since the last one, a backfill pass of the shared model."""
        pool = self.onprem
        order = self._order
        jobs = self.jobs
        while order and pool.free_total:
            job = jobs[order[0][1]]
            if job.gpus > pool.total:
                break  # never fits here (the backfill pass skips it)
            alloc = pool.place(job.gpus)
            if alloc is None:
                break
            self._start(job, alloc, "onprem", now)
            started.append(job)
        if (not order or not pool.free_total
                or (self._pass_version == pool.version and self._pass_pending == len(order))
                or not any(count and pool.fits(width) for width, count in self._widths.items())):
            return  # (no pending job fits the free GPUs now: a pass could start nothing)
        if now - self._last_pass < self.bf_interval_s:
            self.backfill_due_at = self._last_pass + self.bf_interval_s
            return
        self._last_pass = now
        self.bf_passes += 1
        runs = self._node_runs
        space = NodeSpace([pool.size[i] for i in range(len(runs))],
                          [pool.free[i] for i in range(len(runs))],
                          ((i, end, used) for i, on in runs.items() for end, used in on.values()),
                          now)
        depth = self.slurm.max_job_test
        tested = (PendingJob(index, jobs[index].gpus, jobs[index].trace.duration_s)
                  for _, index in order[:depth])
        result = backfill_pass(space, tested, self.slurm)
        for index, alloc in result.started:
            job = jobs[index]
            pool.take(alloc)
            self._start(job, alloc, "onprem", now)
            started.append(job)
        self._pass_version = pool.version
        self._pass_pending = len(order)

    def _reservation(self, job: SimJob, now: float) -> tuple[float, frozenset[int]]:
        """When and on which on-prem nodes ``job`` (which does not fit now) can start, from the
        running jobs' expected ends: (S, nodes); (inf, no nodes) if it can never fit on-prem.

        The answer depends only on the pool and its runs (the pool's version moves with both),
        the job's width and, for a job wider than a node, ``now``: the engine dispatches at every
        event and tick while the same wide job waits, so the last answer is kept."""
        pool = self.onprem
        wide = job.gpus > pool.max_size
        key = (pool.version, job.gpus, now if wide else None)
        cached = self._reserve_cache
        if cached[0] == key:
            return cached[1]
        answer = self._reserve(job, now, wide)
        self._reserve_cache = (key, answer)
        return answer

    def _reserve(self, job: SimJob, now: float, wide: bool) -> tuple[float, frozenset[int]]:
        pool = self.onprem
        runs = self._node_runs
        if wide:
            return self._reserve_wide(job.gpus, now)
        best = (math.inf, -1)
        for index, on_node in runs.items():
            free = pool.free[index]
            if pool.size[index] < job.gpus:
                continue
            for end, used in sorted(on_node.values()):
                free += used
                if free >= job.gpus:
                    if (end, index) < best:
                        best = (end, index)
                    break
        return (best[0], frozenset((best[1],))) if best[1] >= 0 else (math.inf, frozenset())

    def _reserve_wide(self, gpus: int, now: float) -> tuple[float, frozenset[int]]:
        """The reservation of a job wider than a node: whole nodes in the order they free up
        (by their last running job's expected end, the world's ``_last_end``; an empty node at
        ``now``), lowest index on ties, until their GPUs cover it; the order is kept while the
        pool does not change (a pass over every run on every node was most of a dispatch)."""
        pool = self.onprem
        if self._wide_cache[0] != pool.version:
            last = self._last_end
            busy = sorted((end, i) for i, end in last.items() if i in pool.size)
            empty = [i for i in sorted(pool.size) if i not in last]
            self._wide_cache = (pool.version, busy, empty)
        _, busy, empty = self._wide_cache
        if busy and busy[0][0] <= now:
            # (A run past its expected end sorts among the empty nodes: the full sort.)
            frees = sorted([(now, i) for i in empty] + busy)
        else:
            frees = [(now, i) for i in empty] + busy
        chosen: list[int] = []
        covered = 0
        for until, index in frees:
            chosen.append(index)
            covered += pool.size[index]
            if covered >= gpus:
                return until, frozenset(chosen)
        return math.inf, frozenset()
