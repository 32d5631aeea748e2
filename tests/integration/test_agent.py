"""Integration tests of the node agent: the real agent process against a small in-memory controller.

The controller below implements the four agent endpoints over http.server in a thread; the agent
is started exactly as a node starts it (``python -m orchestrator.fabric.agent --user-data FILE``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil
import pytest

from orchestrator.fabric.bootstrap import Bootstrap
from tests.processes import READY_S
from tests.processes import wait_for as shared_wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_S = 0.2


@dataclass
class Call:
    path: str
    auth: str | None
    body: dict[str, Any]
    at: float = field(default_factory=time.monotonic)


class Controller:
    """The controller's agent API, in memory."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.join_token = f"jt-{secrets.token_hex(8)}"
        self.credential = f"cred-{secrets.token_hex(8)}"
        self.refuse_registration = False
        self.revoked = False
        self.fail_next: dict[str, int] = {}  # path -> how many more calls answer 503
        self.down = False  # an outage: every call is cut off without an answer (and recorded)
        self.jobs: deque[dict[str, Any]] = deque()
        self.drain: dict[str, Any] = {
            "drain": False,
            "deadline": None,
            "respect_running_jobs": True,
        }
        self.calls: list[Call] = []
        self.finished: dict[str, dict[str, Any]] = {}
        self.ended_at: dict[str, datetime] = {}

    def answer(self, path: str, auth: str | None, body: dict[str, Any]) -> tuple[int, Any]:
        with self.lock:
            self.calls.append(Call(path, auth, body))
            if self.down:
                return 0, None
            if self.fail_next.get(path, 0) > 0:
                self.fail_next[path] -= 1
                return 503, {"detail": "controller restarting"}
            if path == "/v1/agent/register":
                if self.refuse_registration or body.get("join_token") != self.join_token:
                    return 401, {"detail": "bad join token"}
                return 200, {"credential": self.credential, "heartbeat_s": HEARTBEAT_S}
            if self.revoked or auth != f"Bearer {self.credential}":
                return 401, {"detail": "bad credential"}
            if path == "/v1/agent/heartbeat":
                return 200, dict(self.drain)
            if path == "/v1/agent/jobs/next":
                if not self.jobs:
                    return 204, None
                return 200, {"job": self.jobs.popleft()}
            if path.startswith("/v1/agent/jobs/") and path.endswith("/finish"):
                # ended_at (the node's clock) is checked on its own: the rest compares exactly.
                self.ended_at[path.split("/")[4]] = datetime.fromisoformat(body["ended_at"])
                self.finished[path.split("/")[4]] = {
                    k: v for k, v in body.items() if k != "ended_at"}
                return 200, {"accepted": True}
            return 404, {"detail": "no such endpoint"}

    def of(self, path: str) -> list[Call]:
        with self.lock:
            return [c for c in self.calls if c.path == path]

    def heartbeats(self) -> list[Call]:
        return self.of("/v1/agent/heartbeat")

    def set_drain(self, *, respect: bool, deadline: datetime | None = None) -> None:
        with self.lock:
            self.drain = {
                "drain": True,
                "deadline": deadline.isoformat() if deadline else None,
                "respect_running_jobs": respect,
            }


def serve(controller: Controller) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            status, answer = controller.answer(self.path, self.headers.get("Authorization"), body)
            if status == 0:  # the controller is down: hang up without an answer
                self.close_connection = True
                return
            payload = b"" if answer is None else json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return server


@pytest.fixture
def controller() -> Iterator[Controller]:
    ctl = Controller()
    server = serve(ctl)
    ctl.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield ctl
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class AgentProcess:
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    work_dir: Path
    node_id: str

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait(self, timeout: float = 5.0) -> int:
        return self.proc.wait(timeout)


