"""libcloud provider: burst nodes from any apache-libcloud compute driver (OpenStack first).

``LibcloudProvider(config)`` builds the driver named by ``config.driver`` with ``config.key``,
``config.secret`` and ``config.args`` (any string of the form ``env:VAR`` is read from the
environment when the provider is built, and never logged), and keeps the ``Provider`` contract on
top of the driver's generic calls (``list_sizes``, ``list_images``, ``create_node``,
``list_nodes``, ``destroy_node``). ``config`` is any object with the attributes of the policy's
``LibcloudConfig`` (driver, key, secret, args, image, sizes); this module does not import the
policy package.

Offerings
    Drivers know neither GPUs nor (mostly) prices, so ``config.sizes`` supplies them; each is
    matched to a driver size by id or name. A configured size the driver does not list is left
    out, with a warning. All offerings are on-demand (libcloud has no generic spot market), in
    region ``region`` (constructor argument, default ``"default"``), zone ``None``.

Ownership and idempotency
    libcloud has no client token in general, so the instance name and metadata carry them:

    * Drivers whose ``create_node`` takes ``ex_metadata`` (OpenStack: server metadata; EC2: tags)
      get the four ``burst:*`` tags unchanged: Nova's metadata keys may be
      ``[a-zA-Z0-9-_:. ]{1,255}`` and EC2 tag keys allow ':'. GCE metadata keys may not contain
      ':', so for ``gce`` the keys are written ``burst-cluster`` etc.; reading accepts both
      spellings. The instance is named after the node id.
    * Drivers without ``ex_metadata`` get the ownership encoded in the name:
      ``burst--<cluster>--<policy>--<node id>--<request id>`` (a component containing ``--`` is an
      :class:`InvalidRequest`). Drivers that ignore the name (libcloud's Dummy driver) cannot
      carry ownership at all: launches work, ``list_owned`` never sees them, and a warning says so.
    * ``launch`` first looks for a node tagged with the request id (or, untagged, bearing the
      expected name) and returns it. Where ``create_node`` takes ``ex_clienttoken`` (EC2) the
      request id is passed as the client token as well.
    * User data goes through ``ex_userdata`` where the driver has it (OpenStack, EC2, ...).

Launch failures reported after the API accepted the launch (OpenStack)
    Nova answers ``POST /servers`` with 202 before scheduling; when no hypervisor fits, the
    server turns ``ERROR`` with fault "No valid host was found" a moment later. ``launch``
    therefore polls the new server (``ex_get_node_details``) while it is still being scheduled
    (status BUILD, task state ``scheduling`` or unknown), for at most ``settle_s`` seconds. A
    server found in ``ERROR`` is deleted (best effort, so it leaks neither quota nor a request id)
    and its fault is raised through the error table below: NoValidHost becomes
    :class:`CapacityError`, with a :class:`ServerFault` as ``__cause__``. A NoValidHost message in
    an HTTP error (some Nova deployments and proxies answer 500 at once) maps the same way. A
    server still scheduling after ``settle_s`` is returned as pending; a later ``launch`` with the
    same request id settles it again: if it failed meanwhile, that call deletes it and raises the
    typed error, and the call after that launches afresh.

Errors (:func:`classify`, checked in this order; the libcloud exception is kept as ``__cause__``)

    ===================================================================  =====================
    libcloud.common.types.InvalidCredsError                              AuthError
    libcloud.common.exceptions.RateLimitReachedError (HTTP 429)          TransientError
    message matches "No valid host" / "NoValidHost" / "capacity" /       CapacityError
    "Insufficient resources" / "not enough hosts" (Nova NoValidHost, EC2
    InsufficientInstanceCapacity); not "insufficient privileges"
    message matches "rate limit" / "throttl" (throttling under any       TransientError
    status, so "Rate limit exceeded" is not read as a quota)
    message matches "quota" / "LimitExceeded" (Nova answers 403 "Quota   QuotaError
    exceeded for instances", EC2 InstanceLimitExceeded)
    HTTP status (BaseHTTPError.code, ProviderError.http_code): 401, 403  AuthError
    HTTP 413 (Nova's old overLimit for quotas)                           QuotaError
    HTTP 409 (Nova: the server is busy in another task), 429, 500, 502,  TransientError
    503, 504 (and any other 5xx)
    HTTP 400, 404, 405, 422 (and any other 4xx)                          InvalidRequest
    OSError (socket errors, timeouts, requests' ConnectionError and      TransientError
    Timeout, SSL errors)
    any other LibcloudError (e.g. MalformedResponseError from a proxy)   TransientError
    NotImplementedError, anything else (a bug here or in the driver)     InvalidRequest
    ===================================================================  =====================

Threads: launches through one provider object are serialised (so two concurrent launches of the
same request id create one node); other calls go straight to the driver.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from typing import Any

from libcloud import pricing as libcloud_pricing
from libcloud.common.exceptions import BaseHTTPError, RateLimitReachedError
from libcloud.common.types import InvalidCredsError, LibcloudError
from libcloud.common.types import ProviderError as LibcloudProviderError
from libcloud.compute.base import Node, NodeDriver, NodeImage, NodeSize
from libcloud.compute.providers import get_driver
from libcloud.compute.types import NodeState
from libcloud.compute.types import Provider as LibcloudProviderName

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.offerings import BillingRule, Market, Offering, offering_key
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

log = logging.getLogger(__name__)

PROVIDER_NAME = "libcloud"
DEFAULT_REGION = "default"
_ENV_REF = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]*)$")
_TAG_PREFIX = OwnershipTags.PREFIX + ":"
_TAG_FIELDS = ("cluster", "policy", "node-id", "request-id")
# GCE instance metadata keys are [a-zA-Z0-9-_]{1,128}: no ':'.
_DASH_KEY_DRIVERS = frozenset({"gce"})
_NAME_SEPARATOR = "--"

# "Insufficient" only where it is about capacity: "insufficient privileges" is not a stockout.
_CAPACITY_MESSAGE = re.compile(
    r"no valid host|novalidhost|capacity|insufficient\s*(compute\s*)?resources|not enough hosts",
    re.IGNORECASE)
_THROTTLE_MESSAGE = re.compile(r"rate\s*limit|throttl", re.IGNORECASE)
_QUOTA_MESSAGE = re.compile(r"quota|limitexceeded|limit exceeded", re.IGNORECASE)
_STATUS_ERRORS: dict[int, type[ProviderError]] = {
    401: AuthError,
    403: AuthError,
    413: QuotaError,
    409: TransientError,
    429: TransientError,
    500: TransientError,
    502: TransientError,
    503: TransientError,
    504: TransientError,
    400: InvalidRequest,
    404: InvalidRequest,
    405: InvalidRequest,
    422: InvalidRequest,
}

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


class ServerFault(Exception):
    """A launch the cloud accepted and then failed (a server in ERROR with a fault).

    The ``__cause__`` of the typed error raised for it, standing in for the SDK exception that
    does not exist in that case.
    """

    def __init__(self, node_id: str, message: str, code: int | None):
        super().__init__(f"server {node_id} failed: {message}")
        self.node_id = node_id
        self.message = message
        self.code = code



def resolve_env_ref(value: Any) -> Any:
    """``env:NAME`` -> the variable's value (KeyError naming it if unset); anything else as is."""
    if not isinstance(value, str):
        return value
    match = _ENV_REF.match(value)
    if match is None:
        return value
    name = match.group(1)
    try:
        return os.environ[name]
    except KeyError:
        raise KeyError(name) from None


