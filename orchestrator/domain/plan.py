"""What the planner returns: typed actions and one explainable decision per policy per tick."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from orchestrator.domain.offerings import Offering
from orchestrator.domain.snapshot import PolicyMemory


class Rule(StrEnum):
    """The rule that decided a policy's tick (one per decision)."""

    PAUSED = "paused"  # bursting is paused for the pool
    NO_DEMAND = "no-demand"  # nothing pending beyond what on-prem and burst nodes absorb
    TRIGGER_NOT_MET = "trigger-not-met"  # demand exists but below the trigger thresholds
    SUSTAINING = "sustaining"  # trigger holds but not yet for sustained_for
    COVERED = "covered"  # demand is already answered by nodes booting or free
    COOLDOWN = "cooldown"  # scale-up cooldown after the last launch
    SCALE_UP = "scale-up"  # nodes launched for unmet demand
    LIMITED = "limited"  # demand exists but limits allow no launch
    NO_OFFERING = "no-offering"  # no usable offering fits the demand
    MIN_NODES = "min-nodes"  # launches to keep min_nodes
    PREWARM = "prewarm"  # an operator's pre-warm floor decided the tick (launches or holds)


class ActionReason(StrEnum):
    """Why an action was emitted."""

    DEMAND = "demand"  # unmet pending GPU demand
    MIN_NODES = "min-nodes"  # keeping the policy's min_nodes
    IDLE = "idle"  # ran nothing for scale_down.idle_for
    # its jobs' GPUs measured under utilisation.idle_below_percent for utilisation.idle_for, and
    # the policy counts that as idle (scale_down.count_low_utilisation_as_idle)
    LOW_UTILISATION = "low-utilisation"
    DRAINED = "drained"  # drain finished: node released by the fabric
    DRAIN_DEADLINE = "drain-deadline"  # drain grace expired
    OVER_LIMIT = "over-limit"  # more nodes than max_nodes (policy lowered)
    LAUNCH_TIMEOUT = "launch-timeout"
    BOOT_TIMEOUT = "boot-timeout"
    JOIN_TIMEOUT = "join-timeout"
    HEARTBEAT_LOST = "heartbeat-lost"
    TERMINATE_RETRY = "terminate-retry"
    FAILED = "failed"  # node failed; its instance must go
    LEAKED = "leaked"  # an owned instance with no live node record
    RETRY_LAUNCH = "retry-launch"  # re-issue a launch whose outcome was never recorded
    PREWARM = "prewarm"  # keeping an operator's pre-warm floor of GPUs for the pool
    OPERATOR = "operator"  # an operator asked for it (e.g. draining a whole pool)
    SPOT_NOTICE = "spot-notice"  # the provider announced the instance's reclaim (spot/preemption)
    BUDGET = "budget"  # the node's budget is past its drain grade (spend over the limit)
    SLURM_SUSPEND = "slurm-suspend"  # Slurm's SuspendProgram powered the CLOUD node down
    SLURM_RESUME_FAIL = "slurm-resume-fail"  # Slurm's ResumeFailProgram: not up by ResumeTimeout
    # another node of its launch group could not be launched: the group falls back as a whole
    GROUP_FALLBACK = "group-fallback"


# Elapsed seconds in a summary ("42s", "3.5s"): blanked when telling a repeat from a new decision.
_ELAPSED = re.compile(r"\b\d+(?:\.\d+)?s\b")


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch one node of ``offering``; ``request_id`` is the provider idempotency token."""

    policy: str
    pool: str
    node_id: str
    request_id: str
    offering: Offering
    reason: ActionReason
    project: str | None = None
    decision_id: str | None = None
    # Budget the launch commits (USD): price x billed (overhead + expected runtime of ``jobs`` +
    # idle tail); recorded on the node so budgets count it until it is spent.
    budget_commit_usd: float = 0.0
    jobs: tuple[str, ...] = ()  # the pending jobs it is launched for (empty: min-nodes, pre-warm)
    # The one user all of ``jobs`` belong to (None: several, none known, or no jobs); the node's
    # ``burst:user`` cost-allocation tag.
    user: str | None = None
    # Launch group: the nodes of one multi-node job, all of one offering (one provider, region,
    # zone), launched together in one placement group or not at all. None: a lone node.
    group: str | None = None
    group_size: int = 1


@dataclass(frozen=True, slots=True)
class Drain:
    """Stop giving the node work; release it by ``deadline``."""

    node_id: str
    reason: ActionReason
    deadline: datetime
    decision_id: str | None = None


@dataclass(frozen=True, slots=True)
class Terminate:
    """Terminate the node's instance. ``instance_id`` alone (no node) terminates a leak."""

    node_id: str | None
    reason: ActionReason
    instance_id: str | None = None
    provider: str | None = None
    decision_id: str | None = None


