"""``burst demo``: a whole burst cycle on the embedded defaults, in about a minute.

A small on-prem pool (the policy's), a spike of queued jobs well beyond it, local-provider nodes
(real processes running the node agent) launched by the real loop, each agent joining with its
single-use token and running jobs pulled from the queue, the queue clearing, idle nodes drained
and terminated, then a summary. Everything runs in a throwaway state directory and the demo checks
at the end that no node process is left.

The shipped policy's timings are for real clusters (minutes); the demo shortens them so the cycle
fits in a minute, and says so. Prices, offerings, limits and priorities are the policy's own.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path

from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.domain.jobs import JobState, Placement
from orchestrator.domain.nodes import NodeState
from orchestrator.domain.offerings import BillingRule
from orchestrator.loop import ControlLoop, TickReport
from orchestrator.policy.models import Policy
from orchestrator.wiring import Runtime, Settings, build_runtime

# (project, gpus, seconds): the spike, 18 jobs / 42 GPUs against an 8-GPU on-prem pool.
SPIKE: tuple[tuple[str, int, float], ...] = (
    ("prod-training", 4, 14), ("prod-training", 4, 12), ("prod-training", 2, 10),
    ("research", 1, 8), ("research", 2, 12), ("research", 4, 10), ("research", 1, 6),
    ("research", 2, 9), ("vision", 4, 12), ("vision", 2, 8), ("vision", 1, 10),
    ("vision", 4, 9), ("research", 2, 7), ("prod-training", 1, 8), ("vision", 2, 11),
    ("research", 1, 9), ("vision", 4, 7), ("prod-training", 1, 6),
)


def demo_policy(policy: Policy) -> Policy:
    """The policy with its timings shortened to demo scale (seconds instead of minutes)."""
    s = timedelta(seconds=1)
    return policy.model_copy(update={
        "trigger": policy.trigger.model_copy(update={
            "sustained_for": 2 * s, "oldest_wait_above": 3 * s,
            "wait_slo": 6 * s if policy.trigger.wait_slo is not None else None,
            "expected_boot": 3 * s}),
        "scale_down": policy.scale_down.model_copy(update={"idle_for": 4 * s, "drain_grace": 30 * s}),
        "cooldowns": policy.cooldowns.model_copy(update={"scale_up": 2 * s, "scale_down": 4 * s}),
        "timeouts": policy.timeouts.model_copy(update={
            "launch": 30 * s, "boot": 60 * s, "join": 30 * s, "terminate": 30 * s, "heartbeat": 20 * s}),
    })


@dataclass
class DemoSummary:
    """The demo's outcome (``burst demo --json`` prints this)."""

    policy: str
    nodes_launched: int = 0
    nodes_terminated: int = 0
    nodes_failed: int = 0
    jobs_total: int = 0
    jobs_onprem: int = 0
    jobs_burst: int = 0
    jobs_done: int = 0
    wait_p50_s: float = 0.0
    wait_p95_s: float = 0.0
    wait_max_s: float = 0.0
    burst_node_minutes: float = 0.0
    cost_usd: float = 0.0
    onprem_gpu_hours: float = 0.0
    onprem_cost_usd: float = 0.0
    decisions: int = 0
    launch_decisions: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    leftover_processes: int = 0
    timed_out: bool = False
    timings: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def run_demo(policy: Policy, *, on_tick: Callable[[Runtime, TickReport], None] | None = None,
             timeout_s: float = 240.0, keep_state: Path | None = None) -> DemoSummary:
    """Run the burst cycle; always stops the loop and leaves no node process behind."""
    policy = demo_policy(policy)
    state_dir = Path(tempfile.mkdtemp(prefix="burst-demo-")) if keep_state is None else keep_state
    settings = Settings(state_dir=state_dir, database_url=None, tick_s=1.0, api_port=0,
                        local_boot_delay_s=3.0, controller_url=None)
    runtime = build_runtime(settings, [policy])
    server = ApiServer(create_app(runtime), "127.0.0.1", 0)
    summary = DemoSummary(policy=policy.name, timings={
        "tick": "1s", "boot": "3s", "trigger.sustained_for": "2s",
        **({"trigger.wait_slo": "6s"} if policy.trigger.wait_slo is not None else {}),
        "scale_down.idle_for": "4s", "cooldowns": "2s up / 4s down"})
    started = time.monotonic()
    stop = threading.Event()
    loop_thread: threading.Thread | None = None
    try:
        runtime.executor.config.controller_url = f"http://127.0.0.1:{server.start()}"
        now = runtime.clock.now()
        for project, gpus, seconds in SPIKE:
            runtime.store.submit_job(project=project, pool=policy.pool.name, gpus=gpus, priority=0,
                                     duration_s=seconds, command=None, submitted_at=now)
        loop = ControlLoop(runtime, settings.tick_s)

        def _tick(report: TickReport) -> None:
            if on_tick is not None:
                on_tick(runtime, report)

        loop_thread = threading.Thread(target=loop.run, args=(stop,), kwargs={"on_tick": _tick},
                                       name="burst-loop", daemon=True)
        loop_thread.start()
        while time.monotonic() - started < timeout_s:
            if _finished(runtime):
                break
            time.sleep(0.5)
        else:
            summary.timed_out = True
    finally:
        stop.set()
        if loop_thread is not None:
            loop_thread.join(timeout=30)
        _cleanup(runtime)
        server.stop()
        summary.wall_s = round(time.monotonic() - started, 1)
        _summarise(runtime, policy, summary)
        summary.leftover_processes = _leftovers(runtime)
        runtime.close()
        if keep_state is None:
            shutil.rmtree(state_dir, ignore_errors=True)
    return summary


