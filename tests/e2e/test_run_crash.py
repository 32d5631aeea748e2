"""`burst run` as a user runs it: clean stop on SIGTERM, and kill -9 mid-burst then restart.

The crash test is the DESIGN.md invariant "a crash at any line is recovered by reconciliation":
the loop is killed with SIGKILL while nodes are booting or running jobs, the node processes keep
running (they are separate instances), and a new `burst run` must pick up every node it owned
(no duplicate launch, no orphan), finish the work and scale down to nothing.

The loops are `burst run` processes; what the user types beside them (submit, the status polls)
runs in-process (run_burst_here), which leaves the 2-core machine's CPU to the loop and its nodes
instead of an interpreter start per poll.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import (
    FAST_POLICY,
    READY_S,
    burst_cmd,
    burst_json_here,
    free_port,
    kill_all,
    node_processes,
    run_burst_here,
    wait_for,
)

POLL_S = 0.5  # between status polls: each is a whole `burst status` in this process

pytestmark = pytest.mark.slow


@pytest.fixture
def env(tmp_path: Path):
    state = tmp_path / "state"
    environment = {"BURST_STATE_DIR": str(state), "BURST_API_PORT": str(free_port()),
                   "BURST_LOCAL_BOOT_DELAY_S": "1", "BURST_LOG_LEVEL": "INFO"}
    yield environment
    kill_all(str(state))


def start_loop(env: dict, log: Path) -> subprocess.Popen:
    handle = log.open("ab")
    return subprocess.Popen(burst_cmd("run", "--policy", str(FAST_POLICY), "--tick", "1"),
                            env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT,
                            start_new_session=True)


def status(env: dict) -> dict:
    return burst_json_here("status", "--policy", str(FAST_POLICY), "--all", env=env)


def instance_records(env: dict) -> list[dict]:
    folder = Path(env["BURST_STATE_DIR"]) / "local-provider" / "instances"
    return [json.loads(p.read_text()) for p in folder.glob("*.json")]


def test_sigterm_stops_the_loop_cleanly(env, tmp_path):
    loop = start_loop(env, tmp_path / "loop.log")
    wait_for(lambda: "running policies" in (tmp_path / "loop.log").read_text(), READY_S,
             what="loop start")
    loop.send_signal(signal.SIGTERM)
    assert loop.wait(timeout=30) == 0
    assert "stopped" in (tmp_path / "loop.log").read_text()


def test_kill_9_mid_burst_then_restart_accounts_for_every_node(env, tmp_path):
    run_burst_here("submit", "--policy", str(FAST_POLICY), "--project", "research", "--gpus", "4",
                   "--duration", "8s", "--count", "5", env=env, check=True)
    log = tmp_path / "loop.log"
    loop = start_loop(env, log)
    # Wait until the burst is under way: nodes launched and at least one running a job.
    wait_for(lambda: len([n for n in status(env)["nodes"] if n["state"] in ("booting", "joining", "ready")]) >= 2,
             60, interval=POLL_S, what="nodes booting or ready")
    os.killpg(loop.pid, signal.SIGKILL)
    loop.wait(timeout=10)
    before = {n["id"]: n for n in status(env)["nodes"]}
    assert node_processes(env["BURST_STATE_DIR"]), "node instances must outlive the controller"

    restarted = start_loop(env, log)
    try:
        def finished():
            s = status(env)
            jobs_left = sum(p["pending_jobs"] + p["running_onprem_jobs"] + p["running_burst_jobs"] for p in s["pools"])
            alive = [n for n in s["nodes"] if n["state"] != "terminated"]
            return s if jobs_left == 0 and not alive else None

        final = wait_for(finished, 120, interval=POLL_S, what="queue cleared and all nodes terminated")
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(timeout=30)

    nodes = {n["id"]: n for n in final["nodes"]}
    assert set(before) <= set(nodes), "a node the first loop owned was forgotten"
    records = instance_records(env)
    # Exactly one instance per node that got one, and every instance belongs to a known node.
    owners = [r["tags"]["burst:node-id"] for r in records]
    assert len(owners) == len(set(owners)), f"an instance was launched twice for one node: {owners}"
    assert set(owners) <= set(nodes), "an instance exists without a node record"
    assert all(n["state"] == "terminated" for n in nodes.values())
    time.sleep(0.5)
    assert node_processes(env["BURST_STATE_DIR"]) == [], "node processes were left behind"