@pytest.fixture
def start_agent(tmp_path: Path, controller: Controller) -> Iterator[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []

    def start(boot_overrides: dict[str, Any] | None = None, **env_extra: str) -> AgentProcess:
        node_id = f"node-{len(started)}-{secrets.token_hex(3)}"
        boot = Bootstrap(
            node_id=node_id,
            controller_url=controller.url,  # type: ignore[attr-defined]
            join_token=controller.join_token,
            cluster="lab",
            policy="burst",
            gpus=2,
            gpu_model="simulated",
            boot_delay_s=0.0,
            heartbeat_s=HEARTBEAT_S,
            **(boot_overrides or {}),
        )
        user_data = tmp_path / f"{node_id}.user-data"
        user_data.write_text(boot.render())
        work_dir = tmp_path / f"{node_id}.work"
        stderr_path = tmp_path / f"{node_id}.stderr"
        # The bootstrap script exports the join token; the agent must keep it from its jobs.
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO_ROOT),
            "BURST_JOIN_TOKEN": controller.join_token,
        }
        env.pop("BURST_BOOT_DELAY_S", None)
        env.update(env_extra)
        with open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "orchestrator.fabric.agent",
                    "--user-data",
                    str(user_data),
                    "--work-dir",
                    str(work_dir),
                ],
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                env=env,
                start_new_session=True,
            )
        agent = AgentProcess(proc, stderr_path, work_dir, node_id)
        started.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in started:
            # Kill the agent's whole session: jobs run in their own groups inside it.
            victims = []
            for p in psutil.process_iter():
                try:
                    if os.getsid(p.pid) == agent.proc.pid:
                        victims.append(p)
                except OSError:
                    continue
            for p in victims:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            if agent.proc.poll() is None:
                agent.proc.kill()
            agent.proc.wait(5)



def wait_for(condition, timeout: float = READY_S, what: str = "condition"):
    """The shared readiness wait (tests/processes.py), polling every 0.02 s."""
    return shared_wait_for(condition, timeout, 0.02, what)


def assert_clean_log(agent: AgentProcess, controller: Controller) -> None:
    text = agent.stderr
    assert controller.join_token not in text
    assert controller.credential not in text
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "the agent logged nothing"
    assert all(agent.node_id in line for line in lines), text


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_registers_heartbeats_and_runs_jobs(
    controller: Controller, start_agent, tmp_path: Path
) -> None:
    out = tmp_path / "out.txt"
    env_dump = tmp_path / "job-env.txt"
    controller.jobs.extend(
        [
            {"id": "job-sleep", "command": None, "duration_s": 0.3, "gpus": 1},
            {
                "id": "job-cmd",
                "command": f"echo hello > {out}; env > {env_dump}; echo to-the-log",
                "duration_s": None,
                "gpus": 2,
            },
            {"id": "job-fail", "command": "exit 3", "duration_s": None, "gpus": 1},
        ]
    )
    agent = start_agent({"checkpoint_uri": "s3://ckpt/lab"})  # storage.checkpoints
    wait_for(lambda: len(controller.finished) == 3, what="three jobs to finish")

    [register] = controller.of("/v1/agent/register")
    assert register.auth is None
    assert register.body["join_token"] == controller.join_token
    assert register.body["node_id"] == agent.node_id
    assert register.body["gpus"] == 2 and register.body["gpu_model"] == "simulated"
    assert register.body["pid"] == agent.proc.pid and register.body["hostname"]

    after_register = [c for c in controller.calls if c.path != "/v1/agent/register"]
    assert after_register and all(
        c.auth == f"Bearer {controller.credential}" for c in after_register
    )
    pulls = controller.of("/v1/agent/jobs/next")
    assert pulls[0].body == {"node_id": agent.node_id, "free_gpus": 2}

    assert controller.finished["job-sleep"] == {
        "node_id": agent.node_id,
        "outcome": "done",
        "exit_code": 0,
    }
    assert controller.finished["job-cmd"]["outcome"] == "done"
    assert controller.finished["job-cmd"]["exit_code"] == 0
    assert controller.finished["job-fail"] == {
        "node_id": agent.node_id,
        "outcome": "failed",
        "exit_code": 3,
    }
    assert out.read_text() == "hello\n"
    assert (agent.work_dir / "jobs" / "job-cmd.log").read_text() == "to-the-log\n"
    job_env = env_dump.read_text()
    assert "BURST_JOB_ID=job-cmd" in job_env and controller.join_token not in job_env
    assert "BURST_CHECKPOINT_URI=s3://ckpt/lab" in job_env.splitlines()

    # Heartbeats keep coming while a job runs, naming it; and at the configured pace.
    last_finish = max(c.at for c in controller.calls if c.path.endswith("/finish"))
    wait_for(
        lambda: [b for b in controller.heartbeats() if b.at > last_finish],
        what="a heartbeat after the last job",
    )
    beats = controller.heartbeats()
    assert any(
        b.body == {"node_id": agent.node_id, "status": "busy", "job_id": "job-sleep"} for b in beats
    )
    assert beats[-1].body == {"node_id": agent.node_id, "status": "idle", "job_id": None}
    # Judged on the mean: one late request on a loaded machine shifts single gaps either way.
    mean_gap = (beats[-1].at - beats[0].at) / (len(beats) - 1)
    assert HEARTBEAT_S * 0.8 < mean_gap < HEARTBEAT_S * 3

    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 0
    assert_clean_log(agent, controller)