def _finished(runtime: Runtime) -> bool:
    jobs = runtime.store.jobs()
    if not jobs or any(j.state in (JobState.PENDING, JobState.RUNNING) for j in jobs):
        return False
    nodes = runtime.store.nodes(include_terminated=True)
    return bool(nodes) and all(n.state is NodeState.TERMINATED for n in nodes)


def _cleanup(runtime: Runtime) -> None:
    """Terminate whatever is still running (only if the demo was cut short)."""
    for provider in runtime.providers.values():
        owned = [i.id for p in runtime.policies.values() for i in provider.list_owned(p.cluster)
                 if i.state.value != "terminated"]
        if owned:
            provider.terminate(owned)


def _leftovers(runtime: Runtime) -> int:
    return sum(1 for provider in runtime.providers.values() for p in runtime.policies.values()
               for i in provider.list_owned(p.cluster) if i.state.value != "terminated")


def _summarise(runtime: Runtime, policy: Policy, summary: DemoSummary) -> None:
    store = runtime.store
    jobs = store.jobs()
    summary.jobs_total = len(jobs)
    summary.jobs_onprem = sum(1 for j in jobs if j.placement is Placement.ONPREM and j.state is JobState.DONE)
    summary.jobs_burst = sum(1 for j in jobs if j.placement is Placement.BURST and j.state is JobState.DONE)
    summary.jobs_done = sum(1 for j in jobs if j.state is JobState.DONE)
    waits = sorted((j.started_at - j.submitted_at).total_seconds() for j in jobs if j.started_at)
    summary.wait_p50_s = round(_percentile(waits, 50), 1)
    summary.wait_p95_s = round(_percentile(waits, 95), 1)
    summary.wait_max_s = round(max(waits, default=0.0), 1)
    onprem_s = sum(j.gpus * (j.finished_at - j.started_at).total_seconds() for j in jobs
                   if j.placement is Placement.ONPREM and j.started_at and j.finished_at)
    summary.onprem_gpu_hours = round(onprem_s / 3600, 4)
    rate = float(policy.pool.onprem.gpu_hour_usd or 0)
    summary.onprem_cost_usd = round(summary.onprem_gpu_hours * rate, 4)
    nodes = store.nodes(include_terminated=True)
    events = store.events()
    billing = BillingRule()
    node_seconds = cost = 0.0
    for node in nodes:
        times = {e.to_state: e.at for e in events if e.node_id == node.id}
        if NodeState.LAUNCHING in times:
            summary.nodes_launched += 1
            end = times.get(NodeState.TERMINATED) or runtime.clock.now()
            seconds = (end - times[NodeState.LAUNCHING]).total_seconds()
            node_seconds += seconds
            cost += node.price_usd_hour * billing.billed_seconds(seconds) / 3600
        if node.state is NodeState.TERMINATED and NodeState.LAUNCHING in times:
            summary.nodes_terminated += 1
        if NodeState.FAILED in times:
            summary.nodes_failed += 1
    summary.burst_node_minutes = round(node_seconds / 60, 2)
    summary.cost_usd = round(cost, 4)
    decisions = store.decisions(limit=10_000)
    summary.decisions = len(decisions)
    summary.launch_decisions = [d.id for d in reversed(decisions) if d.rule.value in ("scale-up", "min-nodes")]


