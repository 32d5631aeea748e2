"""A local Compute Engine REST server (the subset burst uses) for tests of the GCP adapter.

No Compute Engine emulator exists, so this is our own, speaking the wire format the real
``google-cloud-compute`` REST transport produces and parses (see /work/shared/research/test-peers.md
section 2.4): camelCase JSON, int64 as strings, operations that stay RUNNING for a few polls.

Served (all under ``/compute/v1/projects/{project}``)::

    POST   zones/{z}/instances?requestId=       instances.insert  (requestId dedupe, 409 on a name)
    GET    zones/{z}/instances/{name}           instances.get     (PROVISIONING, STAGING, RUNNING)
    GET    zones/{z}/instances?filter=&maxResults=&pageToken=   instances.list
    DELETE zones/{z}/instances/{name}           instances.delete  (STOPPING, then gone; 404 unknown)
    GET    zones/{z}/operations/{op}            zoneOperations.get
    POST   zones/{z}/operations/{op}/wait       zoneOperations.wait
    GET    zones/{z}/machineTypes[/{type}]      machineTypes.list / get
    GET    global/images/{name}                 images.get
    GET    global/images/family/{family}        images.getFromFamily
    ...    regions/{r}/resourcePolicies[/{name}], regions/{r}/operations/{op}[/wait]
                                                resource policies (tests.servers.fake_gce_policies)

plus ``POST /token``, an OAuth2 / STS token endpoint (RFC 8693 token exchange, as workload identity
federation uses it), so tests run the production credential path (Application Default Credentials)
against it. Every compute call needs ``Authorization: Bearer`` with either a token this server
issued or a self-signed JWT whose RS256 signature verifies against a registered key; anything else
gets 401. (google-cloud-compute makes service-account keys sign their own JWTs, so a key file's
``token_uri`` is never called; and google-auth always sends ``authorized_user`` refreshes to
Google's own endpoint, so that credential type cannot be pointed here.)

Behaviour worth knowing:
    * An operation is RUNNING for ``op_polls`` polls (get or wait), then DONE.
    * The same ``requestId`` returns the same operation, failed ones included (as GCE does); an
      HTTP-level error creates no operation and records no requestId.
    * An instance reports PROVISIONING, then advances one status per ``boot_reads`` reads.
    * Delete marks it STOPPING; it disappears when the delete operation completes or after
      ``delete_reads`` reads. Deleting it again meanwhile answers 400 ``resourceNotReady``.
    * Unknown machine, accelerator type or image on insert: 404; an invalid name, label, requestId
      or a GPU VM that may live-migrate: 400; an unsupported ``filter``: 400.

Failure injection, consumed by the next insert calls: ``inject(kind, times, after)`` with kind
one of ``FAULTS`` (``after`` inserts go through first). Credentials injection: ``fail_token(times)`` makes the token endpoint answer
``invalid_grant``.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import secrets
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.servers.fake_gce_policies import ROUTES as POLICY_ROUTES
from tests.servers.fake_gce_policies import ResourcePoliciesMixin

SELF_LINK_BASE = "https://www.googleapis.com/compute/v1"

# kind -> (where it happens, details). "op": the insert is accepted and its operation fails;
# "http": the insert call itself fails; "drop": the insert is processed, the response is lost.
FAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "capacity": (
        "op",
        {
            "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
            "status": 503,
            "message": "The zone '{zone}' does not have enough resources available "
            "to fulfill the request. Try a different zone, or try again later.",
        },
    ),
    "capacity-details": (
        "op",
        {
            "code": "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
            "status": 503,
            "message": "The zone '{zone}' does not have enough resources "
            "available to fulfill the request. '(resource type:compute)'.",
        },
    ),
    "quota": (
        "op",
        {
            "code": "QUOTA_EXCEEDED",
            "status": 403,
            "message": "Quota 'NVIDIA_A100_GPUS' exceeded.  Limit: 0.0 in region {region}.",
        },
    ),
    "quota-http": (
        "http",
        {
            "status": 403,
            "reason": "quotaExceeded",
            "message": "Quota 'CPUS' exceeded.  Limit: 24.0 in region {region}.",
        },
    ),
    "auth": (
        "http",
        {
            "status": 403,
            "reason": "insufficientPermissions",
            "grpc": "PERMISSION_DENIED",
            "message": "Required 'compute.instances.create' permission for "
            "'projects/{project}/zones/{zone}/instances/{name}'",
        },
    ),
    "unauthenticated": (
        "http",
        {
            "status": 401,
            "reason": "authError",
            "grpc": "UNAUTHENTICATED",
            "message": "Request had invalid authentication credentials.",
        },
    ),
    "transient": (
        "http",
        {
            "status": 503,
            "reason": "backendError",
            "grpc": "UNAVAILABLE",
            "message": "Internal error. Please try again or contact Google Support.",
        },
    ),
    "rate-limit": (
        "http",
        {
            "status": 429,
            "reason": "rateLimitExceeded",
            "grpc": "RESOURCE_EXHAUSTED",
            "message": "Rate Limit Exceeded",
        },
    ),
    "server-error": (
        "http",
        {"status": 500, "reason": "backendError", "grpc": "INTERNAL", "message": "Internal error."},
    ),
    "invalid": (
        "http",
        {
            "status": 400,
            "reason": "invalid",
            "grpc": "INVALID_ARGUMENT",
            "message": "Invalid value for field 'resource.machineType': '{machine}'.",
        },
    ),
    "precondition": (
        "http",
        {
            "status": 412,
            "reason": "conditionNotMet",
            "grpc": "FAILED_PRECONDITION",
            "message": "Precondition not met.",
        },
    ),
    "drop": ("drop", {}),
}

_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
_CLAUSE_RE = re.compile(r'^\(?\s*labels\.([a-z][a-z0-9_-]*)\s*(?:=|eq)\s*"([^"]*)"\s*\)?$')
_STATUS_STEPS = ("PROVISIONING", "STAGING", "RUNNING")

_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile("^/compute/v1/projects/(?P<project>[^/]+)/" + p + "$"), api)
    for m, p, api in [
        ("POST", r"zones/(?P<zone>[^/]+)/instances", "compute.instances.insert"),
        ("GET", r"zones/(?P<zone>[^/]+)/instances", "compute.instances.list"),
        ("GET", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "compute.instances.get"),
        ("DELETE", r"zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", "compute.instances.delete"),
        ("GET", r"zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)", "compute.zoneOperations.get"),
        (
            "POST",
            r"zones/(?P<zone>[^/]+)/operations/(?P<op>[^/]+)/wait",
            "compute.zoneOperations.wait",
        ),
        ("GET", r"zones/(?P<zone>[^/]+)/machineTypes", "compute.machineTypes.list"),
        ("GET", r"zones/(?P<zone>[^/]+)/machineTypes/(?P<type>[^/]+)", "compute.machineTypes.get"),
        ("GET", r"global/images/family/(?P<family>[^/]+)", "compute.images.getFromFamily"),
        ("GET", r"global/images/(?P<image>[^/]+)", "compute.images.get"),
        *POLICY_ROUTES,
    ]
]

# zone -> machine type -> (vCPUs, memory MiB, built-in accelerators); and accelerator types.
DEFAULT_MACHINE_TYPES: dict[str, tuple[int, int, list[tuple[str, int]]]] = {
    "a2-highgpu-1g": (12, 87040, [("nvidia-tesla-a100", 1)]),
    "a2-highgpu-8g": (96, 696320, [("nvidia-tesla-a100", 8)]),
    "g2-standard-4": (4, 16384, [("nvidia-l4", 1)]),
    "n1-standard-8": (8, 30720, []),
    "e2-standard-4": (4, 16384, []),
}
DEFAULT_ACCELERATOR_TYPES = (
    "nvidia-tesla-a100",
    "nvidia-l4",
    "nvidia-tesla-t4",
    "nvidia-tesla-v100",
)


class HttpError(Exception):
    def __init__(self, status: int, reason: str, message: str, grpc: str = ""):
        super().__init__(message)
        self.status, self.reason, self.message, self.grpc = status, reason, message, grpc

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "code": self.status,
            "message": self.message,
            "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
        }
        if self.grpc:
            error["status"] = self.grpc
        return {"error": error}


@dataclass
class Call:
    """One request the server saw (never the credential itself)."""

    api: str
    method: str
    path: str
    query: dict[str, str]
    body: Any
    auth: str | None  # "jwt" | "token" | None
    status: int = 0


@dataclass
class _Op:
    body: dict[str, Any]
    polls_left: int
    on_done: Any = None  # callable applied when the operation completes


@dataclass
class _Instance:
    project: str
    zone: str
    body: dict[str, Any]
    reads: int = 0
    deleting: bool = False
    delete_reads: int = 0
    delete_op: str | None = None


@dataclass
class _State:
    instances: dict[tuple[str, str, str], _Instance] = field(default_factory=dict)
    ops: dict[tuple[str, str, str], _Op] = field(default_factory=dict)
    request_ids: dict[str, tuple[str, str, str]] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)
    token_failures: int = 0
    calls: list[Call] = field(default_factory=list)
    tokens: set[str] = field(default_factory=set)
    # (project, region, name) -> resource policy (tests.servers.fake_gce_policies)
    policies: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)


class FakeGce(ResourcePoliciesMixin):
    """The server; use as a context manager, or ``start()``/``stop()``."""

    def __init__(
        self,
        *,
        op_polls: int = 2,
        boot_reads: int = 1,
        delete_reads: int = 2,
        require_auth: bool = True,
        zones: tuple[str, ...] = ("us-central1-a", "us-central1-b"),
    ):
        self.op_polls = op_polls
        self.boot_reads = boot_reads
        self.delete_reads = delete_reads
        self.require_auth = require_auth
        self.wait_delay_s = 0.0  # how long operations.wait blocks before answering (GCE: <= 2 min)
        self.zones = zones
        self._lock = threading.RLock()
        self._state = _State()
        self._ids = itertools.count(1)
        self._keys: dict[str, Any] = {}  # service-account e-mail -> public key
        self._subject_tokens: set[str] = set()  # external identities the token exchange accepts
        self.machine_types = {z: dict(DEFAULT_MACHINE_TYPES) for z in zones}
        self.accelerator_types = {z: set(DEFAULT_ACCELERATOR_TYPES) for z in zones}
        self.images: dict[tuple[str, str], dict[str, Any]] = {}
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="fake-gce", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def token_uri(self) -> str:
        return f"{self.url}/token"

    def reset(self) -> None:
        """Forget every instance, operation, fault and call (registered credentials stay)."""
        with self._lock:
            self._state = _State()

    # -- test controls ------------------------------------------------------------------------

    def inject(self, kind: str, times: int = 1, after: int = 0) -> None:
        """Fail the next ``times`` inserts with ``kind``, once ``after`` inserts went through."""
        if kind not in FAULTS:
            raise ValueError(f"unknown fault {kind!r}; known: {sorted(FAULTS)}")
        with self._lock:
            self._state.faults.extend([""] * after + [kind] * times)

    def clear_faults(self) -> None:
        with self._lock:
            self._state.faults.clear()
            self._state.token_failures = 0

    def fail_token(self, times: int = 1) -> None:
        with self._lock:
            self._state.token_failures += times

    def forget_request_ids(self) -> None:
        """As GCE does after its dedupe window (about an hour): the next insert is new."""
        with self._lock:
            self._state.request_ids.clear()

    def register_key(self, email: str, public_key: Any) -> None:
        with self._lock:
            self._keys[email] = public_key

    def register_subject_token(self, subject_token: str) -> None:
        with self._lock:
            self._subject_tokens.add(subject_token)

    def add_image(self, project: str, name: str, family: str | None = None) -> None:
        with self._lock:
            self.images[(project, name)] = {
                "kind": "compute#image",
                "id": str(self._new_id()),
                "name": name,
                "family": family or "",
                "status": "READY",
                "selfLink": f"{SELF_LINK_BASE}/projects/{project}/global/images/{name}",
            }

    def create_instance(self, project: str, zone: str, body: dict[str, Any]) -> None:
        """Put an instance in place directly (someone else's, or one from a lost earlier run)."""
        with self._lock:
            inst = _Instance(project, zone, self._complete(project, zone, dict(body)))
            self._state.instances[(project, zone, body["name"])] = inst

    # -- inspection ---------------------------------------------------------------------------

    @property
    def calls(self) -> list[Call]:
        with self._lock:
            return list(self._state.calls)

    def calls_to(self, api: str) -> list[Call]:
        return [c for c in self.calls if c.api == api]

    @property
    def issued_tokens(self) -> list[str]:
        """Access tokens the token endpoint handed out (to look for in logs)."""
        with self._lock:
            return sorted(self._state.tokens)

    def instances(self, zone: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [
                json.loads(json.dumps(i.body))
                for (_, z, _), i in sorted(self._state.instances.items())
                if zone in (None, z)
            ]

    def instance(self, zone: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            for (_, z, n), inst in self._state.instances.items():
                if (z, n) == (zone, name):
                    return json.loads(json.dumps(inst.body))
        return None

    def metadata(self, zone: str, name: str) -> dict[str, str]:
        body = self.instance(zone, name) or {}
        return {i["key"]: i.get("value", "") for i in body.get("metadata", {}).get("items", [])}

    # -- request handling (called by the handler, under the lock) ------------------------------

    def _new_id(self) -> int:
        return 10**18 + next(self._ids)

    def _now(self) -> str:
        return datetime.now(UTC).isoformat(timespec="milliseconds")

    def handle(
        self, method: str, path: str, query: dict[str, str], body: Any, auth_header: str | None
    ) -> tuple[int, Any, str]:
        """-> (status, JSON body or None, api name). Status 0 means: drop the connection."""
        for route_method, pattern, api in _ROUTES:
            match = pattern.match(path)
            if match and route_method == method:
                break
        else:
            return (
                404,
                HttpError(404, "notFound", f"no route for {method} {path}").body(),
                "unknown",
            )
        with self._lock:
            call = Call(api, method, path, query, body, None)
            self._state.calls.append(call)
            try:
                call.auth = self._authenticate(auth_header)
                status, out = getattr(self, "_" + api.split(".", 1)[1].replace(".", "_"))(
                    query=query, body=body, **match.groupdict()
                )
            except HttpError as error:
                status, out = error.status, error.body()
            call.status = status
            return status, out, api

    def _authenticate(self, header: str | None) -> str | None:
        if not self.require_auth:
            return None
        unauthenticated = HttpError(
            401,
            "authError",
            "Request is missing required authentication credential. Expected OAuth 2 access token.",
            "UNAUTHENTICATED",
        )
        if not header or not header.startswith("Bearer "):
            raise unauthenticated
        token = header.removeprefix("Bearer ").strip()
        if token in self._state.tokens:
            return "token"
        if self._verify_jwt(token) is not None:
            return "jwt"
        raise unauthenticated

    def _verify_jwt(self, token: str) -> dict[str, Any] | None:
        try:
            head_b64, claims_b64, sig_b64 = token.split(".")
            header = json.loads(_b64decode(head_b64))
            claims = json.loads(_b64decode(claims_b64))
            key = self._keys.get(claims.get("iss", ""))
            if key is None or header.get("alg") != "RS256":
                return None
            key.verify(
                _b64decode(sig_b64),
                f"{head_b64}.{claims_b64}".encode(),
                padding.PKCS1v15(),
                hashes.SHA256(),
            )
            if float(claims.get("exp", 0)) < time.time():
                return None
            return claims
        except (ValueError, KeyError, TypeError, InvalidSignature):  # malformed or forged: invalid
            return None

    def token(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self._state.calls.append(
                Call(
                    "oauth2.token",
                    "POST",
                    "/token",
                    {"grant_type": form.get("grant_type", "")},
                    None,
                    None,
                    0,
                )
            )
            if self._state.token_failures > 0:
                self._state.token_failures -= 1
                return 400, {
                    "error": "invalid_grant",
                    "error_description": "Token has been revoked.",
                }
            grant = form.get("grant_type", "")
            if grant == "urn:ietf:params:oauth:grant-type:jwt-bearer":
                ok = self._verify_jwt(form.get("assertion", "")) is not None
            elif grant == "urn:ietf:params:oauth:grant-type:token-exchange":
                ok = form.get("subject_token", "") in self._subject_tokens
            else:
                ok = False
            if not ok:
                return 400, {"error": "invalid_grant", "error_description": "Invalid grant."}
            access = f"ya29.fake-{secrets.token_urlsafe(24)}"
            self._state.tokens.add(access)
            return 200, {
                "access_token": access,
                "expires_in": 3599,
                "token_type": "Bearer",
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
            }

    # -- instances ----------------------------------------------------------------------------

    def _instances_insert(
        self, *, project: str, zone: str, query: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        name = (body or {}).get("name", "")
        fault = self._state.faults.pop(0) if self._state.faults else None
        where, spec = FAULTS[fault] if fault else ("", {})
        fmt = {
            "project": project,
            "zone": zone,
            "region": zone.rsplit("-", 1)[0],
            "name": name,
            "machine": (body or {}).get("machineType", ""),
        }
        if where == "http":
            raise HttpError(
                spec["status"], spec["reason"], spec["message"].format(**fmt), spec.get("grpc", "")
            )
        request_id = query.get("requestId")
        if request_id:
            try:
                if uuid.UUID(request_id).int == 0:
                    raise ValueError
            except ValueError:
                raise HttpError(
                    400,
                    "invalid",
                    f"Invalid value for field 'requestId': '{request_id}'. "
                    "The request ID must be a valid UUID.",
                ) from None
            seen = self._state.request_ids.get(request_id)
            if seen is not None:
                return 200, self._op_view(self._state.ops[seen])
        self._validate_instance(project, zone, body)
        self._check_instance_policies(project, zone, body)
        key = (project, zone, name)
        if key in self._state.instances:
            raise HttpError(
                409,
                "alreadyExists",
                f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists",
                "ALREADY_EXISTS",
            )
        target = f"{SELF_LINK_BASE}/projects/{project}/zones/{zone}/instances/{name}"
        on_done = None
        if where == "op":
            # Accepted, then refused by the zone: the operation fails and no instance remains.
            def on_done(o: _Op) -> None:
                o.body.update(
                    error={
                        "errors": [{"code": spec["code"], "message": spec["message"].format(**fmt)}]
                    },
                    httpErrorStatusCode=spec["status"],
                    httpErrorMessage="SERVICE UNAVAILABLE"
                    if spec["status"] == 503
                    else "FORBIDDEN",
                )

        op = self._new_op(project, zone, "insert", target, on_done)
        if where != "op":
            inst = _Instance(project, zone, self._complete(project, zone, body))
            inst.body["id"] = op.body["targetId"]
            self._state.instances[key] = inst
        if request_id:
            self._state.request_ids[request_id] = (project, zone, op.body["name"])
        view = self._op_view(op)
        if where == "drop":
            return 0, view
        return 200, view

    def _validate_instance(self, project: str, zone: str, body: Any) -> None:
        if not isinstance(body, dict):
            raise HttpError(400, "required", "Required field 'resource' not specified")
        name = body.get("name", "")
        if not _NAME_RE.match(name):
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field 'resource.name': '{name}'. Must be "
                "a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'",
            )
        machine = body.get("machineType", "").rsplit("/", 1)[-1]
        if machine not in self.machine_types.get(zone, {}):
            raise HttpError(
                404,
                "notFound",
                f"The resource 'projects/{project}/zones/{zone}/machineTypes/"
                f"{machine}' was not found",
            )
        for disk in body.get("disks", []):
            source = disk.get("initializeParams", {}).get("sourceImage")
            if source and self._find_image(project, source) is None:
                raise HttpError(404, "notFound", f"The resource '{source}' was not found")
        for key, value in body.get("labels", {}).items():
            if not _LABEL_KEY_RE.match(key) or not _LABEL_VALUE_RE.match(value):
                raise HttpError(
                    400, "invalid", f"Invalid value for field 'resource.labels': '{key}'"
                )
        for item in body.get("metadata", {}).get("items", []):
            if len(item.get("value", "").encode()) > 256 * 1024:
                raise HttpError(
                    400, "invalid", f"Metadata value of '{item.get('key')}' is too large"
                )
        accelerators = list(self.machine_types[zone][machine][2])
        for acc in body.get("guestAccelerators", []):
            acc_name = acc.get("acceleratorType", "").rsplit("/", 1)[-1]
            if acc_name not in self.accelerator_types.get(zone, set()):
                raise HttpError(
                    404,
                    "notFound",
                    f"The resource 'projects/{project}/zones/{zone}/"
                    f"acceleratorTypes/{acc_name}' was not found",
                )
            accelerators.append((acc_name, int(acc.get("acceleratorCount", 1))))
        scheduling = body.get("scheduling", {})
        if accelerators and scheduling.get("onHostMaintenance") != "TERMINATE":
            raise HttpError(
                400, "invalid", "Instances with guest accelerators do not support live migration."
            )
        if scheduling.get("provisioningModel") == "SPOT" and scheduling.get(
            "automaticRestart", False
        ):
            raise HttpError(
                400,
                "invalid",
                "Invalid value for field 'resource.scheduling."
                "automaticRestart': 'true'. Spot VMs cannot be restarted automatically.",
            )

    def _complete(self, project: str, zone: str, body: dict[str, Any]) -> dict[str, Any]:
        """The instance as GCE returns it: the request body plus server-set fields."""
        body = json.loads(json.dumps(body))
        zone_url = f"{SELF_LINK_BASE}/projects/{project}/zones/{zone}"
        machine = body.get("machineType", "").rsplit("/", 1)[-1]
        body.update(
            kind="compute#instance",
            id=body.get("id") or str(self._new_id()),
            creationTimestamp=self._now(),
            status="PROVISIONING",
            zone=zone_url,
            machineType=f"{zone_url}/machineTypes/{machine}",
            selfLink=f"{zone_url}/instances/{body['name']}",
            labelFingerprint=base64.b64encode(secrets.token_bytes(8)).decode(),
        )
        body.setdefault("metadata", {})["fingerprint"] = base64.b64encode(
            secrets.token_bytes(8)
        ).decode()
        body["metadata"]["kind"] = "compute#metadata"
        return body

    def _find_image(self, project: str, source: str) -> dict[str, Any] | None:
        match = re.search(
            r"(?:projects/([^/]+)/)?global/images/(?:family/([^/]+)|([^/]+))$", source
        )
        if match is None:
            return None
        image_project = match[1] or project
        if match[2]:
            return next(
                (
                    i
                    for (p, _), i in sorted(self.images.items())
                    if p == image_project and i["family"] == match[2]
                ),
                None,
            )
        return self.images.get((image_project, match[3]))

    def _instances_get(self, *, project: str, zone: str, name: str, **_: Any) -> tuple[int, Any]:
        inst = self._state.instances.get((project, zone, name))
        if inst is None:
            raise _not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        view = json.loads(json.dumps(inst.body))
        self._read(inst)
        return 200, view

    def _read(self, inst: _Instance) -> None:
        """Time passes for an instance each time it is read."""
        if inst.deleting:
            inst.delete_reads += 1
            if inst.delete_reads >= self.delete_reads:
                self._finish_delete(inst)
            return
        inst.reads += 1
        step = min(inst.reads // max(self.boot_reads, 1), len(_STATUS_STEPS) - 1)
        if _STATUS_STEPS.index(inst.body["status"]) < step:
            inst.body["status"] = _STATUS_STEPS[step]

    def _finish_delete(self, inst: _Instance) -> None:
        self._state.instances.pop((inst.project, inst.zone, inst.body["name"]), None)
        if inst.delete_op:
            op = self._state.ops.get((inst.project, inst.zone, inst.delete_op))
            if op is not None and op.body["status"] != "DONE":
                op.polls_left = 0
                self._complete_op(op)

    def _instances_list(
        self, *, project: str, zone: str, query: dict[str, str], **_: Any
    ) -> tuple[int, Any]:
        wanted = _parse_filter(query.get("filter", ""))
        items = [
            i
            for (p, z, _), i in sorted(self._state.instances.items())
            if (p, z) == (project, zone)
            and all(i.body.get("labels", {}).get(k) == v for k, v in wanted)
        ]
        try:
            max_results = min(int(query.get("maxResults", "500")), 500)
            start = int(query.get("pageToken") or 0)
        except ValueError:
            raise HttpError(400, "invalid", "Invalid value for maxResults or pageToken") from None
        page = items[start : start + max_results]
        out: dict[str, Any] = {
            "kind": "compute#instanceList",
            "id": f"projects/{project}/zones/{zone}/instances",
            "selfLink": f"{SELF_LINK_BASE}/projects/{project}/zones/{zone}/instances",
        }
        if page:
            out["items"] = [json.loads(json.dumps(i.body)) for i in page]
        if start + max_results < len(items):
            out["nextPageToken"] = str(start + max_results)
        for inst in page:
            self._read(inst)
        return 200, out

    def _instances_delete(self, *, project: str, zone: str, name: str, **_: Any) -> tuple[int, Any]:
        inst = self._state.instances.get((project, zone, name))
        if inst is None:
            raise _not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        if inst.deleting:
            raise HttpError(
                400,
                "resourceNotReady",
                f"The resource 'projects/{project}/zones/{zone}/instances/{name}' is not ready",
            )
        inst.deleting = True
        inst.body["status"] = "STOPPING"
        op = self._new_op(
            project,
            zone,
            "delete",
            inst.body["selfLink"],
            lambda o: self._state.instances.pop((project, zone, name), None),
        )
        inst.delete_op = op.body["name"]
        return 200, self._op_view(op)

    # -- operations ---------------------------------------------------------------------------

    def _new_op(self, project: str, zone: str, kind: str, target: str, on_done: Any = None,
                *, region_scoped: bool = False) -> _Op:
        # ``zone`` is the region for a regional operation (resource policies): keyed the same way
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}"
        scope = "regions" if region_scoped else "zones"
        zone_url = f"{SELF_LINK_BASE}/projects/{project}/{scope}/{zone}"
        body = {
            "kind": "compute#operation",
            "id": str(self._new_id()),
            "name": name,
            "region" if region_scoped else "zone": zone_url,
            "operationType": kind,
            "targetLink": target,
            "targetId": str(self._new_id()),
            "status": "RUNNING",
            "user": "burst-test@example.iam.gserviceaccount.com",
            "progress": 0,
            "insertTime": self._now(),
            "startTime": self._now(),
            "selfLink": f"{zone_url}/operations/{name}",
        }
        op = _Op(body, self.op_polls, on_done)
        self._state.ops[(project, zone, name)] = op
        if op.polls_left <= 0:
            self._complete_op(op)
        return op

    def _complete_op(self, op: _Op) -> None:
        op.body.update(status="DONE", progress=100, endTime=self._now())
        if op.on_done is not None:
            op.on_done(op)

    def _op_view(self, op: _Op) -> dict[str, Any]:
        return json.loads(json.dumps(op.body))

    def _poll(self, project: str, zone: str, op_name: str) -> tuple[int, Any]:
        op = self._state.ops.get((project, zone, op_name))
        if op is None:
            raise _not_found(f"projects/{project}/zones/{zone}/operations/{op_name}")
        if op.body["status"] != "DONE":
            op.polls_left -= 1
            if op.polls_left <= 0:
                self._complete_op(op)
        return 200, self._op_view(op)

    def _zoneOperations_get(self, *, project: str, zone: str, op: str, **_: Any) -> tuple[int, Any]:
        return self._poll(project, zone, op)

    def _zoneOperations_wait(
        self, *, project: str, zone: str, op: str, **_: Any
    ) -> tuple[int, Any]:
        return self._poll(project, zone, op)

    # -- machine types and images ---------------------------------------------------------------

    def _machine_type(self, project: str, zone: str, name: str) -> dict[str, Any]:
        cpus, mem, accelerators = self.machine_types[zone][name]
        out: dict[str, Any] = {
            "kind": "compute#machineType",
            "id": str(abs(hash(name)) % 10**12),
            "name": name,
            "guestCpus": cpus,
            "memoryMb": mem,
            "zone": zone,
            "selfLink": f"{SELF_LINK_BASE}/projects/{project}/zones/{zone}/machineTypes/{name}",
        }
        if accelerators:
            out["accelerators"] = [
                {"guestAcceleratorType": t, "guestAcceleratorCount": n} for t, n in accelerators
            ]
        return out

    def _machineTypes_list(self, *, project: str, zone: str, **_: Any) -> tuple[int, Any]:
        items = [
            self._machine_type(project, zone, n) for n in sorted(self.machine_types.get(zone, {}))
        ]
        return 200, {"kind": "compute#machineTypeList", "items": items}

    def _machineTypes_get(self, *, project: str, zone: str, type: str, **_: Any) -> tuple[int, Any]:
        if type not in self.machine_types.get(zone, {}):
            raise _not_found(f"projects/{project}/zones/{zone}/machineTypes/{type}")
        return 200, self._machine_type(project, zone, type)

    def _images_get(self, *, project: str, image: str, **_: Any) -> tuple[int, Any]:
        found = self.images.get((project, image))
        if found is None:
            raise _not_found(f"projects/{project}/global/images/{image}")
        return 200, dict(found)

    def _images_getFromFamily(self, *, project: str, family: str, **_: Any) -> tuple[int, Any]:
        found = self._find_image(project, f"projects/{project}/global/images/family/{family}")
        if found is None:
            raise _not_found(f"projects/{project}/global/images/family/{family}")
        return 200, dict(found)


def _not_found(resource: str) -> HttpError:
    return HttpError(404, "notFound", f"The resource '{resource}' was not found", "NOT_FOUND")


def _parse_filter(text: str) -> list[tuple[str, str]]:
    """The filter subset we serve: ``labels.KEY = "VALUE"`` clauses joined by AND."""
    if not text.strip():
        return []
    clauses = []
    for part in re.split(r"\s+AND\s+", text.strip()):
        match = _CLAUSE_RE.match(part.strip())
        if match is None:
            raise HttpError(
                400,
                "invalid",
                f"Invalid value for field 'filter': '{text}'. "
                '(the fake serves labels.KEY = "VALUE" [AND ...] only)',
            )
        clauses.append((match[1], match[2]))
    return clauses


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class _Handler(BaseHTTPRequestHandler):
    fake: FakeGce
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the tests read fake.calls instead

    def _reply(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _serve(self) -> None:
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if parts.path == "/token" and self.command == "POST":
            form = {k: v[0] for k, v in parse_qs(raw.decode()).items()}
            status, body = self.fake.token(form)
            self._reply(status, body)
            return
        query = {k: v[0] for k, v in parse_qs(parts.query).items()}
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            self._reply(400, HttpError(400, "parseError", "Parse Error").body())
            return
        if self.fake.wait_delay_s and parts.path.endswith("/wait"):
            # Outside the fake's lock, so others are served; in short naps, so that a test
            # setting wait_delay_s back to 0 frees a blocked wait at once.
            until = time.monotonic() + self.fake.wait_delay_s
            while self.fake.wait_delay_s and time.monotonic() < until:
                time.sleep(0.05)
            if not self.fake.wait_delay_s:
                self.close_connection = True  # freed by the test: its client is long gone
                return
        status, out, _ = self.fake.handle(
            self.command, parts.path, query, body, self.headers.get("Authorization")
        )
        if status == 0:
            # The request was carried out but its answer is lost on the way back.
            self.close_connection = True
            return
        self._reply(status, out)

    do_GET = do_POST = do_DELETE = _serve


# -- credentials for tests -------------------------------------------------------------------------

_KEY_CACHE: dict[str, rsa.RSAPrivateKey] = {}


def _private_key() -> rsa.RSAPrivateKey:
    # One key per test process: generating RSA keys is the slow part of setting credentials up.
    if "key" not in _KEY_CACHE:
        _KEY_CACHE["key"] = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return _KEY_CACHE["key"]


def write_service_account_key(
    fake: FakeGce,
    path: Path,
    *,
    project: str = "burst-test",
    email: str = "burst-controller@burst-test.iam.gserviceaccount.com",
    register: bool = True,
) -> Path:
    """A real-format service-account JSON key whose token_uri is the fake; its public key is
    registered with the fake unless ``register`` is false (a key the API does not know)."""
    key = _private_key()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    if register:
        fake.register_key(email, key.public_key())
    info = {
        "type": "service_account",
        "project_id": project,
        "private_key_id": secrets.token_hex(20),
        "private_key": pem,
        "client_email": email,
        "client_id": str(10**20 + 7),
        "auth_uri": f"{fake.url}/auth",
        "token_uri": fake.token_uri,
        "auth_provider_x509_cert_url": f"{fake.url}/certs",
        "client_x509_cert_url": f"{fake.url}/certs/{email}",
        "universe_domain": "googleapis.com",
    }
    path.write_text(json.dumps(info))
    path.chmod(0o600)
    return path


def write_external_account_file(fake: FakeGce, directory: Path) -> tuple[Path, str]:
    """A workload identity federation ADC file (``external_account``, file-sourced OIDC token),
    what an on-prem controller uses without a key; its STS ``token_url`` is the fake.
    Returns (path of the ADC file, the external token the fake accepts)."""
    subject_token = f"eyJfake-oidc.{secrets.token_urlsafe(24)}"
    fake.register_subject_token(subject_token)
    token_file = directory / "oidc-token"
    token_file.write_text(subject_token)
    token_file.chmod(0o600)
    info = {
        "type": "external_account",
        "audience": "//iam.googleapis.com/locations/global/workloadIdentityPools/burst/providers/"
        "onprem",
        "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        "token_url": fake.token_uri,
        "credential_source": {"file": str(token_file)},
        "universe_domain": "googleapis.com",
    }
    path = directory / "wif.json"
    path.write_text(json.dumps(info))
    return path, subject_token


def private_key_marker() -> str:
    """A line of the test private key, to look for in logs."""
    pem = (
        _private_key()
        .private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        .decode()
    )
    return pem.splitlines()[5]
