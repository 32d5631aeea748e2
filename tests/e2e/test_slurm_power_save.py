"""Slurm power save driving burst: slurmctld calls `burst slurm resume/suspend`, burst decides.

Against the Slurm mini-cluster's partition ``cloud`` of ``State=CLOUD`` nodes ``cloud-[1-2]``
whose ResumeProgram/SuspendProgram/ResumeFailProgram are the mini-cluster's wrappers around the
real ``burst slurm ...`` entry point (``infra/slurm/minicluster.py``), with ``SuspendTime=5``:

1. a job submitted to ``cloud`` makes slurmctld call ``burst slurm resume cloud-1``; the policy
   (``fabric.slurm.join: power-save``) decides the offering and records the decision; the local
   provider's node runs the agent, which joins as ``cloud-1`` (``slurmd -b -N cloud-1``); the job
   runs there; idle for SuspendTime, slurmctld calls ``burst slurm suspend cloud-1``, and the burst
   node is terminated (reason ``slurm-suspend``) while Slurm shows the node powered down;
2. with the policy's budget exhausted, the next resume launches nothing: the node is marked DOWN
   with burst's reason (``burst: ... budgets[...] ...``), which ``scontrol show node`` shows.

The controller (agent API and control loop: reconciler, heartbeats) runs in the test process on
the same state directory, as ``burst run`` would; the control loop does not plan the power-save
policy. Slurm's periodic pass holds a job on a resumed node CONFIGURING for up to 30 s, so this
runs about a minute: marked long.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.domain.nodes import NodeState
from orchestrator.loop import ControlLoop
from orchestrator.policy import load_policy
from orchestrator.wiring import Settings, build_runtime
from tests.e2e.helpers import node_processes
from tests.slurm_env import slurm, slurm_cluster  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.long]

ROOT = Path(__file__).resolve().parents[2]


def policy_doc(conf: Path, budget_usd: float | None = None) -> dict:
    doc = {
        "version": 1, "name": "cloud-ps", "cluster": "e2e-powersave",
        "pool": {"name": "cloud", "onprem": {"nodes": 1, "gpus_per_node": 4}},
        "queue": {"source": "slurm", "partition": "cloud", "slurm_conf": str(conf)},
        "offerings": [{"provider": "local", "region": "local", "zone": "local-a",
                       "instance_type": "local.4gpu", "market": "on-demand", "gpus": 4,
                       "price_usd_hour": 4.1}],
        "limits": {"max_nodes": 2, "max_concurrent_launches": 2},
        "timeouts": {"launch": "30s", "boot": "60s", "join": "90s", "terminate": "30s",
                     "heartbeat": "60s"},
        "fabric": {"slurm": {"join": "power-save", "slots": ["cloud-[1-2]"], "feature": "cloud"}},
    }
    if budget_usd is not None:
        doc["budgets"] = [{"name": "cloud-day", "window": "day", "limit_usd": budget_usd}]
    return doc


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(what: str, condition, timeout_s: float, every: float = 0.5):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        value = condition()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what} not within {timeout_s:.0f}s")


def timings(submitted, finished_at, power_log: str, decision, events) -> str:
    """The cycle's figures: when each program was called (power.log, local time of this host)
    and what burst recorded."""
    called = {}
    for line in power_log.splitlines():
        clock, action = line.split()[:2]
        at = datetime.combine(submitted.date(), datetime.strptime(clock[:15], "%H:%M:%S.%f").time(),
                              tzinfo=datetime.now().astimezone().tzinfo).astimezone(UTC)
        called.setdefault(action, at)
    at = {str(e.to_state): e.at for e in events}
    def s(a, b) -> str:
        return f"{(b - a).total_seconds():.1f}s"
    return ("power save e2e: submit -> ResumeProgram " + s(submitted, called["resume"])
            + "; ResumeProgram -> decision " + s(called["resume"], decision.at)
            + "; decision -> node ready " + s(decision.at, at["ready"])
            + "; submit -> job done " + s(submitted, finished_at)
            + "; SuspendProgram -> terminating " + s(called["suspend"], at["terminating"])
            + "; terminating -> terminated " + s(at["terminating"], at["terminated"]))


def node_line(slurm, name: str) -> str:
    return slurm.run("scontrol", "-o", "show", "node", name, check=False)


def test_slurm_power_save_resumes_through_burst_and_suspends(slurm, tmp_path):
    state = tmp_path / "state"
    policy_file = tmp_path / "cloud-ps.yaml"
    policy_file.write_text(yaml.safe_dump(policy_doc(slurm.conf)))
    port = free_port()
    burst = Path(sys.executable).with_name("burst")
    slurm.power_env.write_text("\n".join([
        f"export BURST={burst}",
        f"export PATH={burst.parent}:/usr/sbin:/usr/bin:/sbin:/bin",
        f"export PYTHONPATH={ROOT}",
        f"export BURST_STATE_DIR={state}",
        f"export BURST_POLICY_FILES='{json.dumps([str(policy_file)])}'",
        f"export BURST_CONTROLLER_URL=http://127.0.0.1:{port}",
        "export BURST_LOCAL_BOOT_DELAY_S=0",
        f"export SLURM_CONF={slurm.conf}", ""]))
    settings = Settings(state_dir=state, tick_s=1.0, api_port=port, local_boot_delay_s=0.0,
                        controller_url=f"http://127.0.0.1:{port}")
    runtime = build_runtime(settings, [load_policy(policy_file)])
    server = ApiServer(create_app(runtime), "127.0.0.1", port)
    server.start()
    stop = threading.Event()
    thread = threading.Thread(target=ControlLoop(runtime, 1.0).run, args=(stop,), daemon=True)
    thread.start()
    try:
        # 1. Resume through burst, run the job, suspend after SuspendTime.
        out = tmp_path / "job.out"
        submitted = datetime.now(UTC)
        job = slurm.run("sbatch", "--parsable", "-p", "cloud", "--gres=gpu:4", "-t", "2",
                        "-o", str(out), "--wrap", "echo ran on $SLURMD_NODENAME; sleep 1").strip()
        finished = wait_for("the cloud job's end", lambda: next(
            (j for j in slurm.jobs() if str(j["job_id"]) == job
             and j["job_state"] in ("COMPLETED", "FAILED", "CANCELLED", "NODE_FAIL")), None), 100)
        finished_at = datetime.now(UTC)
        assert finished["job_state"] == "COMPLETED", (finished, node_line(slurm, "cloud-1"))
        assert out.read_text().startswith("ran on cloud-"), out.read_text()
        ran_on = out.read_text().split()[2]

        decisions = [d for d in runtime.store.decisions(limit=100) if d.policy == "cloud-ps"]
        assert len(decisions) == 1, [(d.rule, d.summary) for d in decisions]  # the loop plans none
        decision = decisions[0]
        assert str(decision.rule) == "scale-up" and decision.summary.startswith(
            f"Slurm ResumeProgram asked for {ran_on}:"), decision.summary
        power = decision.inputs["slurm_power_save"]
        assert power["resume"] == [ran_on] and power["gpus"] == {ran_on: 4}
        node_id = power["launched_for"][ran_on]
        assert decision.options and decision.chosen.startswith("local/")

        def suspended():
            node = runtime.store.get_node(node_id)
            return node.state is NodeState.TERMINATED and "POWERED_DOWN" in node_line(slurm, ran_on)
        wait_for("the suspend of the idle node", suspended, 90)
        events = runtime.store.events(node_id)
        reasons = {str(e.to_state): e.reason for e in events}
        assert reasons["ready"] and reasons["terminating"] == "slurm-suspend", reasons
        assert all(m.node_id is None or m.node_id != node_id
                   for m in runtime.store.fabric_members())
        power_log = (slurm.base / "log" / "power.log").read_text()
        assert f"resume {ran_on}" in power_log and f"suspend {ran_on}" in power_log, power_log
        wait_for("the node's processes to end", lambda: node_processes(str(state)) == [], 20)
        print("\n" + timings(submitted, finished_at, power_log, decision, events))

        # 2. An exhausted budget: the resume launches nothing and Slurm shows why.
        policy_file.write_text(yaml.safe_dump(policy_doc(slurm.conf, budget_usd=0.01)))
        job = slurm.run("sbatch", "--parsable", "-p", "cloud", "--gres=gpu:4", "-t", "2",
                        "--wrap", "true").strip()
        down = wait_for("a node marked down by burst", lambda: next(
            (line for line in map(lambda n: node_line(slurm, n), slurm.cloud_names)
             if "Reason=burst:" in line), None), 60)
        reason = re.search(r"Reason=(.*?) \[", down).group(1)
        print(f"\nDOWN reason shown by Slurm: {reason}")
        assert "budgets[cloud-day]" in reason, reason
        refused = [d for d in runtime.store.decisions(limit=100)
                   if d.policy == "cloud-ps" and d.inputs.get("slurm_power_save", {}).get("refused")]
        assert refused and refused[0].id in reason, reason
        assert len(runtime.store.nodes(include_terminated=True)) == 1  # nothing launched
        slurm.run("scancel", job, check=False)
    finally:
        stop.set()
        thread.join(timeout=30)
        server.stop()
        slurm.power_env.unlink(missing_ok=True)
        for provider in runtime.providers.values():
            live = [i.id for i in provider.list_owned("e2e-powersave")
                    if i.state.value != "terminated"]
            if live:
                provider.terminate(live)
        runtime.close()
