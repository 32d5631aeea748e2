"""Waiting out a launch the cloud accepted but is still scheduling (Nova's BUILD/scheduling).

A server found in ERROR is deleted (best effort) and its fault raised, typed (NoValidHost ->
``CapacityError``, a ``ServerFault`` as the cause); see the package docstring.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from libcloud.common.exceptions import BaseHTTPError
from libcloud.common.types import LibcloudError
from libcloud.compute.base import Node, NodeDriver
from libcloud.compute.types import NodeState

from orchestrator.domain.ports import LaunchRequest
from providers.libcloud_driver.errors import ServerFault, classify, int_or_none
from providers.libcloud_driver.tags import PROVIDER_NAME

log = logging.getLogger(__package__)


def scheduling(node: Node) -> bool:
    """Still being placed (Nova: BUILD in task ``scheduling``, or with the task not reported)."""
    if node.state != NodeState.PENDING:
        return False
    extra = node.extra or {}
    return "task_state" in extra and extra["task_state"] in (None, "scheduling")


def settle(
    node: Node,
    req: LaunchRequest,
    *,
    driver: NodeDriver,
    settle_s: float,
    poll_s: float,
    destroy: Callable[[Node], None],
) -> Node:
    """Wait out scheduling; a server that failed is deleted and its fault raised, typed."""
    getter = getattr(driver, "ex_get_node_details", None)
    deadline = time.monotonic() + settle_s
    while getter is not None and scheduling(node) and time.monotonic() < deadline:
        time.sleep(poll_s)
        latest = getter(node.id)
        if latest is None:
            break  # deleted meanwhile: report what we saw last
        node = latest
    if node.state != NodeState.ERROR:
        return node
    fault = node.extra.get("fault") or {}
    cause = ServerFault(str(node.id), str(fault.get("message") or "server in ERROR"),
                        int_or_none(fault.get("code")))
    log.warning("instance %s of request %s failed: %s; deleting it", node.id,
                req.request_id, cause.message)
    try:
        destroy(node)
    except (BaseHTTPError, LibcloudError, OSError) as exc:
        # The fault matters more than the cleanup; the reconciler deletes leftovers.
        log.warning("could not delete failed instance %s: %s", node.id, type(exc).__name__)
    error, code = classify(cause)
    raise error(
        f"launch of {req.offering.instance_type} failed at the provider: {cause.message}",
        provider=PROVIDER_NAME, offering_key=req.offering.key, request_id=req.request_id,
        code=code,
    ) from cause
