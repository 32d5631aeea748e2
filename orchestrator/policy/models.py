"""Pydantic v2 models of the policy YAML a platform owner writes.

Every model is strict (no silent coercion: ``"8"`` is not a number), frozen, and rejects unknown
keys, so a typo such as ``max_node`` fails loudly instead of being ignored. Every field carries a
description: the JSON Schema (``burst policy schema``) and the field reference in
``docs/policy-reference.md`` are generated from them.

Cross-field rules (``min_nodes <= max_nodes`` and so on) live in ``model_validator``s next to the
fields they relate. Their messages start with ``@field:`` so the loader can point at the exact
field and line; see :mod:`orchestrator.policy.loader`.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from orchestrator.policy.units import Duration, Money

from orchestrator.policy.accelerators import AcceleratorSpec
from orchestrator.policy.base import CloudName, Name, PolicyModel, Text, field_problem
from orchestrator.policy.budgets import (  # re-exported: the budget sections live there
    Budget,
    BudgetAction,
    BudgetCommitment,
    BudgetGrade,
    BudgetWindow,
)
from orchestrator.policy.bounds import (
    MAX_GPUS_PER_NODE,
    MAX_NODES,
    MAX_POOL_GPUS,
    MAX_PRICE_USD_HOUR,
    MAX_PRIORITY,
    MAX_USD,
    MAX_WEIGHT,
)
from orchestrator.policy.enums import InterconnectNeed, Market, ProviderName
from orchestrator.policy.fabric import FabricConfig, FabricKind
from orchestrator.policy.notifications import Notifications
from orchestrator.policy.providers import ProviderSettings
from orchestrator.policy.storage import Storage
from orchestrator.policy.tags import tag_problems


class QueueSourceKind(StrEnum):
    """Where the on-prem queue is read from."""

    BUILTIN = "builtin"  # burst's own job queue in its state database (`burst submit`)
    SLURM = "slurm"  # squeue/sinfo of a Slurm cluster


class TriggerCombine(StrEnum):
    """How the trigger's conditions combine."""

    ANY = "any"  # either condition fires the trigger
    ALL = "all"  # both conditions must hold


class WaitModel(StrEnum):
    """How the wait-aware rule predicts a pending job's on-prem start."""

    POOLED = "pooled"  # the on-prem GPUs pooled, first fit (node fragmentation ignored)
    NODES = "nodes"  # node by node with Slurm's backfill model (orchestrator/planner/backfill.py)


class OnPremOrder(StrEnum):
    """In which order the wait-aware rule keeps queued jobs for on-prem (``trigger.onprem_order``)."""

    SUBMIT = "submit"  # the scheduling order: priority, then oldest first
    # within each project priority, the longest expected runtime first: short jobs are the ones
    # that go to the cloud when not all fit, and the on-prem scheduler is told the order
    LONGEST_FIRST = "longest-first"


