"""Scale-down: which nodes to drain, and which drains are over and may be terminated.

Rules, in order:

1. A draining node the fabric has released is terminated (``drained``).
2. A draining node past its drain deadline is terminated (``drain-deadline``): the fabric had the
   whole grace period to checkpoint and hand back its work.
3. A ready node that has run nothing for ``scale_down.idle_for`` is drained, unless pending work
   would fit on it, keeping it would be needed for ``limits.min_nodes``, or the pool launched
   within ``cooldowns.scale_down`` (hysteresis: a node is not given up right after the pool
   decided it needed more).
   Nor is it drained while an operator's pre-warm floor still needs it: ``floor_gpus`` burst
   GPUs (ready or starting) stay until the pre-warm's ``until``; idle nodes above the floor go
   as usual, and once ``until`` has passed the floor is 0 and the normal idle rule applies.
   A node a budget covers (``bounded``) is held by the cooldown at most ``cooldowns.scale_down``
   past ``idle_for``: its commitment paid for that much idling, not for as long as the pool keeps
   launching.
4. Ready nodes beyond ``limits.max_nodes`` (the limit was lowered) are drained, idle ones first.
   A hard limit: it wins over a pre-warm floor.

With ``scale_down.count_low_utilisation_as_idle``, a ready node whose jobs' GPUs were measured
under ``utilisation.idle_below_percent`` for ``utilisation.idle_for`` is drained by rule 3 too,
after the idle ones and under the same holds, with reason ``low-utilisation`` (its jobs are
handed back or finish as the drain allows). Unknown use never counts.
"""

from __future__ import annotations

from datetime import datetime

from orchestrator.domain.nodes import Node
from orchestrator.domain.plan import Action, ActionReason, Drain, Terminate
from orchestrator.domain.snapshot import PolicyMemory
from orchestrator.planner.census import Census, take_census
from orchestrator.policy.models import Policy


def plan_scale_down(
    policy: Policy,
    nodes: list[Node],
    busy_nodes: frozenset[str],
    memory: PolicyMemory,
    now: datetime,
    decision_id: str,
    floor_gpus: int = 0,
    bounded: frozenset[str] = frozenset(),
    census: Census | None = None,
) -> list[Action]:
    """``census``: the nodes' census this tick (:func:`take_census` of ``nodes`` when not given)."""
    if census is None:
        census = take_census(nodes, policy, now)
    actions: list[Action] = []
    for node in census.draining:
        if node.released:
            actions.append(Terminate(node.id, ActionReason.DRAINED, decision_id=decision_id))
        elif node.drain_deadline is not None and now >= node.drain_deadline:
            actions.append(Terminate(node.id, ActionReason.DRAIN_DEADLINE, decision_id=decision_id))
    ready = census.ready
    staying, staying_gpus = census.staying, census.staying_gpus
    idle = [n for n in census.idle if n.id not in busy_nodes]

    deadline = now + policy.scale_down.drain_grace
    keep = policy.limits.min_nodes
    in_cooldown = (
        memory.last_launch_at is not None
        and now - memory.last_launch_at < policy.cooldowns.scale_down
    )
    removable = staying - keep
    draining_now: set[str] = set()

    idle.sort(key=lambda n: (n.idle_since, n.id))
    low = ([n for n in census.low_utilisation if n.id not in busy_nodes]
           if policy.scale_down.count_low_utilisation_as_idle else [])
    low.sort(key=lambda n: (n.low_utilisation_since, n.id))
    if in_cooldown:
        longest = policy.scale_down.idle_for + policy.cooldowns.scale_down
        idle = [n for n in idle
                if n.id in bounded and n.idle_since is not None and now - n.idle_since >= longest]
        longest_low = policy.utilisation.idle_for + policy.cooldowns.scale_down
        low = [n for n in low if n.id in bounded and n.low_utilisation_since is not None
               and now - n.low_utilisation_since >= longest_low]
    candidates = [(n, ActionReason.IDLE) for n in idle] + [
        (n, ActionReason.LOW_UTILISATION) for n in low]
    for node, reason in candidates:
        if removable <= 0:
            break
        if staying_gpus - node.gpus < floor_gpus:
            continue  # the pre-warm floor still needs it (a smaller idle node may go)
        staying_gpus -= node.gpus
        actions.append(Drain(node.id, reason, deadline, decision_id=decision_id))
        draining_now.add(node.id)
        removable -= 1

    # Only nodes that are staying count as excess: nodes already draining, terminating or failed
    # are on their way out, as are the ones drained as idle just above. Counting them (all nodes
    # not terminated) drained more ready nodes on every tick until none was left.
    excess = staying - len(draining_now) - policy.limits.max_nodes
    if excess > 0:
        # Prefer idle nodes, then the least busy; never the ones already leaving.
        order = sorted(
            (n for n in ready if n.id not in draining_now),
            key=lambda n: (n.running_jobs, n.gpus_busy, n.id),
        )
        for node in order[:excess]:
            actions.append(Drain(node.id, ActionReason.OVER_LIMIT, deadline, decision_id=decision_id))
    return actions


