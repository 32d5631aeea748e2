"""Measured GPU use end to end: the store's aggregates on both backends, and the real node agent
(in-process, with an injected sampler) heartbeating its readings into the real API.

The sampler is injected (no GPU is lent to this task): it replays the recorded reading of a real
RTX 2080 (tests/unit/data/gpu) with the utilisation the test sets. Everything else is real: the
agent's HTTP client and job runner, uvicorn, the API, the store on SQLite and PostgreSQL.
"""

from __future__ import annotations

import signal
import threading
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.domain.jobs import JobState
from orchestrator.domain.utilisation import GpuUse, UsageSource
from orchestrator.fabric.agent import Agent
from orchestrator.fabric.bootstrap import Bootstrap
from orchestrator.fabric.gpu_sampler import GpuReading, GuardedSampler, parse_query_gpu
from orchestrator.store import Store
from orchestrator.store.usage import hour_of
from orchestrator.wiring import Settings
from tests.builders import POOL, T0, make_rig
from tests.integration.api_support import add_node, runtime_of
from tests.processes import wait_for
from tests.unit.test_gpu_usage_readers import DATA, RTX2080_FIELDS

WAIT_S = 60.0


def _node(store: Store):
    rig = make_rig(store)
    return rig, add_node(rig, 1, "research")


def test_readings_fold_into_job_and_node_hour_aggregates(store: Store) -> None:
    rig, node = _node(store)
    job = store.submit_job("research", POOL, 2, 0, 60.0, None, T0)
    # Two GPUs held by the job at 90 % then 10 %, one free GPU unknown; 10 s per reading.
    store.record_gpu_readings(node, T0, 10.0, [
        GpuUse(0, 90.0, 1000.0, 8000.0, job.id), GpuUse(1, 90.0, 3000.0, 8000.0, job.id),
        GpuUse(2, None, None, None, None)], below_percent=5.0)
    store.record_gpu_readings(node, T0 + timedelta(seconds=10), 10.0, [
        GpuUse(0, 10.0, 500.0, 8000.0, job.id), GpuUse(1, 10.0, 500.0, 8000.0, job.id),
        GpuUse(2, 0.0, 0.0, 8000.0, None)], below_percent=5.0)
    [use] = store.job_utilisation([job.id])
    assert (use.project, use.node_id, use.source) == ("research", node.id, UsageSource.AGENT)
    assert (use.sampled_gpu_s, use.measured_gpu_s) == (40.0, 40.0)
    assert use.used_gpu_s == pytest.approx(20.0)
    assert use.mean_utilisation_percent == 50.0
    assert use.p50_utilisation_percent is not None and 10 <= use.p50_utilisation_percent <= 15
    assert (use.peak_memory_mib, use.memory_total_mib) == (3000.0, 8000.0)
    assert use.low_since is None and use.allocated_gpu_s is None  # no run recorded
    [hour] = store.node_utilisation_hours(since=T0)
    assert (hour.node_id, hour.hour, hour.gpus) == (node.id, hour_of(T0), 8)
    assert (hour.gpu_s, hour.allocated_gpu_s, hour.measured_gpu_s) == (60.0, 40.0, 50.0)
    assert hour.mean_utilisation_percent == 40.0  # (18 + 2 + 0) / 50 measured GPU-seconds


