"""libcloud adapter: ``LibcloudProvider``, the ``Provider`` contract over one libcloud driver.

The rules (offerings, ownership and idempotency, launch failures after acceptance, errors,
threads) are in the package docstring, ``providers.libcloud_driver``. Driver building lives in
``drivers``, tags and names in ``tags``, the error table in ``errors``, the scheduling wait in
``operations``.
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import Any

from libcloud.common.exceptions import BaseHTTPError
from libcloud.compute.base import Node, NodeImage, NodeSize
from libcloud.compute.types import NodeState

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.offerings import BillingRule, Market, Offering, offering_key
from orchestrator.domain.ports import (
    AuthError,
    CheckRow,
    Instance,
    InvalidRequest,
    LaunchRequest,
    ProviderError,
    TransientError,
)
from providers.libcloud_driver.drivers import attr, build_driver
from providers.libcloud_driver.errors import classify, libcloud_errors
from providers.libcloud_driver.operations import settle
from providers.libcloud_driver.tags import (
    DASH_KEY_DRIVERS,
    PROVIDER_NAME,
    TAG_PREFIX,
    node_name,
    read_tags,
    state_of,
    utc,
    write_tags,
)

log = logging.getLogger(__package__)

DEFAULT_REGION = "default"


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
    # Nodes boot stock images with cloud-init: the executor hands them a #cloud-config that
    # installs the pinned burst and starts the agent's systemd unit (infra/bootstrap/).
    cloud_init = True

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
        self.driver_name = str(attr(config, "driver")).strip().lower()
        self.image_ref = str(attr(config, "image"))
        self._sizes_config: dict[str, Any] = dict(attr(config, "sizes") or {})
        self._driver = build_driver(config, self.driver_name)
        params = inspect.signature(self._driver.create_node).parameters
        self._has_metadata = "ex_metadata" in params
        self._has_userdata = "ex_userdata" in params
        self._has_client_token = "ex_clienttoken" in params
        self._dash_keys = self.driver_name in DASH_KEY_DRIVERS
        self._launch_lock = threading.Lock()
        self._size_cache: dict[str, NodeSize] | None = None  # config size key -> driver size
        self._size_cache_at = 0.0
        self._image: NodeImage | None = None
        if not self._has_userdata:
            log.warning("libcloud driver %s cannot pass user data: nodes will not bootstrap",
                        self.driver_name)

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
                gpus=int(attr(facts, "gpus")),
                price_usd_hour=float(attr(facts, "price_usd_hour")),
                gpu_model=str(attr(facts, "gpu_model", "") or ""),
                vcpus=int(vcpus) if vcpus else None,
                memory_gib=round(float(ram) / 1024, 3) if ram else None,
                # The cost ledger bills by this rule: clouds behind libcloud differ (hourly, ...).
                billing=BillingRule(minimum_s=int(attr(facts, "billing_minimum_s", 60)),
                                    increment_s=int(attr(facts, "billing_increment_s", 1))),
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
                kwargs["ex_metadata"] = self._write_tags(req.tags, req.cost_tags)
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
            if tags.get(f"{TAG_PREFIX}cluster") == cluster:
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

    def _node_name(self, req: LaunchRequest) -> str:
        return node_name(req, has_metadata=self._has_metadata, driver_name=self.driver_name)

    def _find_launched(self, req: LaunchRequest, name: str) -> Node | None:
        matches = []
        for node in self._driver.list_nodes():
            tags = self._read_tags(node)
            request_id = tags.get(f"{TAG_PREFIX}request-id")
            if request_id == req.request_id or (request_id is None and node.name == name):
                matches.append(node)
        # A live attempt wins over a failed one still listed while its deletion completes.
        matches.sort(key=lambda n: n.state in (NodeState.ERROR, NodeState.TERMINATED))
        return matches[0] if matches else None

    def _settle(self, node: Node, req: LaunchRequest) -> Node:
        """Wait out scheduling; a server that failed is deleted and its fault raised, typed."""
        return settle(node, req, driver=self._driver, settle_s=self.settle_s, poll_s=self.poll_s,
                      destroy=self._destroy)

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

    def _write_tags(self, tags: OwnershipTags, cost: Mapping[str, str] | None = None) -> dict[str, str]:
        return write_tags(tags, dash_keys=self._dash_keys, cost=cost)

    def _read_tags(self, node: Node) -> dict[str, str]:
        """Our tags on ``node``, whichever way the driver reports them (keys as ``burst:*``)."""
        return read_tags(node, has_metadata=self._has_metadata)

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
            state=state_of(node),
            tags=tags,
            offering_key=req.offering.key if req is not None else self._offering_key(node),
            launched_at=utc(getattr(node, "created_at", None)),
        )

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

    def _errors(self, req: LaunchRequest | None = None) -> AbstractContextManager[None]:
        return libcloud_errors(self.driver_name, req)
