"""Until when a tick's answer holds: the planner's own ``Decision.holds_until``.

Most ticks of a replay, and of a quiet production cluster, decide nothing, and nothing changes
until an event (a job arrives, starts or ends, a node changes) or until a rule's time comes: a
queued job reaches its ``wait_slo`` deadline, the trigger's ``oldest_wait_above`` or
``sustained_for`` is reached, a cooldown ends, an idle node reaches ``idle_for``. The planner
knows those instants; :func:`holds_until` says the first of them, so a caller (the simulator)
may skip the ticks before it while nothing else changed.

The claim: planned again on the same snapshot (queue, nodes, offerings, memory, everything but
the clock) at any instant ``t`` with ``now < t < holds_until`` that is a whole number of minutes
after ``now`` (the wait-aware rule's pooled on-prem timeline counts whole minutes from ``now``),
the plan has no action but Holds, the memory it was given back unchanged, and the same rule and
limits held back by (its summary and the elapsed times in its inputs move on). It is made only
for a tick that acted on nothing and left the memory as it was; :data:`FOREVER` where nothing
read depends on the clock. It is conservative: whatever reads the clock in a way not bounded here
(budgets, whose spend moves with time; a pre-warm floor; spot chosen by expected cost; data
staging, which weighs predicted waits; the forecast of a tick that bursts or covers jobs, which
the decision records) gives None: plan again at the next tick.

The bounds, each the first instant it could change something:

* the wait-aware split (:attr:`.wait.WaitSplit.holds_s`): the next waiting job's burst time, the
  next on-prem bound of a simulated job, the next start the on-prem model placed;
* the trigger not fired: the oldest job beyond on-prem reaching ``oldest_wait_above`` (the wait
  only grows, so a fired trigger stays fired); ``sustaining``: ``trigger_since + sustained_for``;
  ``cooldown``: the scale-up cooldown's end;
* scale-down: a ready node running nothing reaching ``idle_for``, a node's measured low use
  reaching ``utilisation.idle_for``, the scale-down cooldown's end while idle or low-use nodes
  are kept by it, a drain's deadline;
* a capacity block's end (the offerings usable change);
* ``trigger.spare_room``: the first job absorption let onto a burst node's room reaching the
  instant it would add more than its share there (the node's work ends sooner as the clock
  moves; a job refused stays refused). The jobs it keeps are the split's deferred ones, bounded
  with the split.

Pure: reads only its arguments.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from orchestrator.domain.plan import Action, Hold, Rule
from orchestrator.domain.snapshot import PolicyMemory, Snapshot
from orchestrator.planner import staging
from orchestrator.planner.census import Census
from orchestrator.planner.demand import Demand
from orchestrator.planner.wait import WaitSplit
from orchestrator.policy.models import Policy, TriggerCombine

# Nothing the tick read depends on the clock: the answer holds until something else changes.
FOREVER = datetime.max.replace(tzinfo=UTC)


class _Bound:
    """The earliest of the instants given."""

    __slots__ = ("until",)

    def __init__(self) -> None:
        self.until = FOREVER

    def at(self, when: datetime | None) -> None:
        if when is not None and when < self.until:
            self.until = when


def holds_until(policy: Policy, snapshot: Snapshot, now: datetime, *, census: Census,
                demand: Demand, split: WaitSplit | None, fired: bool, before: PolicyMemory,
                after: PolicyMemory, actions: list[Action], rule: Rule,
                recorded: dict, spare_turns_s: float = math.inf) -> datetime | None:
    """The first instant the tick's answer may change with the clock alone (module docstring);
    None: no claim. ``before``/``after``: the memory given and returned; ``recorded``: the
    decision's inputs; ``spare_turns_s``: under ``trigger.spare_room``, seconds until a job
    absorption let onto a burst node's room would be refused there
    (:attr:`.spare_room.SpareAdmit.turns_s`)."""
    if after != before or any(not isinstance(a, Hold) for a in actions):
        return None  # it acts, or its memory moves: the next tick is another answer
    if (policy.budgets or policy.spot.by_expected_cost or "burst_wait" in recorded
            or "staging" in recorded or "prewarm" in recorded or snapshot.prewarm):
        return None
    if demand.ordered and staging.applies(policy, demand.ordered):
        return None
    bound = _Bound()
    if spare_turns_s < math.inf:  # a job let onto a burst node's room would be refused there
        bound.at(now + timedelta(microseconds=math.floor(spare_turns_s * 1e6)))
    if split is not None:
        if split.holds_s <= 0:
            return None
        if split.holds_s < math.inf:  # (in whole microseconds, rounded down: never later)
            bound.at(now + timedelta(microseconds=math.floor(split.holds_s * 1e6)))
    trigger = policy.trigger
    if not fired:
        bound.at(_fires_at(policy, demand))
    elif rule is Rule.SUSTAINING and after.trigger_since is not None:
        bound.at(after.trigger_since + trigger.sustained_for)
    if rule is Rule.COOLDOWN and after.last_launch_at is not None:
        bound.at(after.last_launch_at + policy.cooldowns.scale_up)
    _scale_down(policy, census, after, now, bound)
    for block in snapshot.capacity_blocks:
        if block.until > now:
            bound.at(block.until)
    return bound.until if bound.until > now else None


def _fires_at(policy: Policy, demand: Demand) -> datetime | None:
    """When a trigger not fired now could fire with the clock alone: its wait part, once the
    oldest job beyond on-prem has waited ``oldest_wait_above`` (None: never by the clock)."""
    trigger = policy.trigger
    if not demand.beyond_onprem or demand.oldest_beyond is None:
        return None
    if trigger.combine is TriggerCombine.ALL:
        gpus = demand.pending_gpus - demand.absorbed_onprem_gpus()
        if not gpus > trigger.pending_gpus_above:
            return None  # both parts needed, and the GPU part does not move with the clock
    return demand.oldest_beyond + trigger.oldest_wait_above


def _scale_down(policy: Policy, census: Census, memory: PolicyMemory, now: datetime,
                bound: _Bound) -> None:
    """The first instant a scale-down rule could newly apply to the nodes as they are."""
    idle_for = policy.scale_down.idle_for
    low_for = policy.utilisation.idle_for
    kept = bool(census.idle) or bool(census.low_utilisation)
    for node in census.ready:
        if node.running_jobs == 0 and node.idle_since is not None:
            reaches = node.idle_since + idle_for
            if reaches > now:
                bound.at(reaches)
        elif node.running_jobs > 0 and node.low_utilisation_since is not None:
            reaches = node.low_utilisation_since + low_for
            if reaches > now:
                bound.at(reaches)
    if kept and memory.last_launch_at is not None:
        ends = memory.last_launch_at + policy.cooldowns.scale_down
        if ends > now:
            bound.at(ends)
    for node in census.draining:
        if node.drain_deadline is not None and node.drain_deadline > now:
            bound.at(node.drain_deadline)


__all__ = ["FOREVER", "holds_until"]
