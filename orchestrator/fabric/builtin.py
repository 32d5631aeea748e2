"""The built-in fabric: burst nodes join the built-in queue through their node agent.

Joining is registration: an agent that presents a valid join token is ready to run work at once.
Draining is cooperative: the node's state (``draining``) reaches the agent in its next heartbeat
answer; the agent stops taking work, lets its job finish (or hands it back if the policy does not
respect running jobs, or the deadline passes), then reports ``released``. Only then, or at the
drain deadline, does the planner terminate the node. Jobs still on a node that is gone are put
back in the queue. Under ``trigger.spare_room`` each plan's kept jobs are recorded for the queue's
claim, which keeps them off burst nodes they would lengthen beyond their share.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from orchestrator.domain.nodes import Node
from orchestrator.policy.models import Policy
from orchestrator.sources.builtin import BuiltinQueue


class BuiltinFabric:
    """Fabric port over the built-in queue."""

    name = "builtin"

    def __init__(self, queue: BuiltinQueue):
        self.queue = queue

    def keep_onprem(self, policy: Policy, order: tuple[str, ...], kept: Any) -> int:
        """Record the jobs the policy keeps for on-prem under ``trigger.spare_room`` (``kept``:
        the decision's :class:`~orchestrator.planner.spare_room.KeptOnPrem`), which the queue's
        claim reads (:meth:`BuiltinQueue.claim_for_node`); returns how many rows changed. The
        built-in queue takes no on-prem order (``order``), and without the rule its claim reads
        no list: nothing is written."""
        if kept is None or not policy.trigger.spare_room.enabled:
            return 0
        return self.queue.store.keep_onprem(policy.name, kept.kept)

    def request_release(self, node: Node, deadline: datetime) -> None:
        # Nothing to call: the agent reads the drain from its heartbeat answer.
        return None

    def is_released(self, node: Node) -> bool:
        return node.released

    def node_gone(self, node: Node, at: datetime) -> int:
        """Requeue the jobs of a node that failed or was terminated; returns how many."""
        return self.queue.release_node(node.id, at)
