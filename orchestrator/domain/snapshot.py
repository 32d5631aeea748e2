"""The Snapshot: everything the planner may know about the world at one instant.

Observers build it from copies (queue sources, the store, provider catalogues); the planner reads
it and nothing else. Its JSON form is documented by ``burst plan --snapshot-schema`` so a scenario
can be written by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

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
class PoolQueue:
    """The queue of one pool: pending jobs and on-prem capacity."""

    pool: str
    onprem: OnPremState
    pending: tuple[Job, ...] = ()
    running_onprem_jobs: int = 0
    running_burst_jobs: int = 0


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
class Snapshot:
    """World state at ``taken_at``."""

    taken_at: datetime
    queues: dict[str, PoolQueue] = field(default_factory=dict)
    nodes: tuple[Node, ...] = ()
    offerings: tuple[Offering, ...] = ()
    capacity_blocks: tuple[CapacityBlock, ...] = ()
    memory: dict[str, PolicyMemory] = field(default_factory=dict)
    paused_pools: frozenset[str] = frozenset()
