"""GCP adapter: ``GcpProvider``, burst nodes as Compute Engine VMs (google-cloud-compute, REST).

The rules it follows (identity and idempotency, labels, operations, states, errors, credentials,
permissions) are in the package docstring, ``providers.gcp``. The instance resource lives in
``labels``, placement in ``placement``, the error table in ``errors``, operation waits in
``operations``, the provider check in ``checks``. Imports only ``orchestrator.domain``,
``google.*`` and the standard library.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import google.auth
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.cloud import compute_v1

from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import (
    CheckRow,
    Instance,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    ProviderError,
    TransientError,
)
from providers.gcp.checks import check_rows
from providers.gcp.errors import classify, codes_of, map_exception
from providers.gcp.labels import (
    CLUSTER_LABEL,
    CLUSTER_TAG,
    GOING,
    PROVIDER_NAME,
    REQUEST_TAG,
    SCOPES,
    gce_request_id,
    instance_body,
    instance_name,
    label_value,
    parse_instance_id,
    region_of,
    to_instance,
)
from providers.gcp.groups import GcpGroups
from providers.gcp.operations import operation_exception, wait_for_operation
from providers.gcp.placement import accelerator_problem, zone_for
from providers.gcp.redaction import install_redaction

log = logging.getLogger(__package__)

# Every Compute API method the adapter calls, with the IAM permissions each needs. The custom role
# in infra/gcp/ must grant exactly their union (a test checks it). insert's extra permissions are
# the ones GCE checks for what the body sets: metadata, labels, service account, a new boot disk
# from an image, a subnet (and its external IP when ``external_ip`` is on), acting as the nodes'
# service account.
API_PERMISSIONS: dict[str, tuple[str, ...]] = {
    "compute.instances.insert": (
        "compute.instances.create",
        "compute.instances.setMetadata",
        "compute.instances.setLabels",
        "compute.instances.setServiceAccount",
        "compute.disks.create",
        "compute.images.useReadOnly",
        "compute.subnetworks.use",
        "compute.subnetworks.useExternalIp",
        "compute.resourcePolicies.use",
        "iam.serviceAccounts.actAs",
    ),
    "compute.instances.get": ("compute.instances.get",),
    "compute.instances.list": ("compute.instances.list",),
    "compute.instances.delete": ("compute.instances.delete",),
    "compute.zoneOperations.wait": ("compute.zoneOperations.get",),
    # Compact placement policies of launch groups (providers.gcp.groups); an instance naming
    # one needs resourcePolicies.use.
    "compute.resourcePolicies.insert": ("compute.resourcePolicies.create",),
    "compute.resourcePolicies.get": ("compute.resourcePolicies.get",),
    "compute.resourcePolicies.list": ("compute.resourcePolicies.list",),
    "compute.resourcePolicies.delete": ("compute.resourcePolicies.delete",),
    "compute.regionOperations.wait": ("compute.regionOperations.get",),
    # Used by check() only:
    "compute.machineTypes.list": ("compute.machineTypes.list",),
    "compute.images.get": ("compute.images.get",),
    "compute.images.getFromFamily": ("compute.images.getFromFamily",),
}


# -- the provider ----------------------------------------------------------------------------------


class GcpProvider:
    """The ``Provider`` whose instances are Compute Engine VMs in the configured zones."""

    name = PROVIDER_NAME
    # A guest halt stops the VM (TERMINATED): its GPUs stop billing, spot VMs are deleted
    # (instance_termination_action DELETE). Used by the node agent's dead-man switch.
    self_terminate_command = "shutdown -h now"
    # Nodes boot stock images with cloud-init: the executor hands them a #cloud-config that
    # installs the pinned burst and starts the agent's systemd unit (infra/bootstrap/).
    cloud_init = True

    def __init__(
        self,
        config: Any,
        *,
        zones: set[str],
        catalog: list[Offering] | None = None,
        credentials: Any = None,
        operation_timeout_s: float = 120.0,
        poll_interval_s: float = 1.0,
        call_timeout_s: float = 60.0,
        page_size: int = 500,
    ):
        if not zones:
            raise ValueError("GcpProvider needs at least one zone")
        self.config = config
        self.project: str = config.project
        self.zones = frozenset(zones)
        self.regions = frozenset(region_of(z) for z in self.zones)
        self.api_endpoint: str | None = getattr(config, "api_endpoint", None)
        self.operation_timeout_s = float(operation_timeout_s)
        self.poll_interval_s = float(poll_interval_s)
        self.call_timeout_s = float(call_timeout_s)
        self.page_size = int(page_size)
        self._catalog = list(catalog) if catalog is not None else None
        self._credentials = credentials
        self._lock = threading.Lock()
        self._clients: dict[str, Any] = {}
        # request id -> attempts whose operation failed (see "Identity and idempotency").
        self._failed_attempts: dict[str, int] = {}
        # Compact placement policies for launch groups (the GroupPlacement port; .groups).
        self.placement = GcpGroups(self)
        install_redaction()

    # -- Provider -----------------------------------------------------------------------------

    def offerings(self) -> list[Offering]:
        if self._catalog is not None:
            catalog = self._catalog
        else:
            # Imported here: the bundled price catalogue loads only when offerings are asked for.
            from providers.catalog import offerings_for

            catalog = offerings_for(PROVIDER_NAME, set(self.regions))
        chosen: dict[str, Offering] = {}
        for o in catalog:
            if o.provider != PROVIDER_NAME:
                continue
            if (o.zone not in self.zones) if o.zone else (o.region not in self.regions):
                continue
            problem = accelerator_problem(self.config, o)
            if problem is not None:
                log.debug("offering %s skipped: %s", o.key, problem)
                continue
            chosen.setdefault(o.key, o)
        return list(chosen.values())

    def launch(self, req: LaunchRequest) -> list[Instance]:
        offering = req.offering
        zone = zone_for(self.config, self.zones, req)
        name = instance_name(req.tags.node_id)
        body = instance_body(self.config, req, zone, name)
        with self._lock:
            attempt = self._failed_attempts.get(req.request_id, 0)
        request = compute_v1.InsertInstanceRequest(
            project=self.project,
            zone=zone,
            instance_resource=body,
            request_id=gce_request_id(req.request_id, attempt),
        )
        log.info("launching %s (%s) for request %s", f"{zone}/{name}", offering.key, req.request_id)
        try:
            with self._errors("insert instance", req):
                op = self._client("instances").insert_unary(
                    request=request, retry=None, timeout=self.call_timeout_s
                )
        except ProviderError as error:
            cause = error.__cause__
            if isinstance(cause, api_exceptions.Conflict) and "alreadyExists" in (
                codes_of(cause) or ["alreadyExists"]
            ):
                return [self._adopt(req, zone, name, cause)]
            raise
        op = self._wait(op, zone, req)
        if op.status != compute_v1.Operation.Status.DONE:
            # Accepted but still running at our deadline: the instance exists and is pending.
            instance = self._get(zone, name, req)
            if instance is None:
                raise TransientError(
                    f"insert of {zone}/{name} still running after {self.operation_timeout_s:.0f}s",
                    provider=self.name,
                    offering_key=offering.key,
                    request_id=req.request_id,
                    code="OperationTimeout",
                )
            log.warning("insert of %s not done yet; returning it pending", instance.id)
            return [instance]
        if op.error.errors:
            with self._lock:
                self._failed_attempts[req.request_id] = attempt + 1
            codes = [e.code for e in op.error.errors]
            cause = operation_exception(op)
            if "RESOURCE_ALREADY_EXISTS" in codes:
                return [self._adopt(req, zone, name, cause)]
            # After a restart the first key may replay an old failure although a later attempt
            # succeeded: an instance of ours under our name means the launch is already done.
            existing = self._get(zone, name, req)
            if existing is not None and existing.tags.get(REQUEST_TAG) == req.request_id:
                log.info(
                    "launch %s already done: %s (old failure replayed)", req.request_id, existing.id
                )
                return [existing]
            kind = classify(codes, op.http_error_status_code or None, cause.message or "")
            raise kind(
                f"insert of {zone}/{name} failed: {cause.message}",
                provider=self.name,
                offering_key=offering.key,
                request_id=req.request_id,
                code=codes[0],
            ) from cause
        instance = self._get(zone, name, req)
        if instance is None:
            # Created and already gone (a spot VM preempted at once): "already done", terminated.
            instance = Instance(
                id=f"{zone}/{name}",
                provider=self.name,
                state=InstanceState.TERMINATED,
                tags=req.tags.as_dict(),
                offering_key=offering.key,
            )
        log.info("launched %s for request %s", instance.id, req.request_id)
        return [instance]

    def describe(self, ids: list[str]) -> list[Instance]:
        found = []
        for instance_id in ids:
            zone, name = parse_instance_id(instance_id)
            for z in [zone] if zone else sorted(self.zones):
                instance = self._get(z, name)
                if instance is not None:
                    found.append(instance)
                    break
        return found

    def list_owned(self, cluster: str) -> list[Instance]:
        owned = []
        for zone in sorted(self.zones):
            request = compute_v1.ListInstancesRequest(
                project=self.project,
                zone=zone,
                filter=f'labels.{CLUSTER_LABEL} = "{label_value(cluster)}"',
                max_results=self.page_size,
            )
            with self._errors(f"list instances in {zone}"):
                pager = self._client("instances").list(
                    request=request, retry=None, timeout=self.call_timeout_s
                )
                for raw in pager:  # the pager fetches the following pages as it goes
                    instance = to_instance(raw, zone)
                    # The label is lossy (lower-cased, cut); the exact cluster is in the tags.
                    if instance.tags.get(CLUSTER_TAG) == cluster:
                        owned.append(instance)
        return owned

    def terminate(self, ids: list[str]) -> None:
        for instance_id in ids:
            zone, name = parse_instance_id(instance_id)
            if zone is None:
                found = self.describe([name])
                if not found:
                    continue  # unknown everywhere: nothing to do
                zone, name = parse_instance_id(found[0].id)
            try:
                with self._errors(f"delete {zone}/{name}"):
                    self._client("instances").delete_unary(
                        project=self.project,
                        zone=zone,
                        instance=name,
                        retry=None,
                        timeout=self.call_timeout_s,
                    )
            except ProviderError as error:
                cause = error.__cause__
                if isinstance(cause, api_exceptions.NotFound):
                    continue  # already gone
                if isinstance(cause, api_exceptions.GoogleAPICallError) and (
                    "resourceNotReady" in codes_of(cause)
                ):
                    # A delete already under way answers "not ready": done, if it is going.
                    # (An instance still being created answers it too: that one is retried.)
                    current = self._get(zone, name)
                    if current is None or current.state in GOING:
                        continue
                raise
            log.info("terminate sent for %s/%s", zone, name)

    # -- extras (not part of the Protocol) -----------------------------------------------------

    def credentials_problem(self) -> str | None:
        """Why Application Default Credentials cannot be found (None: they can). No API call."""
        try:
            with self._errors("credentials"):
                self._resolved_credentials()
        except ProviderError as exc:
            return str(exc)
        return None

    def check(self) -> list[CheckRow]:
        """What ``burst provider check`` prints (``providers.gcp.checks``). Never raises."""
        return check_rows(self)

    # -- launching ----------------------------------------------------------------------------
    def _wait(
        self, op: compute_v1.Operation, zone: str, req: LaunchRequest
    ) -> compute_v1.Operation:
        """Wait for ``op`` through our own ZoneOperationsClient, until done or our deadline."""
        return wait_for_operation(
            op,
            project=self.project,
            zone=zone,
            client=lambda: self._client("zone_operations"),
            errors=lambda what: self._errors(what, req),
            timeout_s=self.operation_timeout_s,
            poll_interval_s=self.poll_interval_s,
        )

    def _adopt(self, req: LaunchRequest, zone: str, name: str, cause: BaseException) -> Instance:
        """Our name is taken: ours from an earlier try ("already done"), or a foreign instance."""
        instance = self._get(zone, name, req)
        if instance is None:
            raise TransientError(
                f"{zone}/{name} exists but could not be read (being deleted?)",
                provider=self.name,
                offering_key=req.offering.key,
                request_id=req.request_id,
                code="alreadyExists",
            ) from cause
        if instance.tags.get(REQUEST_TAG) != req.request_id:
            raise InvalidRequest(
                f"{zone}/{name} already exists and was not launched for request {req.request_id}",
                provider=self.name,
                offering_key=req.offering.key,
                request_id=req.request_id,
                code="alreadyExists",
            ) from cause
        log.info("launch %s already done: instance %s", req.request_id, instance.id)
        return instance

    # -- observing ----------------------------------------------------------------------------

    def _get(self, zone: str, name: str, req: LaunchRequest | None = None) -> Instance | None:
        try:
            with self._errors(f"get {zone}/{name}", req):
                raw = self._client("instances").get(
                    project=self.project,
                    zone=zone,
                    instance=name,
                    retry=None,
                    timeout=self.call_timeout_s,
                )
        except InvalidRequest as error:
            if isinstance(error.__cause__, api_exceptions.NotFound):
                return None
            raise
        return to_instance(raw, zone)

    # -- plumbing -------------------------------------------------------------------------------

    def _endpoint_text(self) -> str:
        return self.api_endpoint or "compute.googleapis.com"

    def _resolved_credentials(self) -> Any:
        with self._lock:
            if self._credentials is None:
                self._credentials, _ = google.auth.default(scopes=list(SCOPES))
            return self._credentials

    def _client(self, kind: str) -> Any:
        """One client of each kind, all with the same endpoint and credentials (built lazily)."""
        creds = self._resolved_credentials()
        with self._lock:
            client = self._clients.get(kind)
            if client is None:
                options = (
                    ClientOptions(api_endpoint=self.api_endpoint) if self.api_endpoint else None
                )
                factory = {
                    "instances": compute_v1.InstancesClient,
                    "zone_operations": compute_v1.ZoneOperationsClient,
                    "machine_types": compute_v1.MachineTypesClient,
                    "images": compute_v1.ImagesClient,
                    "resource_policies": compute_v1.ResourcePoliciesClient,
                    "region_operations": compute_v1.RegionOperationsClient,
                }[kind]
                client = factory(credentials=creds, client_options=options, transport="rest")
                self._clients[kind] = client
            return client

    @contextlib.contextmanager
    def _errors(self, what: str, req: LaunchRequest | None = None) -> Iterator[None]:
        try:
            yield
        except ProviderError:
            raise
        except Exception as exc:
            mapped = map_exception(
                exc,
                what,
                offering_key=req.offering.key if req else None,
                request_id=req.request_id if req else None,
            )
            if mapped is None:
                raise
            raise mapped from exc
