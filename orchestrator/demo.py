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
        "trigger": policy.trigger.model_copy(update={"sustained_for": 2 * s, "oldest_wait_above": 3 * s}),
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
        "tick": "1s", "boot": "3s", "trigger.sustained_for": "2s", "scale_down.idle_for": "4s",
        "cooldowns": "2s up / 4s down"})
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
