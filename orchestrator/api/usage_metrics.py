"""Store-side ``/metrics`` families of measured GPU use and idle GPUs (docs/utilisation.md).

=========================================  =====  ==============================================
family                                     type   labels / meaning
=========================================  =====  ==============================================
``burst_node_gpu_utilisation_percent``     gauge  node, pool, provider: mean utilisation of the
                                                  live node's last GPU reading (absent: unknown)
``burst_gpu_low_utilisation_nodes``        gauge  policy: ready nodes whose jobs' GPUs sat under
                                                  utilisation.idle_below_percent for idle_for
``burst_gpu_low_utilisation_jobs``         gauge  policy: running jobs flagged the same way
=========================================  =====  ==============================================

Computed at scrape time from the nodes' ``low_utilisation_since`` and the jobs' aggregates; a
policy with nothing flagged reports 0, so an alert's ``for:`` does not restart.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import GaugeMetricFamily, Metric

from orchestrator.domain.jobs import JobState
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.utilisation import low_utilisation
from orchestrator.store.usage import JobUtilisation
from orchestrator.wiring import Runtime


def node_flagged(runtime: Runtime, node: Node, now: datetime) -> bool:
    """The node's jobs' GPUs sat under its policy's threshold for its ``idle_for``."""
    policy = runtime.policies.get(node.policy)
    return policy is not None and low_utilisation(
        node.low_utilisation_since, policy.utilisation.idle_for, now)


def job_flagged(runtime: Runtime, use: JobUtilisation | None, policy_name: str | None,
                now: datetime) -> bool:
    """A running job's GPUs sat under its node's policy threshold for its ``idle_for``."""
    policy = runtime.policies.get(policy_name) if policy_name else None
    return use is not None and policy is not None and low_utilisation(
        use.low_since, policy.utilisation.idle_for, now)


def utilisation_families(runtime: Runtime, now: datetime) -> Iterator[Metric]:
    gauge = GaugeMetricFamily(
        "burst_node_gpu_utilisation_percent",
        "Mean measured GPU utilisation of the node's last reading (absent: unknown).",
        labels=["node", "pool", "provider"])
    nodes = [n for n in runtime.store.nodes() if n.state is not NodeState.TERMINATED]
    low_nodes = dict.fromkeys(sorted(runtime.policies), 0)
    for node in nodes:
        if node.gpu_utilisation_percent is not None:
            gauge.add_metric([node.id, node.pool, node.provider], node.gpu_utilisation_percent)
        if node.state is NodeState.READY and node_flagged(runtime, node, now):
            low_nodes[node.policy] = low_nodes.get(node.policy, 0) + 1
    yield gauge
    family = GaugeMetricFamily(
        "burst_gpu_low_utilisation_nodes", "Ready burst nodes whose jobs' GPUs were measured "
        "under utilisation.idle_below_percent for utilisation.idle_for.", labels=["policy"])
    for policy, count in low_nodes.items():
        family.add_metric([policy], count)
    yield family
    policy_of = {n.id: n.policy for n in nodes}
    running = [j for j in runtime.store.jobs(states=[JobState.RUNNING]) if j.node_id in policy_of]
    uses = {u.job_id: u for u in runtime.store.job_utilisation([j.id for j in running])}
    low_jobs = dict.fromkeys(sorted(runtime.policies), 0)
    for job in running:
        policy = policy_of[job.node_id]
        if job_flagged(runtime, uses.get(job.id), policy, now):
            low_jobs[policy] = low_jobs.get(policy, 0) + 1
    jobs = GaugeMetricFamily(
        "burst_gpu_low_utilisation_jobs", "Running jobs whose GPUs were measured under "
        "utilisation.idle_below_percent for utilisation.idle_for.", labels=["policy"])
    for policy, count in low_jobs.items():
        jobs.add_metric([policy], count)
    yield jobs


__all__ = ["job_flagged", "node_flagged", "utilisation_families"]
