"""Placement groups: the nodes of one multi-node job launched together, close on the network.

A launch group (``Launch.group``) becomes one provider placement group: an AWS cluster placement
group, a GCP compact placement resource policy. The group is a recorded resource, like a node:
its intent is written before the provider call that creates it and its deletion before the call
that deletes it, so a crash anywhere leaves a record the reconciler can finish; and it carries our
ownership tags, so one with no live record is found and collected like a leaked instance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum


class GroupState(StrEnum):
    """Where a placement group is in its life (recorded before each side effect)."""

    REQUESTED = "requested"  # intent recorded; the provider's create not (known to be) done
    ACTIVE = "active"  # created at the provider; its nodes launch into it
    DELETING = "deleting"  # intent to delete recorded; the provider's delete not confirmed
    DELETED = "deleted"  # gone at the provider (terminal)


@dataclass(frozen=True, slots=True)
class GroupTags:
    """Ownership tags every placement group burst creates carries."""

    cluster: str
    policy: str
    group: str

    PREFIX = "burst"

    def as_dict(self) -> dict[str, str]:
        return {f"{self.PREFIX}:cluster": self.cluster, f"{self.PREFIX}:policy": self.policy,
                f"{self.PREFIX}:group": self.group}

    @classmethod
    def from_dict(cls, tags: dict[str, str]) -> GroupTags | None:
        try:
            return cls(tags[f"{cls.PREFIX}:cluster"], tags[f"{cls.PREFIX}:policy"],
                       tags[f"{cls.PREFIX}:group"])
        except KeyError:
            return None


@dataclass(frozen=True, slots=True)
class PlacementGroup:
    """A provider's view of one placement group. ``name``: the provider-side name (what a launch
    names); ``region``/``zone``: where it holds nodes."""

    name: str
    provider: str
    region: str
    zone: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    id: str | None = None  # the provider's own id (EC2 GroupId, GCE selfLink), where it has one

    @property
    def ownership(self) -> GroupTags | None:
        return GroupTags.from_dict(self.tags)


@dataclass(frozen=True, slots=True)
class GroupRecord:
    """A placement group as the store records it: the launch group id, where, for which nodes."""

    group_id: str
    policy: str
    provider: str
    region: str
    zone: str | None
    offering_key: str
    size: int
    node_ids: tuple[str, ...]
    state: GroupState
    state_since: datetime
    created_at: datetime
    name: str | None = None  # provider-side name, once created
    reason: str = ""

    @property
    def alive(self) -> bool:
        return self.state is not GroupState.DELETED

    def as_group(self) -> PlacementGroup:
        """The provider-side group this record stands for (for a delete call)."""
        return PlacementGroup(self.name or self.group_id, self.provider, self.region, self.zone)
