"""Duplicate delivery: the same launch / drain / terminate task delivered many times does its work once.

The launch intents of N nodes are recorded the way the tick records them
(``Executor.record_launch``, here from the test process against the same database); then
``burst.provider.launch`` is sent for them 1,000 times in one burst, in runs of twelve copies of
one node's launch, to three worker processes of four threads: the copies of a launch are picked
up together and race into the provider call.
Once the nodes are ready, ``burst.node.drain`` is sent 200 times and ``burst.node.terminate``
a few times per node. Every copy after the first must find the work done: exactly one
local-provider instance per node (counted by the ``burst:node-id`` tag of the provider's own
records), one ``requested -> launching`` and one ``ready -> draining`` event per node.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from celery.result import ResultSet

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.offerings import Offering
from orchestrator.domain.plan import ActionReason, Launch
from orchestrator.policy.models import Market
from tests.controlplane.conftest import POLICY_NAME

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

NODES = 10
LAUNCH_DELIVERIES = 1000
DRAIN_DELIVERIES = 200
TERMINATE_PER_NODE = 3
WORKERS, THREADS_PER_WORKER = 3, 4
THREADS = WORKERS * THREADS_PER_WORKER
OFFERING = Offering(provider="local", region="local", zone="local-a", instance_type="local.4gpu",
                    market=Market.SPOT, gpus=4, price_usd_hour=4.10, gpu_model="simulated")


def deliver(cp, task: str, argses: list[list], timeout: float = 120) -> list[dict]:
    """Send ``task`` once per argument list, all at once, and wait for every result."""
    results = [cp.celery.send_task(task, args=args) for args in argses]
    return ResultSet(results).join_native(timeout=timeout, propagate=True)


def transitions(cp, node_id: str) -> Counter:
    return Counter((e.from_state, e.to_state) for e in cp.store.events(node_id))


def test_duplicate_deliveries_launch_drain_and_terminate_each_node_once(cp):
    cp.api()
    names = [f"w{i}" for i in range(1, WORKERS + 1)]
    for name in names:
        cp.worker(name, concurrency=THREADS_PER_WORKER, wait=False)
    cp.wait_ready(*names)

    runtime = cp.runtime()
    try:
        run = secrets.token_hex(3)
        ids = [f"{POLICY_NAME}-dup{run}-{i:02d}" for i in range(NODES)]
        for node_id in ids:
            action = Launch(policy=POLICY_NAME, pool="gpu", node_id=node_id, request_id=f"req-{node_id}",
                            offering=OFFERING, reason=ActionReason.DEMAND, project="research")
            assert runtime.executor.record_launch(action) is not None
            # Recording the same intent again (a redelivered tick) adds nothing.
            assert runtime.executor.record_launch(action) is not None
            assert len(cp.store.events(node_id)) == 1
    finally:
        runtime.close()

    # 1,000 launch deliveries in runs of THREADS copies of one node: every worker thread picks up
    # a copy of the same launch at about the same time, so copies race into the provider call.
    began = time.monotonic()
    order = [ids[(i // THREADS) % NODES] for i in range(LAUNCH_DELIVERIES)]
    launches = deliver(cp, "burst.provider.launch", [[node_id] for node_id in order])
    launch_s = time.monotonic() - began
    statuses = Counter(r["status"] for r in launches)
    launched = Counter(r["node"] for r in launches if r["status"] == "launched")
    double_launches = sum(count - 1 for count in launched.values() if count > 1)
    per_node = cp.instances_per_node()
    double_instances = sum(count - 1 for count in per_node.values() if count > 1)
    # Copies that raced past the node-state check into the provider call, answered there by the
    # provider's idempotency on the request id (the local provider logs "already done").
    raced = sum(cp.log(name).count("already done: instance") for name in names)
    print(f"\nlaunch: {len(launches)} deliveries for {NODES} nodes in {launch_s:.1f}s "
          f"({len(launches) / launch_s:.0f}/s), statuses {dict(statuses)}, "
          f"{raced} copies deduplicated inside the provider call, "
          f"double launches {double_launches}, extra instances {double_instances}")
    assert len(launches) == LAUNCH_DELIVERIES
    assert double_launches == 0 and double_instances == 0
    assert statuses == Counter({"launched": NODES, "already-done": LAUNCH_DELIVERIES - NODES}), statuses
    assert per_node == Counter({node_id: 1 for node_id in ids}), per_node
    for node_id in ids:
        assert transitions(cp, node_id)[(NodeState.REQUESTED, NodeState.LAUNCHING)] == 1

    # The agents register with the API: every node gets ready (one registration each).
    cp.wait(lambda: all(n.state is NodeState.READY for n in map(cp.store.get_node, ids)), 60,
            "every node ready")

    # 200 drain deliveries, in runs the same way.
    deadline = (datetime.now(UTC) + timedelta(seconds=60)).isoformat()
    drains = deliver(cp, "burst.node.drain", [[ids[(i // THREADS) % NODES], deadline, "idle"]
                                              for i in range(DRAIN_DELIVERIES)])
    drained = Counter(r["node"] for r in drains if r["drained"])
    double_drains = sum(count - 1 for count in drained.values() if count > 1)
    print(f"drain: {len(drains)} deliveries, drained {sum(drained.values())}, double drains {double_drains}")
    assert len(drains) == DRAIN_DELIVERIES
    assert drained == Counter({node_id: 1 for node_id in ids}), drained
    for node_id in ids:
        counts = transitions(cp, node_id)
        assert counts[(NodeState.READY, NodeState.DRAINING)] == 1, counts
        assert counts[(NodeState.REQUESTED, NodeState.LAUNCHING)] == 1, counts

    # A few terminate deliveries per node: each instance is terminated, once.
    terminates = deliver(cp, "burst.node.terminate", [[node_id, "drained"] for node_id in ids
                                                      for _ in range(TERMINATE_PER_NODE)])
    terminated = Counter(r["node"] for r in terminates if r["terminated"])
    print(f"terminate: {len(terminates)} deliveries, terminated {sum(terminated.values())}")
    assert terminated == Counter({node_id: 1 for node_id in ids}), terminated
    for node_id in ids:
        node = cp.store.get_node(node_id)
        assert node.state is NodeState.TERMINATING, (node_id, node.state)
    # The reconciler records what the provider shows: every instance gone.
    cp.celery.send_task("burst.reconcile.run").get(timeout=30)
    cp.wait(lambda: all(n.state is NodeState.TERMINATED for n in map(cp.store.get_node, ids)), 30,
            "every node terminated")
    assert all(r["state"] == "terminated" for r in cp.instance_records())
    assert cp.instances_per_node() == Counter({node_id: 1 for node_id in ids})
    cp.wait(lambda: cp.node_processes() == [], 10, "no local-provider process left")
    total = len(launches) + len(drains) + len(terminates)
    print(f"duplicates: {total} deliveries in all, double launches 0, double drains 0")
