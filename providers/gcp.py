"""GCP provider: burst nodes as Compute Engine VMs, through google-cloud-compute over REST.

``GcpProvider`` implements the ``Provider`` Protocol of ``orchestrator.domain.ports`` with the
official client (``InstancesClient`` and ``ZoneOperationsClient``, REST transport). It imports only
``orchestrator.domain``, ``google.*`` and the standard library; the policy's ``GcpConfig`` arrives
as a plain object with attributes.

Identity and idempotency
    * Instance id: ``"<zone>/<name>"`` (e.g. ``us-central1-a/burst-train-3f2a9c01de``), so describe
      and terminate work after a restart without any memory. A bare name is also accepted; it is
      looked up in every configured zone.
    * Instance name: ``burst-<node id>`` (RFC 1035: lower case, starts with a letter, <= 63 chars).
      A node id that is not already lower-case ``[a-z0-9-]`` or would make the name too long is
      sanitised, truncated and suffixed with 8 hex digits of its SHA-256 (:func:`instance_name`).
      GCE refuses a second instance of the same name in a zone, which is the last line of
      idempotency.
    * ``InsertInstanceRequest.request_id``: GCE's own idempotency key, a UUID5 of the request id
      (:func:`gce_request_id`). The same key returns the same operation (for up to an hour at GCE),
      *even when that operation failed*; so after an operation fails (stockout, quota) the next try
      for the same request id uses ``uuid5(request_id#attempt)``. The attempt counter lives in
      process memory, so after a restart the first try may get an old failure replayed: if an
      instance of ours then exists under our name (a later attempt succeeded), it is returned as
      "already done"; otherwise the old failure is reported once and the next try is fresh.
      Nothing is created twice either way.
    * A 409 ``alreadyExists`` for our name means "already done": the instance is fetched and
      returned when it carries the same ``burst:request-id``, else :class:`InvalidRequest`.

Labels and metadata
    GCP label keys cannot hold ``:``; the ownership tags map one to one::

        burst:cluster    <->  burst-cluster
        burst:policy     <->  burst-policy
        burst:node-id    <->  burst-node-id
        burst:request-id <->  burst-request-id

    Label values are lower-cased, anything outside ``[a-z0-9_-]`` becomes ``-`` and they are cut
    at 63 characters (:func:`label_value`). Because that is lossy, the exact tags also ride in the
    metadata item ``burst-tags`` (JSON); ``Instance.tags`` is read from it, or rebuilt from the
    labels through the inverse key map when it is missing. ``list_owned`` filters server-side on
    the label and then on the exact cluster. Other metadata items: ``user-data`` (the bootstrap;
    cloud-init's GCE datasource reads it), ``burst-node-id`` and ``burst-offering`` (offering key).

Operations
    Insert returns a zone operation; the adapter waits for it with its own ``ZoneOperationsClient``
    built with the same endpoint and credentials (``wait`` in a bounded loop,
    ``operation_timeout_s``). ``ExtendedOperation.result()`` is never used: it polls through a
    client created without the endpoint override, i.e. Google's public host. Delete is not waited
    for: the instance shows ``STOPPING`` until it disappears, which the reconciler observes.

States: PROVISIONING, STAGING -> pending; RUNNING -> running; STOPPING, SUSPENDING, SUSPENDED,
STOPPED, REPAIRING, PENDING_STOP -> stopping; TERMINATED -> terminated. A deleted instance is
simply absent.

Errors (``_CODE_ERRORS`` then ``_STATUS_ERRORS``; the google exception is the ``__cause__``):

    =====================================================  ==================
    operation error code / HTTP error reason                error
    =====================================================  ==================
    ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS],            CapacityError
    RESOURCE_POOL_EXHAUSTED, 429/503 saying the zone
    "does not have enough resources"
    QUOTA_EXCEEDED, quotaExceeded, limitExceeded            QuotaError
    401, 403 (insufficientPermissions, forbidden, ...),     AuthError
    google.auth DefaultCredentialsError / RefreshError
    429 (rateLimitExceeded), 500, 502, 503, 504,            TransientError
    resourceNotReady, connection errors, timeouts,
    RefreshError marked retryable, auth TransportError
    400 (invalid, badRequest), 404 on insert (bad image,    InvalidRequest
    machine or accelerator type), UNSUPPORTED_OPERATION,
    409 for an instance that is not ours, 412
    =====================================================  ==================

``UNSUPPORTED_OPERATION`` is deliberately *not* capacity: GCE uses it for shapes a zone never
offers (e.g. an accelerator type or spot for a machine type there), which retrying elsewhere later
will not fix; a spot stockout comes back as ``ZONE_RESOURCE_POOL_EXHAUSTED`` like any other.
``rateLimitExceeded`` is throttling (transient), not quota.

Credentials: Application Default Credentials (``google.auth.default``) unless given; resolved on
first use, so a missing credential surfaces as :class:`AuthError` (and as a failed ``check()``
row). Neither credentials nor user data are ever logged, by us or, when an operator turns on debug
logging for the google libraries, by them: their records of request and response bodies (an
instance body carries the bootstrap's join token; google-auth logs a federation subject token in
clear) are blanked by a logging filter on the emitting loggers.

Permissions: ``API_PERMISSIONS`` lists every API method this module calls with the IAM
permissions it needs; ``infra/gcp/burst-controller-role.yaml`` grants exactly their union.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import google.auth
import google.auth.exceptions as auth_exceptions
from google.api_core import exceptions as api_exceptions
from google.api_core.client_options import ClientOptions
from google.cloud import compute_v1

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.offerings import Offering, offering_key
from orchestrator.domain.ports import (
    AuthError,
    CapacityError,
    CheckRow,
    Instance,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    ProviderError,
    QuotaError,
    TransientError,
)
from orchestrator.policy.timefmt import parse_aware

log = logging.getLogger(__name__)

PROVIDER_NAME = "gcp"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)

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
        "iam.serviceAccounts.actAs",
    ),
    "compute.instances.get": ("compute.instances.get",),
    "compute.instances.list": ("compute.instances.list",),
    "compute.instances.delete": ("compute.instances.delete",),
    "compute.zoneOperations.wait": ("compute.zoneOperations.get",),
    # Used by check() only:
    "compute.machineTypes.list": ("compute.machineTypes.list",),
    "compute.images.get": ("compute.images.get",),
    "compute.images.getFromFamily": ("compute.images.getFromFamily",),
}

# Ownership tag key <-> GCP label key (label keys allow [a-z0-9_-], not ':').
LABEL_KEYS: dict[str, str] = {
    key: key.replace(":", "-") for key in OwnershipTags("c", "p", "n", "r").as_dict()
}
TAG_KEYS: dict[str, str] = {label: tag for tag, label in LABEL_KEYS.items()}
_CLUSTER_TAG = f"{OwnershipTags.PREFIX}:cluster"
_REQUEST_TAG = f"{OwnershipTags.PREFIX}:request-id"
CLUSTER_LABEL = LABEL_KEYS[_CLUSTER_TAG]

META_USER_DATA = "user-data"
META_NODE_ID = "burst-node-id"
META_TAGS = "burst-tags"
META_OFFERING = "burst-offering"
# GCE's limit for one metadata value.
MAX_METADATA_VALUE_BYTES = 256 * 1024

_GOING = frozenset({InstanceState.STOPPING, InstanceState.TERMINATED})

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

# Error codes of operations (error.errors[].code) and reasons of HTTP errors (error.errors[].reason,
# or the ErrorInfo reason), checked in the order GCE lists them; the first one known decides.
_CODE_ERRORS: dict[str, type[ProviderError]] = {
    "ZONE_RESOURCE_POOL_EXHAUSTED": CapacityError,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": CapacityError,
    "RESOURCE_POOL_EXHAUSTED": CapacityError,
    "QUOTA_EXCEEDED": QuotaError,
    "quotaExceeded": QuotaError,
    "limitExceeded": QuotaError,
    "insufficientPermissions": AuthError,
    "forbidden": AuthError,
    "authError": AuthError,
    "accessNotConfigured": AuthError,  # the Compute API is not enabled for the project
    "PERMISSION_DENIED": AuthError,
    "rateLimitExceeded": TransientError,  # throttling, not quota
    "userRateLimitExceeded": TransientError,
    "RATE_LIMIT_EXCEEDED": TransientError,
    "RESOURCE_OPERATION_RATE_EXCEEDED": TransientError,
    "backendError": TransientError,
    "internalError": TransientError,
    "INTERNAL_ERROR": TransientError,
    "resourceNotReady": TransientError,
    "RESOURCE_NOT_READY": TransientError,
    "UNSUPPORTED_OPERATION": InvalidRequest,  # see the module docstring: not a stockout
    "invalid": InvalidRequest,
    "badRequest": InvalidRequest,
    "required": InvalidRequest,
    "notFound": InvalidRequest,
    "RESOURCE_NOT_FOUND": InvalidRequest,
    "INVALID_FIELD_VALUE": InvalidRequest,
    "conditionNotMet": InvalidRequest,
    "alreadyExists": InvalidRequest,  # only reached when the instance is not ours
    "RESOURCE_ALREADY_EXISTS": InvalidRequest,
}

# HTTP status when no code above is known.
_STATUS_ERRORS: dict[int, type[ProviderError]] = {
    400: InvalidRequest,
    401: AuthError,
    403: AuthError,
    404: InvalidRequest,
    409: InvalidRequest,
    412: InvalidRequest,
    429: TransientError,
    500: TransientError,
    502: TransientError,
    503: TransientError,
    504: TransientError,
}

# How GCE words a stockout when it arrives without one of the codes above.
_CAPACITY_MESSAGES = (
    "does not have enough resources available",
    "resource pool exhausted",
    "currently unavailable in the",
)

# requests' exceptions derive from OSError; these few mean a bad endpoint, not a flaky network.
_BAD_URL_ERRORS = frozenset({"InvalidURL", "MissingSchema", "InvalidSchema", "URLRequired"})

# Machine families whose machine types include their GPUs; the others (N1) need guestAccelerators.
_BUILTIN_GPU_FAMILIES = ("a2-", "a3-", "a4-", "a4x-", "g2-", "g4-")

_MIN_WAIT_S = 0.5  # shortest read timeout given to one operations.wait call

_UUID_NAMESPACE = uuid.UUID("6f1c2a52-61a5-4bd4-9f5a-6a3f0f6c9b1e")  # burst's GCE requestIds
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_IMAGE_RE = re.compile(
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


def _last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def _region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


def _has_builtin_gpus(machine_type: str) -> bool:
    return machine_type.startswith(_BUILTIN_GPU_FAMILIES)


# -- error mapping ---------------------------------------------------------------------------------


def _codes_of(exc: api_exceptions.GoogleAPICallError) -> list[str]:
    codes = [e.get("reason", "") for e in (exc.errors or []) if isinstance(e, dict)]
    codes += [getattr(e, "code", "") for e in (exc.errors or []) if not isinstance(e, dict)]
    if getattr(exc, "reason", None):
        codes.append(exc.reason)
    return [c for c in codes if c]


def _classify(codes: list[str], status: int | None, message: str) -> type[ProviderError]:
    for code in codes:
        if code in _CODE_ERRORS:
            return _CODE_ERRORS[code]
    if status in (429, 503) and any(m in message.lower() for m in _CAPACITY_MESSAGES):
        return CapacityError
    if status in _STATUS_ERRORS:
        return _STATUS_ERRORS[status]
    if status is not None and 400 <= status < 500:
        return InvalidRequest
    return TransientError  # 5xx and anything unexplained: the executor retries, then gives up


def _map_exception(
    exc: BaseException, what: str, *, offering_key: str | None, request_id: str | None
) -> ProviderError | None:
    """The typed error for an exception of the client stack, or None if it is not one of them."""
    kind: type[ProviderError]
    code: str | None = None
    if isinstance(exc, api_exceptions.GoogleAPICallError):
        codes = _codes_of(exc)
        status = exc.code if isinstance(exc.code, int) else None
        kind = _classify(codes, status, exc.message or "")
        code = codes[0] if codes else (str(status) if status else type(exc).__name__)
        detail = exc.message
    elif isinstance(exc, api_exceptions.GoogleAPIError):  # RetryError and kin
        kind, code, detail = TransientError, type(exc).__name__, str(exc)
    elif isinstance(exc, auth_exceptions.RefreshError):
        kind = TransientError if getattr(exc, "retryable", False) else AuthError
        code, detail = "RefreshError", str(exc)
    elif isinstance(exc, auth_exceptions.TransportError):
        kind, code, detail = TransientError, "TransportError", str(exc)
    elif isinstance(exc, auth_exceptions.GoogleAuthError):  # DefaultCredentialsError and kin
        kind, code, detail = AuthError, type(exc).__name__, str(exc)
    elif isinstance(exc, OSError):  # requests' ConnectionError, Timeout, ...
        name = type(exc).__name__
        kind = InvalidRequest if name in _BAD_URL_ERRORS else TransientError
        code, detail = name, str(exc)
    else:
        return None
    return kind(
        f"{what}: {detail}",
        provider=PROVIDER_NAME,
        offering_key=offering_key,
        request_id=request_id,
        code=code,
    )


def _is_read_timeout(exc: BaseException | None) -> bool:
    return isinstance(exc, api_exceptions.DeadlineExceeded) or type(exc).__name__ == "ReadTimeout"


def _operation_exception(op: compute_v1.Operation) -> api_exceptions.GoogleAPICallError:
    """The google exception ``op.result()`` would have raised for a failed operation."""
    errors = list(op.error.errors)
    message = "; ".join(f"{e.code}: {e.message}" for e in errors) or op.http_error_message
    return api_exceptions.from_http_status(
        op.http_error_status_code or 500, message or "operation failed", errors=errors
    )


class _RedactPayloads(logging.Filter):
    """Blanks request and response bodies in the google libraries' debug records.

    With debug logging on for the ``google`` loggers, the compute REST transport logs every body
    as record extras (an instance body carries the bootstrap and its join token), and google-auth
    logs token requests, a workload identity federation subject token included, in clear.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        for attr in ("httpRequest", "httpResponse"):
            value = getattr(record, attr, None)
            if isinstance(value, dict):
                setattr(
                    record,
                    attr,
                    {
                        k: "<redacted by burst>" if k in ("payload", "body") else v
                        for k, v in value.items()
                    },
                )
        for attr in ("request", "response"):
            if getattr(record, attr, None) is not None:
                setattr(record, attr, "<redacted by burst>")
        return True


