"""Fake Nova: a small OpenStack Compute (v2.1) server for testing the libcloud adapter over HTTP.

It speaks the subset of the Compute API (plus the two Glance v2 image calls) that libcloud's real
``OpenStack_2_NodeDriver`` makes, so the adapter's whole production path (driver construction from
``config.args``, HTTP, JSON parsing, libcloud's own error types) runs in tests. Bodies are shaped
like libcloud's bundled fixtures (``libcloud/test/compute/fixtures/openstack_v1_1/``): the
bundled flavors and Glance images are served as-is beside the GPU flavors and the node image
defined here, and servers are rendered from the bundled server template. Unlike the fixtures,
servers have real state: what ``POST /servers`` sent (name, flavorRef, imageRef, metadata,
user_data) is what later reads return.

Behaviour modelled on Nova:

* ``X-Auth-Token`` is checked on every call (401 without it or with a wrong one). Keystone is
  never called: the driver is given the token and the endpoint (``ex_force_auth_token``,
  ``ex_force_base_url``).
* ``POST /servers`` validates like Nova's JSON schema (metadata keys ``[a-zA-Z0-9-_:. ]{1,255}``,
  values up to 255 characters, ``user_data`` base64 of at most 65535 bytes, known flavor and
  image) and answers 202. The server is ``BUILD`` (task ``scheduling``) on its first
  ``build_polls`` reads and ``ACTIVE`` afterwards.
* ``DELETE /servers/{id}`` answers 204; the server is gone at once (404 afterwards).

Failure injection (``inject(kind, times)``) acts on the next ``times`` calls of ``POST /servers``
(the launch), each answered the way Nova answers that case:

* ``capacity``: accepted (202), then the scheduler finds no host: after the ``BUILD`` reads the
  server is ``ERROR`` with fault ``{"code": 500, "message": "No valid host was found. There are
  not enough hosts available."}``. Nova reports NoValidHost only this way, never on the POST.
* ``quota``: 403 ``{"forbidden": {"message": "Quota exceeded for instances: ..."}}``.
* ``auth``: 401; ``transient``: 503; ``invalid``: 400 ``{"badRequest": ...}``.
"""

from __future__ import annotations

import base64
import binascii
import copy
import itertools
import json
import os
import re
import secrets
import threading
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

import libcloud

FIXTURES = os.path.join(
    os.path.dirname(libcloud.__file__), "test", "compute", "fixtures", "openstack_v1_1"
)
FAULT_KINDS = ("capacity", "quota", "auth", "transient", "invalid")
NO_VALID_HOST = "No valid host was found. There are not enough hosts available."
# Nova's schema for server metadata (nova/api/validation/parameter_types.py): ':' is allowed, so
# the adapter can use burst's own tag keys ("burst:cluster") unchanged.
_METADATA_KEY = re.compile(r"^[a-zA-Z0-9-_:. ]{1,255}$")
_MAX_USER_DATA = 65535

NODE_IMAGE_ID = "5e1c6a52-8f3e-4d6b-9b1a-6a3e0b7f0c11"
NODE_IMAGE_NAME = "burst-node-ubuntu-22.04"
# GPU flavors as an operator would define them: the GPU is a PCI passthrough alias in the extra
# specs, which libcloud exposes but burst does not interpret (the policy's sizes carry the facts).
GPU_FLAVORS: list[dict[str, Any]] = [
    {"id": "g1.a100.1", "name": "gpu.a100.1x", "vcpus": 12, "ram": 98304, "disk": 200,
     "extra_specs": {"pci_passthrough:alias": "a100:1"}},
    {"id": "g1.a100.4", "name": "gpu.a100.4x", "vcpus": 48, "ram": 393216, "disk": 800,
     "extra_specs": {"pci_passthrough:alias": "a100:4"}},
    {"id": "g1.h100.8", "name": "gpu.h100.8x", "vcpus": 96, "ram": 1048576, "disk": 2000,
     "extra_specs": {"pci_passthrough:alias": "h100:8"}},
]


def _fixture(name: str) -> dict[str, Any]:
    with open(os.path.join(FIXTURES, name)) as f:
        return json.load(f)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Reply(Exception):
    """Raised inside a handler to answer with ``status`` and a JSON body."""

    def __init__(self, status: int, body: dict[str, Any] | None = None):
        super().__init__(status)
        self.status = status
        self.body = body