class Displacement(PolicyModel):
    """Which jobs to burst: when a queued job would miss its SLO
    on-prem, burst a few cheaper queued jobs ahead of it instead, so it keeps its on-prem start."""

    enabled: bool = Field(default=False, description="Displace cheaper queued jobs to the cloud "
                          "so that a dearer one (long, wide) starts on-prem within wait_slo.")
    max_displaced: int = Field(default=8, ge=1, le=64, description="Most queued jobs burst "
                               "instead of one job that would miss its SLO.")
    lookahead: Duration = Field(
        default=timedelta(hours=1),
        description="How far ahead of now the on-prem prediction may place a job's start for it "
        "to be displaced or kept (already-queued jobs only; future arrivals are never assumed).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Displacement:
        if not timedelta(0) < self.lookahead <= timedelta(hours=24):
            raise field_problem("lookahead", "must be more than 0s and at most 24h")
        return self


class SpareRoom(PolicyModel):
    """Which jobs may take a burst node's spare room: a job the wait-aware rule keeps queued
    for on-prem (predicted to start there within wait_slo) starts on a burst node only where
    that lengthens the node's bill by little, so a long job does not keep a node alive for days
    that would otherwise have been drained."""

    enabled: bool = Field(default=False, description="Keep the jobs predicted to start on-prem "
                          "within wait_slo off burst nodes where they would lengthen a node's "
                          "bill by more than max_extension of their share of it.")
    max_extension: float = Field(
        default=1.0, ge=0.0, le=1.0,
        description="How much longer a kept job may make a burst node run, as a fraction of the "
        "job's share of that node over its runtime (its GPUs / the node's GPUs x its runtime): 0 "
        "only where the node's running work outlasts the job; 1 where the added node time costs "
        "no more than the job's own GPU-hours at the node's per-GPU price (what bursting it on a "
        "node of its own size would). A job wider than one node takes whole free nodes, whose "
        "whole runtime is added: it may only with 1 and an exact fit.",
    )


class OnPrem(PolicyModel):
    """The on-prem capacity of the pool: what is used before any cloud node."""

    nodes: int = Field(ge=0, le=MAX_NODES, description="Number of on-prem GPU nodes in the pool.")
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE, description="GPUs in each on-prem node.")
    gpu_hour_usd: Money | None = Field(
        default=None,
        description="Amortised cost of one on-prem GPU-hour, for comparing on-prem and cloud cost.",
    )

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class Pool(PolicyModel):
    """A named pool of GPU capacity: jobs submitted to it run on-prem first, then in the cloud."""

    name: Name = Field(description="Pool name; jobs name the pool they belong to.")
    onprem: OnPrem = Field(description="On-prem capacity of the pool.")
    storage: Storage | None = Field(
        default=None,
        description="Where the pool's data and checkpoints live and what moving them to the cloud "
        "costs (docs/fabric.md \"Data and checkpoints\"); unset: bursting moves no data.")


class QueueConfig(PolicyModel):
    """Where pending work is read from."""

    source: QueueSourceKind = Field(
        default=QueueSourceKind.BUILTIN, description="Queue source of the pool."
    )
    partition: str | None = Field(
        default=None, description="Slurm partition to watch (slurm source only)."
    )
    slurm_conf: str | None = Field(
        default=None,
        description="slurm.conf of the cluster (slurm source only; default: $SLURM_CONF, else "
        "Slurm's own default). Exported as SLURM_CONF to every Slurm command burst runs.",
    )

    @model_validator(mode="after")
    def _partition_only_for_slurm(self) -> QueueConfig:
        if self.partition is not None and self.source is not QueueSourceKind.SLURM:
            raise field_problem("partition", "only applies to source: slurm")
        if self.slurm_conf is not None and self.source is not QueueSourceKind.SLURM:
            raise field_problem("slurm_conf", "only applies to source: slurm")
        return self