def test_drain_respecting_running_jobs_lets_the_job_finish(
    controller: Controller, start_agent
) -> None:
    controller.jobs.extend(
        [
            {"id": "long", "command": None, "duration_s": 1.0, "gpus": 2},
            {"id": "never", "command": None, "duration_s": 0.1, "gpus": 2},
        ]
    )
    agent = start_agent()
    wait_for(lambda: any(b.body["status"] == "busy" for b in controller.heartbeats()), what="busy")
    controller.set_drain(respect=True, deadline=datetime.now(UTC) + timedelta(seconds=30))
    assert agent.wait(timeout=5) == 0

    assert controller.finished == {
        "long": {"node_id": agent.node_id, "outcome": "done", "exit_code": 0}
    }
    assert [j["id"] for j in controller.jobs] == ["never"]  # no work taken once draining
    final = controller.heartbeats()[-1]
    assert final.body == {"node_id": agent.node_id, "status": "released", "job_id": None}
    finish = controller.of("/v1/agent/jobs/long/finish")[0]
    assert finish.at <= final.at
    assert_clean_log(agent, controller)


def test_drain_without_respect_hands_the_job_back_at_once(
    controller: Controller, start_agent, tmp_path: Path
) -> None:
    pid_file = tmp_path / "job.pid"
    controller.jobs.append(
        {
            "id": "big",
            "command": f"echo $$ > {pid_file}; exec sleep 30",
            "duration_s": None,
            "gpus": 2,
        }
    )
    agent = start_agent()
    wait_for(pid_file.exists, what="the job to start")
    job_pid = int(wait_for(lambda: pid_file.read_text().strip(), what="the job pid"))
    controller.set_drain(respect=False)
    started = time.monotonic()
    assert agent.wait(timeout=5) == 0
    assert time.monotonic() - started < 2.0
    assert controller.finished["big"]["outcome"] == "handed-back"
    assert controller.heartbeats()[-1].body["status"] == "released"
    assert gone(job_pid)
    assert_clean_log(agent, controller)


def test_drain_deadline_hands_back_a_respected_job(controller: Controller, start_agent) -> None:
    controller.jobs.append({"id": "slow", "command": None, "duration_s": 30.0, "gpus": 1})
    agent = start_agent()
    wait_for(lambda: any(b.body["status"] == "busy" for b in controller.heartbeats()), what="busy")
    controller.set_drain(respect=True, deadline=datetime.now(UTC) + timedelta(seconds=0.5))
    assert agent.wait(timeout=5) == 0
    assert controller.finished["slow"]["outcome"] == "handed-back"
    assert controller.heartbeats()[-1].body["status"] == "released"


