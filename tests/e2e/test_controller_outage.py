"""A controller outage longer than the heartbeat timeout keeps what is healthy (issue 13, finding 1).

``burst run`` is killed with SIGKILL while burst nodes (local-provider processes running the real
node agent) run jobs, stays down for longer than ``timeouts.heartbeat``, and is started again. The
agents were alive all along; only the controller was absent. So: no node is failed as
heartbeat-lost, no running job is killed or run again (each job's command writes a marker line
per execution), and every job ends done.

The loops are `burst run` processes; submit and the status polls run in-process (run_burst_here),
which leaves the 2-core machine's CPU to the loop and the nodes instead of an interpreter start
per poll.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.store import Store, default_sqlite_url
from tests.e2e.helpers import burst_cmd, burst_json_here, free_port, kill_all, run_burst_here, wait_for

pytestmark = pytest.mark.slow

HEARTBEAT_S = 6
POLL_S = 0.5  # between status polls: each is a whole `burst status` in this process

POLICY = f"""\
# Outage test: second-scale timings, a tight heartbeat timeout.
version: 1
name: outage
cluster: e2e-outage
pool:
  name: gpu
  onprem: {{nodes: 1, gpus_per_node: 4}}
trigger: {{pending_gpus_above: 0, oldest_wait_above: 1s, sustained_for: 1s}}
offerings:
  - {{provider: local, region: local, zone: local-a, instance_type: local.4gpu, market: on-demand,
     gpus: 4, price_usd_hour: 4.10}}
limits: {{max_nodes: 3, max_concurrent_launches: 3}}
scale_down: {{idle_for: 2s, drain_grace: 30s}}
timeouts: {{launch: 30s, boot: 60s, join: 30s, terminate: 30s, heartbeat: {HEARTBEAT_S}s}}
cooldowns: {{scale_up: 1s, scale_down: 2s}}
"""


@pytest.fixture
def env(tmp_path: Path):
    state = tmp_path / "state"
    environment = {"BURST_STATE_DIR": str(state), "BURST_API_PORT": str(free_port()),
                   "BURST_LOCAL_BOOT_DELAY_S": "1", "BURST_LOG_LEVEL": "INFO"}
    yield environment
    kill_all(str(state))


def start_loop(env: dict, policy: Path, log: Path) -> subprocess.Popen:
    handle = log.open("ab")
    return subprocess.Popen(burst_cmd("run", "--policy", str(policy), "--tick", "1"),
                            env={**os.environ, **env}, stdout=handle, stderr=subprocess.STDOUT,
                            start_new_session=True)


def test_restart_after_an_outage_longer_than_the_heartbeat_timeout_keeps_healthy_nodes(
        env, tmp_path):
    policy = tmp_path / "outage.yaml"
    policy.write_text(POLICY)
    markers = tmp_path / "markers"
    markers.mkdir()
    # One job fills the on-prem node; the other two burst, each onto a node of its own.
    command = (f'echo "$BURST_JOB_ID" >> {markers}/started; sleep 25; '
               f'echo "$BURST_JOB_ID" >> {markers}/finished')
    run_burst_here("submit", "--policy", str(policy), "--project", "research", "--gpus", "4",
                   "--duration", "25s", "--command", command, "--count", "3", env=env, check=True)
    log = tmp_path / "loop.log"

    def status() -> dict:
        return burst_json_here("status", "--policy", str(policy), "--all", env=env)

    loop = start_loop(env, policy, log)
    try:
        wait_for(lambda: sum(p["running_burst_jobs"] for p in status()["pools"]) >= 2, 90,
                 interval=POLL_S, what="two jobs running on burst nodes")
    finally:
        os.killpg(loop.pid, signal.SIGKILL)
        loop.wait(timeout=10)
    # The outage: longer than the heartbeat timeout (this is the scenario, not a wait).
    time.sleep(HEARTBEAT_S + 6)
    restarted = start_loop(env, policy, log)
    try:
        def finished():
            s = status()
            left = sum(p["pending_jobs"] + p["running_onprem_jobs"] + p["running_burst_jobs"]
                       for p in s["pools"])
            alive = [n for n in s["nodes"] if n["state"] != "terminated"]
            return s if left == 0 and not alive else None

        wait_for(finished, 150, interval=POLL_S, what="every job done and every node scaled down")
    finally:
        restarted.send_signal(signal.SIGTERM)
        restarted.wait(timeout=30)

    with Store(default_sqlite_url(Path(env["BURST_STATE_DIR"]))) as store:
        events = store.events(limit=10_000)
        jobs = store.jobs()
    lost = [(e.node_id, e.reason) for e in events if "heartbeat" in (e.reason or "")
            or e.to_state.value == "failed"]
    assert lost == [], f"healthy nodes were failed while the controller was away: {lost}"
    assert sorted(j.state.value for j in jobs) == ["done"] * 3
    assert [j.attempts for j in jobs] == [1, 1, 1], "a job was run again"
    started = (markers / "started").read_text().split()
    finished = (markers / "finished").read_text().split()
    assert len(started) == len(set(started)) == 2, f"a burst job ran twice: {started}"
    assert sorted(finished) == sorted(started)