class Trigger(PolicyModel):
    """When bursting starts. Unmet demand is pending GPUs that on-prem free GPUs cannot absorb."""

    pending_gpus_above: int = Field(
        default=0, ge=0, le=MAX_POOL_GPUS,
        description="Fire when unmet pending GPU demand exceeds this many GPUs."
    )
    oldest_wait_above: Duration = Field(
        default=timedelta(minutes=5),
        description="Fire when the oldest pending job has waited longer than this.",
    )
    combine: TriggerCombine = Field(
        default=TriggerCombine.ANY, description="Whether any or all conditions must hold."
    )
    sustained_for: Duration = Field(
        default=timedelta(minutes=1),
        description="The condition must hold this long before anything is launched (hysteresis).",
    )
    wait_slo: Duration | None = Field(
        default=None,
        description="Wait-aware scale-up (the shipped default policy sets 30m): the queue-wait "
        "target of a pending job. When set, "
        "the planner predicts each unmet job's on-prem start from the running on-prem jobs' "
        "expected ends (in scheduling order); a job predicted to start on-prem by submit + "
        "wait_slo - expected_boot stays queued for on-prem, and any other job is burst only once "
        "waiting one more minute would miss that point (just in time), not at arrival. Unset: "
        "every unmet job may be burst as soon as the trigger fires.",
    )
    expected_boot: Duration = Field(
        default=timedelta(minutes=5),
        description="Boot time the wait-aware rule (wait_slo) allows for a burst node between "
        "its launch and the job's start (with learn_boot: until enough boots are observed).",
    )
    onprem_margin: Duration | None = Field(
        default=None,
        description="With wait_slo and wait_model: nodes: how long before submit + wait_slo a "
        "job's predicted on-prem "
        "start must be for the job to stay queued for on-prem. Unset: expected_boot (a job is "
        "left on-prem only if it would start there before a node launched for it would have to "
        "be). Shorter (e.g. 1m) keeps on-prem every job the prediction starts within the SLO, "
        "and bursts the others at submit + wait_slo - expected_boot as before; a prediction "
        "that slips after that point can then miss the SLO. Where the queue source cannot give "
        "the node model (pooled is used, and the decision says so), expected_boot stands.",
    )
    learn_boot: bool = Field(
        default=False,
        description="The wait-aware rule allows the learned launch-to-ready time instead of "
        "expected_boot: the p90 of the observed boots of the policy's offerings (decayed, "
        "24 h half-life; the slowest offering's), once at least 8 boots were seen.",
    )
    wait_model: WaitModel = Field(
        default=WaitModel.POOLED,
        description="How the wait-aware rule predicts on-prem starts: pooled (on-prem GPUs "
        "pooled, first fit) or nodes (node by node with Slurm's backfill model, whole nodes for "
        "jobs wider than a node; needs the queue source to report each running job's node, else "
        "pooled is used and the decision says so).",
    )
    displacement: Displacement = Field(
        default_factory=Displacement,
        description="Which jobs to burst: displace cheaper queued jobs so that a dearer one keeps "
        "its on-prem start (needs wait_slo and wait_model: nodes).",
    )
    onprem_order: OnPremOrder = Field(
        default=OnPremOrder.SUBMIT,
        description="In which order the wait-aware rule keeps queued jobs for on-prem: submit "
        "(priority, then oldest first) or longest-first (within each project priority, the "
        "longest expected runtime first, so the jobs that go to the cloud when not all can start on-prem "
        "within wait_slo are the short ones; the decision carries the order for the on-prem "
        "scheduler to apply; needs wait_slo and wait_model: nodes).",
    )
    spare_room: SpareRoom = Field(
        default_factory=SpareRoom,
        description="Which jobs may take a burst node's spare room: the jobs kept for on-prem "
        "(wait_slo) only where they lengthen the node's bill by little (needs wait_slo).",
    )

    @model_validator(mode="after")
    def _wait_rules(self) -> Trigger:
        if self.onprem_margin is not None:
            if self.wait_slo is None or self.wait_model is not WaitModel.NODES:
                raise field_problem("onprem_margin", "needs wait_slo set and wait_model: nodes")
            if self.onprem_margin > self.wait_slo:
                raise field_problem("onprem_margin", f"must not be longer than wait_slo "
                                    f"({self.wait_slo})")
        if self.displacement.enabled and (self.wait_slo is None
                                          or self.wait_model is not WaitModel.NODES):
            raise field_problem("displacement", "enabled needs wait_slo set and wait_model: nodes")
        if self.onprem_order is OnPremOrder.LONGEST_FIRST and (
                self.wait_slo is None or self.wait_model is not WaitModel.NODES):
            raise field_problem("onprem_order", "longest-first needs wait_slo set and "
                                "wait_model: nodes")
        if self.spare_room.enabled and self.wait_slo is None:
            raise field_problem("spare_room", "enabled needs wait_slo set (the jobs it keeps are "
                                "those the wait-aware rule keeps queued for on-prem)")
        return self


