"""libcloud ownership: burst's tags in node metadata or, failing that, in the node name; states.

See the package docstring (``providers.libcloud_driver``, "Ownership and idempotency"). Imports
``orchestrator.domain`` and ``libcloud`` only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from libcloud.compute.base import Node
from libcloud.compute.types import NodeState

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.ports import InstanceState, InvalidRequest, LaunchRequest

log = logging.getLogger(__package__)

PROVIDER_NAME = "libcloud"
TAG_PREFIX = OwnershipTags.PREFIX + ":"
_TAG_FIELDS = ("cluster", "policy", "node-id", "request-id")
# GCE instance metadata keys are [a-zA-Z0-9-_]{1,128}: no ':'.
DASH_KEY_DRIVERS = frozenset({"gce"})
NAME_SEPARATOR = "--"

_STATES: dict[str, InstanceState] = {
    NodeState.RUNNING: InstanceState.RUNNING,
    # A server being resized, migrated or updated is still up and still ours to use.
    NodeState.RECONFIGURING: InstanceState.RUNNING,
    NodeState.MIGRATING: InstanceState.RUNNING,
    NodeState.UPDATING: InstanceState.RUNNING,
    NodeState.NORMAL: InstanceState.RUNNING,
    NodeState.PENDING: InstanceState.PENDING,
    NodeState.STARTING: InstanceState.PENDING,
    NodeState.REBOOTING: InstanceState.PENDING,
    # Stopped or suspended servers do no work for burst but are still billed: the reconciler
    # treats them as going away and terminates them.
    NodeState.STOPPING: InstanceState.STOPPING,
    NodeState.STOPPED: InstanceState.STOPPING,
    NodeState.SUSPENDED: InstanceState.STOPPING,
    NodeState.PAUSED: InstanceState.STOPPING,
    NodeState.TERMINATED: InstanceState.TERMINATED,
}


def node_name(req: LaunchRequest, *, has_metadata: bool, driver_name: str) -> str:
    """The node's name: its node id, or the ownership itself where the driver has no metadata."""
    if has_metadata:
        return req.tags.node_id
    parts = (req.tags.cluster, req.tags.policy, req.tags.node_id, req.tags.request_id)
    if any(NAME_SEPARATOR in p or not p for p in parts):
        raise InvalidRequest(
            f"driver {driver_name} keeps ownership in the node name, which needs "
            f"cluster, policy, node id and request id without {NAME_SEPARATOR!r}",
            provider=PROVIDER_NAME, offering_key=req.offering.key, request_id=req.request_id,
            code="UnencodableName",
        )
    return NAME_SEPARATOR.join(("burst", *parts))


def write_tags(tags: OwnershipTags, *, dash_keys: bool,
               cost: Mapping[str, str] | None = None) -> dict[str, str]:
    """The metadata a node is created with: the cost-allocation tags and the ownership tags
    (``burst-*`` keys for GCE). Drivers without metadata get neither (the name holds ownership)."""
    written = {**(cost or {}), **tags.as_dict()}
    if dash_keys:
        written = {k.replace(":", "-", 1) if k.startswith(TAG_PREFIX) else k: v
                   for k, v in written.items()}
    return written


def read_tags(node: Node, *, has_metadata: bool) -> dict[str, str]:
    """Our tags on ``node``, whichever way the driver reports them (keys as ``burst:*``)."""
    extra = node.extra or {}
    raw: dict[str, Any] = {}
    for field in ("metadata", "tags", "labels"):
        value = extra.get(field)
        if isinstance(value, Mapping) and isinstance(value.get("items"), list):
            # GCE's metadata: {"items": [{"key": ..., "value": ...}]}
            value = {i.get("key"): i.get("value") for i in value["items"]
                     if isinstance(i, Mapping)}
        if isinstance(value, Mapping):
            raw.update(value)
    tags = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not isinstance(value, str):
            continue
        for spelled in (":", "-"):
            prefix = f"{OwnershipTags.PREFIX}{spelled}"
            if key.startswith(prefix) and key[len(prefix):] in _TAG_FIELDS:
                tags[TAG_PREFIX + key[len(prefix):]] = value
    if not tags and not has_metadata and node.name:
        parts = str(node.name).split(NAME_SEPARATOR)
        if len(parts) == 5 and parts[0] == "burst":
            tags = OwnershipTags(*parts[1:]).as_dict()
    return tags


def state_of(node: Node) -> InstanceState:
    """Our state for a libcloud node (ERROR / UNKNOWN: stopping)."""
    state = _STATES.get(node.state)
    if state is None:
        # ERROR / UNKNOWN: the instance is no use to burst; "stopping" makes the reconciler
        # terminate it rather than wait for it.
        log.warning("instance %s is in libcloud state %s: treated as stopping", node.id,
                    node.state)
        return InstanceState.STOPPING
    return state


def utc(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
