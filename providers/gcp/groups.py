"""GCP placement groups: a multi-node job's VMs under one **compact placement resource policy**.

``GcpGroups`` is the ``placement`` capability of :class:`~providers.gcp.adapter.GcpProvider`
(the ``GroupPlacement`` port). One resource policy per launch group, in the offering's region,
with ``groupPlacementPolicy: {collocation: COLLOCATED, vmCount: <nodes>}``: Compute Engine places
the VMs that name it (``resourcePolicies`` on instances.insert) close together, in one zone, for
low network latency (https://cloud.google.com/compute/docs/instances/use-compact-placement-policies;
the REST shape: https://cloud.google.com/compute/docs/reference/rest/v1/resourcePolicies).

Resource policies carry no labels, so ownership is in the ``description``: ``burst-placement``
followed by our tags as JSON (``burst:cluster``, ``burst:policy``, ``burst:group``);
``list_owned_groups`` lists each region's policies and keeps those whose description says ours.

* ``create_group`` is idempotent: insert with a request id derived from the group id, and an
  ``alreadyExists`` answer reads the policy back (refused unless its description is ours);
* ``delete_group`` of a policy already gone (404) returns normally; one still used by a VM
  (``resourceInUseByAnotherResource``) is a ``TransientError``: deleted on a later sweep.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from typing import Any

from google.api_core import exceptions as api_exceptions
from google.cloud import compute_v1

from orchestrator.domain.offerings import Offering
from orchestrator.domain.placement import GroupTags, PlacementGroup
from orchestrator.domain.ports import InvalidRequest, ProviderError, TransientError
from providers.gcp.errors import codes_of
from providers.gcp.labels import PROVIDER_NAME
from providers.gcp.operations import operation_exception

log = logging.getLogger(__package__)

DESCRIPTION_PREFIX = "burst-placement "
_UUID_NAMESPACE = uuid.UUID("6f0b7f3e-8a51-4a5e-9a55-3c1f5f0b9a21")
_NAME_MAX = 63


def policy_name(group_id: str) -> str:
    """The resource policy name of a launch group: RFC 1035 (lower case, digits, dashes)."""
    text = re.sub(r"[^a-z0-9-]+", "-", group_id.lower()).strip("-")
    name = f"burst-{text}"[:_NAME_MAX].rstrip("-")
    return name


def policy_path(project: str, region: str, name: str) -> str:
    """What an instance's ``resourcePolicies`` names."""
    return f"projects/{project}/regions/{region}/resourcePolicies/{name}"


