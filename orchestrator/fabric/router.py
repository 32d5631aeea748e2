"""One Fabric port over several fabrics: each node goes to the fabric of its policy.

The executor and reconciler take a single :class:`~orchestrator.domain.ports.Fabric`; a controller
running a builtin-queue policy next to a Slurm one hands them this router. Besides the port's
three calls it routes the two joining calls the agent API uses:

* ``join_spec(node, gpus) -> dict | None``: what the agent needs to join (None: the node is ready
  as soon as it registers, as in the built-in fabric);
* ``confirm_joined(node) -> bool``: the fabric sees the node usable (checked before ``ready``);

and the reconciler's ``retry_gone(nodes, now)``: finish fabric clean-ups a node's departure could
not complete (Slurm unreachable at the time).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from orchestrator.domain.nodes import Node
from orchestrator.domain.ports import Fabric
from orchestrator.policy.models import Policy


class FabricRouter:
    """Routes by ``node.policy``; policies not listed go to ``default``."""

    name = "router"

    def __init__(self, default: Fabric, by_policy: Mapping[str, Fabric] | None = None):
        self.default = default
        self.by_policy = dict(by_policy or {})

    def for_node(self, node: Node) -> Fabric:
        return self.by_policy.get(node.policy, self.default)

    def keep_onprem(self, policy: Policy, order: tuple[str, ...], kept: Any) -> int:
        """The policy's fabric's ``keep_onprem`` (the decision's kept jobs: their on-prem order,
        and off the burst nodes they may not take), where that fabric has one; else 0."""
        apply = getattr(self.by_policy.get(policy.name, self.default), "keep_onprem", None)
        return 0 if apply is None else apply(policy, order, kept)

    def request_release(self, node: Node, deadline: datetime) -> None:
        self.for_node(node).request_release(node, deadline)

    def is_released(self, node: Node) -> bool:
        return self.for_node(node).is_released(node)

    def node_gone(self, node: Node, at: datetime) -> int:
        return self.for_node(node).node_gone(node, at)

    def retry_gone(self, nodes: Mapping[str, Node], now: datetime) -> int:
        """Let every fabric that can finish an interrupted clean-up do so (see
        ``SlurmFabric.retry_gone``); returns how many nodes were retried."""
        retried = 0
        fabrics = {id(f): f for f in (self.default, *self.by_policy.values())}
        for fabric in fabrics.values():
            retry = getattr(fabric, "retry_gone", None)
            if retry is not None:
                retried += retry(nodes, now)
        return retried

    def join_spec(self, node: Node, gpus: int) -> dict[str, Any] | None:
        join_spec = getattr(self.for_node(node), "join_spec", None)
        return None if join_spec is None else join_spec(node, gpus)

    def confirm_joined(self, node: Node) -> bool:
        confirm = getattr(self.for_node(node), "confirm_joined", None)
        return True if confirm is None else bool(confirm(node))
