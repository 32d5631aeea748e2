"""Bursting a real Slurm cluster: burst nodes join Slurm, run its pending jobs, drain out clean.

Against the Slurm mini-cluster (munged, slurmctld, two on-prem slurmds with 4 fake GPUs each, FUTURE
slots ``burst-[1-4]``): GPU jobs are submitted with ``sbatch`` beyond on-prem capacity; the real
control loop (``build_runtime`` with ``queue.source: slurm``, the local provider, the agent API)
reads ``squeue``/``sinfo``, launches three nodes at once; each node's agent starts from its
rendered bootstrap, registers with its join token and fills a Slurm slot (``slurmd -N burst-k``);
Slurm runs the pending jobs on them. One of them is a checkpointing job; a spot notice for its
node (from a local metadata server) drains the node mid-run: the job is signalled, checkpoints,
confirms, is requeued, resumes elsewhere and loses no step. When the work is done the nodes drain
and leave: no slurmd, every slot back to FUTURE, no agent, no instance, every slot free in the store.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
import yaml

from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.domain.nodes import NodeState
from orchestrator.fabric.bootstrap import Bootstrap
from orchestrator.loop import ControlLoop
from orchestrator.policy import load_policy_text
from orchestrator.wiring import Settings, build_runtime
from tests.e2e.helpers import node_processes
from tests.slurm_env import CHECKPOINT_JOB
from tests.slurm_env import slurm, slurm_cluster  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

STEPS = 60  # steps of the checkpointing job, 0.1 s each


class Metadata:
    """A local instance-metadata server: AWS spot instance-action, per node id in the path."""

    def __init__(self) -> None:
        self.noticed: dict[str, datetime] = {}
        self.polls = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # IMDSv2 token
                self._answer(200, b"test-token")

            def do_GET(self) -> None:
                outer.polls += 1
                node_id = self.path.strip("/").split("/")[0]
                deadline = outer.noticed.get(node_id)
                if deadline is None:
                    self._answer(404, b"Not Found")
                else:
                    body = {"action": "terminate", "time": deadline.strftime("%Y-%m-%dT%H:%M:%SZ")}
                    self._answer(200, json.dumps(body).encode())

            def _answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def policy_text(conf: Path, metadata_url: str) -> str:
    return yaml.safe_dump({
        "version": 1, "name": "slurm-burst", "cluster": "e2e-slurm",
        "pool": {"name": "gpu", "onprem": {"nodes": 2, "gpus_per_node": 4}},
        "queue": {"source": "slurm", "partition": "gpu", "slurm_conf": str(conf)},
        "trigger": {"pending_gpus_above": 0, "oldest_wait_above": "1s", "sustained_for": "0s"},
        "offerings": [{"provider": "local", "region": "local", "zone": "local-a",
                       "instance_type": "local.4gpu", "market": "on-demand", "gpus": 4,
                       "price_usd_hour": 4.1}],
        "limits": {"max_nodes": 3, "max_concurrent_launches": 3},
        "scale_down": {"idle_for": "2s", "drain_grace": "40s"},
        "timeouts": {"launch": "30s", "boot": "60s", "join": "30s", "terminate": "30s",
                     "heartbeat": "30s"},
        "cooldowns": {"scale_up": "0s", "scale_down": "2s"},
        "fabric": {
            "slurm": {"join": "slot", "slots": ["burst-[1-4]"], "checkpoint_wait": "15s"},
            "spot_notice": {"kind": "aws", "poll": "1s",
                            "url": metadata_url + "/{node_id}/latest/meta-data/spot/instance-action"},
        },
    })


def sbatch(slurm, *args: str) -> str:
    return slurm.run("sbatch", "--parsable", *args).strip().split(";")[0]


def events_of(runtime, node_id: str) -> list:
    return sorted(runtime.store.events(node_id), key=lambda e: e.at)


def test_slurm_jobs_burst_onto_joined_nodes_and_drain_without_losing_work(slurm, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    work = tmp_path / "ck"
    work.mkdir()
    script = tmp_path / "ck.sh"
    script.write_text(CHECKPOINT_JOB.format(dir=work, steps=STEPS))
    script.chmod(0o755)
    metadata = Metadata()
    policy = load_policy_text(policy_text(slurm.conf, metadata.url), "slurm-e2e.yaml")
    settings = Settings(state_dir=tmp_path / "state", tick_s=1.0, api_port=0,
                        local_boot_delay_s=0.0)
    runtime = build_runtime(settings, [policy])
    server = ApiServer(create_app(runtime), "127.0.0.1", 0)
    runtime.executor.config.controller_url = f"http://127.0.0.1:{server.start()}"
    stop = threading.Event()
    loop = ControlLoop(runtime, 1.0)
    thread = threading.Thread(target=loop.run, args=(stop,), daemon=True)
    ran_on: dict[str, set[str]] = {}
    try:
        jobs_dir = str(tmp_path)
        # On-prem full for ~15 s; then three 4-GPU jobs that only burst capacity can start now.
        fill = [sbatch(slurm, "-D", jobs_dir, "-J", f"fill-{i}", "--gres=gpu:4", "-t", "2",
                       "--wrap", "sleep 15") for i in (1, 2)]
        plain = [sbatch(slurm, "-D", jobs_dir, "-J", f"burst-{i}", "--gres=gpu:4", "-t", "2",
                        "--wrap", "sleep 6") for i in (1, 2)]
        ck = sbatch(slurm, "-D", jobs_dir, "-J", "ckpt", "--gres=gpu:4", "-t", "5",
                    "-o", str(tmp_path / "ck.out"), str(script))
        submitted = time.monotonic()
        thread.start()

        noticed_node: str | None = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            jobs = {str(j["job_id"]): j for j in slurm.jobs()}
            for job_id, job in jobs.items():
                if job.get("job_state") == "RUNNING" and job.get("nodes"):
                    ran_on.setdefault(job_id, set()).add(job["nodes"])
            log_text = (work / "log").read_text() if (work / "log").exists() else ""
            steps_done = log_text.count("step ")
            if noticed_node is None and steps_done >= 10 and "burst-" in jobs[ck].get("nodes", ""):
                member = next(m for m in runtime.store.fabric_members()
                              if m.name == jobs[ck]["nodes"])
                noticed_node = member.node_id
                metadata.noticed[noticed_node] = datetime.now(UTC) + timedelta(seconds=40)
            finished = all(jobs[j]["job_state"] == "COMPLETED" for j in [*fill, *plain, ck])
            nodes = runtime.store.nodes(include_terminated=True)
            if finished and nodes and all(n.state is NodeState.TERMINATED for n in nodes):
                break
            time.sleep(0.25)
        elapsed = time.monotonic() - submitted
        stop.set()
        thread.join(timeout=30)

        nodes = runtime.store.nodes(include_terminated=True)
        states = {n.id: n.state for n in nodes}
        assert noticed_node is not None, f"the checkpoint job never ran on a burst node: {ran_on}"
        assert all(s is NodeState.TERMINATED for s in states.values()), states
        jobs = {str(j["job_id"]): j for j in slurm.jobs()}
        assert all(jobs[j]["job_state"] == "COMPLETED" for j in [*fill, *plain, ck]), (
            [(j, jobs[j]["job_state"], jobs[j]["state_reason"]) for j in [*fill, *plain, ck]],
            slurm.run("scontrol", "show", "job", ck), (work / "log").read_text()[-200:])

        # Burst decided from real squeue output, and several nodes joined at once.
        launches = [d for d in runtime.store.decisions(limit=10_000) if str(d.rule) == "scale-up"]
        assert launches, "no scale-up decision"
        first = launches[-1]  # newest first: the last is the first launch
        # Read from squeue/sinfo: 4-GPU jobs beyond the 8 on-prem GPUs (the two fill jobs may still
        # be pending on the first look; on-prem absorbs them): 12 GPUs only burst nodes can serve.
        assert first.inputs["queue_observed"] and first.inputs["pending_gpus"] in (12, 20)
        # The jobs have no account or QOS: no project (not their user's name), and root's.
        assert first.inputs["unmet_gpus"] == 12
        assert first.inputs["unmet_gpus_by_project"] == {"(no project)": 12}
        assert [(o["project"], o["user"], o["gpus"]) for o in first.inputs["unmet_by_owner"]] == [
            (None, "root", 12)]
        assert len(first.actions) == 3, first.actions  # three nodes at once
        assert len(nodes) >= 3
        ready_at = sorted(e.at for n in nodes for e in events_of(runtime, n.id)
                          if e.to_state is NodeState.READY)
        assert len(ready_at) >= 3 and ready_at[2] - ready_at[0] < timedelta(seconds=10), ready_at
        # The pending jobs ran on burst slots.
        for job_id in plain:
            assert any(h.startswith("burst-") for h in ran_on.get(job_id, ())), (job_id, ran_on)

        # The checkpointing job: drained mid-run by the spot notice, requeued, resumed, no step lost.
        log_lines = (work / "log").read_text().splitlines()
        steps = [int(line.split()[1]) for line in log_lines if line.startswith("step ")]
        assert steps == list(range(1, STEPS + 1)), log_lines
        starts = [line for line in log_lines if line.startswith("start ")]
        checkpoints = [line for line in log_lines if line.startswith("checkpoint ")]
        assert len(starts) >= 2 and checkpoints, log_lines
        resumed_from = int(starts[1].split()[1])
        assert resumed_from == int(checkpoints[0].split()[1]) > 0
        assert "restart=1" in starts[1]
        assert log_lines[-1] == f"done {STEPS}"
        drained = events_of(runtime, noticed_node)
        draining = [e for e in drained if e.to_state is NodeState.DRAINING]
        assert draining and draining[0].reason == "spot-notice", [(e.to_state, e.reason) for e in drained]
        terminating = [e for e in drained if e.to_state is NodeState.TERMINATING]
        assert terminating[0].reason == "drained", "the release, not the deadline, ended the drain"

        # Nothing left behind: no burst slurmd, every slot FUTURE, no agent, no instance, slots free.
        assert set(slurm.slurmd_pids()) == set(slurm.onprem_names), slurm.slurmd_pids()
        for name in slurm.slot_names:
            assert slurm.node_state(name) == "future", (name, slurm.node_state(name))
        provider = runtime.providers["local"]
        assert [i.id for i in provider.list_owned("e2e-slurm") if i.state.value != "terminated"] == []
        assert node_processes(str(tmp_path / "state")) == []
        assert all(m.node_id is None for m in runtime.store.fabric_members())

        # Nodes joined with their own single-use tokens only: replaying one is refused and recorded.
        user_data = sorted((tmp_path / "state" / "local-provider" / "instances").glob("*.user-data"))
        boot = Bootstrap.parse(user_data[0].read_text())
        answer = httpx.post(runtime.executor.config.controller_url + "/v1/agent/register",
                            json={"node_id": boot.node_id, "join_token": boot.join_token, "gpus": 4})
        assert answer.status_code == 401
        attempts = runtime.store.join_attempts(boot.node_id)
        assert [a["ok"] for a in attempts] == [True, False] and attempts[-1]["reason"] == "replayed"

        join_s, drain_s = measure(runtime, nodes)
        print(f"\nslurm e2e: {elapsed:.1f}s; join (instance running -> usable in Slurm) "
              f"{_stats(join_s)}; drain (drain start -> released) {_stats(drain_s)}")
    finally:
        stop.set()
        server.stop()
        metadata.close()
        for name, provider in runtime.providers.items():
            live = [i.id for i in provider.list_owned("e2e-slurm") if i.state.value != "terminated"]
            if live:
                provider.terminate(live)
        runtime.close()


def measure(runtime, nodes) -> tuple[list[float], list[float]]:
    """Join: the instance's launch record (it runs from then on) to ready; drain: draining to
    terminating (released)."""
    join, drain = [], []
    for node in nodes:
        events = events_of(runtime, node.id)
        launched = next((e.at for e in events if e.to_state is NodeState.LAUNCHING), None)
        ready = next((e.at for e in events if e.to_state is NodeState.READY), None)
        draining = next((e.at for e in events if e.to_state is NodeState.DRAINING), None)
        leaving = next((e.at for e in events if e.to_state is NodeState.TERMINATING), None)
        if launched and ready:
            join.append((ready - launched).total_seconds())
        if draining and leaving:
            drain.append((leaving - draining).total_seconds())
    return join, drain


def _stats(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"median {sorted(values)[len(values) // 2]:.2f}s, max {max(values):.2f}s (n={len(values)})"
