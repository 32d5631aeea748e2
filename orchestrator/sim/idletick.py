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
    idle_until: float  # the first instant an idle node reaches idle_for (inf: none idle)


class IdleTicks:
    """The rule for one policy run (module docstring); :meth:`holds` at an instant."""

    def __init__(self, policy: Policy, engine) -> None:
        self.policy = policy
        self.engine = engine
        self.idle_for_s = policy.scale_down.idle_for.total_seconds()
        # Fixed for the run: what would make the planner read the clock beyond the nodes.
        self.applies = (not policy.budgets
                        and not any(p.max_burst_gpus is not None for p in policy.projects)
                        and engine.learner is None and engine.boot_learner is None)
        self._view: NodesView | None = None

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
        view = NodesView(store.version, plain, len(live), idle_until)
        self._view = view
        return view