class OfferingSpec(PolicyModel):
    """A kind of cloud node the pool may launch. The planner prefers the cheapest that fits."""

    provider: ProviderName = Field(description="Provider adapter that launches it.")
    region: CloudName = Field(description="Provider region, e.g. us-east-1.")
    zone: CloudName | None = Field(default=None, description="Zone within the region, if pinned.")
    instance_type: CloudName = Field(description="Provider instance type, e.g. p4d.24xlarge.")
    market: Market = Field(default=Market.ON_DEMAND, description="spot or on-demand.")
    fallback_on_demand: bool = Field(
        default=False,
        description="For spot: also consider the on-demand market of the same type, used when spot "
        "is out of capacity or costlier.",
    )
    gpus: int | None = Field(
        default=None, ge=1, le=MAX_GPUS_PER_NODE,
        description="GPUs per node; taken from the provider catalogue if unset."
    )
    gpu_model: Text | None = Field(
        default=None, description="GPU model, e.g. A100-80GB; from the catalogue if unset."
    )
    price_usd_hour: Money | None = Field(
        default=None, le=MAX_PRICE_USD_HOUR,
        description="Hourly price to plan with; from the provider catalogue if unset.",
    )
    max_nodes: int | None = Field(
        default=None, ge=0, le=MAX_NODES,
        description="Most nodes of this offering at once (unset: pool limit)."
    )
    interconnect: InterconnectNeed = Field(
        default=InterconnectNeed.NONE,
        description="Interconnect this offering must have (efa, rdma: EFA or GPUDirect-RDMA, any: "
        "any GPU fabric, none: no requirement), checked against the provider catalogue; an "
        "instance type without it is a policy error. A type the catalogue does not list is "
        "planned as having it.",
    )

    @model_validator(mode="after")
    def _fallback_only_for_spot(self) -> OfferingSpec:
        if self.fallback_on_demand and self.market is not Market.SPOT:
            raise field_problem("fallback_on_demand", "only applies to market: spot")
        return self

    @property
    def key(self) -> str:
        zone = self.zone or "-"
        return f"{self.provider}/{self.region}/{zone}/{self.instance_type}/{self.market}"


