"""Demand: which pending jobs on-prem and existing burst capacity will absorb, and what is left.

Jobs are considered in scheduling order (project priority, job priority, then oldest first). Each
is fitted first into free on-prem GPUs, then into free GPUs of ready burst nodes and the full GPUs
of nodes still booting (so a spike already being answered is not answered twice). What fits
nowhere is *unmet* demand, the only thing that may cause a launch.

A job wider than one node needs that many whole nodes (multi-node training); a smaller job takes
GPUs of one node. The fitting is first-fit over bins of free GPUs, which is what the built-in
queue's dispatcher and Slurm's backfill roughly do; it is an estimate for planning, not a schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.snapshot import PoolQueue
from orchestrator.policy.models import Policy


@dataclass(slots=True)
class Bins:
    """Free GPUs per node, with a running total so a full set of bins stops work early."""

    free: list[int]
    owners: list[str | None] = field(default_factory=list)  # node id per bin (None: on-prem)
    node_size: int = 0  # GPUs of a whole node, for multi-node jobs (0: size of the largest bin)
    total: int = 0

    def __post_init__(self) -> None:
        self.total = sum(self.free)
        if not self.owners:
            self.owners = [None] * len(self.free)
        if not self.node_size:
            self.node_size = max(self.free, default=0)

    def place(self, gpus: int) -> list[int] | None:
        """Place a job; return the indexes of the bins used, or None if it does not fit."""
        if gpus <= 0 or gpus > self.total:
            return None if gpus > 0 else []
        if gpus <= self.node_size:
            for index, free in enumerate(self.free):
                if free >= gpus:
                    self.free[index] = free - gpus
                    self.total -= gpus
                    return [index]
            return None
        # Multi-node job: needs ceil(gpus / node_size) bins that are whole free nodes.
        needed = -(-gpus // self.node_size)
        whole = [i for i, free in enumerate(self.free) if free >= self.node_size][:needed]
        if len(whole) < needed:
            return None
        for index in whole:
            self.total -= self.free[index]
            self.free[index] = 0
        return whole


@dataclass(frozen=True, slots=True)
class Demand:
    """The outcome of absorbing a pool's pending jobs into existing capacity."""

    ordered: tuple[Job, ...]  # every pending job, in scheduling order
    onprem_absorbed: tuple[Job, ...]
    burst_absorbed: tuple[Job, ...]
    unmet: tuple[Job, ...]  # fits nowhere: candidates for new nodes
    busy_nodes: frozenset[str]  # ready burst nodes that absorbed some pending job

    @property
    def pending_gpus(self) -> int:
        return sum(j.gpus for j in self.ordered)

    @property
    def beyond_onprem(self) -> tuple[Job, ...]:
        """Jobs on-prem cannot start now (the trigger looks at these)."""
        absorbed = {j.id for j in self.onprem_absorbed}
        return tuple(j for j in self.ordered if j.id not in absorbed)

    @property
    def unmet_gpus(self) -> int:
        return sum(j.gpus for j in self.unmet)


def scheduling_order(jobs: tuple[Job, ...] | list[Job], policy: Policy) -> list[Job]:
    """Higher project priority first, then higher job priority, then oldest, then id."""
    priorities = {p.name: p.priority for p in policy.projects}
    default = policy.default_project_priority
    return sorted(
        jobs,
        key=lambda j: (-priorities.get(j.project, default), -j.priority, j.submitted_at, j.id),
    )


def absorb(queue: PoolQueue | None, nodes: list[Node], policy: Policy) -> Demand:
    """Fit the pool's pending jobs into on-prem, then burst capacity; see the module docstring."""
    if queue is None or not queue.pending:
        return Demand((), (), (), (), frozenset())
    ordered = scheduling_order(queue.pending, policy)
    onprem_free = list(queue.onprem.free_per_node) or (
        [queue.onprem.free_gpus] if queue.onprem.free_gpus else []
    )
    onprem = Bins(onprem_free, node_size=policy.pool.onprem.gpus_per_node)
    burst_free: list[int] = []
    owners: list[str | None] = []
    for node in nodes:
        if node.state is NodeState.READY and node.gpus_free > 0:
            burst_free.append(node.gpus_free)
            owners.append(node.id)
        elif node.state.in_flight:
            burst_free.append(node.gpus)
            owners.append(node.id)
    burst = Bins(burst_free, owners)

    onprem_absorbed: list[Job] = []
    burst_absorbed: list[Job] = []
    unmet: list[Job] = []
    busy: set[str] = set()
    for job in ordered:
        if onprem.total and onprem.place(job.gpus) is not None:
            onprem_absorbed.append(job)
            continue
        used = burst.place(job.gpus) if burst.total else None
        if used is not None:
            burst_absorbed.append(job)
            busy.update(o for o in (burst.owners[i] for i in used) if o is not None)
            continue
        unmet.append(job)
    return Demand(tuple(ordered), tuple(onprem_absorbed), tuple(burst_absorbed), tuple(unmet), frozenset(busy))


def oldest_wait_s(jobs: tuple[Job, ...], now: datetime) -> float:
    if not jobs:
        return 0.0
    return max((now - min(j.submitted_at for j in jobs)).total_seconds(), 0.0)
