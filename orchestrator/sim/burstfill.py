"""How the simulated world starts pending jobs on ready burst nodes (and the first-fit scan the
on-prem ``first-fit`` rule shares).

A ready node launched for pending jobs (``Node.launched_for``: the plan's ``Launch.jobs``) is
first offered to those jobs, in scheduling order, while they are still pending: the planner chose
which jobs to burst (their predicted wait, displacement, learned boot), and giving their node to
the oldest pending job would undo that choice at dispatch, as the built-in queue's claim avoids
(:mod:`orchestrator.sources.builtin`). A job on one node takes room on that node; a job of a launch
group takes the group's nodes once enough of them are up, and until then the nodes already up
are kept for it (while others of the group still boot). A node whose jobs started elsewhere
(on-prem, say) or cannot start now goes to the others. Then burst nodes are filled ``first-fit``:
of the first pending job of each width that may run on burst nodes (the controller's minimum wait
is over), the best in scheduling order that fits starts, and that repeats. What one job may use is the pool's spread
(:mod:`orchestrator.sim.burstpool`). A job the plan keeps off burst nodes (staging its data would
outlast its on-prem wait: the world's ``staging_held``) is skipped. Where the policy has budgets,
each start is admitted as the built-in queue's dispatcher admits it
(:mod:`orchestrator.planner.admission`).

:class:`BurstFill` is a part of :class:`orchestrator.sim.world.World` (a mixin): the state it
reads (the burst pool, the burst queues, the store) is the world's, set in its ``__init__``.
"""

from __future__ import annotations

import heapq
from decimal import Decimal

from orchestrator.planner.admission import Admission
from orchestrator.sim.burstpool import Spread
from orchestrator.sim.pool import Allocation, GpuPool
from orchestrator.sim.simjob import PENDING, SimJob, live_head


