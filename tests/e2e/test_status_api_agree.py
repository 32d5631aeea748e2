"""`burst status --json` and the API agree on every figure both show, for one seeded store.

A state directory is seeded through the CLI (jobs submitted) and the store (a ready burst node
running two of the jobs, a booting one); `burst api` serves it; the pools, queue and nodes the API
answers are compared field by field with what `burst status --json` prints. `burst api` is a
process; the CLI commands (submit, token create, status) run in-process (run_burst_here: the same
typer app on the same state directory).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from orchestrator.domain.jobs import JobState, Placement
from orchestrator.domain.nodes import Market, Node, NodeState
from orchestrator.domain.utilisation import GpuUse
from orchestrator.lifecycle import NodeEvent, transition
from orchestrator.store import Store
from tests.e2e.helpers import FAST_POLICY, burst_cmd, burst_json_here, free_port, run_burst_here, wait_for

OFFERING = "local/local/local-a/local.4gpu/spot"


def _node(n: int, at: datetime) -> tuple[Node, NodeEvent]:
    node = Node(id=f"fast-n{n}", policy="fast", pool="gpu", provider="local",
                offering_key=OFFERING, instance_type="local.4gpu", market=Market.SPOT, gpus=4,
                price_usd_hour=4.1, state=NodeState.REQUESTED, state_since=at, created_at=at,
                request_id=f"r-{n}", project="research")
    return node, NodeEvent(node.id, at, None, NodeState.REQUESTED, "demand", {})


def _advance(store: Store, node_id: str, states: list[NodeState], at: datetime) -> None:
    for state in states:
        node = store.get_node(node_id)
        assert node is not None
        new, event = transition(node, state, at=at, reason="seeded")
        if state is NodeState.LAUNCHING:
            new = store_instance(new, node_id)
        assert store.save_transition(node, new, event)


def store_instance(node: Node, node_id: str) -> Node:
    from dataclasses import replace

    return replace(node, instance_id=f"lcl-{node_id}")


def seed(env: dict[str, str], state: Path) -> None:
    run_burst_here("submit", "-p", str(FAST_POLICY), "--project", "research", "--gpus", "2",
                   "--duration", "1h", "--count", "3", env=env, check=True)
    run_burst_here("submit", "-p", str(FAST_POLICY), "--project", "vision", "--gpus", "4",
                   "--duration", "30m", env=env, check=True)
    store = Store(f"sqlite:///{state / 'burst.db'}")
    try:
        at = datetime.now(UTC) - timedelta(minutes=5)
        for n, path in ((1, [NodeState.LAUNCHING, NodeState.BOOTING, NodeState.JOINING,
                             NodeState.READY]), (2, [NodeState.LAUNCHING, NodeState.BOOTING])):
            store.add_node(*_node(n, at))
            _advance(store, f"fast-n{n}", path, at)
        running = [j for j in store.jobs(states=[JobState.PENDING]) if j.project == "research"]
        for job in running[:2]:  # two 2-GPU jobs on the ready node: 4/4 busy
            assert store.start_job(job, placement=Placement.BURST, node_id="fast-n1", at=at)
        # Measured: the ready node's jobs have barely used their GPUs for 40 minutes (past
        # utilisation.idle_for, 30m); the booting node has no reading (unknown).
        low_since = datetime.now(UTC) - timedelta(minutes=40)
        uses = [GpuUse(i, 2.0, 100.0, 16000.0, running[i // 2].id) for i in range(4)]
        store.record_gpu_readings(store.get_node("fast-n1"), low_since, 5.0, uses,
                                  below_percent=5.0)
        assert store.update_node(store.get_node("fast-n1"), gpu_utilisation_percent=2.0,
                                 low_utilisation_since=low_since)
    finally:
        store.close()


def test_status_json_and_the_api_show_the_same_figures(tmp_path: Path):
    state = tmp_path / "state"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BURST_")}
    env = {**clean, "BURST_STATE_DIR": str(state), "BURST_POLICY_FILES": f'["{FAST_POLICY}"]'}
    seed(env, state)
    token = run_burst_here("token", "create", "--role", "admin", env=env, check=True).stdout.strip()
    status = burst_json_here("status", "-p", str(FAST_POLICY), env=env)

    port = free_port()
    proc = subprocess.Popen(burst_cmd("api", "--port", str(port)), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10,
                              headers={"Authorization": f"Bearer {token}"})

        def up():
            if proc.poll() is not None:
                raise AssertionError(f"burst api exited {proc.returncode}:\n{proc.stdout.read()}")
            try:
                return client.get("/healthz").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, timeout=120, interval=0.2, what="burst api to answer /healthz")
        nodes = client.get("/v1/nodes").json()["nodes"]
        queue = client.get("/v1/queue").json()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)

    # Nodes: the same nodes, states, GPUs, GPUs busy (4/4 on the ready one), prices, offerings.
    keys = ("state", "gpus", "gpus_busy", "price_usd_hour", "instance_type", "market", "project",
            "gpu_utilisation_percent", "low_utilisation")
    cli_nodes = {n["id"]: {k: n[k] for k in keys} for n in status["nodes"]}
    api_nodes = {n["id"]: {k: n[k] for k in keys} for n in nodes}
    assert cli_nodes == api_nodes
    assert cli_nodes["fast-n1"]["gpus_busy"] == 4 and cli_nodes["fast-n2"]["gpus_busy"] == 0
    # Idle GPUs: the ready node and its two jobs are flagged; the booting node is unknown.
    def low_since(found: list[dict]) -> dict:
        return {n["id"]: n["low_utilisation_since"] and datetime.fromisoformat(
            n["low_utilisation_since"]) for n in found}

    assert low_since(status["nodes"]) == low_since(nodes)
    assert (cli_nodes["fast-n1"]["gpu_utilisation_percent"], cli_nodes["fast-n1"]["low_utilisation"]
            ) == (2.0, True)
    assert (cli_nodes["fast-n2"]["gpu_utilisation_percent"], cli_nodes["fast-n2"]["low_utilisation"]
            ) == (None, False)
    flagged = {j["id"] for j in queue["jobs"] if j["low_utilisation"]}
    assert flagged == {j["id"] for j in status["low_utilisation_jobs"]} and len(flagged) == 2
    assert {j["gpu_utilisation_percent"] for j in queue["jobs"] if j["id"] in flagged} == {2.0}
    human = run_burst_here("status", "-p", str(FAST_POLICY), env={**env, "COLUMNS": "250"},
                           check=True).stdout
    assert re.search(r"2% idle 4\dm", human), human  # low for 40 minutes and counting
    assert "unknown" in human and "jobs with idle GPUs (2)" in human
    assert {n["id"]: n["offering"] for n in status["nodes"]} == {n["id"]: n["offering"] for n in nodes}

    # Pools: pending jobs and GPUs.
    cli_pools = {p["pool"]: (p["pending_jobs"], p["pending_gpus"]) for p in status["pools"]}
    api_pools = {p["pool"]: (p["pending_jobs"], p["pending_gpus"]) for p in queue["pools"]}
    assert cli_pools == api_pools == {"gpu": (2, 6)}
    cli_running = {p["pool"]: p["running_onprem_jobs"] + p["running_burst_jobs"]
                   for p in status["pools"]}
    assert cli_running == {p["pool"]: p["running_jobs"] for p in queue["pools"]}

    # The queue: the same pending jobs in the same service order, projects, GPUs, priorities.
    pending = [j for j in queue["jobs"] if j["state"] == "pending"]
    assert [(j["id"], j["project"], j["gpus"], j["priority"]) for j in status["queue"]] == \
        [(j["id"], j["project"], j["gpus"], j["priority"]) for j in pending]