class GcpGroups:
    """Compact placement resource policies through the provider's clients (module docstring)."""

    def __init__(self, provider: Any):
        self.provider = provider  # the GcpProvider: project, regions, clients, error mapping

    def create_group(self, group_id: str, offering: Offering, size: int,
                     tags: GroupTags) -> PlacementGroup:
        p = self.provider
        name = policy_name(group_id)
        body = compute_v1.ResourcePolicy(
            name=name,
            description=DESCRIPTION_PREFIX + json.dumps(tags.as_dict(), sort_keys=True),
            group_placement_policy=compute_v1.ResourcePolicyGroupPlacementPolicy(
                collocation="COLLOCATED", vm_count=size),
        )
        request = compute_v1.InsertResourcePolicyRequest(
            project=p.project, region=offering.region, resource_policy_resource=body,
            request_id=str(uuid.uuid5(_UUID_NAMESPACE, group_id)))
        try:
            with p._errors(f"insert resource policy {name}"):
                op = p._client("resource_policies").insert_unary(
                    request=request, retry=None, timeout=p.call_timeout_s)
            self._wait(op, offering.region, name)
        except ProviderError as error:
            if not _already_exists(error):
                raise
            log.info("resource policy %s already there: reading it back", name)
        group = self._get(offering.region, name)
        if group is None:
            raise TransientError(f"resource policy {name} created but not readable yet",
                                 provider=PROVIDER_NAME, offering_key=offering.key,
                                 request_id=group_id, code="NotListedYet")
        if group.ownership is None or group.ownership.group != tags.group:
            raise InvalidRequest(f"resource policy {name} exists and is not ours",
                                 provider=PROVIDER_NAME, offering_key=offering.key,
                                 request_id=group_id, code="PlacementGroupNotOurs")
        log.info("compact placement policy %s for %d node(s) of %s", name, size, offering.key)
        return group

    def delete_group(self, group: PlacementGroup) -> None:
        p = self.provider
        try:
            with p._errors(f"delete resource policy {group.name}"):
                op = p._client("resource_policies").delete_unary(
                    project=p.project, region=group.region, resource_policy=group.name,
                    retry=None, timeout=p.call_timeout_s)
            self._wait(op, group.region, group.name)
        except ProviderError as error:
            cause = error.__cause__
            if isinstance(cause, api_exceptions.NotFound):
                return  # already gone
            if isinstance(cause, api_exceptions.GoogleAPICallError) and (
                    "resourceInUseByAnotherResource" in codes_of(cause)):
                raise TransientError(f"resource policy {group.name} is still used by a VM",
                                     provider=PROVIDER_NAME, request_id=group.name,
                                     code="resourceInUseByAnotherResource") from cause
            raise
        log.info("deleted resource policy %s in %s", group.name, group.region)

    def list_owned_groups(self, cluster: str) -> list[PlacementGroup]:
        p = self.provider
        owned = []
        for region in sorted(p.regions):
            request = compute_v1.ListResourcePoliciesRequest(project=p.project, region=region,
                                                             max_results=p.page_size)
            with p._errors(f"list resource policies in {region}"):
                for raw in p._client("resource_policies").list(
                        request=request, retry=None, timeout=p.call_timeout_s):
                    group = _group(raw, region)
                    if group is not None and group.ownership and group.ownership.cluster == cluster:
                        owned.append(group)
        return owned

    def _get(self, region: str, name: str) -> PlacementGroup | None:
        p = self.provider
        try:
            with p._errors(f"get resource policy {name}"):
                raw = p._client("resource_policies").get(
                    project=p.project, region=region, resource_policy=name, retry=None,
                    timeout=p.call_timeout_s)
        except ProviderError as error:
            if isinstance(error.__cause__, api_exceptions.NotFound):
                return None
            raise
        return _group(raw, region) or PlacementGroup(name, PROVIDER_NAME, region)

    def _wait(self, op: compute_v1.Operation, region: str, name: str) -> None:
        """Wait for a region operation (bounded like the instances' zone operations)."""
        p = self.provider
        deadline = time.monotonic() + p.operation_timeout_s
        while op.status != compute_v1.Operation.Status.DONE and time.monotonic() < deadline:
            with p._errors(f"wait for operation {op.name}"):
                op = p._client("region_operations").wait(
                    project=p.project, region=region, operation=op.name, retry=None,
                    timeout=max(deadline - time.monotonic(), 0.5))
            if op.status != compute_v1.Operation.Status.DONE:
                time.sleep(min(p.poll_interval_s, max(deadline - time.monotonic(), 0)))
        if op.status != compute_v1.Operation.Status.DONE:
            raise TransientError(f"operation on resource policy {name} still running",
                                 provider=PROVIDER_NAME, request_id=name, code="OperationTimeout")
        if op.error.errors:
            cause = operation_exception(op)
            raise TransientError(f"operation on resource policy {name} failed: {cause.message}",
                                 provider=PROVIDER_NAME, request_id=name,
                                 code=op.error.errors[0].code) from cause


def _group(raw: compute_v1.ResourcePolicy, region: str) -> PlacementGroup | None:
    """Our view of a resource policy; None unless its description says it is ours."""
    if not raw.description.startswith(DESCRIPTION_PREFIX):
        return None
    try:
        tags = json.loads(raw.description[len(DESCRIPTION_PREFIX):])
    except ValueError:
        return None
    if not isinstance(tags, dict) or not all(isinstance(v, str) for v in tags.values()):
        return None
    return PlacementGroup(raw.name, PROVIDER_NAME, region, None, tags, raw.self_link or None)


def _already_exists(error: ProviderError) -> bool:
    cause = error.__cause__
    return isinstance(cause, api_exceptions.Conflict) or (
        isinstance(cause, api_exceptions.GoogleAPICallError)
        and "alreadyExists" in codes_of(cause))
