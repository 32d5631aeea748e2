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

from dataclasses import dataclass
from datetime import datetime

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.snapshot import PoolQueue
from orchestrator.policy.models import Policy


class Bins:
    """Free GPUs per node, indexed by how many GPUs are free, so placing a job is O(node size).

    A job goes to the bin with the *least* free room that fits it (best fit), which keeps whole
    nodes free for wide jobs. ``total`` lets a full set of bins stop the work early.
    """

    __slots__ = ("free", "owners", "node_size", "total", "_by_free")

    def __init__(self, free: list[int], owners: list[str | None] | None = None, node_size: int = 0):
        self.free = list(free)
        self.owners = list(owners) if owners else [None] * len(self.free)
        self.node_size = node_size or max(self.free, default=0)
        self.total = sum(self.free)
        top = max(self.free, default=0)
        self._by_free: list[list[int]] = [[] for _ in range(top + 1)]
        for index in range(len(self.free) - 1, -1, -1):  # pop() then yields the lowest index first
            self._by_free[self.free[index]].append(index)

    def add(self, gpus: int, owner: str | None = None) -> None:
        """Open one more bin (a node about to be launched) with ``gpus`` free."""
        while len(self._by_free) <= gpus:
            self._by_free.append([])
        self.free.append(gpus)
        self.owners.append(owner)
        self._by_free[gpus].append(len(self.free) - 1)
        self.total += gpus

    def place(self, gpus: int) -> list[int] | None:
        """Place a job; return the indexes of the bins used, or None if it does not fit."""
        if gpus <= 0:
            return []
        if gpus > self.total:
            return None
        by_free = self._by_free
        if gpus <= self.node_size:
            for room in range(gpus, len(by_free)):
                if by_free[room]:
                    index = by_free[room].pop()
                    self._move(index, room - gpus)
                    return [index]
            return None
        # Multi-node job: needs ceil(gpus / node_size) bins that are whole free nodes.
        needed = -(-gpus // self.node_size)
        whole = [i for room in range(self.node_size, len(by_free)) for i in by_free[room]]
        if len(whole) < needed:
            return None
        used = sorted(whole)[:needed]
        for index in used:
            by_free[self.free[index]].remove(index)
            self._move(index, 0)
        return used

    def peek(self, gpus: int) -> list[int] | None:
        """The bins :meth:`place` would use for a job of ``gpus``, without placing it."""
        if gpus <= 0:
            return []
        if gpus > self.total:
            return None
        by_free = self._by_free
        if gpus <= self.node_size:
            for room in range(gpus, len(by_free)):
                if by_free[room]:
                    return [by_free[room][-1]]
            return None
        needed = -(-gpus // self.node_size)
        whole = [i for room in range(self.node_size, len(by_free)) for i in by_free[room]]
        if len(whole) < needed:
            return None
        return sorted(whole)[:needed]

    def copy(self) -> Bins:
        """An independent copy (to try a packing and keep it or not)."""
        other = Bins.__new__(Bins)
        other.free = list(self.free)
        other.owners = list(self.owners)
        other.node_size = self.node_size
        other.total = self.total
        other._by_free = [list(b) for b in self._by_free]
        return other

    def whole(self) -> int:
        """How many bins are whole free nodes (what a multi-node job can use)."""
        if not self.node_size:
            return 0
        return sum(len(b) for b in self._by_free[self.node_size:])

    def _move(self, index: int, room: int) -> None:
        self.total -= self.free[index] - room
        self.free[index] = room
        self._by_free[room].append(index)


@dataclass(frozen=True, slots=True)
class Demand:
    """The outcome of absorbing a pool's pending jobs into existing capacity (totals precomputed)."""

    ordered: tuple[Job, ...]  # every pending job, in scheduling order
    onprem_absorbed: tuple[Job, ...]
    burst_absorbed: tuple[Job, ...]
    unmet: tuple[Job, ...]  # fits nowhere: candidates for new nodes
    busy_nodes: frozenset[str]  # ready burst nodes that absorbed some pending job
    beyond_onprem: tuple[Job, ...] = ()  # jobs on-prem cannot start now (the trigger looks at these)
    pending_gpus: int = 0
    unmet_gpus: int = 0
    oldest_beyond: datetime | None = None  # submit time of the oldest job on-prem cannot start
    # Burst capacity left after absorbing (free GPUs of ready and booting nodes): scale-up packs
    # the unmet jobs onto it first, so a multi-node job can use whole nodes already there.
    burst: Bins | None = None

    def oldest_wait_s(self, now: datetime) -> float:
        if self.oldest_beyond is None:
            return 0.0
        return max((now - self.oldest_beyond).total_seconds(), 0.0)


def scheduling_order(jobs: tuple[Job, ...] | list[Job], policy: Policy) -> list[Job]:
    """Higher project priority first, then higher job priority, then oldest, then id."""
    priorities = {p.name: p.priority for p in policy.projects}
    default = policy.default_project_priority
    # Two stable passes: queues arrive mostly in submit order, which makes the first pass nearly
    # linear, and the second pass only runs when priorities differ.
    ordered = sorted(jobs, key=_submit_key)
    if priorities or default or any(j.priority for j in ordered):
        ordered.sort(key=lambda j: (-priorities.get(j.project, default), -j.priority))
    return ordered


def _submit_key(job: Job) -> tuple:
    return (job.submitted_at, job.id)


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
    node_size = 0
    for node in nodes:
        if node.state is NodeState.READY and node.gpus_free > 0:
            burst_free.append(node.gpus_free)
            owners.append(node.id)
        elif node.state.in_flight:
            burst_free.append(node.gpus)
            owners.append(node.id)
        else:
            continue
        node_size = max(node_size, node.gpus)
    # The node size is that of the nodes, not of their largest free remainder: with only
    # half-busy 8-GPU nodes, a 6-GPU job must not count as a "multi-node" job spread over two
    # 4-GPU remainders (it fits on neither node).
    burst = Bins(burst_free, owners, node_size=node_size)

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
    beyond = tuple(burst_absorbed) + tuple(unmet)
    oldest = min((j.submitted_at for j in beyond), default=None)
    return Demand(tuple(ordered), tuple(onprem_absorbed), tuple(burst_absorbed), tuple(unmet),
                  frozenset(busy), beyond, sum(j.gpus for j in ordered), sum(j.gpus for j in unmet),
                  oldest, burst)


def oldest_wait_s(jobs: tuple[Job, ...], now: datetime) -> float:
    if not jobs:
        return 0.0
    return max((now - min(j.submitted_at for j in jobs)).total_seconds(), 0.0)
