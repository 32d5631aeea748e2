"""Multi-node Slurm jobs on burst nodes, against the real Slurm mini-cluster.

Three burst nodes join (the agent's Slurm member, ``slurmd -N burst-k`` in its slot: Slurm 22.05
runs one dynamic node per host, so several burst nodes on one host take slots) while on-prem is
full. A 2-node job and a 1-node job run on them at once; then all three nodes are drained
together. Each job is signalled once, checkpoints and confirms, is requeued (its 2-node job from
either of its nodes, and only once), and resumes on-prem from its checkpoint: no step is lost,
no step is done twice, and the nodes leave Slurm.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.domain.nodes import NodeState
from orchestrator.fabric.slurm import SlurmFabric
from orchestrator.fabric.slurm_node import SlurmMember
from tests.builders import FixedClock, make_node
from tests.processes import wait_for as shared_wait_for
from tests.slurm_env import CHECKPOINT_JOB, slurm_policy
from tests.slurm_env import live_store, slurm, slurm_cluster  # noqa: F401 (fixtures)

pytestmark = pytest.mark.slow

NOW = datetime(2026, 1, 1, tzinfo=UTC)
STEPS = 25  # 0.1 s each


def wait_for(condition, timeout: float = 60.0, what: str = "condition"):
    return shared_wait_for(condition, timeout, 0.1, what)


def _job(slurm, job_id: str) -> dict:
    return next(j for j in slurm.jobs() if str(j["job_id"]) == job_id)


def _sbatch(slurm, *args: str) -> str:
    return slurm.run("sbatch", "--parsable", *args).strip().split(";")[0]


def _steps(log: str) -> list[int]:
    return [int(x.split()[1]) for x in log.splitlines() if x.startswith("step ")]


def test_a_two_node_and_a_one_node_job_run_on_burst_nodes_and_survive_their_drain(
        slurm, live_store, tmp_path):
    policy = slurm_policy(slurm.conf, join="slot", slots=["burst-[1-4]"])
    fabric = SlurmFabric(live_store, {policy.name: policy}, FixedClock(NOW))
    nodes = [make_node(f"train-mn{i}", policy=policy.name, state=NodeState.JOINING)
             for i in (1, 2, 3)]
    # On-prem (2 x 4 GPUs) busy for a while: the jobs start on burst nodes, resume on-prem.
    fill = [_sbatch(slurm, "-D", str(tmp_path), "--gres=gpu:4", "--wrap", "sleep 12")
            for _ in (1, 2)]
    wait_for(lambda: all(_job(slurm, f)["job_state"] == "RUNNING" for f in fill),
             what="on-prem to fill up")
    members = []
    for node in nodes:
        work = tmp_path / node.id
        work.mkdir()
        members.append(SlurmMember(fabric.join_spec(node, gpus=4), work))
    try:
        for member in members:
            member.start()
        wait_for(lambda: all(m.poll() or m.state == "joined" for m in members),
                 what="three burst nodes to join")
        assert all(fabric.confirm_joined(n) for n in nodes)
        dirs = {}
        ids = {}
        for name, width in (("wide", 2), ("one", 1)):
            dirs[name] = tmp_path / name
            dirs[name].mkdir()
            script = tmp_path / f"{name}.sh"
            script.write_text(CHECKPOINT_JOB.format(dir=dirs[name], steps=STEPS))
            script.chmod(0o755)
            ids[name] = _sbatch(slurm, "-D", str(tmp_path), "-N", str(width),
                                "--gres=gpu:4", str(script))

        def progressing() -> bool:
            return all((d / "log").exists() and len(_steps((d / "log").read_text())) >= 3
                       for d in dirs.values())

        wait_for(progressing, what="both jobs to make progress on burst nodes")
        burst_names = {m.name for m in members}
        wide = _job(slurm, ids["wide"])
        assert int(wide["node_count"]) == 2
        first_start = (dirs["wide"] / "log").read_text().splitlines()[0]
        assert "nodes=2:burst-" in first_start, first_start
        assert _job(slurm, ids["one"])["job_state"] == "RUNNING"

        for node in nodes:  # the controller drains all three at once
            fabric.request_release(node, NOW + timedelta(minutes=5))
        deadline = datetime.now(UTC) + timedelta(seconds=60)
        wait_for(lambda: all([m.drain_step(deadline) for m in members]), timeout=70,
                 what="the three drains")
        for name in burst_names:
            assert slurm.node_state(name) == "future"
        requeued = [j for m in members for j in m.report.requeued]
        signalled = [j for m in members for j in m.report.signalled]
        confirmed = [j for m in members for j in m.report.confirmed]
        assert set(requeued) == set(signalled) == set(confirmed) == set(ids.values())
        assert all(m.report.ended_by == "release" for m in members)

        wait_for(lambda: all(_job(slurm, j)["job_state"] == "COMPLETED" for j in ids.values()),
                 timeout=90, what="both jobs to finish on-prem")
        for name, d in dirs.items():
            log = (d / "log").read_text()
            assert _steps(log) == list(range(1, STEPS + 1)), (name, log)  # none lost or redone
            starts = [x for x in log.splitlines() if x.startswith("start ")]
            assert len(starts) == 2 and "restart=1" in starts[1], (name, log)
            assert "onprem-" in starts[1] and "burst-" not in starts[1], (name, log)
    finally:
        for member in members:
            member.stop()
    for node in nodes:
        assert fabric.node_gone(node, NOW) == 0