def classify(exc: BaseException) -> tuple[type[ProviderError], str]:
    """The typed error for a libcloud (or transport) exception, and a short code; see the table."""
    if isinstance(exc, InvalidCredsError):
        return AuthError, "InvalidCreds"
    if isinstance(exc, RateLimitReachedError):
        return TransientError, "HTTP 429"
    message = _message(exc)
    status = _status(exc)
    if _CAPACITY_MESSAGE.search(message):
        return CapacityError, "NoValidHost" if "valid host" in message.lower() else "Capacity"
    if _THROTTLE_MESSAGE.search(message):
        return TransientError, "Throttled"
    if _QUOTA_MESSAGE.search(message):
        return QuotaError, "QuotaExceeded"
    if status is not None:
        if status in _STATUS_ERRORS:
            return _STATUS_ERRORS[status], f"HTTP {status}"
        if 400 <= status < 500:
            return InvalidRequest, f"HTTP {status}"
        return TransientError, f"HTTP {status}"
    if isinstance(exc, OSError):
        return TransientError, type(exc).__name__
    if isinstance(exc, LibcloudError):
        return TransientError, type(exc).__name__
    return InvalidRequest, type(exc).__name__


def _message(exc: BaseException) -> str:
    if isinstance(exc, ServerFault):
        return exc.message
    if isinstance(exc, BaseHTTPError):
        return str(exc.message)
    if isinstance(exc, LibcloudError):
        return str(exc.value)
    return str(exc)