# -- burst demo --fabric torch ---------------------------------------------------------------------

@dataclass
class TorchDemoSummary:
    """The torch-elastic demo's outcome (``burst demo --fabric torch --json`` prints this)."""

    run_id: str
    steps: int = 0
    world_sizes: list[int] = field(default_factory=list)  # the world size, each time it changed
    contiguous: bool = False  # the checkpointed history is steps 1..N, each exactly once
    restarts: int = 0
    loss_first: float = 0.0
    loss_last: float = 0.0
    checkpoint_step: int | None = None  # the step the drain's checkpoint confirmed
    last_step_in_larger_world: int | None = None
    join_s: float | None = None  # instance launched -> node training in the job (ready)
    drain_s: float | None = None  # drain ordered -> node released (terminating)
    drain_reason: str = ""
    release_reason: str = ""
    nodes_launched: int = 0
    nodes_terminated: int = 0
    leftover_processes: int = 0
    wall_s: float = 0.0
    timed_out: bool = False
    events: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def ok(self) -> bool:
        return (not self.timed_out and self.contiguous and self.leftover_processes == 0
                and self.world_sizes[:3] == [1, 2, 1]
                and self.checkpoint_step == self.last_step_in_larger_world
                and self.loss_last < self.loss_first)


def torch_demo_policy(endpoint: str, checkpoints: Path) -> Policy:
    """A one-node pool whose burst node joins the elastic job ``burst-demo`` (seconds timings)."""
    import yaml

    from orchestrator.fabric import elastic_train
    from orchestrator.policy import load_policy_text

    doc = {
        "version": 1, "name": "elastic-demo", "cluster": "burst-demo-torch",
        "pool": {"name": "train", "onprem": {"nodes": 1, "gpus_per_node": 1}},
        "trigger": {"sustained_for": "0s"},
        "offerings": [{"provider": "local", "region": "local", "zone": "local-a",
                       "instance_type": "local.1gpu", "market": "on-demand", "gpus": 1,
                       "price_usd_hour": 4.1}],
        "limits": {"max_nodes": 1, "max_concurrent_launches": 1},
        "scale_down": {"idle_for": "1s", "drain_grace": "60s"},
        "cooldowns": {"scale_up": "0s", "scale_down": "0s"},
        "timeouts": {"launch": "30s", "boot": "60s", "join": "120s", "terminate": "30s",
                     "heartbeat": "60s"},
        "fabric": {"kind": "torch-elastic", "torch": {
            "rdzv_endpoint": endpoint, "run_id": "burst-demo", "min_nodes": 1, "max_nodes": 3,
            "entrypoint": [elastic_train.__file__, "--checkpoint-dir", str(checkpoints),
                           "--step-time", "0.1"],
            "checkpoint_hook": "file", "checkpoint_wait": "30s", "local_addr": "127.0.0.1"}},
    }
    return load_policy_text(yaml.safe_dump(doc), "burst-demo-torch.yaml")


