"""The Slurm fabric and queue source against a real Slurm mini-cluster and real stores.

* Slots are claimed race-free through the store (SQLite and PostgreSQL).
* The queue source reads pending GPU jobs and on-prem capacity from live ``squeue``/``sinfo``.
* A dynamic node (``slurmd -Z``) joins, runs a checkpointing job, and drains out: the job is
  signalled, confirms its checkpoint, is requeued without Slurm's requeue hold, resumes on an
  on-prem node and loses no step; the node is deleted from Slurm and its slurmd is gone.
* The backstop: a node whose agent died with a job on it is cleaned by ``node_gone``: the job is
  requeued, the slot is FUTURE again and free in the store.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta

import psutil
import pytest

from orchestrator.domain.nodes import NodeState
from orchestrator.fabric.slurm import SlurmFabric, slurm_scope
from orchestrator.fabric.slurm_node import SlurmMember
from orchestrator.sources.slurm import SlurmQueue
from tests.builders import FixedClock, make_node
from tests.slurm_env import CHECKPOINT_JOB, slurm_policy
from tests.slurm_env import live_store, slurm, slurm_cluster  # noqa: F401 (fixtures)
from tests.processes import READY_S
from tests.processes import wait_for as shared_wait_for

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def wait_for(condition, timeout: float = READY_S, what: str = "condition"):
    """The shared readiness wait (tests/processes.py), polling every 0.1 s."""
    return shared_wait_for(condition, timeout, 0.1, what)


def job(slurm, job_id: str) -> dict:
    return next(j for j in slurm.jobs() if str(j["job_id"]) == job_id)


def sbatch(slurm, *args: str) -> str:
    return slurm.run("sbatch", "--parsable", *args).strip().split(";")[0]


# -- slots in the store ---------------------------------------------------------------------------

def test_slots_are_claimed_race_free_and_given_back(store):
    scope = "slurm:test"
    names = [f"burst-{i}" for i in range(1, 5)]
    assert store.seed_fabric_slots(scope, names) == 4
    assert store.seed_fabric_slots(scope, names) == 0  # idempotent
    results: dict[str, object] = {}
    barrier = threading.Barrier(8)

    def claim(node_id: str) -> None:
        barrier.wait()
        results[node_id] = store.claim_fabric_slot(scope, node_id, NOW)

    threads = [threading.Thread(target=claim, args=(f"node-{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = {n: m.name for n, m in results.items() if m is not None}
    assert len(won) == 4 and sorted(won.values()) == names, won
    winner = next(iter(won))
    assert store.claim_fabric_slot(scope, winner, NOW).name == won[winner]  # the same one again
    assert store.release_fabric_member(winner).name == won[winner]
    assert store.release_fabric_member(winner) is None  # idempotent
    assert store.claim_fabric_slot(scope, "node-late", NOW).name == won[winner]
    # Dynamic members: recorded once per node, a name held by one node only.
    assert store.add_fabric_member(scope, "dyn-a", "node-d", NOW).kind == "dynamic"
    assert store.add_fabric_member(scope, "dyn-a", "node-d", NOW).name == "dyn-a"
    with pytest.raises(ValueError, match="already held"):
        store.add_fabric_member(scope, "dyn-a", "node-e", NOW)
    store.release_fabric_member("node-d")
    assert all(m.name != "dyn-a" for m in store.fabric_members(scope))


# -- queue source ---------------------------------------------------------------------------------

def test_queue_source_reads_pending_gpu_jobs_and_onprem_capacity(slurm, live_store, tmp_path):
    store = live_store
    policy = slurm_policy(slurm.conf)
    for i in (1, 2):
        sbatch(slurm, "-D", str(tmp_path), "-J", f"fill-{i}", "--gres=gpu:4", "--wrap", "sleep 60")
    pending = sbatch(slurm, "-D", str(tmp_path), "-J", "want", "--gres=gpu:2", "-A", "research",
                     "-t", "30", "--wrap", "sleep 5")
    source = SlurmQueue(store, [policy])
    queue = wait_for(lambda: (q := source.observe(NOW)["gpu"]).running_onprem_jobs == 2 and q,
                     what="both fill jobs running")
    assert queue.onprem.total_gpus == 8 and queue.onprem.free_gpus == 0
    wanted = wait_for(lambda: [j for j in source.observe(NOW)["gpu"].pending if j.id == pending],
                      what="the pending job")
    assert wanted[0].gpus == 2 and wanted[0].project == "research"
    assert wanted[0].duration_s == 1800 and wanted[0].pool == "gpu"
    # This cluster keeps no accounting (accounting_storage/none): sacct fails, the observation
    # goes on, and no job gets a measurement (unknown, never 0).
    assert source._accounting_failed == {policy.queue.slurm_conf}
    assert store.job_utilisation() == []


# -- join and drain -------------------------------------------------------------------------------

def test_dynamic_node_joins_runs_a_job_and_drains_out_losing_no_step(slurm, live_store, tmp_path):
    store = live_store
    policy = slurm_policy(slurm.conf)  # join: dynamic (the default)
    fabric = SlurmFabric(store, {policy.name: policy}, FixedClock(NOW))
    node = make_node("train-dyn1", policy=policy.name, state=NodeState.JOINING)
    spec = fabric.join_spec(node, gpus=4)
    assert spec["mode"] == "dynamic" and spec["node_name"] == "train-dyn1"
    member = SlurmMember(spec, tmp_path)
    # On-prem busy for a while, so the job starts on the dynamic node (and later resumes on-prem).
    fill = [sbatch(slurm, "-D", str(tmp_path), "--gres=gpu:4", "--wrap", "sleep 10")
            for _ in (1, 2)]
    wait_for(lambda: all(job(slurm, f)["job_state"] == "RUNNING" for f in fill),
             what="on-prem to fill up")
    try:
        started = time.monotonic()
        member.start()
        wait_for(lambda: member.poll() or member.state == "joined", what="slurmd -Z to register")
        join_s = time.monotonic() - started
        assert fabric.confirm_joined(node)
        assert "DYNAMIC_NORM" in slurm.nodes()["train-dyn1"]["state_flags"]

        work = tmp_path / "ck"
        work.mkdir()
        script = tmp_path / "ck.sh"
        script.write_text(CHECKPOINT_JOB.format(dir=work, steps=30))
        script.chmod(0o755)
        ck = sbatch(slurm, "-D", str(tmp_path), "--gres=gpu:4", str(script))
        wait_for(lambda: (work / "log").exists() and (work / "log").read_text().count("step ") >= 5,
                 what="the job to make progress on the dynamic node")
        assert "node=train-dyn1" in (work / "log").read_text()

        drain_started = time.monotonic()
        fabric.request_release(node, NOW + timedelta(minutes=5))  # controller: drain in Slurm
        assert "DRAIN" in slurm.nodes()["train-dyn1"]["state_flags"]
        deadline = datetime.now(UTC) + timedelta(seconds=60)
        wait_for(lambda: member.drain_step(deadline), timeout=60, what="the drain")
        drain_s = time.monotonic() - drain_started
        report = member.report
        assert report.signalled == [ck] and report.confirmed == [ck] and report.requeued == [ck]
        assert report.ended_by == "release"
        assert slurm.node_state("train-dyn1") is None  # deleted from Slurm
        assert member.slurmd.poll() is not None
        # Requeued without Slurm's 2-minute hold: it resumes on an on-prem node right away.
        wait_for(lambda: job(slurm, ck)["job_state"] == "COMPLETED", timeout=40,
                 what="the requeued job to finish on-prem")
        lines = (work / "log").read_text().splitlines()
        steps = [int(x.split()[1]) for x in lines if x.startswith("step ")]
        assert steps == list(range(1, 31)), lines
        starts = [x for x in lines if x.startswith("start ")]
        assert len(starts) == 2 and "node=onprem-" in starts[1] and "restart=1" in starts[1]
        print(f"\ndynamic node: joined in {join_s:.2f}s, drained (checkpoint+requeue+delete) "
              f"in {drain_s:.2f}s")
    finally:
        member.stop()
    assert fabric.node_gone(node, NOW) == 0  # nothing left to clean
    assert store.fabric_member(node.id) is None


def test_node_gone_requeues_its_jobs_and_returns_the_slot(slurm, live_store, tmp_path):
    store = live_store
    policy = slurm_policy(slurm.conf, join="slot", slots=["burst-[1-4]"])
    fabric = SlurmFabric(store, {policy.name: policy}, FixedClock(NOW))
    node = make_node("train-slot1", policy=policy.name, state=NodeState.READY)
    spec = fabric.join_spec(node, gpus=4)
    assert spec["node_name"] == "burst-1" and spec["mode"] == "slot"
    member = SlurmMember(spec, tmp_path)
    member.start()
    try:
        wait_for(lambda: member.poll() or member.state == "joined", what="burst-1 to join")
        victim = sbatch(slurm, "-D", str(tmp_path), "-w", "burst-1", "--gres=gpu:4", "-t", "5",
                        "--wrap", "sleep 300")
        wait_for(lambda: job(slurm, victim)["job_state"] == "RUNNING", what="the job to start")
    finally:
        member.stop()  # the agent and its slurmd die with the instance
    kill_job_processes(victim)  # ... and so does the job's slurmstepd, on a real instance
    assert fabric.node_gone(node, NOW) == 1
    assert job(slurm, victim)["job_state"] == "PENDING"
    assert job(slurm, victim)["state_reason"] != "BeginTime"  # free to start again at once
    assert slurm.node_state("burst-1") == "future"
    assert store.fabric_member(node.id) is None
    assert {m.name for m in store.fabric_members(slurm_scope(policy)) if m.node_id is None} == {
        "burst-1", "burst-2", "burst-3", "burst-4"}


def kill_job_processes(job_id: str) -> None:
    """Kill what a dead host would have taken with it: the job's slurmstepd and its children."""
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if f"[{job_id}." in cmdline or f"[{job_id}]" in cmdline or \
                    proc.environ().get("SLURM_JOB_ID") == job_id:
                os.kill(proc.pid, signal.SIGKILL)
        except (psutil.Error, OSError):
            continue


