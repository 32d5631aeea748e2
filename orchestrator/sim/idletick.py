"""Ticks at which ``plan()`` provably does nothing, so the policy controller need not call it.

On the ITP trace most minutes of a replay have nothing pending while every burst node is busy:
the planner's answer is then fixed by its rules (``orchestrator.planner._plan_policy``): no
unmet demand, so no trigger, no wait-aware split, no launch and no Hold; no idle node past
``scale_down.idle_for``, nothing draining and the node count within ``limits``, so no drain and
no terminate. Its whole effect is one ``no-demand`` decision and the memory it was given (with
``trigger_since`` unset, as an unfired trigger leaves it). :func:`idle_tick` says when that holds
from the world and the store alone; the controller then records that decision's rule and skips
the call (``tests/sim/test_idle_ticks.py`` replays slices with and without the skip, and
with every skipped tick planned and checked, and compares every job's outcome and the cost).

A second rule, :meth:`IdleTicks.held`, covers ticks the limits decide: jobs pending, but the
node count at ``limits.max_nodes`` with every node ready and all its GPUs busy, so nothing can
launch, drain or be absorbed. If nothing changed since the last plan (no job arrived, started or
ended, no node changed) and that plan only held (no action) with its trigger holding, the plan
now only holds again: its demand is the same, and the trigger, fired then, is fired now (its
pending-GPU part does not depend on the clock, its wait part only grows), so ``trigger_since``
stays. Its rule and text may move with the clock (``wait_slo``'s due jobs), so such a tick is
counted apart (``held_ticks``), not by rule. A policy whose jobs may stage data is left out
(staging holds jobs off burst nodes by their predicted wait, which moves with the clock); project
quotas are allowed here (what a project holds is read from the nodes and runs, not the clock).

Only the plain case is claimed: a policy with budgets or project quotas (spend and holdings move
with time), learned capacity or boot times (their views decay with time), a capacity block in
force, a node in flight, draining, released, under-used or of another policy, or fewer nodes than
``min_nodes``, always plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.plan import Hold
from orchestrator.policy.models import Policy
from orchestrator.sim.simjob import seconds

_READY = NodeState.READY
# An idle node is left out of the rule this long before it reaches idle_for: the planner compares
# datetimes (microseconds), the rule virtual seconds (floats); at the boundary the tick plans.
MARGIN_S = 1e-3


class IdleMode(StrEnum):
    """What the policy controller does at a tick the rule says is idle."""

    SKIP = "skip"  # record the no-demand decision, do not call plan()
    PLAN = "plan"  # call plan() as at any tick (the reference the skip is compared with)
    CHECK = "check"  # call plan() and fail if it does anything the rule said it would not


@dataclass(frozen=True, slots=True)
class NodesView:
    """What the rule reads of the live nodes, kept until the store changes (its version)."""

    version: int
    plain: bool  # every live node is ready, this policy's, not released, not under-used
    count: int
    full: bool  # every GPU of every live node busy (nothing for pending jobs to be absorbed on)
    idle_until: float  # the first instant an idle node reaches idle_for (inf: none idle)


class IdleTicks:
    """The rule for one policy run (module docstring); :meth:`holds` at an instant."""

    def __init__(self, policy: Policy, engine) -> None:
        self.policy = policy
        self.engine = engine
        self.idle_for_s = policy.scale_down.idle_for.total_seconds()
        # Fixed for the run: what would make the planner read the clock beyond the nodes. (The
        # learners are read at each tick: the replay sets them after binding the controller.)
        self._applies = (not policy.budgets
                         and not any(p.max_burst_gpus is not None for p in policy.projects))
        # The second rule reads no clock through quotas (what each project holds is the nodes'
        # and runs'), so it allows them; budgets (spend over time) and learners it does not.
        self._applies_held = not policy.budgets
        self._view: NodesView | None = None
        self.stages = (policy.pool.storage is not None
                       or any(p.storage is not None for p in policy.projects)
                       or any(j.trace.dataset_gb is not None for j in engine.world.jobs))
        self._held_after: tuple | None = None  # the state after the last plan that only held

    @property
    def applies(self) -> bool:
        engine = self.engine
        return self._applies and engine.learner is None and engine.boot_learner is None

    @property
    def applies_held(self) -> bool:
        engine = self.engine
        return self._applies_held and engine.learner is None and engine.boot_learner is None

    def state(self) -> tuple:
        """What the planner reads that only events change (the clock aside)."""
        engine = self.engine
        return (engine.world.changes, engine.store.version, engine.world.onprem.version)

    def planned(self, plan, memory_before, memory_after) -> None:
        """After a plan: remember the state if the plan only held with its trigger holding."""
        self._held_after = None
        if (not plan.actions or all(isinstance(a, Hold) for a in plan.actions)) \
                and memory_after is not None and memory_after.trigger_since is not None \
                and memory_after == memory_before:
            self._held_after = self.state()

    def held(self, now: float) -> bool:
        """True when ``plan()`` at ``now`` only holds again (the second rule, module docstring)."""
        engine = self.engine
        if (not self.applies_held or self.stages or self._held_after is None
                or not engine.world.pending or self._held_after != self.state()):
            return False
        view = self._nodes(engine.store)
        limits = self.policy.limits
        if not (view.plain and view.full and view.count == limits.max_nodes
                and view.count >= limits.min_nodes):
            return False
        return not engine.store.has_blocks(engine.clock.now())

    def holds(self, now: float) -> bool:
        """True when ``plan()`` at ``now`` returns no action and the memory it was given."""
        engine = self.engine
        if not self.applies or engine.world.pending:
            return False
        store = engine.store
        memory = store.load_memory().get(self.policy.name)
        if memory is None or memory.trigger_since is not None:
            return False
        view = self._nodes(store)
        if not view.plain or now >= view.idle_until - MARGIN_S:
            return False
        limits = self.policy.limits
        if not limits.min_nodes <= view.count <= limits.max_nodes:
            return False
        return not store.has_blocks(engine.clock.now())

    def _nodes(self, store) -> NodesView:
        view = self._view
        if view is not None and view.version == store.version:
            return view
        name = self.policy.name
        live = store.live_nodes()
        plain = all(n.state is _READY and n.policy == name and not n.released
                    and n.low_utilisation_since is None for n in live)
        idle_until = math.inf
        if plain:
            for node in live:
                if node.running_jobs == 0 and node.idle_since is not None:
                    idle_until = min(idle_until, seconds(node.idle_since) + self.idle_for_s)
        full = all(n.gpus_busy >= n.gpus for n in live)
        view = NodesView(store.version, plain, len(live), full, idle_until)
        self._view = view
        return view