def run_torch_demo(*, on_event: Callable[[str], None] | None = None, timeout_s: float = 240.0,
                   keep_state: Path | None = None) -> TorchDemoSummary:
    """A torch elastic job trains on an "on-prem" node; a burst node joins it (world 1 -> 2),
    then drains out through the checkpoint hook (2 -> 1); the job goes on to the end. Always
    stops everything it started."""
    import json
    import os
    import signal
    import socket
    import subprocess

    from orchestrator.fabric.torch_node import elastic_env, torchrun_command

    state_dir = Path(tempfile.mkdtemp(prefix="burst-demo-torch-")) if keep_state is None else keep_state
    checkpoints = state_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{sock.getsockname()[1]}"
    policy = torch_demo_policy(endpoint, checkpoints)
    settings = Settings(state_dir=state_dir, database_url=None, tick_s=1.0, api_port=0,
                        local_boot_delay_s=0.0, controller_url=None)
    runtime = build_runtime(settings, [policy])
    server = ApiServer(create_app(runtime), "127.0.0.1", 0)
    fabric = runtime.fabric.by_policy[policy.name]
    summary = TorchDemoSummary(run_id="burst-demo")
    started = time.monotonic()
    stop = threading.Event()
    loop_thread: threading.Thread | None = None
    onprem: subprocess.Popen[bytes] | None = None
    status_file = state_dir / "onprem" / "elastic" / "status.json"

    def say(line: str) -> None:
        line = f"[{time.monotonic() - started:5.1f}s] {line}"
        summary.events.append(line)
        if on_event is not None:
            on_event(line)

    def status() -> dict:
        try:
            return json.loads(status_file.read_text())
        except (OSError, ValueError):
            return {}

    def wait(condition: Callable[[], object], what: str) -> bool:
        while time.monotonic() - started < timeout_s:
            if condition():
                return True
            time.sleep(0.2)
        say(f"timed out waiting for {what}")
        summary.timed_out = True
        return False

    try:
        runtime.executor.config.controller_url = f"http://127.0.0.1:{server.start()}"
        fabric.ensure_store(policy)
        say(f"controller hosts the rendezvous store at {endpoint}")
        spec = fabric.job_spec(policy)
        (state_dir / "onprem").mkdir(exist_ok=True)
        with open(state_dir / "onprem" / "torchrun.log", "ab") as out:
            onprem = subprocess.Popen(
                torchrun_command(spec), env=elastic_env(spec, status_file.parent, "onprem"),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=state_dir / "onprem", process_group=0)
        say("on-prem node: torchrun --nnodes=1:3 (c10d, gloo, CPU) started")
        loop = ControlLoop(runtime, settings.tick_s)
        loop_thread = threading.Thread(target=loop.run, args=(stop,), name="burst-loop", daemon=True)
        loop_thread.start()
        pool = policy.pool.name
        if wait(lambda: status().get("step", 0) >= 5, "the job to train on-prem"):
            say(f"training alone: step {status()['step']}, world size {status()['world_size']}")
            now = runtime.clock.now()
            runtime.store.set_prewarm(pool, 1, now + timedelta(hours=1), now)
            say("pre-warm 1 burst GPU: the planner launches a node; its agent joins the job")
        if not summary.timed_out and wait(lambda: status().get("world_size") == 2, "world size 2"):
            joined_step = status()["step"]
            say(f"burst node joined: world size 2 at step {joined_step}")
            if wait(lambda: status().get("step", 0) >= joined_step + 10, "training at world 2"):
                runtime.store.clear_prewarm(pool, runtime.clock.now())
                say("pre-warm cleared: the idle rule drains the node through the checkpoint hook")
        if not summary.timed_out and wait(
                lambda: status().get("world_size") == 1 and all(
                    n.state is NodeState.TERMINATED for n in runtime.store.nodes(include_terminated=True)),
                "the node to drain and the job to shrink"):
            shrunk_step = status()["step"]
            say(f"burst node drained and terminated: world size 1 at step {shrunk_step}")
            if wait(lambda: status().get("step", 0) >= shrunk_step + 5, "training after the drain"):
                (status_file.parent / "stop").write_text("demo over")
                try:
                    code = onprem.wait(60)
                    say(f"job stopped cleanly at step {status().get('step')} (torchrun exit {code})")
                except subprocess.TimeoutExpired:
                    say("the job did not stop within 60s")
                    summary.timed_out = True
    finally:
        stop.set()
        if loop_thread is not None:
            loop_thread.join(timeout=30)
        _cleanup(runtime)
        server.stop()
        if onprem is not None and onprem.poll() is None:
            os.killpg(onprem.pid, signal.SIGKILL)
            onprem.wait(10)
        fabric.close()
        summary.wall_s = round(time.monotonic() - started, 1)
        _summarise_torch(runtime, checkpoints, summary)
        summary.leftover_processes = _leftovers(runtime) + _processes_under(state_dir)
        runtime.close()
        if keep_state is None:
            shutil.rmtree(state_dir, ignore_errors=True)
    return summary


