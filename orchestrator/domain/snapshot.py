"""The Snapshot: everything the planner may know about the world at one instant.

Observers build it from copies (queue sources, the store, provider catalogues); the planner reads
it and nothing else. Its JSON form is documented by ``burst plan --snapshot-schema`` so a scenario
can be written by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node
from orchestrator.domain.offerings import Offering


@dataclass(frozen=True, slots=True)
class OnPremState:
    """On-prem capacity of a pool right now. ``free_per_node`` lists free GPUs node by node."""

    total_gpus: int
    free_gpus: int
    free_per_node: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.free_gpus > self.total_gpus or self.free_gpus < 0:
            raise ValueError(f"free_gpus {self.free_gpus} outside 0..total_gpus {self.total_gpus}")


@dataclass(frozen=True, slots=True)
class OnPremRelease:
    """A job running on-prem: the GPUs it holds and when it is expected to end (start + time
    limit). The wait-aware rule (``trigger.wait_slo``) predicts on-prem starts from these.

    ``node``: the index of the node holding them in :attr:`OnPremState.free_per_node` (a job on
    several nodes is one release per node), or None where the source cannot tell; the per-node
    prediction (``trigger.wait_model: nodes``) needs it on every release."""

    gpus: int
    ends_at: datetime
    node: int | None = None


@dataclass(frozen=True, slots=True)
class PoolQueue:
    """The queue of one pool: pending jobs and on-prem capacity.

    ``pending``: a tuple of jobs, or the :class:`~orchestrator.domain.pending.PendingColumns` a
    queue source built straight from its query (a sequence of jobs too, making each Job only when
    read); the planner reads the columns either way.
    ``onprem_releases``: the running on-prem jobs whose expected end is known (optional; empty
    when the source cannot tell, and then the wait-aware rule assumes no GPU frees up).
    """

    pool: str
    onprem: OnPremState
    # (annotated as the tuple the JSON form is: a PendingColumns is a Sequence[Job] of it)
    pending: tuple[Job, ...] = ()
    running_onprem_jobs: int = 0
    running_burst_jobs: int = 0
    onprem_releases: tuple[OnPremRelease, ...] = ()


@dataclass(frozen=True, slots=True)
class CapacityBlock:
    """An offering excluded after a capacity error, until ``until`` (negative-capacity cache)."""

    offering_key: str
    until: datetime
    reason: str = ""


@dataclass(frozen=True, slots=True)
class PolicyMemory:
    """What the planner carries from one tick to the next for one policy (its only state).

    The planner returns it in the Plan and gets it back in the next Snapshot, so hysteresis and
    cooldowns work while ``plan()`` stays a pure function.
    """

    trigger_since: datetime | None = None  # since when the trigger condition has held
    last_launch_at: datetime | None = None
    last_drain_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class PrewarmRequest:
    """An operator's floor for a pool: keep at least ``gpus`` burst GPUs ready or starting
    until ``until`` (e.g. before a scheduled experiment). A floor, not a cap."""

    gpus: int
    until: datetime

    def __post_init__(self) -> None:
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ValueError(f"prewarm gpus must be a positive int, got {self.gpus!r}")

    def active(self, now: datetime) -> bool:
        return now < self.until


@dataclass(frozen=True, slots=True)
class PoolControl:
    """Operator controls of one pool as stored: bursting paused or not, and a pre-warm floor."""

    pool: str
    paused: bool = False
    paused_reason: str = ""
    paused_at: datetime | None = None
    prewarm_gpus: int | None = None
    prewarm_until: datetime | None = None
    updated_at: datetime | None = None

    def prewarm(self, now: datetime) -> PrewarmRequest | None:
        """The pre-warm request in force at ``now``, if any (an expired one is ignored)."""
        if self.prewarm_gpus is None or self.prewarm_until is None or self.prewarm_gpus < 1:
            return None
        if not now < self.prewarm_until:
            return None
        return PrewarmRequest(self.prewarm_gpus, self.prewarm_until)


@dataclass(frozen=True, slots=True)
class BudgetSpend:
    """Spend observed for one budget (from the cost ledger) in its window at the snapshot time.

    Keyed ``"<policy>/<budget name>"`` in :attr:`Snapshot.budget_spend`. ``spent_usd`` is what the
    budget's scope (its pool, or one project of it) has cost from ``window_start`` until now,
    accrued cost of nodes still running included; ``burn_usd_hour`` is the rate it spends at now.
    """

    spent_usd: Decimal
    burn_usd_hour: Decimal = Decimal(0)
    window_start: datetime | None = None
    window_end: datetime | None = None


@dataclass(frozen=True, slots=True)
class BurstRun:
    """A job running on a burst node now: whose work it is, where, and for how long it was
    declared (``duration_s``; None: the policy's ``budget_commitment.default_runtime``). Budgets
    read these: a project's work on another project's node is its spend."""

    job_id: str
    project: str
    node_id: str
    gpus: int
    started_at: datetime
    duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class OfferingHealth:
    """What is known of one offering's capacity: its spot preemption hazard (interruptions per
    instance-hour) and the odds that a launch of it fails for lack of capacity (stockout),
    estimated from node events (decayed) on top of a prior (the catalogue's published
    interruption bucket). ``evidence_hours``/``evidence_launches``: the decayed node-hours and
    launches the estimate rests on beyond the prior."""

    offering_key: str
    preemptions_per_hour: float
    stockout_odds: float
    evidence_hours: float = 0.0
    evidence_launches: float = 0.0
    prior: str = ""


@dataclass(frozen=True, slots=True)
class BootEstimate:
    """The learned launch-to-ready time of one offering (:mod:`orchestrator.domain.boot`): a high
    percentile of the observed boots, decayed, for one node and for launch groups. ``samples``:
    the decayed number of boots it rests on (the planner uses it once there are enough, else the
    policy's ``expected_boot``)."""

    offering_key: str
    boot_s: float
    samples: float
    percentile: float = 0.9
    # (n, seconds) for launch groups of n nodes (2, 4, ... 64): the same percentile of the
    # slowest of n boots, i.e. the percentile ** (1/n) quantile of one boot (a group is ready when
    # its last node is); empty: not worked out (one node's boot_s stands for any group).
    groups: tuple[tuple[int, float], ...] = ()

    def group_boot_s(self, nodes: int) -> float:
        """The boot of a launch group of ``nodes``: the smallest worked-out group at least that
        large (past the largest, the largest's)."""
        if nodes <= 1 or not self.groups:
            return self.boot_s
        for size, seconds in self.groups:
            if size >= nodes:
                return seconds
        return self.groups[-1][1]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """World state at ``taken_at``."""

    taken_at: datetime
    queues: dict[str, PoolQueue] = field(default_factory=dict)
    nodes: tuple[Node, ...] = ()
    offerings: tuple[Offering, ...] = ()
    capacity_blocks: tuple[CapacityBlock, ...] = ()
    memory: dict[str, PolicyMemory] = field(default_factory=dict)
    paused_pools: frozenset[str] = frozenset()
    prewarm: dict[str, PrewarmRequest] = field(default_factory=dict)  # pool -> floor in force
    # "<policy>/<budget>" -> spend observed in the budget's window; a budget missing here has
    # spent nothing as far as the planner knows (the decision records it as unobserved).
    budget_spend: dict[str, BudgetSpend] = field(default_factory=dict)
    # Jobs running on burst nodes (the built-in queue and the simulator report them; a source
    # that cannot tell leaves it empty).
    burst_runs: tuple[BurstRun, ...] = ()
    # Per offering key: learned preemption hazard and stockout odds (observer-computed; an
    # offering missing here is planned with no interruptions and no stockouts). Any mapping: the
    # simulator passes a lazy one (orchestrator.domain.capacity.HealthView).
    offering_health: Mapping[str, OfferingHealth] = field(default_factory=dict)
    # Per offering key: the learned launch-to-ready time (observer-computed from node events; read
    # by the wait-aware rule when ``trigger.learn_boot`` is set).
    boot_estimates: dict[str, BootEstimate] = field(default_factory=dict)