def test_a_drain_that_reaches_its_deadline_requeues_what_is_left_and_says_so(
        slurm, live_store, tmp_path):
    # A job without a checkpoint handler never confirms; the deadline, not the release, ends
    # the drain, and the job is requeued (its progress since its own last checkpoint is the
    # price), never killed without a requeue.
    policy = slurm_policy(slurm.conf, join="slot", slots=["burst-[1-4]"], checkpoint_wait="5m")
    fabric = SlurmFabric(live_store, {policy.name: policy}, FixedClock(NOW))
    node = make_node("train-late1", policy=policy.name, state=NodeState.READY)
    member = SlurmMember(fabric.join_spec(node, gpus=4), tmp_path)
    member.start()
    try:
        wait_for(lambda: member.poll() or member.state == "joined", what="the slot to join")
        name = member.name
        stubborn = sbatch(slurm, "-D", str(tmp_path), "-w", name, "--gres=gpu:4",
                          "--wrap", "trap '' USR1; sleep 300")
        wait_for(lambda: job(slurm, stubborn)["job_state"] == "RUNNING", what="the job to start")
        deadline = datetime.now(UTC) + timedelta(seconds=3)
        wait_for(lambda: member.drain_step(deadline), timeout=30, what="the drain")
    finally:
        member.stop()
    assert member.report.ended_by == "deadline"
    assert member.report.signalled == [stubborn] and member.report.confirmed == []
    assert member.report.requeued == [stubborn]
    assert job(slurm, stubborn)["job_state"] in ("PENDING", "RUNNING")  # requeued, not lost
    assert slurm.node_state(name) == "future"
