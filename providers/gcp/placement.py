"""GCP placement: which configured zone a launch goes to, and whether an offering can launch at all.

An offering is refused (``InvalidRequest``) when it is not GCP's, its zone or region is not
configured, its machine type has no built-in GPUs and the policy's ``gcp.accelerators`` attaches
none (or another count), or the user data exceeds GCE's metadata limit.
"""

from __future__ import annotations

from typing import Any

from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import InvalidRequest, LaunchRequest
from providers.gcp.labels import (
    MAX_METADATA_VALUE_BYTES,
    PROVIDER_NAME,
    has_builtin_gpus,
    region_of,
)


def zone_for(config: Any, zones: frozenset[str], req: LaunchRequest) -> str:
    """The zone ``req`` launches in; InvalidRequest when the provider cannot launch it at all."""
    offering = req.offering
    problem = None
    if offering.provider != PROVIDER_NAME:
        problem = f"offering {offering.key} is not a GCP offering"
    elif offering.zone:
        if offering.zone not in zones:
            problem = (
                f"zone {offering.zone} is not one of this provider's zones {sorted(zones)}"
            )
    elif not any(region_of(z) == offering.region for z in zones):
        problem = f"no configured zone in region {offering.region}"
    problem = problem or accelerator_problem(config, offering)
    if problem is None and len(req.user_data.encode()) > MAX_METADATA_VALUE_BYTES:
        problem = (
            f"user data is larger than GCE's {MAX_METADATA_VALUE_BYTES} byte metadata limit"
        )
    if problem is not None:
        raise InvalidRequest(
            problem,
            provider=PROVIDER_NAME,
            offering_key=offering.key,
            request_id=req.request_id,
            code="InvalidOffering",
        )
    if offering.zone:
        return offering.zone
    # A regional offering: the first configured zone of that region, so a retry picks the same.
    return min(z for z in zones if region_of(z) == offering.region)


def accelerator_problem(config: Any, offering: Offering) -> str | None:
    """Why ``offering``'s GPUs cannot be attached as the policy says (None: they can)."""
    if offering.gpus < 1 or has_builtin_gpus(offering.instance_type):
        return None
    accelerator = (getattr(config, "accelerators", None) or {}).get(offering.instance_type)
    if accelerator is None:
        return (
            f"machine type {offering.instance_type} has no built-in GPUs and the policy's "
            f"gcp.accelerators does not name any for it"
        )
    if accelerator.count != offering.gpus:
        return (
            f"offering {offering.key} has {offering.gpus} GPUs but gcp.accelerators attaches "
            f"{accelerator.count} to {offering.instance_type}"
        )
    return None