# Logger filters only see records logged on that very logger, so each emitting module is named.
_REDACTED_LOGGERS = (
    "google.auth.transport.requests",
    "google.auth._helpers",
    *(
        f"google.cloud.compute_v1.services.{service}.{module}"
        for service in ("instances", "zone_operations", "images", "machine_types")
        for module in ("client", "transports.rest")
    ),
)


def _install_redaction() -> None:
    for name in _REDACTED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _RedactPayloads) for f in logger.filters):
            logger.addFilter(_RedactPayloads())


# -- the provider ----------------------------------------------------------------------------------


class GcpProvider:
    """The ``Provider`` whose instances are Compute Engine VMs in the configured zones."""

    name = PROVIDER_NAME
    # A guest halt stops the VM (TERMINATED): its GPUs stop billing, spot VMs are deleted
    # (instance_termination_action DELETE). Used by the node agent's dead-man switch.
    self_terminate_command = "shutdown -h now"

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
        self.regions = frozenset(_region_of(z) for z in self.zones)
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
        _install_redaction()

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
            problem = self._accelerator_problem(o)
            if problem is not None:
                log.debug("offering %s skipped: %s", o.key, problem)
                continue
            chosen.setdefault(o.key, o)
        return list(chosen.values())

    def launch(self, req: LaunchRequest) -> list[Instance]:
        offering = req.offering
        zone = self._zone_for(req)
        name = instance_name(req.tags.node_id)
        body = self._instance_body(req, zone, name)
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
                _codes_of(cause) or ["alreadyExists"]
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
            cause = _operation_exception(op)
            if "RESOURCE_ALREADY_EXISTS" in codes:
                return [self._adopt(req, zone, name, cause)]
            # After a restart the first key may replay an old failure although a later attempt
            # succeeded: an instance of ours under our name means the launch is already done.
            existing = self._get(zone, name, req)
            if existing is not None and existing.tags.get(_REQUEST_TAG) == req.request_id:
                log.info(
                    "launch %s already done: %s (old failure replayed)", req.request_id, existing.id
                )
                return [existing]
            kind = _classify(codes, op.http_error_status_code or None, cause.message or "")
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
                    instance = self._to_instance(raw, zone)
                    # The label is lossy (lower-cased, cut); the exact cluster is in the tags.
                    if instance.tags.get(_CLUSTER_TAG) == cluster:
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
                    "resourceNotReady" in _codes_of(cause)
                ):
                    # A delete already under way answers "not ready": done, if it is going.
                    # (An instance still being created answers it too: that one is retried.)
                    current = self._get(zone, name)
                    if current is None or current.state in _GOING:
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
        """What ``burst provider check`` prints: can these credentials do what launches need?

        Lists instances in each zone, lists the machine types of each zone (every offered type must
        exist there) and reads the boot image. Never raises; each failure is a row.
        """
        rows: list[CheckRow] = []
        try:
            with self._errors("credentials"):
                creds = self._resolved_credentials()
            who = getattr(creds, "service_account_email", None) or type(creds).__name__
            rows.append(CheckRow("credentials", True, f"{who}; endpoint {self._endpoint_text()}"))
        except ProviderError as error:
            rows.append(CheckRow("credentials", False, str(error)))
            return rows
        offered = self._safe_offerings(rows)
        for zone in sorted(self.zones):
            rows.append(
                self._check_row(f"list instances in {zone}", lambda z=zone: self._check_list(z))
            )
            wanted = {o.instance_type for o in offered if o.zone in (zone, None)}
            wanted |= set(getattr(self.config, "accelerators", {}) or {})
            rows.append(
                self._check_row(
                    f"machine types in {zone}", lambda z=zone, w=wanted: self._check_types(z, w)
                )
            )
        rows.append(self._check_row("boot image", self._check_image))
        return rows

    # -- launching ----------------------------------------------------------------------------

    def _zone_for(self, req: LaunchRequest) -> str:
        offering = req.offering
        problem = None
        if offering.provider != PROVIDER_NAME:
            problem = f"offering {offering.key} is not a GCP offering"
        elif offering.zone:
            if offering.zone not in self.zones:
                problem = (
                    f"zone {offering.zone} is not one of this provider's zones {sorted(self.zones)}"
                )
        elif not any(_region_of(z) == offering.region for z in self.zones):
            problem = f"no configured zone in region {offering.region}"
        problem = problem or self._accelerator_problem(offering)
        if problem is None and len(req.user_data.encode()) > MAX_METADATA_VALUE_BYTES:
            problem = (
                f"user data is larger than GCE's {MAX_METADATA_VALUE_BYTES} byte metadata limit"
            )
        if problem is not None:
            raise InvalidRequest(
                problem,
                provider=self.name,
                offering_key=offering.key,
                request_id=req.request_id,
                code="InvalidOffering",
            )
        if offering.zone:
            return offering.zone
        # A regional offering: the first configured zone of that region, so a retry picks the same.
        return min(z for z in self.zones if _region_of(z) == offering.region)

    def _accelerator_problem(self, offering: Offering) -> str | None:
        if offering.gpus < 1 or _has_builtin_gpus(offering.instance_type):
            return None
        accelerator = (getattr(self.config, "accelerators", None) or {}).get(offering.instance_type)
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

    def _instance_body(self, req: LaunchRequest, zone: str, name: str) -> compute_v1.Instance:
        cfg = self.config
        offering = req.offering
        labels = labels_for(req.tags)
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
        accelerator = (getattr(cfg, "accelerators", None) or {}).get(offering.instance_type)
        if accelerator is not None and not _has_builtin_gpus(offering.instance_type):
            body.guest_accelerators = [
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"zones/{zone}/acceleratorTypes/{accelerator.type}",
                    accelerator_count=int(accelerator.count),
                )
            ]
        return body

    def _wait(
        self, op: compute_v1.Operation, zone: str, req: LaunchRequest
    ) -> compute_v1.Operation:
        """Wait for ``op`` through our own ZoneOperationsClient, until done or our deadline."""
        deadline = time.monotonic() + self.operation_timeout_s
        while op.status != compute_v1.Operation.Status.DONE:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            request = compute_v1.WaitZoneOperationRequest(
                project=self.project, zone=zone, operation=op.name
            )
            try:
                with self._errors(f"wait for operation {op.name}", req):
                    # wait() returns when the operation is done or after up to two minutes, so
                    # our deadline is the read timeout: past it we stop waiting, not fail.
                    op = self._client("zone_operations").wait(
                        request=request, retry=None, timeout=max(remaining, _MIN_WAIT_S)
                    )
            except TransientError as error:
                if _is_read_timeout(error.__cause__):
                    break  # the caller looks at the instance instead
                raise
            if op.status != compute_v1.Operation.Status.DONE:
                time.sleep(min(self.poll_interval_s, max(deadline - time.monotonic(), 0)))
        return op

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
        if instance.tags.get(_REQUEST_TAG) != req.request_id:
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
        return self._to_instance(raw, zone)

    def _to_instance(self, raw: compute_v1.Instance, zone: str) -> Instance:
        zone = _last_segment(raw.zone) if raw.zone else zone
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
                _region_of(zone),
                zone,
                _last_segment(raw.machine_type),
                "spot" if spot else "on-demand",
            )
        launched_at = None
        if raw.creation_timestamp:
            with contextlib.suppress(ValueError):
                launched_at = parse_aware(raw.creation_timestamp, "creationTimestamp",
                                          assume_utc=True)
        return Instance(
            id=f"{zone}/{raw.name}",
            provider=self.name,
            state=state,
            tags=tags,
            offering_key=key or None,
            launched_at=launched_at,
        )

    # -- check --------------------------------------------------------------------------------

    def _check_row(self, check: str, probe: Any) -> CheckRow:
        try:
            return CheckRow(check, *probe())
        except ProviderError as error:
            return CheckRow(check, False, f"{error.kind}: {error}")

    def _safe_offerings(self, rows: list[CheckRow]) -> list[Offering]:
        try:
            return self.offerings()
        except (ImportError, OSError, ValueError, KeyError) as exc:  # report it, as a row
            rows.append(CheckRow("offerings", False, f"{type(exc).__name__}: {exc}"))
            return []

    def _check_list(self, zone: str) -> tuple[bool, str]:
        request = compute_v1.ListInstancesRequest(project=self.project, zone=zone, max_results=1)
        with self._errors(f"list instances in {zone}"):
            pager = self._client("instances").list(
                request=request, retry=None, timeout=self.call_timeout_s
            )
        return True, f"instances.list allowed ({'some' if pager.items else 'no'} instances)"

    def _check_types(self, zone: str, wanted: set[str]) -> tuple[bool, str]:
        request = compute_v1.ListMachineTypesRequest(project=self.project, zone=zone)
        with self._errors(f"list machine types in {zone}"):
            names = {
                mt.name
                for mt in self._client("machine_types").list(
                    request=request, retry=None, timeout=self.call_timeout_s
                )
            }
        missing = sorted(wanted - names)
        if missing:
            return False, f"not offered in {zone}: {', '.join(missing)}"
        return True, f"{len(wanted)} machine types used, all offered"

    def _check_image(self) -> tuple[bool, str]:
        match = _IMAGE_RE.search(self.config.image)
        if match is None:
            return False, f"unrecognised image reference {self.config.image!r}"
        project = match["project"] or self.project
        with self._errors(f"read image {self.config.image}"):
            images = self._client("images")
            if match["family"]:
                image = images.get_from_family(
                    project=project, family=match["family"], retry=None, timeout=self.call_timeout_s
                )
            else:
                image = images.get(
                    project=project, image=match["name"], retry=None, timeout=self.call_timeout_s
                )
        ok = image.status in ("", "READY")
        return ok, f"{image.name} ({image.status or 'status unknown'})"

    # -- plumbing -----------------------------------------------------------------------------

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
            mapped = _map_exception(
                exc,
                what,
                offering_key=req.offering.key if req else None,
                request_id=req.request_id if req else None,
            )
            if mapped is None:
                raise
            raise mapped from exc