def _status(exc: BaseException) -> int | None:
    if isinstance(exc, BaseHTTPError):
        return _int_or_none(exc.code)
    if isinstance(exc, LibcloudProviderError):
        return _int_or_none(exc.http_code)
    if isinstance(exc, ServerFault):
        return exc.code
    return None


def _attr(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


class LibcloudProvider:
    """The ``Provider`` over one libcloud compute driver, configured by a ``LibcloudConfig``.

    ``region`` names the offerings' region (libcloud drivers take theirs in ``config.args``).
    ``settle_s``/``poll_s``: how long and how often ``launch`` watches a new server while the
    cloud is still scheduling it (see the module docstring). ``sizes_ttl_s``: how long the
    driver's size list is reused before it is listed again.
    """

    name = PROVIDER_NAME
    # Clouds behind libcloud differ in what a guest halt does (stop and keep billing, or
    # nothing): no self-termination is offered; the controller terminates the node.
    self_terminate_command: str | None = None

    def __init__(
        self,
        config: Any,
        *,
        region: str | None = None,
        settle_s: float = 20.0,
        poll_s: float = 1.0,
        sizes_ttl_s: float = 600.0,
    ):
        self.region = region or DEFAULT_REGION
        self.settle_s = float(settle_s)
        self.poll_s = float(poll_s)
        self.sizes_ttl_s = float(sizes_ttl_s)
        self.driver_name = str(_attr(config, "driver")).strip().lower()
        self.image_ref = str(_attr(config, "image"))
        self._sizes_config: dict[str, Any] = dict(_attr(config, "sizes") or {})
        self._driver = self._build_driver(config)
        params = inspect.signature(self._driver.create_node).parameters
        self._has_metadata = "ex_metadata" in params
        self._has_userdata = "ex_userdata" in params
        self._has_client_token = "ex_clienttoken" in params
        self._dash_keys = self.driver_name in _DASH_KEY_DRIVERS
        self._launch_lock = threading.Lock()
        self._size_cache: dict[str, NodeSize] | None = None  # config size key -> driver size
        self._size_cache_at = 0.0
        self._image: NodeImage | None = None
        if not self._has_userdata:
            log.warning("libcloud driver %s cannot pass user data: nodes will not bootstrap",
                        self.driver_name)

    # -- construction -------------------------------------------------------------------------

    def _build_driver(self, config: Any) -> NodeDriver:
        cls = _driver_class(self.driver_name)
        try:
            key = resolve_env_ref(_attr(config, "key"))
            secret = resolve_env_ref(_attr(config, "secret"))
            args = {str(k): resolve_env_ref(v) for k, v in dict(_attr(config, "args") or {}).items()}
        except KeyError as exc:
            # The variable's name only: its value, if any, is a secret.
            raise AuthError(
                f"environment variable {exc.args[0]} (named by the libcloud config) is not set",
                provider=PROVIDER_NAME, code="MissingEnv",
            ) from None
        positional = [key] if secret is None else [key, secret]
        try:
            driver = cls(*positional, **args)
        except Exception as exc:
            error, code = classify(exc)
            if error is TransientError and not isinstance(exc, OSError) and _status(exc) is None:
                # A LibcloudError raised while building, not from the network, is a bad setting
                # (e.g. "OpenStack instance must have auth_url set"): retrying will not help.
                error = InvalidRequest
            # Arguments are named, never their values (they may hold tokens); a TypeError's text
            # names only the offending parameter, other messages could quote a value.
            why = f"{type(exc).__name__}: {exc}" if isinstance(exc, TypeError) else type(exc).__name__
            raise error(
                f"cannot build libcloud driver {self.driver_name!r} with arguments "
                f"{sorted(args)}: {why}",
                provider=PROVIDER_NAME, code=code,
            ) from exc
        log.info("libcloud driver %s built (arguments: %s)", self.driver_name,
                 ", ".join(sorted(args)) or "none")
        _remember_missing_pricing(driver)
        return driver

    # -- Provider -----------------------------------------------------------------------------

    def offerings(self) -> list[Offering]:
        with self._errors():
            sizes = self._sizes()
        offerings = []
        for key, facts in self._sizes_config.items():
            size = sizes.get(key)
            if size is None:
                continue  # warned about in _sizes
            ram = getattr(size, "ram", None)
            vcpus = getattr(size, "vcpus", None) or (size.extra or {}).get("vcpus")
            offerings.append(Offering(
                provider=PROVIDER_NAME,
                region=self.region,
                zone=None,
                instance_type=key,
                market=Market.ON_DEMAND,
                gpus=int(_attr(facts, "gpus")),
                price_usd_hour=float(_attr(facts, "price_usd_hour")),
                gpu_model=str(_attr(facts, "gpu_model", "") or ""),
                vcpus=int(vcpus) if vcpus else None,
                memory_gib=round(float(ram) / 1024, 3) if ram else None,
                # The cost ledger bills by this rule: clouds behind libcloud differ (hourly, ...).
                billing=BillingRule(minimum_s=int(_attr(facts, "billing_minimum_s", 60)),
                                    increment_s=int(_attr(facts, "billing_increment_s", 1))),
            ))
        return offerings

    def launch(self, req: LaunchRequest) -> list[Instance]:
        offering = req.offering
        if (offering.provider != PROVIDER_NAME or offering.instance_type not in self._sizes_config
                or offering.market != Market.ON_DEMAND):
            raise InvalidRequest(
                f"offering {offering.key} is not a configured libcloud size",
                provider=self.name, offering_key=offering.key, request_id=req.request_id,
                code="UnknownOffering",
            )
        name = self._node_name(req)
        with self._launch_lock, self._errors(req):
            existing = self._find_launched(req, name)
            if existing is not None:
                # An earlier attempt: still scheduling (settled now), running, or failed (its
                # fault is raised again, after deleting it, so the same request can launch anew).
                node = self._settle(existing, req)
                log.info("launch %s already done: instance %s", req.request_id, node.id)
                return [self._instance(node, req)]
            size = self._size_for(offering.instance_type, req)
            image = self._resolve_image(req)
            kwargs: dict[str, Any] = {"name": name, "size": size, "image": image}
            if self._has_metadata:
                kwargs["ex_metadata"] = self._write_tags(req.tags)
            if self._has_userdata:
                kwargs["ex_userdata"] = req.user_data
            if self._has_client_token:
                kwargs["ex_clienttoken"] = req.request_id
            node = self._driver.create_node(**kwargs)
            log.info("launched %s (%s) for request %s", node.id, offering.instance_type,
                     req.request_id)
            if node.name != name:
                log.warning("libcloud driver %s ignored the node name %r (named it %r): burst "
                            "cannot recognise this instance as its own later",
                            self.driver_name, name, node.name)
            return [self._instance(self._settle(node, req), req)]

    def describe(self, ids: list[str]) -> list[Instance]:
        wanted = {str(i) for i in ids}
        with self._errors():
            nodes = self._driver.list_nodes()
        return [self._instance(n) for n in nodes if str(n.id) in wanted]

    def list_owned(self, cluster: str) -> list[Instance]:
        with self._errors():
            nodes = self._driver.list_nodes()
        owned = []
        for node in nodes:
            tags = self._read_tags(node)
            if tags.get(f"{_TAG_PREFIX}cluster") == cluster:
                owned.append(self._instance(node, tags=tags))
        return owned

    def terminate(self, ids: list[str]) -> None:
        wanted = {str(i) for i in ids}
        if not wanted:
            return
        with self._errors():
            nodes = [n for n in self._driver.list_nodes() if str(n.id) in wanted]
            for node in nodes:
                if node.state == NodeState.TERMINATED:
                    continue
                self._destroy(node)
                log.info("terminated %s", node.id)

    # -- extras (not part of the Protocol) -----------------------------------------------------

    def check(self) -> list[CheckRow]:
        """Can we authenticate, and do every configured size and the image exist? Never raises."""
        rows: list[CheckRow] = []
        try:
            with self._errors():
                sizes = self._sizes(refresh=True)
            rows.append(CheckRow("credentials", True,
                                 f"driver {self.driver_name} listed its sizes"))
        except ProviderError as exc:
            rows.append(CheckRow("credentials", False, f"{exc.kind}: {exc}"))
            return rows
        try:
            with self._errors():
                count = len(self._driver.list_nodes())
            rows.append(CheckRow("list instances", True, f"{count} instance(s) visible"))
        except ProviderError as exc:
            rows.append(CheckRow("list instances", False, f"{exc.kind}: {exc}"))
        for key in self._sizes_config:
            size = sizes.get(key)
            rows.append(CheckRow(
                f"size {key}", size is not None,
                f"driver size id={size.id} name={size.name}" if size is not None
                else "not listed by the driver (by id or name)"))
        try:
            self._image = None  # look again: it may have been deleted since the last launch
            image = self._resolve_image(None)
            rows.append(CheckRow(f"image {self.image_ref}", True,
                                 f"image id={image.id} name={image.name}"))
        except ProviderError as exc:
            rows.append(CheckRow(f"image {self.image_ref}", False, f"{exc.kind}: {exc}"))
        return rows

    # -- launching ----------------------------------------------------------------------------

    def _node_name(self, req: LaunchRequest) -> str:
        if self._has_metadata:
            return req.tags.node_id
        parts = (req.tags.cluster, req.tags.policy, req.tags.node_id, req.tags.request_id)
        if any(_NAME_SEPARATOR in p or not p for p in parts):
            raise InvalidRequest(
                f"driver {self.driver_name} keeps ownership in the node name, which needs "
                f"cluster, policy, node id and request id without {_NAME_SEPARATOR!r}",
                provider=self.name, offering_key=req.offering.key, request_id=req.request_id,
                code="UnencodableName",
            )
        return _NAME_SEPARATOR.join(("burst", *parts))

    def _find_launched(self, req: LaunchRequest, name: str) -> Node | None:
        matches = []
        for node in self._driver.list_nodes():
            tags = self._read_tags(node)
            request_id = tags.get(f"{_TAG_PREFIX}request-id")
            if request_id == req.request_id or (request_id is None and node.name == name):
                matches.append(node)
        # A live attempt wins over a failed one still listed while its deletion completes.
        matches.sort(key=lambda n: n.state in (NodeState.ERROR, NodeState.TERMINATED))
        return matches[0] if matches else None

    def _settle(self, node: Node, req: LaunchRequest) -> Node:
        """Wait out scheduling; a server that failed is deleted and its fault raised, typed."""
        getter = getattr(self._driver, "ex_get_node_details", None)
        deadline = time.monotonic() + self.settle_s
        while getter is not None and _scheduling(node) and time.monotonic() < deadline:
            time.sleep(self.poll_s)
            latest = getter(node.id)
            if latest is None:
                break  # deleted meanwhile: report what we saw last
            node = latest
        if node.state != NodeState.ERROR:
            return node
        fault = node.extra.get("fault") or {}
        cause = ServerFault(str(node.id), str(fault.get("message") or "server in ERROR"),
                            _int_or_none(fault.get("code")))
        log.warning("instance %s of request %s failed: %s; deleting it", node.id,
                    req.request_id, cause.message)
        try:
            self._destroy(node)
        except (BaseHTTPError, LibcloudError, OSError) as exc:
            # The fault matters more than the cleanup; the reconciler deletes leftovers.
            log.warning("could not delete failed instance %s: %s", node.id, type(exc).__name__)
        error, code = classify(cause)
        raise error(
            f"launch of {req.offering.instance_type} failed at the provider: {cause.message}",
            provider=self.name, offering_key=req.offering.key, request_id=req.request_id,
            code=code,
        ) from cause

    def _destroy(self, node: Node) -> None:
        try:
            self._driver.destroy_node(node)
        except BaseHTTPError as exc:
            if exc.code != 404:  # already gone: terminate is idempotent
                raise

    def _sizes(self, *, refresh: bool = False) -> dict[str, NodeSize]:
        """Configured size key -> driver size, cached for ``sizes_ttl_s``.

        Cached because flavors rarely change and listing them is slow: libcloud looks every
        OpenStack flavor up in its bundled price file, re-reading the whole file each time.
        """
        fresh = time.monotonic() - self._size_cache_at < self.sizes_ttl_s
        if self._size_cache is not None and fresh and not refresh:
            return self._size_cache
        listed = self._driver.list_sizes()
        by_id = {str(s.id): s for s in listed}
        by_name = {str(s.name): s for s in listed}
        matched = {}
        for key in self._sizes_config:
            size = by_id.get(key) or by_name.get(key)
            if size is None:
                log.warning("libcloud size %r is configured but driver %s does not list it; "
                            "it is left out of the offerings", key, self.driver_name)
                continue
            matched[key] = size
        self._size_cache = matched
        self._size_cache_at = time.monotonic()
        return matched

    def _size_for(self, key: str, req: LaunchRequest) -> NodeSize:
        size = self._sizes().get(key) or self._sizes(refresh=True).get(key)
        if size is None:
            raise InvalidRequest(
                f"size {key!r} is not offered by libcloud driver {self.driver_name}",
                provider=self.name, offering_key=req.offering.key, request_id=req.request_id,
                code="UnknownSize",
            )
        return size

    def _resolve_image(self, req: LaunchRequest | None) -> NodeImage:
        if self._image is not None:
            return self._image
        ref = self.image_ref
        rid = req.request_id if req else None
        okey = req.offering.key if req else None
        with self._errors(req):
            try:
                image = self._driver.get_image(ref)
            except Exception as exc:
                kind, _ = classify(exc)
                if kind in (AuthError, TransientError):
                    raise
                image = None  # not an id (or no get_image): look it up by name below
            if image is None:
                images = self._driver.list_images()
                matches = [i for i in images if str(i.id) == ref] or [
                    i for i in images if i.name == ref]
                if len(matches) != 1:
                    found = "no image" if not matches else (
                        f"{len(matches)} images ({', '.join(str(i.id) for i in matches)})")
                    raise InvalidRequest(
                        f"image {ref!r}: {found} with that id or name at driver "
                        f"{self.driver_name}",
                        provider=self.name, offering_key=okey, request_id=rid,
                        code="UnknownImage",
                    )
                image = matches[0]
        self._image = image
        return image

    # -- observing ----------------------------------------------------------------------------

    def _write_tags(self, tags: OwnershipTags) -> dict[str, str]:
        written = tags.as_dict()
        if self._dash_keys:
            written = {k.replace(":", "-", 1): v for k, v in written.items()}
        return written

    def _read_tags(self, node: Node) -> dict[str, str]:
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
                    tags[_TAG_PREFIX + key[len(prefix):]] = value
        if not tags and not self._has_metadata and node.name:
            parts = str(node.name).split(_NAME_SEPARATOR)
            if len(parts) == 5 and parts[0] == "burst":
                tags = OwnershipTags(*parts[1:]).as_dict()
        return tags

    def _instance(self, node: Node, req: LaunchRequest | None = None, *,
                  tags: dict[str, str] | None = None) -> Instance:
        tags = tags if tags is not None else self._read_tags(node)
        if req is not None and OwnershipTags.from_dict(tags) is None:
            # The driver did not echo the tags back on create (or cannot store them): report
            # what this launch asked for.
            tags = req.tags.as_dict()
        return Instance(
            id=str(node.id),
            provider=self.name,
            state=self._state(node),
            tags=tags,
            offering_key=req.offering.key if req is not None else self._offering_key(node),
            launched_at=_utc(getattr(node, "created_at", None)),
        )

    def _state(self, node: Node) -> InstanceState:
        state = _STATES.get(node.state)
        if state is None:
            # ERROR / UNKNOWN: the instance is no use to burst; "stopping" makes the reconciler
            # terminate it rather than wait for it.
            log.warning("instance %s is in libcloud state %s: treated as stopping", node.id,
                        node.state)
            return InstanceState.STOPPING
        return state

    def _offering_key(self, node: Node) -> str | None:
        extra = node.extra or {}
        size_id = extra.get("flavorId") or extra.get("instance_type") or extra.get("size")
        if size_id is None and getattr(node, "size", None) is not None:
            size_id = node.size.id
        if size_id is None:
            return None
        size_id = str(size_id)
        for key, size in (self._size_cache or {}).items():
            if size_id in (str(size.id), str(size.name)):
                return offering_key(PROVIDER_NAME, self.region, None, key, Market.ON_DEMAND)
        if size_id in self._sizes_config:
            return offering_key(PROVIDER_NAME, self.region, None, size_id, Market.ON_DEMAND)
        return None

    # -- errors -------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, req: LaunchRequest | None = None) -> Iterator[None]:
        try:
            yield
        except ProviderError:
            raise
        except Exception as exc:
            error, code = classify(exc)
            raise error(
                f"libcloud {self.driver_name}: {type(exc).__name__}: {_message(exc)}",
                provider=self.name,
                offering_key=req.offering.key if req else None,
                request_id=req.request_id if req else None,
                code=code,
            ) from exc


def _driver_class(name: str) -> type[NodeDriver]:
    members = {m.name.lower(): m for m in LibcloudProviderName}
    members.update({str(m.value).lower(): m for m in LibcloudProviderName})
    member = members.get(name)
    if member is None:
        examples = "openstack, ec2, gce, azure_arm, digital_ocean, dummy"
        raise InvalidRequest(
            f"unknown libcloud driver {name!r}; known drivers include {examples} "
            f"(any libcloud.compute.types.Provider name)",
            provider=PROVIDER_NAME, code="UnknownDriver",
        )
    try:
        return get_driver(member)
    except (AttributeError, ImportError) as exc:
        raise InvalidRequest(f"libcloud driver {name!r} cannot be loaded: {exc}",
                             provider=PROVIDER_NAME, code="UnknownDriver") from exc


def _remember_missing_pricing(driver: NodeDriver) -> None:
    """Record "no bundled prices" for drivers libcloud has none for (OpenStack among them).

    libcloud prices every size it lists from its bundled price file and caches only drivers found
    in it; for the others it re-reads the whole file (megabytes of JSON) once per size, which makes
    listing a hundred flavors take seconds. An empty entry gives the same result (no price; burst
    takes prices from the policy anyway) at the cost of one read here.
    """
    name = getattr(driver, "api_name", None)
    if not name:
        return
    try:
        libcloud_pricing.get_pricing("compute", name)
    except KeyError:
        libcloud_pricing.set_pricing("compute", name, {})
    except (OSError, ValueError):
        pass  # no readable price file: libcloud will say so itself if it needs one


def _scheduling(node: Node) -> bool:
    """Still being placed (Nova: BUILD in task ``scheduling``, or with the task not reported)."""
    if node.state != NodeState.PENDING:
        return False
    extra = node.extra or {}
    return "task_state" in extra and extra["task_state"] in (None, "scheduling")


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _utc(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)
