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

from orchestrator.policy.base import NAME_PATTERN, Name, PolicyModel, field_problem
from orchestrator.policy.providers import ProviderSettings


class ProviderName(StrEnum):
    """The provider adapters burst ships. ``local`` and ``sim`` need no cloud account."""

    LOCAL = "local"  # nodes are local processes running the node agent (embedded default)
    SIM = "sim"  # simulated cloud on a virtual clock, for the simulator
    AWS = "aws"  # EC2 through boto3
    GCP = "gcp"  # Compute Engine through google-cloud-compute
    LIBCLOUD = "libcloud"  # any apache-libcloud compute driver


class Market(StrEnum):
    """How an instance is bought."""

    SPOT = "spot"  # interruptible, cheaper; may fail for lack of capacity more often
    ON_DEMAND = "on-demand"  # regular price, not interrupted


class QueueSourceKind(StrEnum):
    """Where the on-prem queue is read from."""

    BUILTIN = "builtin"  # burst's own job queue in its state database (`burst submit`)
    SLURM = "slurm"  # squeue/sinfo of a Slurm cluster


class TriggerCombine(StrEnum):
    """How the trigger's conditions combine."""

    ANY = "any"  # either condition fires the trigger
    ALL = "all"  # both conditions must hold


class OnPrem(PolicyModel):
    """The on-prem capacity of the pool: what is used before any cloud node."""

    nodes: int = Field(ge=0, description="Number of on-prem GPU nodes in the pool.")
    gpus_per_node: int = Field(ge=1, description="GPUs in each on-prem node.")
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


class QueueConfig(PolicyModel):
    """Where pending work is read from."""

    source: QueueSourceKind = Field(
        default=QueueSourceKind.BUILTIN, description="Queue source of the pool."
    )
    partition: str | None = Field(
        default=None, description="Slurm partition to watch (slurm source only)."
    )

    @model_validator(mode="after")
    def _partition_only_for_slurm(self) -> QueueConfig:
        if self.partition is not None and self.source is not QueueSourceKind.SLURM:
            raise field_problem("partition", "only applies to source: slurm")
        return self


class Trigger(PolicyModel):
    """When bursting starts. Unmet demand is pending GPUs that on-prem free GPUs cannot absorb."""

    pending_gpus_above: int = Field(
        default=0, ge=0, description="Fire when unmet pending GPU demand exceeds this many GPUs."
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


class OfferingSpec(PolicyModel):
    """A kind of cloud node the pool may launch. The planner prefers the cheapest that fits."""

    provider: ProviderName = Field(description="Provider adapter that launches it.")
    region: str = Field(min_length=1, description="Provider region, e.g. us-east-1.")
    zone: str | None = Field(default=None, description="Zone within the region, if pinned.")
    instance_type: str = Field(min_length=1, description="Provider instance type, e.g. p4d.24xlarge.")
    market: Market = Field(default=Market.ON_DEMAND, description="spot or on-demand.")
    fallback_on_demand: bool = Field(
        default=False,
        description="For spot: also consider the on-demand market of the same type, used when spot "
        "is out of capacity or costlier.",
    )
    gpus: int | None = Field(
        default=None, ge=1, description="GPUs per node; taken from the provider catalogue if unset."
    )
    gpu_model: str | None = Field(
        default=None, description="GPU model, e.g. A100-80GB; from the catalogue if unset."
    )
    price_usd_hour: Money | None = Field(
        default=None,
        description="Hourly price to plan with; from the provider catalogue if unset.",
    )
    max_nodes: int | None = Field(
        default=None, ge=0, description="Most nodes of this offering at once (unset: pool limit)."
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

    min_nodes: int = Field(default=0, ge=0, description="Burst nodes kept even when idle.")
    max_nodes: int = Field(default=10, ge=0, description="Most burst nodes at once, any state.")
    max_concurrent_launches: int = Field(
        default=4, ge=1, description="Most nodes requested but not yet ready at once."
    )
    max_hourly_spend_usd: Money | None = Field(
        default=None, description="Most USD per hour all burst nodes of the pool may cost together."
    )
    max_burst_gpus: int | None = Field(
        default=None, ge=0, description="Most burst GPUs at once across the pool."
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

    @model_validator(mode="after")
    def _consistent(self) -> ScaleDown:
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

    @model_validator(mode="after")
    def _positive(self) -> Timeouts:
        for name in ("launch", "boot", "join", "terminate", "heartbeat"):
            if getattr(self, name) <= timedelta(0):
                raise field_problem(name, "must be longer than 0s")
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


class Project(PolicyModel):
    """A tenant of the pool: its priority and its share of burst capacity."""

    name: Name = Field(description="Project name, as jobs carry it (Slurm account, etc.).")
    priority: int = Field(
        default=0,
        description="Higher runs first on burst capacity. Projects of equal priority are served "
        "job by job in submit order (FIFO across the projects), each within its own quota.",
    )
    max_burst_gpus: int | None = Field(
        default=None, ge=0, description="Most burst GPUs the project may hold at once."
    )


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
        min_length=1, description="Cloud node kinds the pool may launch."
    )
    limits: Limits = Field(default_factory=Limits, description="Hard limits.")
    scale_down: ScaleDown = Field(default_factory=ScaleDown, description="Scale-down rules.")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Per-state node timeouts.")
    cooldowns: Cooldowns = Field(default_factory=Cooldowns, description="Anti-flap cooldowns.")
    projects: list[Project] = Field(
        default_factory=list, description="Per-project priority and burst quota."
    )
    default_project_priority: int = Field(
        default=0, description="Priority of projects not listed under projects."
    )
    providers: ProviderSettings = Field(
        default_factory=ProviderSettings,
        description="Per-provider launch settings (AMI, project, driver...), for each cloud used.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Policy:
        seen: set[str] = set()
        for index, project in enumerate(self.projects):
            if project.name in seen:
                raise field_problem(f"projects[{index}].name", f"duplicate project {project.name!r}")
            seen.add(project.name)
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
        if self.limits.min_nodes and not any(
            (o.max_nodes is None or o.max_nodes > 0) for o in self.offerings
        ):
            raise field_problem("limits.min_nodes", "no offering may launch a node")
        return self

    def project_priority(self, name: str) -> int:
        """Priority of a project's work; unlisted projects get ``default_project_priority``."""
        for project in self.projects:
            if project.name == name:
                return project.priority
        return self.default_project_priority

    def project_quota(self, name: str) -> int | None:
        """Most burst GPUs the project may hold, or None for no per-project limit."""
        for project in self.projects:
            if project.name == name:
                return project.max_burst_gpus
        return None
