"""Burst nodes: the cloud capacity burst owns, and the states a node passes through."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from orchestrator.policy.models import Market


class NodeState(StrEnum):
    """States of a burst node; the allowed edges are in :mod:`orchestrator.lifecycle`."""

    REQUESTED = "requested"  # intent recorded with a request id; provider not yet called back
    LAUNCHING = "launching"  # provider accepted the launch and returned an instance id
    BOOTING = "booting"  # the instance is running; its agent has not registered yet
    JOINING = "joining"  # the agent registered; the node is joining the fabric
    READY = "ready"  # joined: runs work
    DRAINING = "draining"  # takes no new work; waits for running work to finish or hand back
    TERMINATING = "terminating"  # terminate sent; waiting for the provider to confirm
    TERMINATED = "terminated"  # the provider confirmed the instance is gone (terminal)
    FAILED = "failed"  # something went wrong; the instance, if any, must still be terminated

    @property
    def is_terminal(self) -> bool:
        return self is NodeState.TERMINATED

    @property
    def in_flight(self) -> bool:
        """Requested but not yet usable: counts toward demand already being answered."""
        return self in _IN_FLIGHT

    @property
    def counts_toward_limits(self) -> bool:
        """Occupies a node slot and costs money (everything not yet confirmed gone)."""
        return self is not NodeState.TERMINATED


_IN_FLIGHT = frozenset(
    {NodeState.REQUESTED, NodeState.LAUNCHING, NodeState.BOOTING, NodeState.JOINING}
)


@dataclass(frozen=True, slots=True)
class OwnershipTags:
    """Tags every instance burst creates carries; the reconciler finds its instances by them."""

    cluster: str
    policy: str
    node_id: str
    request_id: str

    PREFIX = "burst"

    def as_dict(self) -> dict[str, str]:
        return {
            f"{self.PREFIX}:cluster": self.cluster,
            f"{self.PREFIX}:policy": self.policy,
            f"{self.PREFIX}:node-id": self.node_id,
            f"{self.PREFIX}:request-id": self.request_id,
        }

    @classmethod
    def from_dict(cls, tags: dict[str, str]) -> OwnershipTags | None:
        try:
            return cls(
                cluster=tags[f"{cls.PREFIX}:cluster"],
                policy=tags[f"{cls.PREFIX}:policy"],
                node_id=tags[f"{cls.PREFIX}:node-id"],
                request_id=tags[f"{cls.PREFIX}:request-id"],
            )
        except KeyError:
            return None


@dataclass(frozen=True, slots=True)
class Node:
    """A burst node as recorded in the store (a copy; never a live reference)."""

    id: str
    policy: str
    pool: str
    provider: str
    offering_key: str
    instance_type: str
    market: Market
    gpus: int
    price_usd_hour: float
    state: NodeState
    state_since: datetime
    created_at: datetime
    request_id: str
    instance_id: str | None = None
    project: str | None = None  # the project whose demand launched it
    gpus_busy: int = 0
    running_jobs: int = 0
    idle_since: datetime | None = None  # since when it has run nothing; None while busy
    last_heartbeat: datetime | None = None
    drain_deadline: datetime | None = None
    released: bool = False  # fabric reports the node runs nothing and may go
    launch_attempts: int = 0
    version: int = 0
    # Budget committed at launch (USD): price x billed expected lifetime, see
    # orchestrator.planner.budgets. Budgets count what of it is not yet spent.
    budget_commit_usd: float = 0.0
    # Measured GPU use (orchestrator.domain.utilisation): the mean utilisation of the last
    # reading of its GPUs (those a job holds, else all; None: unknown, never 0) and since when
    # its allocated GPUs sit under utilisation.idle_below_percent (None: not low, or unknown).
    gpu_utilisation_percent: float | None = None
    low_utilisation_since: datetime | None = None
    # The pending jobs its launch was for (the plan's Launch.jobs; empty: min-nodes, pre-warm, a
    # baseline's node). A dispatcher hands the node to these first while they are still pending
    # (orchestrator.sources.builtin, the simulator), so the planner's per-job choice holds.
    launched_for: tuple[str, ...] = ()

    @property
    def gpus_free(self) -> int:
        return max(self.gpus - self.gpus_busy, 0)