class BurstFill:
    """The burst fills of the world (module docstring)."""

    def _fill_launched_for(self, admission: Admission | None, now: float,
                           started: list[SimJob]) -> Allocation:
        """Start pending jobs on the ready nodes launched for them (module docstring); what is
        left of each node goes to the ordinary fill. Returns the free room of the nodes kept for
        a launch group still booting, for the ordinary fill to leave alone."""
        pool = self.burst
        claims = self._claims
        held = self.staging_held
        reserved: list[tuple[int, int]] = []
        for index, jobs in list(claims.items()):
            waiting = []
            for job in jobs:
                if job.state != PENDING:
                    continue
                if (job.eligible and job.trace.job_id not in held
                        and self._start_claimed(index, job, admission, now)):
                    started.append(job)
                    continue
                waiting.append(job)
            if not waiting:
                del claims[index]
                continue
            claims[index] = tuple(waiting)
            free = pool.free.get(index, 0)
            if (free and free == pool.size[index]
                    and any(job.gpus > free for job in waiting) and self._group_booting(index)):
                reserved.append((index, free))
        return tuple(reserved)

    def _start_claimed(self, index: int, job: SimJob, admission: Admission | None,
                       now: float) -> bool:
        """Start ``job`` on the node ``index`` launched for it (with the rest of its launch
        group's nodes, if it is wider), if it fits there now and the budgets admit it."""
        pool = self.burst
        size = pool.size[index]
        if job.gpus <= size:
            if pool.free[index] < job.gpus:
                return False
            alloc: Allocation = ((index, job.gpus),)
        else:
            if pool.spread is Spread.ONE_NODE or admission is not None:
                return False  # (the fabric, or the admitted fill, runs it on one node only)
            alloc = self._group_room(index, job)
            if not alloc:
                return False
        if admission is not None:
            node = self.store.get_node(self._burst_ids[index])
            verdict = admission.check(job.domain, node)
            if not verdict.admitted:
                return False
            admission.take(job.domain, node, verdict)
            if verdict.extension_usd:
                self.store.set_usage(node.id, budget_commit_usd=float(
                    Decimal(repr(node.budget_commit_usd)) + verdict.extension_usd))
        pool.take(alloc)
        self._start(job, alloc, "burst", now)
        self.claimed_starts += 1
        return True

    def _group_room(self, index: int, job: SimJob) -> Allocation:
        """Whole free nodes, of ``index``'s offering, launched for ``job`` (its launch group):
        enough of them for it, or none."""
        pool = self.burst
        offering = pool.offering_of(index)
        chosen: list[tuple[int, int]] = []
        covered = 0
        for other, jobs in sorted(self._claims.items()):
            size = pool.size.get(other)
            if (size is None or pool.free[other] != size or job not in jobs
                    or pool.offering_of(other) != offering):
                continue
            chosen.append((other, size))
            covered += size
            if covered >= job.gpus:
                return tuple(chosen)
        return ()

    def _group_booting(self, index: int) -> bool:
        """Whether ``index``'s launch group (if it is in one) still has a node on its way up."""
        store = self.store
        group = store.group_of_node(self._burst_ids[index])
        if group is None:
            return False
        for node_id in group.node_ids:
            node = store.get_node(node_id)
            if node is not None and node.state.in_flight:
                return True
        return False

    def _fill(self, pool: GpuPool, queues: dict[int, list], where: str, now: float,
              started: list[SimJob]) -> None:
        burst = where == "burst"
        # Burst nodes: what one job may use is the pool's spread (one node, whole nodes of one
        # offering, any whole nodes; orchestrator.sim.burstpool).
        fits = pool.fits_job if burst else pool.fits
        while pool.free_total:
            best = None
            for width, heap in queues.items():
                head = self._burst_head(heap) if burst else live_head(heap)
                if head is not None and (best is None or head[0] < best[0]) and fits(width):
                    best = head
            if best is None:
                return
            job = best[2]
            if queues[job.gpus][0] is best:
                heapq.heappop(queues[job.gpus])  # (else its entry goes stale: live_head drops it)
            self._start(job, pool.place(job.gpus) if not burst else self._take_burst(job.gpus),
                        where, now)
            started.append(job)

    def _take_burst(self, gpus: int) -> Allocation:
        alloc = self.burst.find_job(gpus)
        self.burst.take(alloc)
        return alloc

    def _burst_head(self, heap: list) -> tuple | None:
        """The first live entry of a burst queue that the decision does not keep on-prem."""
        head = live_head(heap)
        held = self.staging_held
        if head is None or not held or head[2].trace.job_id not in held:
            return head
        for entry in sorted(heap):
            job = entry[2]
            if job.state == PENDING and entry[1] == job.attempt and job.trace.job_id not in held:
                return entry
        return None

    def _fill_admitted(self, admission: Admission, now: float, started: list[SimJob]) -> None:
        """Fill burst nodes as :meth:`_fill` does (the best head of each width, one node per
        job), each job on the best-fit node that admits it under the budgets and quotas. A job no node
        admits waits; the next one in order (of its width, or another) may start, as the
        built-in queue's dispatcher and the planner's absorption take them."""
        pool = self.burst
        queues = self._burst_q
        store = self.store
        refused: set[int] = set()  # jobs no node admits at this instant

        def first(heap: list) -> tuple | None:
            head = self._burst_head(heap)
            if head is None or head[2].index not in refused:
                return head
            # The head was refused: the next job of its width in order (refusals are rare,
            # so sorting the width's queue here is cheap overall).
            for entry in sorted(heap):
                job = entry[2]
                if (job.state == PENDING and entry[1] == job.attempt and job.index not in refused
                        and job.trace.job_id not in self.staging_held):
                    return entry
            return None

        while pool.free_total:
            best = None
            for width, heap in queues.items():
                if width > pool.max_size or not pool.fits(width):
                    continue
                head = first(heap)
                if head is not None and (best is None or head[0] < best[0]):
                    best = head
            if best is None:
                return
            job = best[2]
            verdicts: dict[int, tuple] = {}

            def ok(index: int, job: SimJob = job, verdicts: dict = verdicts) -> bool:
                node = store.get_node(self._burst_ids[index])
                verdict = admission.check(job.domain, node)
                verdicts[index] = (node, verdict)
                return verdict.admitted

            alloc = pool.find(job.gpus, ok=ok)
            if alloc is None:
                refused.add(job.index)
                continue
            if queues[job.gpus][0] is best:
                heapq.heappop(queues[job.gpus])  # (else its entry goes stale: live_head drops it)
            [(index, _)] = alloc
            node, verdict = verdicts[index]
            admission.take(job.domain, node, verdict)
            if verdict.extension_usd:
                store.set_usage(node.id, budget_commit_usd=float(
                    Decimal(repr(node.budget_commit_usd)) + verdict.extension_usd))
            pool.take(alloc)
            self._start(job, alloc, "burst", now)
            started.append(job)
