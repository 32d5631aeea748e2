"""The torch-elastic fabric, controller side: burst nodes join a running torchrun elastic job.

At registration the controller answers with the job's rendezvous (the store it hosts, see
:mod:`orchestrator.fabric.torch_store`), its node range, entry point and drain hook
(:meth:`TorchElasticFabric.join_spec`); the node's agent runs torchrun
(:mod:`orchestrator.fabric.torch_node`) and reports ``joined`` once its workers train. Draining is
the agent's: it asks the job to checkpoint through the hook, waits for the confirmation (or the
checkpoint wait, or the deadline), stops torchrun by signal and reports ``released``. A node that
goes without a drain is noticed by the job itself (its next collective fails; torchrun restarts
the survivors from the last checkpoint), so :meth:`node_gone` has nothing to hand back.

Torch-elastic nodes take no jobs of a queue: they burst for a pre-warm floor (``burst pool
prewarm``) or ``limits.min_nodes``, and leave when that floor goes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from orchestrator.domain.nodes import Node
from orchestrator.fabric.torch_store import RendezvousHost, reachable
from orchestrator.policy.models import Policy
from orchestrator.store import Store

log = logging.getLogger(__name__)


class TorchElasticFabric:
    """Fabric port for policies whose fabric is torch-elastic (see the module docstring)."""

    name = "torch-elastic"

    def __init__(self, store: Store, policies: Mapping[str, Policy], clock: Any, *,
                 host_store: bool = True):
        self.store = store
        self.policies = dict(policies)
        self.clock = clock
        self.host_store = host_store
        self.hosts: dict[str, RendezvousHost] = {}

    def ensure_store(self, policy: Policy) -> None:
        """Start the rendezvous store of the policy's job here unless one already answers."""
        config = policy.fabric.torch
        assert config is not None
        host, _, port = config.rdzv_endpoint.rpartition(":")
        if reachable(host, int(port)) or not self.host_store:
            return
        if config.rdzv_endpoint not in self.hosts:
            self.hosts[config.rdzv_endpoint] = RendezvousHost(config.rdzv_endpoint).start()

    def job_spec(self, policy: Policy) -> dict[str, Any]:
        """How a node joins the policy's job (what torchrun needs and the drain hook)."""
        config = policy.fabric.torch
        assert config is not None  # the policy validator makes sure
        return {
            "kind": "torch-elastic",
            "rdzv_endpoint": config.rdzv_endpoint,
            "run_id": config.run_id,
            "min_nodes": config.min_nodes,
            "max_nodes": config.max_nodes,
            "nproc_per_node": config.nproc_per_node,
            "entrypoint": list(config.entrypoint),
            "checkpoint_hook": str(config.checkpoint_hook),
            "checkpoint_wait_s": config.checkpoint_wait.total_seconds(),
            "local_addr": config.local_addr,
        }

    def join_spec(self, node: Node, gpus: int) -> dict[str, Any]:
        policy = self.policies[node.policy]
        self.ensure_store(policy)
        return {**self.job_spec(policy), "node_id": node.id, "gpus": gpus}

    def confirm_joined(self, node: Node) -> bool:
        # The agent reports joined once its workers train in the job; the store cannot say more.
        return True

    def request_release(self, node: Node, deadline: datetime) -> None:
        return None  # the agent reads the drain from its heartbeat answer and runs the hook

    def is_released(self, node: Node) -> bool:
        return node.released

    def node_gone(self, node: Node, at: datetime) -> int:
        return 0  # the job notices the departure itself and resumes from its checkpoint

    def close(self) -> None:
        for host in self.hosts.values():
            host.stop()
        self.hosts.clear()
