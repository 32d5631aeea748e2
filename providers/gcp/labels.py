"""GCP naming and the instance resource: burst's node <-> a Compute Engine instance, both ways.

Instance names, ownership tags as GCP labels (and their exact copy in metadata), cost-allocation
tags as labels (``burst-project``, ``burst-user`` and the policy's ``tags:``, which the billing
export carries), GCE's request ids,
instance ids, the status table, the body inserted for a launch and the ``Instance`` read back. See
the package docstring (``providers.gcp``) for the rules. Imports ``orchestrator.domain`` and
``google.cloud.compute_v1`` only.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import uuid
from collections.abc import Mapping
from typing import Any

from google.cloud import compute_v1

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.offerings import offering_key
from orchestrator.domain.ports import Instance, InstanceState, LaunchRequest
from orchestrator.policy.timefmt import parse_aware

log = logging.getLogger(__package__)

PROVIDER_NAME = "gcp"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

# Ownership tag key <-> GCP label key (label keys allow [a-z0-9_-], not ':').
LABEL_KEYS: dict[str, str] = {
    key: key.replace(":", "-") for key in OwnershipTags("c", "p", "n", "r").as_dict()
}
TAG_KEYS: dict[str, str] = {label: tag for tag, label in LABEL_KEYS.items()}
CLUSTER_TAG = f"{OwnershipTags.PREFIX}:cluster"
REQUEST_TAG = f"{OwnershipTags.PREFIX}:request-id"
CLUSTER_LABEL = LABEL_KEYS[CLUSTER_TAG]

META_USER_DATA = "user-data"
META_NODE_ID = "burst-node-id"
META_TAGS = "burst-tags"
META_OFFERING = "burst-offering"
# GCE's limit for one metadata value.
MAX_METADATA_VALUE_BYTES = 256 * 1024

GOING = frozenset({InstanceState.STOPPING, InstanceState.TERMINATED})

_STATES: dict[str, InstanceState] = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "PENDING_STOP": InstanceState.STOPPING,
    "STOPPING": InstanceState.STOPPING,
    "SUSPENDING": InstanceState.STOPPING,
    "SUSPENDED": InstanceState.STOPPING,
    "STOPPED": InstanceState.STOPPING,
    "REPAIRING": InstanceState.STOPPING,
    "TERMINATED": InstanceState.TERMINATED,
}

# Machine families whose machine types include their GPUs; the others (N1) need guestAccelerators.
_BUILTIN_GPU_FAMILIES = ("a2-", "a3-", "a4-", "a4x-", "g2-", "g4-")

_UUID_NAMESPACE = uuid.UUID("6f1c2a52-61a5-4bd4-9f5a-6a3f0f6c9b1e")  # burst's GCE requestIds
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
IMAGE_RE = re.compile(
    r"(?:^|/)(?:projects/(?P<project>[^/]+)/)?global/images/"
    r"(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))$"
)


# -- naming ----------------------------------------------------------------------------------------


def instance_name(node_id: str) -> str:
    """The GCE instance name of a node: ``burst-<node id>``, made RFC 1035-valid if it is not."""
    plain = f"burst-{node_id}"
    if _NAME_RE.match(plain):
        return plain
    cleaned = re.sub(r"[^a-z0-9-]+", "-", node_id.lower()).strip("-")
    digest = hashlib.sha256(node_id.encode()).hexdigest()[:8]
    head = f"burst-{cleaned}"[: 63 - 9].rstrip("-")
    # The digest keeps two node ids that sanitise alike from sharing a name.
    return f"{head}-{digest}"


def label_value(value: str) -> str:
    """A GCP label value for ``value``: lower case, ``[a-z0-9_-]``, at most 63 characters."""
    return re.sub(r"[^a-z0-9_-]", "-", value.lower())[:63]


def labels_for(tags: OwnershipTags) -> dict[str, str]:
    return {LABEL_KEYS[key]: label_value(value) for key, value in tags.as_dict().items()}


def cost_labels(cost_tags: Mapping[str, str]) -> dict[str, str]:
    """Cost-allocation tags as labels: ``burst:`` keys spelled ``burst-``, values made label-valid
    (a user ``Ada.L@lab`` is ``ada-l-lab``; the policy's own tags are label-valid already)."""
    return {key.replace(":", "-", 1) if key.startswith(f"{OwnershipTags.PREFIX}:") else key:
            label_value(value) for key, value in cost_tags.items()}


def tags_from_labels(labels: dict[str, str]) -> dict[str, str]:
    """The inverse key map (values as the labels hold them)."""
    return {TAG_KEYS[key]: value for key, value in labels.items() if key in TAG_KEYS}


def gce_request_id(request_id: str, attempt: int = 0) -> str:
    """GCE's idempotency key for a launch attempt of ``request_id`` (deterministic UUID5)."""
    name = request_id if attempt == 0 else f"{request_id}#{attempt}"
    return str(uuid.uuid5(_UUID_NAMESPACE, name))


def parse_instance_id(instance_id: str) -> tuple[str | None, str]:
    """``"zone/name"`` -> (zone, name); a bare name -> (None, name)."""
    zone, sep, name = instance_id.rpartition("/")
    return (zone or None) if sep else None, name


def last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def has_builtin_gpus(machine_type: str) -> bool:
    return machine_type.startswith(_BUILTIN_GPU_FAMILIES)


# -- the instance resource -------------------------------------------------------------------------


def instance_body(cfg: Any, req: LaunchRequest, zone: str, name: str) -> compute_v1.Instance:
    """The instance resource inserted for ``req``: labels, metadata, boot disk, NIC, scheduling."""
    offering = req.offering
    labels = {**cost_labels(req.cost_tags), **labels_for(req.tags)}
    metadata = compute_v1.Metadata(
        items=[
            compute_v1.Items(key=META_USER_DATA, value=req.user_data),
            compute_v1.Items(key=META_NODE_ID, value=req.tags.node_id),
            compute_v1.Items(
                key=META_TAGS, value=json.dumps(req.tags.as_dict(), sort_keys=True)
            ),
            compute_v1.Items(key=META_OFFERING, value=offering.key),
        ]
    )
    disk_type = getattr(cfg, "disk_type", None) or "pd-balanced"
    boot = compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,  # the disk goes with the VM: nothing to leak on terminate
        type_="PERSISTENT",
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=cfg.image,
            disk_size_gb=int(cfg.disk_size_gb),
            disk_type=f"zones/{zone}/diskTypes/{disk_type}",
            # A VM's labels do not reach its disk: the boot disk is billed apart, label it too.
            labels=labels,
        ),
    )
    nic = compute_v1.NetworkInterface(network=cfg.network)
    if getattr(cfg, "subnetwork", None):
        nic.subnetwork = cfg.subnetwork
    if getattr(cfg, "external_ip", False):
        nic.access_configs = [
            compute_v1.AccessConfig(name="External NAT", type_="ONE_TO_ONE_NAT")
        ]
    # GPU VMs cannot live-migrate; and a VM restarted by GCE would boot again with a join
    # token already spent, so burst replaces lost nodes instead of letting GCE restart them.
    scheduling = compute_v1.Scheduling(on_host_maintenance="TERMINATE", automatic_restart=False)
    if str(offering.market) == "spot":
        scheduling.provisioning_model = "SPOT"
        scheduling.instance_termination_action = "DELETE"  # preempted = gone, not stopped
    else:
        scheduling.provisioning_model = "STANDARD"
    body = compute_v1.Instance(
        name=name,
        machine_type=f"zones/{zone}/machineTypes/{offering.instance_type}",
        labels=labels,
        metadata=metadata,
        disks=[boot],
        network_interfaces=[nic],
        scheduling=scheduling,
    )
    if getattr(cfg, "service_account", None):
        body.service_accounts = [
            compute_v1.ServiceAccount(email=cfg.service_account, scopes=list(SCOPES))
        ]
    if req.placement_group:
        # the launch group's compact placement policy (providers.gcp.groups)
        body.resource_policies = [
            f"projects/{cfg.project}/regions/{region_of(zone)}/resourcePolicies/{req.placement_group}"
        ]
    accelerator = (getattr(cfg, "accelerators", None) or {}).get(offering.instance_type)
    if accelerator is not None and not has_builtin_gpus(offering.instance_type):
        body.guest_accelerators = [
            compute_v1.AcceleratorConfig(
                accelerator_type=f"zones/{zone}/acceleratorTypes/{accelerator.type}",
                accelerator_count=int(accelerator.count),
            )
        ]
    return body