def _nova_error(status: int, key: str, message: str) -> _Reply:
    # Nova wraps every error as {"<kind>": {"message": ..., "code": ...}}; libcloud's
    # OpenStackResponse.parse_error reads the message out of that shape.
    return _Reply(status, {key: {"message": message, "code": status}})


class FakeNova:
    """The server and its state. Use as a context manager, or ``start()``/``stop()``."""

    def __init__(self, *, tenant: str = "tenant1", token: str | None = None, build_polls: int = 1):
        self.tenant = tenant
        self.token = token or f"tok-{secrets.token_hex(8)}"
        self.build_polls = build_polls
        self._lock = threading.Lock()
        self._servers: dict[str, dict[str, Any]] = {}
        self._faults: list[str] = []
        self._ids = itertools.count(1)
        self.requests: list[tuple[str, str]] = []  # (method, path) of every call, for assertions
        self._flavors = self._load_flavors()
        self._images = self._load_images()
        self._server_template = _fixture("_servers_detail.json")["servers"][0]
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        handler = type("Handler", (_Handler,), {"nova": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        name="fake-nova", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._httpd is not None, "not started"
        return self._httpd.server_address[1]

    @property
    def base_url(self) -> str:
        """The compute endpoint, as the service catalogue would list it (``ex_force_base_url``)."""
        return f"http://127.0.0.1:{self.port}/v2.1/{self.tenant}"

    # -- test-side powers ---------------------------------------------------------------------

    def inject(self, kind: str, times: int = 1) -> None:
        """Make the next ``times`` launches (``POST /servers``) fail as Nova does for ``kind``."""
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
        with self._lock:
            self._faults.extend([kind] * times)

    def clear(self) -> None:
        """Drop any injected fault not yet consumed."""
        with self._lock:
            self._faults.clear()

    def reset(self) -> None:
        """Back to no servers, no faults, no recorded requests."""
        with self._lock:
            self._servers.clear()
            self._faults.clear()
            self.requests.clear()

    def servers(self) -> list[dict[str, Any]]:
        """A copy of every server's state (including the decoded ``user_data``)."""
        with self._lock:
            return [copy.deepcopy(s) for s in self._servers.values()]

    def user_data(self, server_id: str) -> str:
        """What the server booted with, decoded as Nova's metadata service would hand it out."""
        with self._lock:
            return self._servers[server_id]["user_data"] or ""

    # -- API ----------------------------------------------------------------------------------

    def handle(self, method: str, path: str, headers: Any, body: bytes) -> tuple[int, Any]:
        with self._lock:
            self.requests.append((method, path))
        if headers.get("X-Auth-Token") != self.token:
            # keystonemiddleware's answer, before Nova sees the request.
            raise _Reply(401, {"error": {"code": 401, "title": "Unauthorized",
                                         "message": "The request you have made requires "
                                                    "authentication."}})
        route = self._route(path)
        parts = [p for p in route.split("/") if p]
        if parts[:2] == ["v2", "images"]:
            return self._glance(method, parts[2:])
        if method == "GET" and parts == ["flavors", "detail"]:
            return 200, {"flavors": self._flavors}
        if method == "GET" and len(parts) == 2 and parts[0] == "flavors":
            return 200, {"flavor": self._flavor(parts[1])}
        if method == "GET" and parts == ["images", "detail"]:
            return 200, {"images": [self._nova_image(i) for i in self._images]}
        if method == "GET" and len(parts) == 2 and parts[0] == "images":
            _, image = self._glance("GET", parts[1:])
            return 200, {"image": self._nova_image(image)}
        if method == "POST" and parts == ["servers"]:
            return self._create(body)
        if method == "GET" and parts in (["servers"], ["servers", "detail"]):
            with self._lock:
                servers = [self._observe(s) for s in self._servers.values()]
            if parts == ["servers"]:
                servers = [{"id": s["id"], "name": s["name"], "links": s["links"]}
                           for s in servers]
            return 200, {"servers": servers}
        if len(parts) >= 2 and parts[0] == "servers":
            return self._server_call(method, parts[1], parts[2:])
        raise _nova_error(404, "itemNotFound", f"The resource could not be found: {route}")

    def _route(self, path: str) -> str:
        path = urlsplit(path).path
        prefix = f"/v2.1/{self.tenant}"
        if path.startswith(prefix):
            return path[len(prefix):]
        if path.startswith("/v2.1"):
            return path[len("/v2.1"):]
        return path

    def _glance(self, method: str, rest: list[str]) -> tuple[int, Any]:
        if method != "GET":
            raise _nova_error(405, "error", "method not allowed")
        if not rest:
            return 200, {"images": self._images, "schema": "/v2/schemas/images",
                         "first": "/v2/images"}
        for image in self._images:
            if image["id"] == rest[0]:
                return 200, image
        # Glance's 404 is plain text wrapped in HTML by webob; JSON is close enough for libcloud.
        raise _nova_error(404, "itemNotFound", f"No image found with ID {rest[0]}")

    def _server_call(self, method: str, server_id: str, rest: list[str]) -> tuple[int, Any]:
        with self._lock:
            server = self._servers.get(server_id)
            if server is None:
                raise _nova_error(404, "itemNotFound", f"Instance {server_id} could not be found.")
            if method == "GET" and not rest:
                return 200, {"server": self._observe(server)}
            if method == "GET" and rest == ["metadata"]:
                return 200, {"metadata": dict(server["metadata"])}
            if method == "DELETE" and not rest:
                del self._servers[server_id]
                return 204, None
        raise _nova_error(404, "itemNotFound", "The resource could not be found.")

    def _create(self, body: bytes) -> tuple[int, Any]:
        try:
            server = json.loads(body or b"{}")["server"]
        except (ValueError, KeyError, TypeError):
            raise _nova_error(400, "badRequest", "Malformed request body") from None
        with self._lock:
            fault = self._faults.pop(0) if self._faults else None
        if fault == "quota":
            raise _nova_error(403, "forbidden",
                              "Quota exceeded for instances: Requested 1, but already used 10 of "
                              "10 instances")
        if fault == "auth":
            raise _Reply(401, {"error": {"code": 401, "title": "Unauthorized",
                                         "message": "The request you have made requires "
                                                    "authentication."}})
        if fault == "transient":
            raise _nova_error(503, "serviceUnavailable",
                              "The server is currently unavailable. Please try again later.")
        if fault == "invalid":
            raise _nova_error(400, "badRequest", "Invalid flavorRef provided.")
        record = self._validated(server)
        record["fault_kind"] = fault  # "capacity" or None: decided by the scheduler, later
        with self._lock:
            self._servers[record["id"]] = record
            links = self._links(record["id"])
        return 202, {"server": {"id": record["id"], "links": links,
                                "adminPass": secrets.token_urlsafe(9)}}

    def _validated(self, server: dict[str, Any]) -> dict[str, Any]:
        name = server.get("name")
        if not isinstance(name, str) or not 1 <= len(name) <= 255:
            raise _nova_error(400, "badRequest", "Invalid input for field/attribute name.")
        flavor = self._flavor(str(server.get("flavorRef", "")), status=400,
                              message="Invalid flavorRef provided.")
        image_ref = str(server.get("imageRef", ""))
        if not any(i["id"] == image_ref for i in self._images):
            raise _nova_error(400, "badRequest", f"Image {image_ref} could not be found.")
        metadata = server.get("metadata") or {}
        if not isinstance(metadata, dict):
            raise _nova_error(400, "badRequest", "Invalid input for field/attribute metadata.")
        for key, value in metadata.items():
            if not _METADATA_KEY.match(key) or not isinstance(value, str) or len(value) > 255:
                raise _nova_error(400, "badRequest",
                                  f"Invalid input for field/attribute metadata. Value: {key}")
        user_data = None
        if server.get("user_data") is not None:
            try:
                raw = base64.b64decode(server["user_data"], validate=True)
            except (binascii.Error, TypeError):
                raise _nova_error(400, "badRequest", "User data needs to be valid base 64.") from None
            if len(server["user_data"]) > _MAX_USER_DATA:
                raise _nova_error(400, "badRequest", "User data too large.")
            user_data = raw.decode("utf-8", errors="replace")
        now = _now()
        return {
            "id": str(uuid.uuid4()),
            "name": name,
            "flavor_id": str(flavor["id"]),
            "image_id": image_ref,
            "metadata": dict(metadata),
            "user_data": user_data,
            "status": "BUILD",
            "reads": 0,
            "created": now,
            "updated": now,
            "number": next(self._ids),
        }

    # -- rendering ----------------------------------------------------------------------------

    def _observe(self, record: dict[str, Any]) -> dict[str, Any]:
        """Advance a building server by one read, then render it. Locked."""
        if record["status"] == "BUILD":
            if record["reads"] >= self.build_polls:
                record["status"] = "ERROR" if record["fault_kind"] == "capacity" else "ACTIVE"
                record["updated"] = _now()
            record["reads"] += 1
        return self._render(record)

    def _render(self, record: dict[str, Any]) -> dict[str, Any]:
        server = copy.deepcopy(self._server_template)
        status = record["status"]
        n = record["number"]
        server.update(
            id=record["id"],
            name=record["name"],
            status=status,
            metadata=dict(record["metadata"]),
            created=record["created"],
            updated=record["updated"],
            tenant_id=self.tenant,
            user_id="burst-test",
            hostId="" if status != "ACTIVE" else f"host-{n:04d}",
            links=self._links(record["id"]),
            image={"id": record["image_id"], "links": []},
            flavor={"id": record["flavor_id"], "links": []},
            addresses={} if status != "ACTIVE" else {
                "private": [{"version": 4, "addr": f"10.0.{n // 250}.{n % 250 + 2}",
                             "OS-EXT-IPS:type": "fixed"}]},
            progress=0 if status == "BUILD" else 100,
        )
        server["OS-EXT-STS:task_state"] = "scheduling" if status == "BUILD" else None
        server["OS-EXT-STS:vm_state"] = {"BUILD": "building", "ACTIVE": "active",
                                         "ERROR": "error"}[status]
        server["OS-EXT-STS:power_state"] = 1 if status == "ACTIVE" else 0
        server.pop("fault", None)
        server.pop("uuid", None)
        if status == "ERROR":
            server["fault"] = {"code": 500, "created": record["updated"], "message": NO_VALID_HOST}
        return server

    def _links(self, server_id: str) -> list[dict[str, str]]:
        href = f"{self.base_url}/servers/{server_id}"
        return [{"href": href, "rel": "self"}, {"href": href, "rel": "bookmark"}]

    def _flavor(self, flavor_id: str, *, status: int = 404, message: str | None = None
                ) -> dict[str, Any]:
        for flavor in self._flavors:
            if str(flavor["id"]) == flavor_id:
                return flavor
        key = "badRequest" if status == 400 else "itemNotFound"
        raise _nova_error(status, key, message or f"Flavor {flavor_id} could not be found.")

    @staticmethod
    def _load_flavors() -> list[dict[str, Any]]:
        flavors = _fixture("_flavors_detail.json")["flavors"]
        for f in GPU_FLAVORS:
            flavors.append({
                "id": f["id"], "name": f["name"], "vcpus": f["vcpus"], "ram": f["ram"],
                "disk": f["disk"], "swap": 0, "rxtx_factor": 1.0,
                "OS-FLV-EXT-DATA:ephemeral": 0, "OS-FLV-DISABLED:disabled": False,
                "os-flavor-access:is_public": True,
                "OS-FLV-WITH-EXT-SPECS:extra_specs": dict(f["extra_specs"]),
                "links": [],
            })
        return flavors

    @staticmethod
    def _load_images() -> list[dict[str, Any]]:
        images = _fixture("_images_v2.json")["images"]
        node_image = copy.deepcopy(images[0])
        node_image.update(id=NODE_IMAGE_ID, name=NODE_IMAGE_NAME, visibility="public",
                          image_type="image", self=f"/v2/images/{NODE_IMAGE_ID}",
                          file=f"/v2/images/{NODE_IMAGE_ID}/file")
        return [node_image, *images]

    @staticmethod
    def _nova_image(image: dict[str, Any]) -> dict[str, Any]:
        # The deprecated Nova image proxy: upper-case status and camelCase fields.
        return {"id": image["id"], "name": image["name"], "status": image["status"].upper(),
                "created": image["created_at"], "updated": image["updated_at"],
                "minDisk": image.get("min_disk", 0), "minRam": image.get("min_ram", 0),
                "progress": 100, "metadata": {}, "links": []}


class _Handler(BaseHTTPRequestHandler):
    nova: FakeNova
    protocol_version = "HTTP/1.1"
    # Headers and body go out as two writes; with Nagle on, the client's delayed ACK holds the
    # body back ~40 ms per call.
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        try:
            status, payload = self.nova.handle(self.command, self.path, self.headers, body)
        except _Reply as reply:
            status, payload = reply.status, reply.body
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: tests read ``FakeNova.requests`` instead
