"""AWS placement: a multi-node job's nodes in one EC2 **cluster placement group**.

``AwsPlacement`` is the ``placement`` capability of :class:`~providers.aws.adapter.AwsProvider`
(the ``Placement`` port). One group per launch group, named ``burst-<group id>`` in the
offering's region, created with ``Strategy=cluster`` (EC2 packs its instances close together in
one Availability Zone: the low-latency, high-bandwidth placement EFA training wants) and tagged at
creation with our ownership tags (``burst:cluster``, ``burst:policy``, ``burst:group``), so the
reconciler finds it by tag like an instance:

* ``create_group`` is idempotent: a group of that name already there (``InvalidPlacementGroup.
  Duplicate``) is read back and returned, provided it carries our group tag;
* ``delete_group`` of a group already gone (``InvalidPlacementGroup.Unknown``) returns normally;
  one still holding instances (``InvalidPlacementGroup.InUse``: EC2 refuses until they are
  terminated) is a ``TransientError``: deleted again on a later sweep;
* ``list_owned_groups`` asks every region in use, by the cluster tag.

API shapes: CreatePlacementGroup, DeletePlacementGroup and DescribePlacementGroups of the EC2 API
reference (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_CreatePlacementGroup.html).
"""

from __future__ import annotations

import logging
from typing import Any

import botocore.exceptions as bce

from orchestrator.domain.offerings import Offering
from orchestrator.domain.placement import GroupTags, PlacementGroup
from orchestrator.domain.ports import InvalidRequest, TransientError
from providers.aws.errors import Context, ec2_errors
from providers.aws.tags import PROVIDER_NAME

log = logging.getLogger(__package__)

_NAME_MAX = 255  # EC2's limit on a placement group name
_DUPLICATE = "InvalidPlacementGroup.Duplicate"
_UNKNOWN = "InvalidPlacementGroup.Unknown"
_IN_USE = "InvalidPlacementGroup.InUse"


def group_name(group_id: str) -> str:
    """The EC2 name of a launch group's placement group."""
    return ("burst-" + group_id)[:_NAME_MAX]


class AwsPlacement:
    """Cluster placement groups through the provider's clients (see the module docstring)."""

    def __init__(self, provider: Any):
        self.provider = provider  # the AwsProvider: its clients, regions and error handling

    def create_group(self, group_id: str, offering: Offering, size: int,
                     tags: GroupTags) -> PlacementGroup:
        name = group_name(group_id)
        ec2 = self.provider._client(offering.region, launch=True)
        ctx = Context(offering.key, group_id)
        tag_list = [{"Key": k, "Value": v} for k, v in {**tags.as_dict(), "Name": name}.items()]
        with ec2_errors(ctx):
            try:
                ec2.create_placement_group(
                    GroupName=name, Strategy="cluster",
                    TagSpecifications=[{"ResourceType": "placement-group", "Tags": tag_list}])
            except bce.ClientError as exc:
                if _code(exc) != _DUPLICATE:
                    raise
                log.info("placement group %s already there: reading it back", name)
        found = self._describe(offering.region, [{"Name": "group-name", "Values": [name]}], ctx)
        if not found:
            raise TransientError(f"placement group {name} created but not listed yet",
                                 provider=PROVIDER_NAME, offering_key=offering.key,
                                 request_id=group_id, code="NotListedYet")
        group = found[0]
        owner = group.ownership
        if owner is None or owner.group != tags.group:
            raise InvalidRequest(f"placement group {name} exists and is not ours "
                                 f"(tags {group.tags})", provider=PROVIDER_NAME,
                                 offering_key=offering.key, request_id=group_id,
                                 code="PlacementGroupNotOurs")
        log.info("placement group %s (cluster) for %d node(s) of %s", name, size, offering.key)
        return group

    def delete_group(self, group: PlacementGroup) -> None:
        ec2 = self.provider._client(group.region, launch=True)
        with ec2_errors(Context(None, group.name)):
            try:
                ec2.delete_placement_group(GroupName=group.name)
            except bce.ClientError as exc:
                code = _code(exc)
                if code == _UNKNOWN:
                    return  # already gone: done
                if code == _IN_USE:
                    raise TransientError(
                        f"placement group {group.name} still holds instances",
                        provider=PROVIDER_NAME, request_id=group.name, code=code) from exc
                raise
        log.info("deleted placement group %s in %s", group.name, group.region)

    def list_owned_groups(self, cluster: str) -> list[PlacementGroup]:
        owned: list[PlacementGroup] = []
        for region in self.provider._regions_in_use():
            owned.extend(self._describe(region, [{"Name": "tag:burst:cluster",
                                                  "Values": [cluster]}], Context()))
        return owned

    def _describe(self, region: str, filters: list[dict[str, Any]], ctx: Context
                  ) -> list[PlacementGroup]:
        ec2 = self.provider._client(region)
        with ec2_errors(ctx):
            try:
                reply = ec2.describe_placement_groups(Filters=filters)
            except bce.ClientError as exc:
                if _code(exc) == _UNKNOWN:
                    return []
                raise
        groups = []
        for raw in reply.get("PlacementGroups", []):
            if raw.get("State") == "deleted":
                continue
            tags = {t["Key"]: t["Value"] for t in raw.get("Tags") or ()}
            groups.append(PlacementGroup(raw["GroupName"], PROVIDER_NAME, region, None, tags,
                                         raw.get("GroupId")))
        return groups


def _code(exc: bce.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code") or "")