def test_an_unmeasured_job_is_unknown_and_accounting_is_recorded_once(store: Store) -> None:
    rig, node = _node(store)
    store.record_gpu_readings(node, T0, 5.0, [GpuUse(0, None, None, None, "j-unknown")],
                              below_percent=5.0)
    [unknown] = store.job_utilisation(["j-unknown"])
    assert (unknown.sampled_gpu_s, unknown.measured_gpu_s) == (5.0, 0.0)
    assert not unknown.measured
    assert unknown.mean_utilisation_percent is None and unknown.p50_utilisation_percent is None
    ended = T0 + timedelta(hours=2)
    assert store.record_job_accounting("slurm-7", "physics", started_at=T0, ended_at=ended,
                                       gpus=4, mean_utilisation_percent=62.5,
                                       peak_memory_mib=38888.0)
    assert not store.record_job_accounting("slurm-7", "physics", started_at=T0, ended_at=ended,
                                           gpus=4, mean_utilisation_percent=1.0,
                                           peak_memory_mib=None)
    assert store.record_job_accounting("slurm-8", None, started_at=T0, ended_at=ended, gpus=1,
                                       mean_utilisation_percent=None, peak_memory_mib=None)
    slurm7, slurm8 = store.job_utilisation(["slurm-7", "slurm-8"])
    assert (slurm7.source, slurm7.allocated_gpu_s, slurm7.mean_utilisation_percent) == (
        UsageSource.SACCT, 4 * 7200.0, 62.5)
    assert slurm7.p50_utilisation_percent is None  # accounting gives no distribution
    assert not slurm8.measured and slurm8.allocated_gpu_s == 7200.0  # allocation only
    assert store.job_utilisation(project="nobody") == []  # an unknown project: empty
    assert store.prune_utilisation(T0 + timedelta(hours=3)) == 4
    assert store.job_utilisation() == [] and store.node_utilisation_hours() == []


class ReplayedGpus:
    """The injected sampler: the recorded RTX 2080 reading, four of them, at a set utilisation."""

    source = "nvidia-smi"

    def __init__(self) -> None:
        [self.recorded] = parse_query_gpu((DATA / "nvidia-smi-rtx2080.csv").read_text(),
                                          RTX2080_FIELDS)
        self.percent: float | None = 86.0
        self.reads = 0

    def read(self) -> list[GpuReading]:
        self.reads += 1
        return [replace(self.recorded, index=i, utilisation_percent=self.percent,
                        memory_used_mib=1024.0 * (i + 1)) for i in range(4)]


def test_a_real_agent_heartbeats_its_readings_into_the_api(store: Store, tmp_path: Path) -> None:
    rig = make_rig(store)
    rt = replace(runtime_of(rig, tmp_path), settings=Settings(state_dir=tmp_path / "state",
                                                               tick_s=1.0))
    node = add_node(rig, 1, "research")
    [request] = rig.provider.requests.values()
    server = ApiServer(create_app(rt), "127.0.0.1", 0)
    port = server.start()
    seen = tmp_path / "cuda.txt"
    job = store.submit_job("research", POOL, 2, 0, None,
                           f"echo $CUDA_VISIBLE_DEVICES > {seen}; sleep 600", rig.now)
    boot = replace(Bootstrap.parse(request.user_data),
                   controller_url=f"http://127.0.0.1:{port}", boot_delay_s=0.0)
    gpus = ReplayedGpus()
    agent = Agent(boot, tmp_path / "work", sampler=GuardedSampler(gpus))
    runner = threading.Thread(target=agent.run, name="agent", daemon=True)
    try:
        runner.start()
        wait_for(lambda: seen.exists() and seen.read_text().strip(), WAIT_S)
        assert seen.read_text().strip() == "0,1"  # the run holds the node's first two GPUs
        wait_for(lambda: store.job_utilisation([job.id])
                 and store.job_utilisation([job.id])[0].measured_gpu_s > 0, WAIT_S)
        [use] = store.job_utilisation([job.id])
        assert use.mean_utilisation_percent == 86.0 and use.peak_memory_mib == 2048.0
        assert store.get_job(job.id).state is JobState.RUNNING
        wait_for(lambda: store.get_node(node.id).gpu_utilisation_percent == 86.0, WAIT_S)
        hours = store.node_utilisation_hours(node_ids=[node.id])
        assert hours and hours[0].gpu_s > hours[0].allocated_gpu_s > 0  # 2 of 4 GPUs held

        gpus.percent = 1.0  # the job stops using its GPUs: low since now
        wait_for(lambda: store.get_node(node.id).low_utilisation_since is not None, WAIT_S)
        gpus.percent = None  # the reader loses the utilisation: unknown, never idle
        wait_for(lambda: store.get_node(node.id).gpu_utilisation_percent is None, WAIT_S)
        assert store.get_node(node.id).low_utilisation_since is None
    finally:
        agent._signalled = signal.SIGTERM  # what the agent's SIGTERM handler sets
        runner.join(WAIT_S)
        server.stop()
    assert not runner.is_alive()