def test_refused_registration_exits_3(controller: Controller, start_agent) -> None:
    controller.refuse_registration = True
    agent = start_agent()
    assert agent.wait(timeout=5) == 3
    assert len(controller.of("/v1/agent/register")) == 1  # a refusal is final, not retried
    assert controller.heartbeats() == []
    assert "refused" in agent.stderr
    assert_clean_log(agent, controller)


def test_sigterm_mid_job_hands_the_job_back(
    controller: Controller, start_agent, tmp_path: Path
) -> None:
    pid_file = tmp_path / "job.pid"
    controller.jobs.append(
        {
            "id": "train",
            "command": f"sleep 30 & echo $! > {pid_file}; wait",
            "duration_s": None,
            "gpus": 2,
        }
    )
    agent = start_agent()
    job_pid = int(
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the job")
    )
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=5) == 0
    assert controller.finished["train"]["outcome"] == "handed-back"
    assert gone(job_pid)  # the job's whole process group went, not just its shell
    assert_clean_log(agent, controller)


def test_revoked_credential_stops_the_job_and_exits_3(
    controller: Controller, start_agent, tmp_path: Path
) -> None:
    pid_file = tmp_path / "job.pid"
    controller.jobs.append(
        {"id": "j", "command": f"echo $$ > {pid_file}; exec sleep 30", "gpus": 1}
    )
    agent = start_agent()
    job_pid = int(
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), what="the job")
    )
    controller.revoked = True
    assert agent.wait(timeout=5) == 3
    assert gone(job_pid)
    assert_clean_log(agent, controller)


def test_transient_errors_are_retried(controller: Controller, start_agent) -> None:
    controller.fail_next = {
        "/v1/agent/register": 2,
        "/v1/agent/heartbeat": 2,
        "/v1/agent/jobs/next": 1,
    }
    controller.jobs.append({"id": "after-the-storm", "command": None, "duration_s": 0.1, "gpus": 1})
    agent = start_agent()
    wait_for(
        lambda: "after-the-storm" in controller.finished, timeout=8, what="the job despite errors"
    )
    assert len(controller.of("/v1/agent/register")) == 3
    assert agent.proc.poll() is None  # still running: errors are weathered, not fatal
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 0
    assert_clean_log(agent, controller)


def test_boot_delay_from_the_environment_wins(controller: Controller, start_agent) -> None:
    started = time.monotonic()
    agent = start_agent(BURST_BOOT_DELAY_S="0.6")  # the bootstrap says 0
    [register] = wait_for(lambda: controller.of("/v1/agent/register"), what="registration")
    assert register.at - started >= 0.6
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 0


def test_retry_delay_backs_off_from_the_interval_up_to_the_contract_cap() -> None:
    from orchestrator.domain.agent_contract import HEARTBEAT_RETRY_MAX_S
    from orchestrator.fabric.agent import retry_delay

    assert [retry_delay(1.0, k) for k in range(7)] == [1, 1, 2, 4, 8, 10, 10]
    assert retry_delay(5.0, 1) == 5 and retry_delay(5.0, 2) == HEARTBEAT_RETRY_MAX_S
    assert retry_delay(30.0, 1) == HEARTBEAT_RETRY_MAX_S  # never slower than the contract
    assert retry_delay(0.2, 10_000) == HEARTBEAT_RETRY_MAX_S


def test_the_agent_imports_the_contract_without_pydantic() -> None:
    # The agent starts on a bare cloud image: the standard library only.
    code = ("import sys, orchestrator.fabric.agent as a; "
            "from importlib import import_module; "
            "assert 'pydantic' not in sys.modules, 'pydantic imported'; "
            "c = import_module('orchestrator.domain.agent_contract'); "
            "assert (a.HEARTBEAT_RETRY_MAX_S, a.HEARTBEAT_REQUEST_TIMEOUT_S) == "
            "(c.HEARTBEAT_RETRY_MAX_S, c.HEARTBEAT_REQUEST_TIMEOUT_S)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO_ROOT,
                   env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})


