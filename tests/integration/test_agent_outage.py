"""The real node agent against the real API server through a controller outage.

Issue 13, finding 1: a run that finished (exit 0) while the controller was away was recorded
``node-gone`` and executed again. Here the API server is stopped with a job running; while it is
away the job finishes, the agent writes the run's result to its state dir, the (restarted)
controller wrongly puts the job back as node-gone, and the agent process itself is killed -9.
When the API returns, the restarted agent resumes as the node it was (no second registration:
its join token is spent) and delivers the result: the job is recorded done from it, and it ran
exactly once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.domain.jobs import JobState
from orchestrator.fabric.bootstrap import Bootstrap
from orchestrator.store import Store
from orchestrator.wiring import Runtime, Settings
from tests.builders import POOL, make_rig
from tests.integration.api_support import add_node, runtime_of
from tests.integration.test_agent import REPO_ROOT, wait_for

WAIT_S = 60.0  # readiness-bounded waits: generous, a loaded machine only makes them slower


class Agent:
    """``python -m orchestrator.fabric.agent`` as a node runs it, restartable on one state dir."""

    def __init__(self, user_data: Path, work_dir: Path, log: Path):
        self.user_data, self.work_dir, self.log = user_data, work_dir, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        env.pop("BURST_BOOT_DELAY_S", None)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "orchestrator.fabric.agent", "--user-data",
                 str(self.user_data), "--work-dir", str(self.work_dir)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env,
                start_new_session=True)

    @property
    def text(self) -> str:
        return self.log.read_text()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def served_rt(store: Store, tmp_path: Path):
    rig = make_rig(store)
    rt: Runtime = runtime_of(rig, tmp_path)
    rt = replace(rt, settings=Settings(state_dir=tmp_path / "state", tick_s=1.0))  # 1 s beats
    return rig, rt


def booted_node(rig, rt: Runtime, tmp_path: Path):
    """A launched node of project research, the API served on a free port, and the node's
    bootstrap pointed at it (written to a user-data file for the agent to start from)."""
    node = add_node(rig, 1, "research")
    [request] = rig.provider.requests.values()
    server = ApiServer(create_app(rt), "127.0.0.1", 0)
    port = server.start()
    boot = replace(Bootstrap.parse(request.user_data), controller_url=f"http://127.0.0.1:{port}")
    user_data = tmp_path / "n1.user-data"
    user_data.write_text(boot.render())
    return node, server, port, user_data


def test_a_run_finished_during_an_outage_is_delivered_after_it_and_not_rerun(
        served_rt, tmp_path: Path) -> None:
    rig, rt = served_rt
    node, server, port, user_data = booted_node(rig, rt, tmp_path)
    runs, go = tmp_path / "runs.txt", tmp_path / "go"
    job = rig.store.submit_job("research", POOL, node.gpus, 0, None,
                               f"echo ran >> {runs}; while [ ! -e {go} ]; do sleep 0.05; done",
                               rig.now)
    agent = Agent(user_data, tmp_path / "n1.work", tmp_path / "n1.log")
    try:
        agent.start()
        wait_for(lambda: runs.exists(), WAIT_S, "the job to start on the node")
        assert rig.store.get_job(job.id).state is JobState.RUNNING
        server.stop()  # the controller goes away

        # While it is away: the job finishes, its result is kept on disk, the agent retries.
        go.touch()
        results = agent.work_dir / "results"
        wait_for(lambda: list(results.glob("*.json")), WAIT_S, "the run's result on disk")
        wait_for(lambda: agent.text.count("heartbeat failed") >= 2, WAIT_S, "retries")
        # The restarted controller judged the silent node gone and put the job back (finding 1),
        # and the node's agent process is killed too.
        assert rig.queue.release_node("n1", rig.now) == 1
        assert rig.store.get_job(job.id).state is JobState.PENDING
        agent.kill()

        server = ApiServer(create_app(rt), "127.0.0.1", port)  # the controller is back
        server.start()
        agent.start()  # and the node's agent restarts on its state dir
        wait_for(lambda: rig.store.get_job(job.id).state is not JobState.PENDING, WAIT_S,
                 "the late result to be recorded")
        done = rig.store.get_job(job.id)
        assert (done.state, done.exit_code, done.attempts) == (JobState.DONE, 0, 1)
        assert runs.read_text() == "ran\n"  # executed exactly once
        wait_for(lambda: not list(results.glob("*.json")), WAIT_S, "the result acknowledged")
        assert "resuming as registered before this restart" in agent.text
        assert len(rig.store.join_attempts("n1")) == 1  # the spent join token was not re-sent
        assert [r.outcome for r in rig.store.job_runs(job_id=job.id)] == ["done"]
        assert agent.proc is not None and agent.proc.poll() is None
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(WAIT_S) == 0
    finally:
        agent.kill()
        server.stop()


def test_past_the_controller_lease_the_node_checkpoints_its_job_and_stops_itself(
        store: Store, tmp_path: Path) -> None:
    # The lease reaches the agent in the registration answer, from the policy.
    from tests.builders import make_policy

    rig = make_rig(store, policy=make_policy(timeouts={"heartbeat": "1s",
                                                       "controller_lease": "3s"}))
    rt = replace(runtime_of(rig, tmp_path),
                 settings=Settings(state_dir=tmp_path / "state", tick_s=1.0))
    node = add_node(rig, 1, "research")
    [request] = rig.provider.requests.values()
    server = ApiServer(create_app(rt), "127.0.0.1", 0)
    port = server.start()
    stopped, saved, started = tmp_path / "stopped", tmp_path / "saved", tmp_path / "started"
    # A harmless stand-in for the provider's `shutdown -h now`.
    boot = replace(Bootstrap.parse(request.user_data), controller_url=f"http://127.0.0.1:{port}",
                   self_terminate=f"touch {stopped}")
    assert boot.controller_lease_s == 3.0  # the executor rendered the policy's lease
    user_data = tmp_path / "n1.user-data"
    user_data.write_text(boot.render())
    job = rig.store.submit_job(
        "research", POOL, node.gpus, 0, None,
        f"trap 'echo saved > {saved}; exit 0' TERM; touch {started}; "
        "while :; do sleep 0.05; done", rig.now)
    agent = Agent(user_data, tmp_path / "n1.work", tmp_path / "n1.log")
    try:
        agent.start()
        wait_for(started.exists, WAIT_S, "the job to start on the node")
        server.stop()  # the controller is gone, for longer than the lease
        assert agent.proc is not None and agent.proc.wait(WAIT_S) == 6
        assert saved.read_text() == "saved\n"  # the job got its checkpoint signal
        assert stopped.exists()  # and the instance stopped itself
        text = agent.text
        assert "controller lease 3s" in text and "dead-man switch" in text
        # The hand-back is kept on disk for a controller that comes back.
        [result] = (agent.work_dir / "results").glob("*.json")
        assert '"handed-back"' in result.read_text() and job.id in result.read_text()
    finally:
        agent.kill()
        server.stop()


def test_a_run_interrupted_by_an_agent_crash_is_stopped_and_handed_back_on_restart(
        served_rt, tmp_path: Path) -> None:
    import psutil

    rig, rt = served_rt
    node, server, port, user_data = booted_node(rig, rt, tmp_path)
    pid_file = tmp_path / "job.pid"
    job = rig.store.submit_job("research", POOL, node.gpus, 0, None,
                               f"echo $$ >> {pid_file}; exec sleep 300", rig.now)
    agent = Agent(user_data, tmp_path / "n1.work", tmp_path / "n1.log")
    try:
        agent.start()
        first = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().split()[0],
                             WAIT_S, "the job to start"))
        assert agent.proc is not None
        agent.proc.kill()  # the agent alone dies; its job's process group lives on, unseen
        agent.proc.wait(10)
        assert psutil.pid_exists(first)
        agent.start()
        # The restarted agent stops the orphan, hands the run back, and the job runs again.
        wait_for(lambda: rig.store.get_job(job.id).attempts == 2, WAIT_S, "the second run")
        wait_for(lambda: not psutil.pid_exists(first) or
                 psutil.Process(first).status() == psutil.STATUS_ZOMBIE, WAIT_S, "the orphan")
        assert [(r.outcome) for r in rig.store.job_runs(job_id=job.id)] == ["handed-back", None]
        assert "outlived the agent that started it" in agent.text
    finally:
        agent.kill()
        for pid in (pid_file.read_text().split() if pid_file.exists() else []):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except OSError:
                pass
        server.stop()