def test_idle_gpus_are_flagged_in_the_api_and_the_metrics(store: Store, tmp_path: Path) -> None:
    from orchestrator.domain.jobs import Placement
    from orchestrator.domain.nodes import NodeState
    from tests.builders import POLICY
    from tests.integration.api_support import bearer, make_tokens, served
    from tests.integration.test_api_metrics import scrape

    rig = make_rig(store)
    add_node(rig, 1, "research")
    low_since = rig.now - timedelta(minutes=31)  # past utilisation.idle_for (30m)
    node = rig.move("n1", NodeState.BOOTING, NodeState.JOINING, NodeState.READY,
                    gpu_utilisation_percent=1.5, low_utilisation_since=low_since)
    add_node(rig, 2, "research")  # no reading: unknown
    job = store.submit_job("research", POOL, 2, 0, 600.0, None, rig.now)
    assert store.start_job(job, placement=Placement.BURST, node_id=node.id, at=low_since)
    store.record_gpu_readings(node, low_since, 5.0, [GpuUse(0, 1.0, 10.0, 80.0, job.id),
                                                     GpuUse(1, 2.0, 10.0, 80.0, job.id)],
                              below_percent=5.0)
    tokens = make_tokens(store, rig)
    with served(runtime_of(rig, tmp_path)) as client:
        nodes = {n["id"]: n for n in client.get("/v1/nodes", headers=bearer(tokens.admin))
                 .json()["nodes"]}
        queue = client.get("/v1/queue", headers=bearer(tokens.viewer)).json()
        metrics = scrape(client, tokens.admin)
    assert (nodes["n1"]["gpu_utilisation_percent"], nodes["n1"]["low_utilisation"]) == (1.5, True)
    assert (nodes["n2"]["gpu_utilisation_percent"], nodes["n2"]["low_utilisation"]) == (
        None, False)
    [running] = [j for j in queue["jobs"] if j["id"] == job.id]
    assert (running["gpu_utilisation_percent"], running["low_utilisation"]) == (1.5, True)
    assert running["measured_gpu_s"] == 10.0
    policy = (("policy", POLICY),)
    assert metrics["burst_gpu_low_utilisation_nodes"][
        ("burst_gpu_low_utilisation_nodes", policy)] == 1
    assert metrics["burst_gpu_low_utilisation_jobs"][
        ("burst_gpu_low_utilisation_jobs", policy)] == 1
    gauges = metrics["burst_node_gpu_utilisation_percent"]
    assert [dict(labels)["node"] for _, labels in gauges] == ["n1"]  # n2: unknown, absent


def test_slurm_accounting_of_a_real_job_is_recorded_once(store: Store) -> None:
    from orchestrator.sources.slurm import record_accounted
    from orchestrator.sources.slurm_usage import parse_sacct_usage

    text = (DATA / "sacct-tres-usage-in-ave.txt").read_text().splitlines()
    # The recorded job with the allocation fields sacct adds to the recorded usage columns.
    header = "JobID|Account|Start|End|Elapsed|AllocTRES|TRESUsageInAve|"
    rows = [header, "18194943|physics|2026-01-01T00:00:00|2026-01-01T01:00:00|01:00:00|"
                    "gres/gpu=1||"] + [line.replace("|", "||||||", 1) for line in text[2:]]
    jobs = parse_sacct_usage("\n".join(rows)).values()
    assert record_accounted(store, jobs) == 1
    assert record_accounted(store, jobs) == 0  # read again next period: recorded once
    [use] = store.job_utilisation(["18194943"])
    assert (use.source, use.project, use.allocated_gpu_s) == (UsageSource.SACCT, "physics", 3600.0)
    assert use.mean_utilisation_percent == 100.0