class Limits(PolicyModel):
    """Hard limits on burst capacity; the planner never plans past them."""

    min_nodes: int = Field(default=0, ge=0, le=MAX_NODES, description="Burst nodes kept even "
                           "when idle.")
    max_nodes: int = Field(default=10, ge=0, le=MAX_NODES, description="Most burst nodes at once, "
                           "any state.")
    max_concurrent_launches: int = Field(
        default=4, ge=1, le=MAX_NODES, description="Most nodes requested but not yet ready at once."
    )
    max_hourly_spend_usd: Money | None = Field(
        default=None, le=MAX_USD, description="Most USD per hour all burst nodes of the pool may cost together."
    )
    max_burst_gpus: int | None = Field(
        default=None, ge=0, le=MAX_POOL_GPUS, description="Most burst GPUs at once across the pool."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Limits:
        if self.min_nodes > self.max_nodes:
            raise field_problem(
                "min_nodes", f"{self.min_nodes} is more than max_nodes ({self.max_nodes})"
            )
        return self


class ScaleDown(PolicyModel):
    """When and how burst nodes leave."""

    idle_for: Duration = Field(
        default=timedelta(minutes=10), description="Drain a node after it has run nothing this long."
    )
    drain_grace: Duration = Field(
        default=timedelta(minutes=15),
        description="Longest a drain waits for running work to finish or hand back before the node "
        "is terminated anyway.",
    )
    respect_running_jobs: bool = Field(
        default=True,
        description="Wait for running jobs to finish (up to drain_grace); if false, running jobs are "
        "handed back to the queue at once.",
    )
    count_low_utilisation_as_idle: bool = Field(
        default=False,
        description="Also drain a burst node whose allocated GPUs were measured under "
        "utilisation.idle_below_percent for utilisation.idle_for (its jobs run on but barely use "
        "them), as if it ran nothing; the decision names it (reason low-utilisation). Nodes "
        "whose use is unknown are never counted.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ScaleDown:
        if self.idle_for <= timedelta(0):
            raise field_problem("idle_for", "must be longer than 0s")
        return self


class UtilisationRules(PolicyModel):
    """When allocated GPUs count as idle, from their measured utilisation (docs/utilisation.md)."""

    idle_below_percent: float = Field(
        default=5.0, ge=0, le=100,
        description="A job or burst node whose allocated GPUs' mean measured utilisation stays "
        "under this percentage is flagged low-utilisation (status, API, metric, decisions).",
    )
    idle_for: Duration = Field(
        default=timedelta(minutes=30),
        description="How long the utilisation must stay under idle_below_percent before the flag "
        "is raised; an unknown reading (nothing measurable) clears it.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> UtilisationRules:
        if self.idle_for <= timedelta(0):
            raise field_problem("idle_for", "must be longer than 0s")
        return self


class Timeouts(PolicyModel):
    """How long a node may stay in each transient state before it is failed and terminated."""

    launch: Duration = Field(
        default=timedelta(minutes=5), description="requested/launching: provider accepts the launch."
    )
    boot: Duration = Field(
        default=timedelta(minutes=15), description="booting: instance running until agent registers."
    )
    join: Duration = Field(
        default=timedelta(minutes=10), description="joining: agent registered until fabric ready."
    )
    terminate: Duration = Field(
        default=timedelta(minutes=10),
        description="terminating: after this the terminate call is repeated.",
    )
    heartbeat: Duration = Field(
        default=timedelta(minutes=2),
        description="A joined node whose agent is silent this long is failed and replaced.",
    )
    controller_lease: Duration = Field(
        default=timedelta(minutes=30),
        description=(
            "The node side's dead-man switch: an agent that has had no answer from the controller "
            "this long drains itself (SIGTERM to its job, then SIGKILL after a grace), leaves its "
            "fabric and stops its instance where the provider lets it; at least `heartbeat`."
        ),
    )

    @model_validator(mode="after")
    def _positive(self) -> Timeouts:
        for name in ("launch", "boot", "join", "terminate", "heartbeat", "controller_lease"):
            if getattr(self, name) <= timedelta(0):
                raise field_problem(name, "must be longer than 0s")
        if self.controller_lease < self.heartbeat:
            # Shorter, a node would drain itself while the controller still counts it alive.
            raise field_problem("controller_lease", "must be at least timeouts.heartbeat")
        return self


class Cooldowns(PolicyModel):
    """Minimum gaps that stop the pool from flapping."""

    scale_up: Duration = Field(
        default=timedelta(minutes=1),
        description="After a launch, wait this long before launching again for the pool.",
    )
    scale_down: Duration = Field(
        default=timedelta(minutes=5),
        description="After a launch, wait this long before draining any node of the pool.",
    )


def _check_checkpoint_every(value: timedelta | None) -> None:
    """A checkpoint interval (of a project, or spot's default) is longer than zero."""
    if value is not None and value.total_seconds() <= 0:
        raise field_problem("checkpoint_every", "must be longer than 0s (leave it unset for "
                            "jobs that do not checkpoint)")


class Project(PolicyModel):
    """A tenant of the pool: its priority and its share of burst capacity."""

    name: Name = Field(description="Project name, as jobs carry it (Slurm account, etc.).")
    priority: int = Field(
        default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY,
        description="Higher runs first on burst capacity: a higher-priority project's queued work "
        "gets nodes before any lower one's. Projects of equal priority share by max-min fairness "
        "when a pool limit binds: the next node goes to the project holding the fewest burst GPUs "
        "(those held plus those granted this tick, divided by its weight), ties to the project "
        "whose next job comes first in submit order; each stays within its own quota. When no "
        "pool limit binds, every project's work gets nodes in submit order (see docs/budgets.md).",
    )
    max_burst_gpus: int | None = Field(
        default=None, ge=0, le=MAX_POOL_GPUS,
        description="Most burst GPUs the project may hold at once."
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        le=MAX_WEIGHT,
        description="Fair-share weight among projects of equal priority: a project of weight 2 is "
        "granted nodes until it holds twice the burst GPUs of a project of weight 1.",
    )
    checkpoint_every: Duration | None = Field(
        default=None,
        description="How often the project's jobs save a checkpoint they can resume from after "
        "a spot interruption (a job's own annotation wins; unset: spot.checkpoint_every).",
    )
    storage: Storage | None = Field(
        default=None,
        description="The project's data and checkpoints: replaces pool.storage for its jobs.")

    @model_validator(mode="after")
    def _positive_interval(self) -> Project:
        _check_checkpoint_every(self.checkpoint_every)
        return self


class SpotChoice(PolicyModel):
    """How the market (spot or on-demand), provider and region of each job's node are chosen.

    With ``by_expected_cost`` each unmet job is priced on every usable offering at price x
    expected billed time under the offering's preemption hazard (work lost since the last
    checkpoint and ``restart_overhead`` per interruption, a new node's boot), plus the SLO risk of
    restarts and stockouts (the expected delay, valued at ``delay_usd_per_gpu_hour``); the
    cheapest takes the job. Hazard and stockout odds come from the snapshot's offering health
    (learned from node events, seeded by the catalogue's published interruption buckets).
    """

    by_expected_cost: bool = Field(
        default=False,
        description="Choose each job's offering by expected cost including interruptions (see "
        "docs/simulator.md, 'Spot'); off: the offering cheapest for all unmet demand, by price.",
    )
    checkpoint_every: Duration | None = Field(
        default=None,
        description="Checkpoint interval of jobs whose project and annotation give none; unset: "
        "such jobs restart from the beginning after an interruption.",
    )
    restart_overhead: Duration = Field(
        default=timedelta(minutes=3),
        description="Time an interrupted job spends on its next node before it computes again "
        "(loading the checkpoint, warming up), beyond that node's boot.",
    )
    delay_usd_per_gpu_hour: Money | None = Field(
        default=None, le=MAX_PRICE_USD_HOUR,
        description="What an hour of delay to one GPU of a job costs (the SLO risk of a restart "
        "or a stockout); unset: the cheapest on-demand price per GPU-hour among the offerings, "
        "or 0 with the SLO guard (max_slo_miss_odds bounds that risk; a delay within the SLO "
        "costs nothing by its terms).",
    )
    max_slo_miss_odds: float | None = Field(
        default=None, gt=0, lt=1,
        description="SLO guard: a spot offering is passed over for a job (unless nothing else is "
        "on offer) when the odds that its restarts push the job's wait past trigger.wait_slo "
        "exceed this (interruptions Poisson at the offering's hazard; each restart waits a "
        "boot and a tick); a late job whose best guarded choice is spot bursts at once rather "
        "than at its deadline, while its slack can still absorb restarts; a job deferred to "
        "on-prem bursts on spot in the last tick it has room for a restart and a relaunch. Unset: "
        "no guard.",
    )
    learn_restart_wait: bool = Field(
        default=False,
        description="SLO guard: count a job's room for a restart with the learned boot of its "
        "launch group (per offering, the p90 of the slowest of n boots observed, n the job's "
        "nodes) instead of trigger.expected_boot, once enough boots are seen (as "
        "trigger.learn_boot). The wait-aware deadline keeps trigger.expected_boot unless "
        "trigger.learn_boot is set too.",
    )

    @model_validator(mode="after")
    def _positive_interval(self) -> SpotChoice:
        _check_checkpoint_every(self.checkpoint_every)
        return self


class Policy(PolicyModel):
    """A bursting policy for one pool."""

    version: Literal[1] = Field(description="Policy format version; currently 1.")
    name: Name = Field(description="Policy name; recorded on every node and decision.")
    cluster: Name = Field(
        default="burst",
        description="Cluster name written into every instance's ownership tags; the reconciler "
        "only ever touches instances carrying it.",
    )
    pool: Pool = Field(description="The pool this policy bursts for.")
    queue: QueueConfig = Field(default_factory=QueueConfig, description="Queue source.")
    trigger: Trigger = Field(default_factory=Trigger, description="When to burst.")
    offerings: list[OfferingSpec] = Field(
        default_factory=list,
        description="Cloud node kinds the pool may launch (this list, plus what accelerators "
        "expands to; at least one of the two).",
    )
    accelerators: list[AcceleratorSpec] = Field(
        default_factory=list,
        description="Shorthand for offerings by GPU part and count (e.g. A100-80GB:8), expanded "
        "from the bundled catalogues when the policy is loaded for use; `burst policy validate` "
        "shows the expansion.",
    )
    limits: Limits = Field(default_factory=Limits, description="Hard limits.")
    scale_down: ScaleDown = Field(default_factory=ScaleDown, description="Scale-down rules.")
    utilisation: UtilisationRules = Field(
        default_factory=UtilisationRules,
        description="Idle-GPU flags from measured utilisation (see docs/utilisation.md).")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Per-state node timeouts.")
    cooldowns: Cooldowns = Field(default_factory=Cooldowns, description="Anti-flap cooldowns.")
    projects: list[Project] = Field(
        default_factory=list, description="Per-project priority, fair-share weight and burst quota."
    )
    default_project_priority: int = Field(
        default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="Priority of projects not listed under projects."
    )
    providers: ProviderSettings = Field(
        default_factory=ProviderSettings,
        description="Per-provider launch settings (AMI, project, driver...), for each cloud used.",
    )
    fabric: FabricConfig = Field(
        default_factory=FabricConfig,
        description="How burst nodes join the training fabric and drain out of it (see "
        "docs/fabric.md).",
    )
    budgets: list[Budget] = Field(
        default_factory=list,
        description="Spend limits over windows, per project or for the whole pool, with graded "
        "actions (see docs/budgets.md).",
    )
    budget_commitment: BudgetCommitment = Field(
        default_factory=BudgetCommitment,
        description="How much budget each launch commits (every launch records it; budgets "
        "check it).",
    )
    spot: SpotChoice = Field(
        default_factory=SpotChoice,
        description="Spot or on-demand, and which provider and region, per job by expected cost "
        "(see docs/simulator.md, 'Spot').",
    )
    multi_node_requires: InterconnectNeed = Field(
        default=InterconnectNeed.NONE,
        description="Interconnect every node of a job wider than one node must have (efa, rdma, "
        "any; none: no requirement). Offerings without it are not used for such jobs; a policy "
        "none of whose offerings has it is an error.",
    )
    tags: dict[Annotated[str, Field(max_length=128)], Annotated[str, Field(max_length=256)]] = Field(
        default_factory=dict,
        description="Cost-allocation tags every instance of the pool carries (AWS tags, GCP "
        "labels, libcloud metadata), besides burst's own: burst:project (the project whose work "
        "launched it) and burst:user (when that work is one user's). With a gcp provider keys "
        "and values follow GCP's label rules (lower case, [a-z0-9_-], at most 63). See "
        "docs/costs.md, 'Reconciling with the cloud bill'.",
    )
    notifications: Notifications = Field(
        default_factory=Notifications,
        description="Webhooks told about budget grades and forecast overruns, repeated launch "
        "failures, stuck nodes and leaked instances (see docs/monitoring.md).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        if not self.offerings and not self.accelerators:
            raise field_problem("offerings", "list at least one offering (or an accelerators "
                                "entry): the pool has nothing it may launch")
        seen: set[str] = set()
        for index, project in enumerate(self.projects):
            if project.name in seen:
                raise field_problem(f"projects[{index}].name", f"duplicate project {project.name!r}")
            seen.add(project.name)
        budget_names: set[str] = set()
        for index, budget in enumerate(self.budgets):
            if budget.name in budget_names:
                raise field_problem(f"budgets[{index}].name", f"duplicate budget {budget.name!r}")
            budget_names.add(budget.name)
        keys: set[str] = set()
        for index, offering in enumerate(self.offerings):
            if offering.key in keys:
                raise field_problem(f"offerings[{index}]", f"duplicate offering {offering.key}")
            keys.add(offering.key)
        for index, offering in enumerate(self.offerings):
            if offering.provider in (ProviderName.AWS, ProviderName.GCP, ProviderName.LIBCLOUD):
                if getattr(self.providers, str(offering.provider)) is None:
                    raise field_problem(
                        f"offerings[{index}].provider",
                        f"uses {offering.provider}, so providers.{offering.provider} must give its "
                        "launch settings")
            if offering.provider is ProviderName.LIBCLOUD and self.providers.libcloud is not None:
                if offering.instance_type not in self.providers.libcloud.sizes:
                    raise field_problem(
                        f"offerings[{index}].instance_type",
                        f"{offering.instance_type!r} is not among providers.libcloud.sizes")
        if self.limits.min_nodes and not self.accelerators and not any(
            (o.max_nodes is None or o.max_nodes > 0) for o in self.offerings
        ):
            raise field_problem("limits.min_nodes", "no offering may launch a node")
        self._check_tags()
        return self

    def _check_tags(self) -> None:
        libcloud = self.providers.libcloud
        gcp = self.providers.gcp is not None or (
            libcloud is not None and str(getattr(libcloud, "driver", "")).lower() == "gce")
        for key, message in tag_problems(self.tags, gcp=gcp):
            # A key with '.' or '[' cannot be a path of the loader's: name the map instead.
            at = "tags" if key is None or any(c in key for c in ".[]") else f"tags.{key}"
            raise field_problem(at, message)

    @model_validator(mode="after")
    def _fabric_fits_queue(self) -> Policy:
        kind = self.fabric_kind
        if kind is FabricKind.SLURM and self.queue.source is not QueueSourceKind.SLURM:
            raise field_problem("fabric.kind", "slurm needs queue.source: slurm (the nodes join "
                                "the cluster the queue is read from)")
        if self.queue.source is QueueSourceKind.SLURM and kind is not FabricKind.SLURM:
            raise field_problem("fabric.kind", f"{kind} cannot run Slurm jobs; with queue.source: "
                                "slurm the fabric is slurm")
        if kind is FabricKind.TORCH_ELASTIC and self.fabric.torch is None:
            raise field_problem("fabric.torch", "kind: torch-elastic needs the torch section")
        slots = self.fabric.slurm.slot_names()
        if kind is FabricKind.SLURM and str(self.fabric.slurm.join) in ("slot", "power-save") and (
                self.limits.max_nodes > len(slots)):
            raise field_problem("limits.max_nodes", f"{self.limits.max_nodes} is more than the "
                                f"{len(slots)} Slurm slot(s) in fabric.slurm.slots")
        return self

    @property
    def fabric_kind(self) -> FabricKind:
        """The fabric in force: ``fabric.kind``, or what ``queue.source`` implies."""
        if self.fabric.kind is not None:
            return self.fabric.kind
        return FabricKind.SLURM if self.queue.source is QueueSourceKind.SLURM else FabricKind.BUILTIN

    @property
    def power_saved(self) -> bool:
        """Slurm's power save decides this policy's launches and terminations
        (``fabric.slurm.join: power-save``): the control loop does not plan it, ``burst slurm
        resume``/``suspend`` do (docs/slurm-power-save.md)."""
        return (self.fabric_kind is FabricKind.SLURM
                and str(self.fabric.slurm.join) == "power-save")

    def project_priority(self, name: str) -> int:
        """Priority of a project's work; unlisted projects get ``default_project_priority``."""
        for project in self.projects:
            if project.name == name:
                return project.priority
        return self.default_project_priority

    def project_weight(self, name: str) -> float:
        """Fair-share weight of a project among those of equal priority (1 unless listed)."""
        for project in self.projects:
            if project.name == name:
                return project.weight
        return 1.0

    def checkpoint_every_s(self, project: str, annotated_s: float | None = None) -> float | None:
        """A job's checkpoint interval in seconds: its annotation, else its project's, else the
        policy's ``spot.checkpoint_every``; None: it restarts from the beginning."""
        if annotated_s:
            return annotated_s
        for p in self.projects:
            if p.name == project and p.checkpoint_every is not None:
                return p.checkpoint_every.total_seconds()
        default = self.spot.checkpoint_every
        return default.total_seconds() if default is not None else None

    def storage_for(self, project: str | None) -> Storage | None:
        """The storage a project's jobs stage from: its own ``storage``, else ``pool.storage``."""
        for p in self.projects:
            if p.name == project and p.storage is not None:
                return p.storage
        return self.pool.storage

    def project_quota(self, name: str) -> int | None:
        """Most burst GPUs the project may hold, or None for no per-project limit."""
        for project in self.projects:
            if project.name == name:
                return project.max_burst_gpus
        return None
