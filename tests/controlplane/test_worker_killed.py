"""A worker killed with SIGKILL in the middle of a launch: the task comes back and the node is
launched exactly once.

The policy's offering is on AWS, served by the moto server of ``tests/servers/moto_ec2.py`` in
this process, which holds the next ``RunInstances`` for a few seconds. Worker A takes the
``burst.provider.launch`` task and sends RunInstances; while the call is in flight at the server,
A's whole process group is killed with SIGKILL (a crashed host: no warm shutdown, no reject, the
message stays unacknowledged). The server still completes the launch, as EC2 would. Worker B is
started; once the message is older than the visibility timeout kombu puts it back on the queue,
B runs the same task again, finds the instance by its ``burst:request-id`` tag instead of
launching a second one, and records it. At no time do two instances exist for the node.
"""

from __future__ import annotations

import secrets
import signal
import time

import pytest

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.offerings import Offering
from orchestrator.domain.plan import ActionReason, Launch
from orchestrator.policy.models import Market
from tests.controlplane.conftest import CLUSTER, POLICY_NAME

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

REGION, ZONE, TYPE = "us-east-1", "us-east-1a", "g5.12xlarge"
OFFERING = Offering(provider="aws", region=REGION, zone=ZONE, instance_type=TYPE,
                    market=Market.ON_DEMAND, gpus=4, price_usd_hour=5.67, gpu_model="A10G")
RUN_INSTANCES_DELAY_S = 3.0  # shorter than the visibility timeout (5 s): see below


@pytest.fixture(scope="module")
def moto():
    pytest.importorskip("boto3")
    from tests.servers.moto_ec2 import MotoEC2Server

    with MotoEC2Server() as server:
        yield server


@pytest.fixture(scope="module")
def cp_extra_env(moto) -> dict[str, str]:
    return moto.env()


@pytest.fixture(scope="module")
def cp_policy(moto) -> str:
    ami = moto.client().describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    return f"""\
version: 1
name: {POLICY_NAME}
cluster: {CLUSTER}
pool: {{name: gpu, onprem: {{nodes: 1, gpus_per_node: 4}}}}
trigger: {{pending_gpus_above: 0, oldest_wait_above: 1s, sustained_for: 1s}}
offerings:
  - {{provider: aws, region: {REGION}, zone: {ZONE}, instance_type: {TYPE}, market: on-demand,
     gpus: 4, price_usd_hour: 5.67}}
limits: {{max_nodes: 3, max_concurrent_launches: 3}}
scale_down: {{idle_for: 2s, drain_grace: 30s}}
timeouts: {{launch: 60s, boot: 60s, join: 30s, terminate: 30s, heartbeat: 30s}}
cooldowns: {{scale_up: 1s, scale_down: 2s}}
providers:
  aws: {{ami: {ami}}}
"""


def node_instances(moto, node_id: str) -> list[dict]:
    """Every instance at the server tagged with the node's id, whatever its state."""
    found = []
    pages = moto.client().get_paginator("describe_instances").paginate(
        Filters=[{"Name": "tag:burst:node-id", "Values": [node_id]}])
    for page in pages:
        for reservation in page["Reservations"]:
            found.extend(reservation["Instances"])
    return found


def test_sigkill_mid_launch_redelivers_and_launches_exactly_once(cp, moto):
    runtime = cp.runtime()
    node_id = f"{POLICY_NAME}-kill-{secrets.token_hex(3)}"
    try:
        assert runtime.executor.record_launch(Launch(
            policy=POLICY_NAME, pool="gpu", node_id=node_id, request_id=f"req-{node_id}",
            offering=OFFERING, reason=ActionReason.DEMAND, project="research")) is not None
    finally:
        runtime.close()

    cp.worker("a", concurrency=2)
    calls_before = moto.calls("RunInstances")
    moto.delay("RunInstances", RUN_INSTANCES_DELAY_S, times=1)
    result = cp.celery.send_task("burst.provider.launch", args=[node_id])
    cp.wait(lambda: moto.in_flight("RunInstances") == 1, 30, "worker a's RunInstances in flight")
    cp.kill("a", signal.SIGKILL)
    killed_at = time.monotonic()
    assert cp.procs["a"].returncode == -signal.SIGKILL
    assert cp.store.get_node(node_id).state is NodeState.REQUESTED  # a never recorded an outcome

    # The server still finishes what it was asked (the cloud does not know the client died).
    cp.wait(lambda: moto.in_flight("RunInstances") == 0, 10, "the held RunInstances answered")
    assert len(node_instances(moto, node_id)) == 1

    cp.worker("b", concurrency=2)
    outcome = result.get(timeout=60)  # only b can have stored it: a died before answering
    redelivery_s = time.monotonic() - killed_at
    assert outcome == {"node": node_id, "status": "launched"}, outcome
    assert result.id in cp.log("b"), "worker b did not receive the redelivered task"
    assert result.id in cp.log("a")

    instances = node_instances(moto, node_id)
    assert len(instances) == 1, [(i["InstanceId"], i["State"]["Name"]) for i in instances]
    node = cp.store.get_node(node_id)
    assert node.state is NodeState.LAUNCHING and node.instance_id == instances[0]["InstanceId"]
    steps = [(e.from_state, e.to_state) for e in cp.store.events(node_id)]
    assert steps == [(None, NodeState.REQUESTED), (NodeState.REQUESTED, NodeState.LAUNCHING)], steps
    run_calls = moto.calls("RunInstances") - calls_before
    print(f"\nworker killed mid-launch: redelivered and finished {redelivery_s:.1f}s after SIGKILL "
          f"(visibility timeout 5 s), RunInstances calls {run_calls}, instances for the node "
          f"{len(instances)}, double launches 0")
    # b found a's instance by its request-id tag: no second RunInstances.
    assert run_calls == 1

    # Clean up through the task path as well: the instance is terminated at the server.
    done = cp.celery.send_task("burst.node.terminate", args=[node_id, "failed"]).get(timeout=60)
    assert done["terminated"] == [node_id], done
    states = {i["State"]["Name"] for i in node_instances(moto, node_id)}
    assert states <= {"shutting-down", "terminated"}, states
