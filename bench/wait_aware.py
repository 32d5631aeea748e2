"""A prototype wait-aware bursting rule, for the policy-quality benchmark only (not shipped).

It shows what the planner could reach with the change ``docs/performance.md`` recommends: burst
only the jobs that on-prem would not start within the wait SLO, and only when it is time to.

Every tick: predict each pending job's on-prem start by replaying, in scheduling order, the
on-prem GPUs over the running jobs' known ends (their time limits) on a 60 s grid (pooled GPUs,
as the clairvoyant's schedule, but knowing nothing of future arrivals). A job whose predicted
start is later than ``submit + SLO - margin`` is *late*: once ``now`` reaches that point (just in
time for a node to boot) it may run on burst nodes, and nodes are launched for the late jobs that
the nodes in flight cannot hold (packed as greedy packs). Idle nodes go after 10 minutes. Jobs
that are not late never take a burst node.
"""

from __future__ import annotations

import math

import numpy as np

from orchestrator.policy.models import Policy
from orchestrator.sim.controllers import _Bursting

STEP_S = 60.0


class WaitAwareController(_Bursting):
    name = "wait-aware"
    kind = "baseline"
    periodic = True
    min_wait_s = math.inf  # a job runs on burst nodes only once this rule marks it late

    def __init__(self, policy: Policy, slo_s: float, margin_s: float = 480.0):
        super().__init__(policy)
        self.slo_s = slo_s
        self.margin_s = margin_s

    def act(self, now: float) -> None:
        world = self.engine.world
        if world.quiescent():
            self.engine.next_tick = None  # nothing to decide until a job is left pending
            return
        actions = self.scale_down(now)
        if world.pending:
            actions += self.scale_up(self._late(now), now)
        self.run(actions, now)

    def _late(self, now: float) -> list:
        world = self.engine.world
        pending = sorted((j for j in world.pending.values() if not j.eligible), key=lambda j: j.key)
        if not pending:
            return sorted((j for j in world.pending.values() if j.eligible), key=lambda j: j.index)
        horizon = max(j.trace.submit_s for j in pending) + self.slo_s - now
        slots = max(int(horizon // STEP_S) + 2, 2)
        free = np.full(slots, world.onprem.free_total, dtype=np.int64)
        for job in world.onprem_running.values():
            end = job.start_s + job.trace.duration_s
            k = int(math.ceil((end - now) / STEP_S))
            if k < slots:
                free[max(k, 0):] += job.gpus
        late = []
        for job in pending:
            deadline = job.trace.submit_s + self.slo_s - self.margin_s
            last = int((deadline - now) // STEP_S)
            placed = False
            k = 0
            length = max(int(math.ceil(job.trace.duration_s / STEP_S)), 1)
            while k <= min(last, slots - 1):
                window = free[k:k + length]
                short = np.flatnonzero(window < job.gpus)
                if short.size == 0:
                    window -= job.gpus
                    placed = True
                    break
                k += int(short[-1]) + 1
            if not placed and now >= deadline - STEP_S:
                late.append(job)
        for job in late:
            world.make_eligible(job)
        waiting = [j for j in world.pending.values() if j.eligible]
        return sorted(waiting, key=lambda j: j.index)
