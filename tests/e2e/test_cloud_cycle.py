"""A whole burst cycle of the real control loop against each cloud's local peer.

Spike -> launch -> (cloud-init starts the agent) -> join -> run jobs -> drain -> terminate, through
the production wiring (`build_runtime` picks the real adapter from the policy), with the first
offering out of capacity so the loop must fall back to the next offering *within the same tick*.
Afterwards: no instance of ours is left running at the peer, no agent process is left, and the
cloud credentials appear in no log.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.domain.jobs import JobState
from orchestrator.domain.nodes import NodeState
from orchestrator.loop import ControlLoop, TickReport
from orchestrator.policy import load_policy_text
from orchestrator.wiring import Settings, build_runtime
from tests.e2e.cloudinit import CloudInitSimulator, PeerInstance

pytestmark = pytest.mark.slow

SECRET = "burst-e2e-secret-key-do-not-log-7f3a"


def fast_policy(name: str, provider_block: dict, offerings: list[dict]) -> str:
    doc = {
        "version": 1, "name": name, "cluster": f"e2e-{name}",
        "pool": {"name": "gpu", "onprem": {"nodes": 0, "gpus_per_node": 4}},
        "trigger": {"pending_gpus_above": 0, "oldest_wait_above": "1s", "sustained_for": "0s"},
        "offerings": offerings,
        "limits": {"max_nodes": 3, "max_concurrent_launches": 3},
        "scale_down": {"idle_for": "2s", "drain_grace": "30s"},
        "timeouts": {"launch": "30s", "boot": "60s", "join": "30s", "terminate": "30s", "heartbeat": "30s"},
        "cooldowns": {"scale_up": "0s", "scale_down": "2s"},
        "providers": provider_block,
    }
    return yaml.safe_dump(doc)


def run_cycle(policy_text: str, tmp_path: Path, list_peer, inject_capacity, caplog) -> list[TickReport]:
    """Run the loop until 3 jobs ran on burst nodes and every node is terminated."""
    policy = load_policy_text(policy_text, "e2e.yaml")
    settings = Settings(state_dir=tmp_path / "state", tick_s=1.0, api_port=0, secret_key=None)
    runtime = build_runtime(settings, [policy])
    server = ApiServer(create_app(runtime), "127.0.0.1", 0)
    runtime.executor.config.controller_url = f"http://127.0.0.1:{server.start()}"
    reports: list[TickReport] = []
    stop = threading.Event()
    loop = ControlLoop(runtime, 1.0)
    thread = threading.Thread(target=loop.run, args=(stop,), kwargs={"on_tick": reports.append}, daemon=True)
    now = runtime.clock.now()
    for _ in range(3):
        runtime.store.submit_job(project="research", pool="gpu", gpus=4, priority=0, duration_s=3,
                                 command=None, submitted_at=now)
    inject_capacity()
    caplog.set_level(logging.DEBUG)
    try:
        with CloudInitSimulator(list_peer, tmp_path / "vms") as vms:
            thread.start()
            deadline = time.monotonic() + 150
            while time.monotonic() < deadline:
                jobs = runtime.store.jobs()
                nodes = runtime.store.nodes(include_terminated=True)
                if (all(j.state is JobState.DONE for j in jobs) and nodes
                        and all(n.state is NodeState.TERMINATED for n in nodes)):
                    break
                time.sleep(0.5)
            stop.set()
            thread.join(timeout=30)
            agent_logs = vms.logs()
            assert not vms.errors, vms.errors
            live_agents = [p for p in vms.agents.values() if p.poll() is None]
            left_running = [i.id for i in list_peer() if i.running]
    finally:
        stop.set()
        server.stop()
    jobs = runtime.store.jobs()
    nodes = runtime.store.nodes(include_terminated=True)
    runtime.close()
    assert all(j.state is JobState.DONE for j in jobs), [(j.id, j.state) for j in jobs]
    assert all(j.placement.value == "burst" for j in jobs)
    assert nodes and all(n.state is NodeState.TERMINATED for n in nodes), [(n.id, n.state) for n in nodes]
    assert left_running == [], f"instances left running at the peer: {left_running}"
    # Instances that died with the "VM" are gone; no agent survives its instance.
    assert live_agents == [] or all(p.poll() is not None for p in live_agents)
    everything = caplog.text + agent_logs
    assert SECRET not in everything, "a cloud credential reached a log"
    return reports


def assert_fell_back_within_one_tick(reports: list[TickReport], blocked_key: str, fallback_key: str):
    tick = next((r for r in reports if r.execution.capacity_errors), None)
    assert tick is not None, "the injected capacity error never happened"
    assert blocked_key in tick.execution.capacity_errors
    launched = [d for d in tick.decisions if d.rule.value == "scale-up" and d.chosen == fallback_key]
    assert launched, [(d.rule, d.chosen, d.summary) for d in tick.decisions]
    assert tick.execution.launched, "the fallback offering must launch in the same tick"
    rejected = {o.offering_key: o.rejected for o in launched[0].options if o.rejected}
    assert blocked_key in rejected and "capacity error" in rejected[blocked_key]


def test_burst_cycle_on_aws_via_moto(tmp_path, monkeypatch, caplog):
    boto3 = pytest.importorskip("boto3")
    from tests.servers.moto_ec2 import MotoEC2Server

    with MotoEC2Server() as moto:
        monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", moto.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAE2ETESTKEY")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        ec2 = boto3.client("ec2", region_name="us-east-1")
        ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
        spot = {"provider": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "g5.12xlarge",
                "market": "spot", "fallback_on_demand": True, "gpus": 4, "price_usd_hour": 2.2}
        text = fast_policy("aws", {"aws": {"ami": ami}}, [spot])
        spot_key = "aws/us-east-1/us-east-1a/g5.12xlarge/spot"
        od_key = "aws/us-east-1/us-east-1a/g5.12xlarge/on-demand"

        def list_peer() -> list[PeerInstance]:
            found = []
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[{"Name": "tag:burst:cluster", "Values": ["e2e-aws"]}])
            for page in pages:
                for reservation in page["Reservations"]:
                    for inst in reservation["Instances"]:
                        iid = inst["InstanceId"]

                        def user_data(iid=iid) -> str:
                            attr = ec2.describe_instance_attribute(InstanceId=iid, Attribute="userData")
                            return base64.b64decode(attr["UserData"]["Value"]).decode()

                        found.append(PeerInstance(iid, inst["State"]["Name"] in ("pending", "running"), user_data))
            return found

        def inject() -> None:
            moto.inject("RunInstances", 500, "InsufficientInstanceCapacity",
                        "We currently do not have sufficient g5.12xlarge capacity in the AZ.", 1)

        reports = run_cycle(text, tmp_path, list_peer, inject, caplog)
        assert_fell_back_within_one_tick(reports, spot_key, od_key)


def test_burst_cycle_on_gcp_via_the_local_compute_server(tmp_path, monkeypatch, caplog):
    pytest.importorskip("google.cloud.compute_v1")
    from tests.servers.fake_gce import FakeGce, write_service_account_key

    zone = "us-central1-a"
    gce = FakeGce(op_polls=1, zones=(zone,)).start()
    try:
        gce.machine_types[zone]["a2-highgpu-4g"] = (48, 348160, [("nvidia-tesla-a100", 4)])
        gce.add_image("burst-e2e", "burst-node-v1", family="burst-node")
        # Production credentials path: Application Default Credentials from a key file.
        key = write_service_account_key(gce, tmp_path / "key.json", project="burst-e2e")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key))
        monkeypatch.setenv("BURST_E2E_MARKER", SECRET)
        spot = {"provider": "gcp", "region": "us-central1", "zone": zone, "instance_type": "a2-highgpu-4g",
                "market": "spot", "fallback_on_demand": True, "gpus": 4, "price_usd_hour": 4.4}
        block = {"gcp": {"project": "burst-e2e", "image": "projects/burst-e2e/global/images/family/burst-node",
                         "api_endpoint": gce.url}}
        text = fast_policy("gcp", block, [spot])

        def list_peer() -> list[PeerInstance]:
            found = []
            for body in gce.instances(zone):
                labels = body.get("labels", {})
                if labels.get("burst-cluster") != "e2e-gcp":
                    continue
                name = body["name"]
                found.append(PeerInstance(f"{zone}/{name}", body.get("status") in ("PROVISIONING", "STAGING", "RUNNING"),
                                          lambda name=name: gce.metadata(zone, name)["user-data"]))
            return found

        reports = run_cycle(text, tmp_path, list_peer, lambda: gce.inject("capacity", 1), caplog)
        private_key = key.read_text()
        assert "PRIVATE KEY" in private_key
        assert all(line not in caplog.text for line in private_key.splitlines()[2:4])
        assert_fell_back_within_one_tick(reports, f"gcp/us-central1/{zone}/a2-highgpu-4g/spot",
                                         f"gcp/us-central1/{zone}/a2-highgpu-4g/on-demand")
    finally:
        gce.stop()