def to_instance(raw: compute_v1.Instance, zone: str) -> Instance:
    """Our ``Instance`` for a GCE instance (tags from the exact metadata copy, else the labels)."""
    zone = last_segment(raw.zone) if raw.zone else zone
    metadata = {item.key: item.value for item in raw.metadata.items}
    tags = tags_from_labels(dict(raw.labels))
    with contextlib.suppress(ValueError, TypeError):
        exact = json.loads(metadata.get(META_TAGS, ""))
        if isinstance(exact, dict) and all(isinstance(v, str) for v in exact.values()):
            tags = exact
    state = _STATES.get(raw.status)
    if state is None:
        log.warning(
            "instance %s/%s has unknown status %r; treating it as pending",
            zone,
            raw.name,
            raw.status,
        )
        state = InstanceState.PENDING
    key = metadata.get(META_OFFERING)
    if not key and raw.machine_type:
        spot = raw.scheduling.provisioning_model == "SPOT" or raw.scheduling.preemptible
        key = offering_key(
            PROVIDER_NAME,
            region_of(zone),
            zone,
            last_segment(raw.machine_type),
            "spot" if spot else "on-demand",
        )
    launched_at = None
    if raw.creation_timestamp:
        with contextlib.suppress(ValueError):
            launched_at = parse_aware(raw.creation_timestamp, "creationTimestamp",
                                      assume_utc=True)
    return Instance(
        id=f"{zone}/{raw.name}",
        provider=PROVIDER_NAME,
        state=state,
        tags=tags,
        offering_key=key or None,
        launched_at=launched_at,
    )
