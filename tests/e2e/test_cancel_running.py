"""Cancelling running jobs as a user does it, against the embedded loop (`burst run`, local
provider): a job on a burst node is stopped by the node's agent and the idle node is drained and
terminated as after any job; a job running on-prem frees its GPUs. The loop is a `burst run`
process; submit, cancel and status run in-process (run_burst_here)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from orchestrator.domain.jobs import JobState, Placement
from orchestrator.store import Store, default_sqlite_url
from tests.e2e.helpers import (
    FAST_POLICY,
    burst_cmd,
    burst_json_here,
    free_port,
    kill_all,
    run_burst_here,
    wait_for,
)

pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_cancel_stops_a_burst_job_through_its_agent_and_the_node_goes(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {"BURST_STATE_DIR": str(state), "BURST_API_PORT": str(free_port()),
           "BURST_LOCAL_BOOT_DELAY_S": "0"}
    pids = tmp_path / "pids"
    pids.mkdir()
    # Two 4-GPU jobs, one on-prem GPU node of 4: one runs on-prem, the other on a burst node.
    run_burst_here("submit", "--policy", str(FAST_POLICY), "--project", "research", "--gpus", "4",
                   "--duration", "10m", "--count", "2", "--command",
                   f"echo $$ > {pids}/$BURST_JOB_ID.pid; exec sleep 600",
                   env=env, check=True)
    log = (tmp_path / "loop.log").open("ab")
    loop = subprocess.Popen(burst_cmd("run", "--policy", str(FAST_POLICY), "--tick", "1"),
                            env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        with Store(default_sqlite_url(state)) as store:
            def running() -> dict:
                jobs = store.jobs(states=[JobState.RUNNING])
                return {j.placement: j for j in jobs} if len(jobs) == 2 else {}

            placed = wait_for(running, 120, what="one job on-prem and one on a burst node")
            burst, onprem = placed[Placement.BURST], placed[Placement.ONPREM]
        
            # The job is running in the store a moment before its command has written its pid.
            [pid_file] = wait_for(lambda: list(pids.glob("*.pid")), 30, what="the job's pid file")
            job_pid = int(wait_for(lambda: pid_file.read_text().strip(), 30, what="its pid"))

            result = run_burst_here("cancel", burst.id, onprem.id, env=env)
            assert result.returncode == 0, result.stderr
            assert f"cancelled {burst.id} (running on {burst.node_id}" in result.stdout
            wait_for(lambda: _gone(job_pid), 120, what="the agent to stop the cancelled job")

            def node_state() -> str | None:
                node = store.get_node(burst.node_id)
                return node.state.value if node is not None else None

            wait_for(lambda: node_state() == "terminated", 120,
                     what="the idle node drained and terminated")
            assert {store.get_job(j.id).state for j in (burst, onprem)} == {JobState.CANCELLED}
            [run] = store.job_runs(job_id=burst.id)
            assert run.outcome == "cancelled"
        pools = burst_json_here("status", "--policy", str(FAST_POLICY), env=env)["pools"]
        assert pools[0]["onprem_gpus_busy"] == 0 and pools[0]["running_onprem_jobs"] == 0
    finally:
        os.killpg(loop.pid, signal.SIGTERM)
        loop.wait(timeout=60)
        log.close()
        kill_all(str(state))