def test_an_outage_is_ridden_out_the_job_runs_on_and_heartbeats_back_off(
    controller: Controller, start_agent
) -> None:
    controller.jobs.append({"id": "through", "command": "sleep 0.6", "duration_s": None, "gpus": 1})
    agent = start_agent()
    wait_for(lambda: any(b.body["status"] == "busy" for b in controller.heartbeats()), what="busy")
    controller.down = True
    outage_from = time.monotonic()
    # The job ends while the controller is away; the agent keeps trying, ever more slowly.
    wait_for(lambda: "job through ended: done" in agent.stderr, what="the job to end")
    wait_for(lambda: len([b for b in controller.heartbeats() if b.at > outage_from]) >= 5,
             timeout=30, what="five heartbeats into the outage")
    assert "through" not in controller.finished and agent.proc.poll() is None
    # Each retry waits twice as long as the one before, from the interval (the agent says so; the
    # waits themselves are not timed here, a loaded machine would blur them).
    delays = [float(d) for d in re.findall(r"heartbeat failed \(.*\); retrying in ([0-9.]+)s",
                                           agent.stderr)]
    assert delays[:4] == [0.2, 0.4, 0.8, 1.6], delays
    outage_to = time.monotonic()
    controller.down = False
    wait_for(lambda: "through" in controller.finished, timeout=30, what="the report after the outage")
    assert controller.finished["through"]["outcome"] == "done"
    assert controller.finished["through"]["exit_code"] == 0
    # No work was asked for while the controller was away and a report was waiting.
    assert not [c for c in controller.of("/v1/agent/jobs/next") if outage_from < c.at < outage_to]
    assert agent.proc.poll() is None
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 0


def test_a_cancelled_job_is_stopped_and_the_node_takes_work_again(
    controller: Controller, start_agent, tmp_path: Path
) -> None:
    pid_file = tmp_path / "job.pid"
    controller.jobs.append(
        {"id": "doomed", "command": f"echo $$ > {pid_file}; exec sleep 30", "duration_s": None,
         "gpus": 2}
    )
    agent = start_agent()
    job_pid = int(wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(),
                           timeout=30, what="the job to start"))
    with controller.lock:  # the user cancelled it: the heartbeat answer says to stop it
        controller.drain = {**controller.drain, "stop_job": "doomed"}
    wait_for(lambda: "doomed" in controller.finished, timeout=30, what="the job's report")
    assert controller.finished["doomed"]["outcome"] == "handed-back"
    wait_for(lambda: gone(job_pid), timeout=30, what="the job's process to end")
    with controller.lock:
        controller.drain = {**controller.drain, "stop_job": None}
        controller.jobs.append({"id": "next", "command": None, "duration_s": 0.1, "gpus": 1})
    wait_for(lambda: "next" in controller.finished, timeout=30, what="the next job to run")
    assert controller.finished["next"]["outcome"] == "done"
    assert agent.proc.poll() is None  # no drain: the node stays, idle, for the planner to judge
    assert "job doomed was cancelled or has ended" in agent.stderr


def test_the_controller_lease_from_the_bootstrap_stops_an_idle_node(
    controller: Controller, start_agent, tmp_path: Path
) -> None:
    # No lease in the registration answer (an older controller): the bootstrap's counts.
    stopped = tmp_path / "instance-stopped"
    agent = start_agent({"controller_lease_s": 1.0, "self_terminate": f"touch {stopped}"})
    wait_for(lambda: controller.heartbeats(), what="a heartbeat")
    controller.down = True
    assert agent.wait(timeout=60) == 6
    assert stopped.exists()
    assert "dead-man switch" in agent.stderr
    assert not (agent.work_dir / "session.json").exists()  # a restart must not resume this node
    assert_clean_log(agent, controller)