@dataclass(frozen=True, slots=True)
class Hold:
    """Nothing launched for the policy this tick, and why (kept for the record)."""

    policy: str
    reason: str


Action = Launch | Drain | Terminate | Hold


@dataclass(frozen=True, slots=True)
class OfferingOption:
    """An offering the planner weighed, with what it would cost and why it lost, if it did."""

    offering_key: str
    gpus: int
    price_usd_hour: float
    nodes: int
    expected_cost_usd: float
    rejected: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """Why the planner did what it did for one policy in one tick."""

    id: str
    policy: str
    at: datetime
    rule: Rule
    summary: str
    inputs: dict[str, Any] = field(default_factory=dict)
    options: tuple[OfferingOption, ...] = ()
    chosen: str | None = None
    held_back_by: tuple[str, ...] = ()
    actions: tuple[str, ...] = ()
    # Filled by the store, never by the planner: consecutive ticks of the policy that decided the
    # same (rule, summary, actions) are one stored decision seen ``repeats`` times, the newest at
    # ``last_seen_at`` (None while it was seen once).
    repeats: int = 1
    last_seen_at: datetime | None = None
    # Until when this answer holds (the planner's :mod:`orchestrator.planner.horizon`): planned
    # again on the same snapshot, only the clock later by whole minutes, before this instant,
    # the planner would act on nothing, keep the memory and decide by the same rule with the same
    # limits held back by. None: no claim (plan at the next tick). A statement about the
    # decision, not part of it: left out of its repr and equality, so decisions compare as before.
    holds_until: datetime | None = field(default=None, repr=False, compare=False)
    # The order the wait-aware rule kept its deferred jobs in for on-prem (job ids; the first of
    # them is to start first), for the on-prem scheduler to apply (``trigger.onprem_order:
    # longest-first``; () otherwise). The record lists its first ids
    # (``inputs.wait_aware.onprem_order``); the whole order is an instruction, not part of the
    # decision's identity: left out of its repr and equality, as ``holds_until``.
    onprem_order: tuple[str, ...] = field(default=(), repr=False, compare=False)
    # ``trigger.spare_room``: the jobs kept for on-prem and the burst nodes each may still take
    # (:class:`orchestrator.planner.spare_room.KeptOnPrem`, read through its ``kept`` and
    # ``allowed_nodes()``), for the fabric to keep them off the others; None without the rule.
    # An instruction, as ``onprem_order``: left out of its repr and equality.
    kept_off: Any = field(default=None, repr=False, compare=False)

    @property
    def last_seen(self) -> datetime:
        """When this decision was last made (its own time if it was made once)."""
        return self.last_seen_at or self.at

    def repeat_key(self) -> tuple:
        """What a repeat of this decision shares with it: policy, rule, actions, what held it
        back, the chosen offering, and the summary with its elapsed times (``oldest wait 42s``,
        ``for 12s of the 300s required``) blanked — a steady queue's waits grow every tick, and
        counting that as a new decision would store one row per tick for nothing."""
        return (self.policy, str(self.rule), _ELAPSED.sub("#s", self.summary), tuple(self.actions),
                tuple(self.held_back_by), self.chosen)

    def same_as(self, other: Decision) -> bool:
        """Whether ``other`` decided what this did (what makes a tick a repeat of the last)."""
        return self.repeat_key() == other.repeat_key()


@dataclass(frozen=True, slots=True)
class Plan:
    """The planner's output for one tick."""

    at: datetime
    actions: tuple[Action, ...] = ()
    decisions: tuple[Decision, ...] = ()
    memory: dict[str, PolicyMemory] = field(default_factory=dict)

    @property
    def launches(self) -> list[Launch]:
        return [a for a in self.actions if isinstance(a, Launch)]

    @property
    def launch_groups(self) -> dict[str, list[Launch]]:
        """The launches of each launch group (a multi-node job's nodes), in plan order."""
        groups: dict[str, list[Launch]] = {}
        for launch in self.launches:
            if launch.group is not None:
                groups.setdefault(launch.group, []).append(launch)
        return groups

    @property
    def drains(self) -> list[Drain]:
        return [a for a in self.actions if isinstance(a, Drain)]

    @property
    def terminates(self) -> list[Terminate]:
        return [a for a in self.actions if isinstance(a, Terminate)]
