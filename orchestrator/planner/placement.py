"""Placement of multi-node jobs: when a job may span burst nodes, on which offerings, and why not.

A job wider than one node of an offering needs ``ceil(gpus / node_gpus)`` nodes. They are granted
together from **one** candidate (one provider, region and zone: a candidate is one offering), so a
job is never split across providers, regions or zones, nor between on-prem and cloud (demand
fits a job on-prem whole or not at all). The grant is all or nothing: if any limit stops one of
its nodes, none is granted, and the executor launches the group in one placement group, falling
back as a whole when any node of it cannot be had.

A job may span burst nodes only where the fabric can run it across nodes (Slurm, torch elastic);
the built-in queue's dispatcher starts a job on one node, so there such a job is held
(``placement.one_node_per_job``). ``multi_node_requires`` keeps offerings without the asked-for
interconnect out of multi-node grants.
"""

from __future__ import annotations

from orchestrator.policy.fabric import FabricKind
from orchestrator.policy.models import Policy

# What holds back a job wider than one burst node where the fabric cannot span nodes.
MULTI_NODE = "placement.one_node_per_job"
# A multi-node job needing more nodes than ``limits.max_nodes`` (or an offering's own max_nodes)
# allows at once: never partly launched.
WIDER_THAN_LIMIT = "placement.wider_than_max_nodes"
# No candidate has the interconnect ``multi_node_requires`` asks for.
NO_INTERCONNECT = "multi_node_requires"


def spans_nodes(policy: Policy) -> bool:
    """Whether the policy's fabric runs one job across several burst nodes."""
    return policy.fabric_kind is not FabricKind.BUILTIN


def nodes_for(job_gpus: int, node_gpus: int) -> int:
    """Nodes of ``node_gpus`` GPUs one job of ``job_gpus`` needs."""
    return -(-job_gpus // node_gpus)