def _summarise_torch(runtime: Runtime, checkpoints: Path, summary: TorchDemoSummary) -> None:
    import json

    try:
        history = json.loads((checkpoints / "history.json").read_text())
    except (OSError, ValueError):
        history = []
    steps = [h["step"] for h in history]
    summary.steps = len(steps)
    summary.contiguous = bool(steps) and steps == list(range(1, len(steps) + 1))
    for entry in history:
        if not summary.world_sizes or summary.world_sizes[-1] != entry["world"]:
            summary.world_sizes.append(entry["world"])
    if history:
        summary.restarts = max(h["restart"] for h in history)
        summary.loss_first = round(sum(h["loss"] for h in history[:5]) / len(history[:5]), 6)
        summary.loss_last = round(sum(h["loss"] for h in history[-5:]) / len(history[-5:]), 6)
        larger = [h["step"] for h in history if h["world"] > 1]
        summary.last_step_in_larger_world = max(larger) if larger else None
    for node in runtime.store.nodes(include_terminated=True):
        events = runtime.store.events(node.id)
        at = {e.to_state: e for e in events}
        summary.nodes_launched += NodeState.LAUNCHING in at
        summary.nodes_terminated += node.state is NodeState.TERMINATED
        if NodeState.LAUNCHING in at and NodeState.READY in at:
            summary.join_s = round((at[NodeState.READY].at - at[NodeState.LAUNCHING].at).total_seconds(), 2)
        if NodeState.DRAINING in at and NodeState.TERMINATING in at:
            summary.drain_s = round((at[NodeState.TERMINATING].at - at[NodeState.DRAINING].at).total_seconds(), 2)
            summary.drain_reason = at[NodeState.DRAINING].reason
            summary.release_reason = at[NodeState.TERMINATING].reason
    summary.checkpoint_step = _confirmed_checkpoint(runtime)


def _confirmed_checkpoint(runtime: Runtime) -> int | None:
    """The step the drain hook confirmed, from the burst node's elastic directory."""
    import json

    for done in (runtime.settings.state_dir / "local-provider" / "instances").glob(
            "*.work/elastic/checkpoint.done"):
        try:
            return int(json.loads(done.read_text())["step"])
        except (OSError, ValueError, KeyError):
            continue
    return None


def _processes_under(state_dir: Path) -> int:
    """Live processes whose command line names the demo's state directory (agents, torchrun,
    workers): the demo must leave none."""
    import psutil

    count = 0
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if str(state_dir) in " ".join(proc.info["cmdline"] or []) and \
                    proc.info["status"] != psutil.STATUS_ZOMBIE:
                count += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return count
