"""Ports: the small interfaces behind which everything that touches the world sits.

Executors and observers call these; the planner never does. Concrete implementations live in
``providers/`` (clouds), ``orchestrator/sources/`` (queues) and ``orchestrator/fabric/`` (joining a
node to the training fabric), and only ``orchestrator.wiring`` chooses them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import NamedTuple, Protocol, runtime_checkable

from orchestrator.domain.nodes import Node, OwnershipTags
from orchestrator.domain.offerings import Offering
from orchestrator.domain.placement import GroupTags, PlacementGroup
from orchestrator.domain.snapshot import PoolQueue


class InstanceState(StrEnum):
    """A provider instance's state, normalised across providers."""

    PENDING = "pending"  # accepted, not yet running
    RUNNING = "running"
    STOPPING = "stopping"  # shutting down / terminating at the provider
    TERMINATED = "terminated"  # gone (providers may list it for a while, or not at all)


@dataclass(frozen=True, slots=True)
class LaunchRequest:
    """Everything a provider needs to launch one node.

    ``request_id`` is the idempotency token: launching twice with the same id yields one instance.
    ``user_data`` is the node's bootstrap (node id, controller address, join token), delivered the
    way the provider delivers user-data/metadata. ``cost_tags`` are the cost-allocation tags the
    instance carries besides its ownership (``burst:project``, ``burst:user``, the policy's
    ``tags:``; see :mod:`orchestrator.policy.tags`), written as the provider writes tags.
    """

    request_id: str
    offering: Offering
    tags: OwnershipTags
    user_data: str
    # The provider-side name of the placement group the node launches into (None: none).
    placement_group: str | None = None
    cost_tags: Mapping[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Instance:
    """A provider's view of one instance."""

    id: str
    provider: str
    state: InstanceState
    tags: dict[str, str] = field(default_factory=dict)
    offering_key: str | None = None
    launched_at: datetime | None = None

    @property
    def ownership(self) -> OwnershipTags | None:
        return OwnershipTags.from_dict(self.tags)


class CheckRow(NamedTuple):
    """One line of ``burst provider check``: what was checked, whether it passed, and why."""

    check: str
    ok: bool
    detail: str


class ProviderError(Exception):
    """Base of the typed provider errors. The SDK's own error is kept as ``__cause__``."""

    retryable = False

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        offering_key: str | None = None,
        request_id: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.provider = provider
        self.offering_key = offering_key
        self.request_id = request_id
        self.code = code

    @property
    def kind(self) -> str:
        return type(self).__name__


class CapacityError(ProviderError):
    """The offering has no capacity now: try the next offering; back off this one."""


class QuotaError(ProviderError):
    """An account quota/limit stops the launch: do not retry until the quota changes."""


class AuthError(ProviderError):
    """Credentials or permissions are wrong: stop using the provider and alert."""


class TransientError(ProviderError):
    """A temporary failure (throttling, 5xx, timeout): retry with backoff."""

    retryable = True


class InvalidRequest(ProviderError):
    """The request is malformed (a bug or a bad policy): never retried."""


@runtime_checkable
class Provider(Protocol):
    """A cloud (or local, or simulated) source of GPU nodes.

    The contract every adapter keeps, and that the contract test suite checks:

    * **Eventually consistent.** An instance returned by ``launch`` may be missing from
      ``list_owned``/``describe`` for a while, and a terminated one may still be listed as
      ``stopping``/``terminated``. Callers never treat one missing observation as proof.
    * **Idempotent on the request id.** ``launch`` with a ``request_id`` already used returns the
      instance(s) created by the first call, in whatever state they are now ("already done" is a
      normal return, not an error) and creates nothing.
    * **Ownership by tags.** Every instance carries ``req.tags`` (cluster, policy, node id, request
      id). ``list_owned(cluster)`` returns exactly the non-terminated-or-recently-terminated
      instances carrying that cluster tag; the reconciler trusts nothing else.
    * ``terminate`` is idempotent: ids already gone or unknown return normally.
    * Errors are typed: :class:`CapacityError`, :class:`QuotaError`, :class:`AuthError`,
      :class:`TransientError`, :class:`InvalidRequest`; each carries provider, offering and request
      id, with the SDK's error as ``__cause__``. Nothing else escapes.

    Usage::

        provider = wiring.provider("aws", policy)
        [instance] = provider.launch(LaunchRequest(request_id, offering, tags, user_data))
        provider.terminate([instance.id])
    """

    name: str
    # Optional capability, read with getattr (default None): the shell command with which an
    # instance of this provider stops itself for good (aws, gcp: ``shutdown -h now``), carried to
    # the node in its bootstrap for the agent's dead-man switch; None where it cannot.
    # self_terminate_command: str | None

    def offerings(self) -> list[Offering]:
        """GPU instance types this provider can launch, with prices."""
        ...

    def launch(self, req: LaunchRequest) -> list[Instance]:
        """Launch one node for ``req``; idempotent on ``req.request_id``."""
        ...

    def describe(self, ids: list[str]) -> list[Instance]:
        """Current view of the given instances (unknown ids are omitted)."""
        ...

    def list_owned(self, cluster: str) -> list[Instance]:
        """Every instance carrying this cluster's ownership tag."""
        ...

    def terminate(self, ids: list[str]) -> None:
        """Terminate the instances; idempotent."""
        ...


@runtime_checkable
class GroupPlacement(Protocol):
    """Placement groups of a provider: the optional ``placement`` capability of a Provider
    (read with ``getattr(provider, "placement", None)``; None: the provider places no groups).

    The same contract as the provider's: idempotent on the group id (creating a group that is
    already there with our tags returns it), ownership by tags (``list_owned_groups(cluster)``
    returns exactly the groups carrying that cluster's tag), ``delete_group`` idempotent (a group
    already gone returns normally), errors typed as :class:`ProviderError` s. A group still
    holding instances may refuse deletion with a :class:`TransientError`: delete it again once
    they are gone.
    """

    def create_group(self, group_id: str, offering: Offering, size: int,
                     tags: GroupTags) -> PlacementGroup:
        """Create (or find) the group for ``size`` nodes of ``offering``; idempotent."""
        ...

    def delete_group(self, group: PlacementGroup) -> None:
        """Delete the group; idempotent."""
        ...

    def list_owned_groups(self, cluster: str) -> list[PlacementGroup]:
        """Every placement group carrying this cluster's ownership tag."""
        ...


class QueueSource(Protocol):
    """Where pending work comes from (the built-in queue, Slurm, a trace)."""

    def observe(self, now: datetime) -> dict[str, PoolQueue]:
        """The queue of each pool: pending jobs and on-prem capacity."""
        ...


class Fabric(Protocol):
    """The training fabric burst nodes join (built-in queue agents, Slurm, torch elastic)."""

    name: str

    def request_release(self, node: Node, deadline: datetime) -> None:
        """Ask the fabric to stop giving the node work and release it by ``deadline``."""
        ...

    def is_released(self, node: Node) -> bool:
        """True once the node runs nothing that would lose progress if it went away."""
        ...

    def node_gone(self, node: Node, at: datetime) -> int:
        """The node failed or is being terminated: hand its work back; returns jobs requeued."""
        ...


class Clock(Protocol):
    """The only source of time for executors, reconcilers and loops (injected, never patched)."""

    def now(self) -> datetime:
        """Current time, timezone-aware UTC."""
        ...
