"""The jobs burst keeps for on-prem kept off burst nodes (``trigger.spare_room``) on a real Slurm
mini-cluster: the kept job's ``ExcNodeList`` gets the burst names it may not take (its own
exclusion kept), so a burst node that joins runs the job it was launched for and the kept job
waits for on-prem; a later plan that keeps it no more lifts burst's names; a dynamic node joins
drained and is resumed only once the kept jobs exclude it.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

from orchestrator.domain.nodes import NodeState
from orchestrator.fabric.kept_off import JOINING_REASON, held_joining
from orchestrator.fabric.slurm import SlurmFabric
from orchestrator.fabric.slurm_node import SlurmMember
from orchestrator.planner.spare_room import Busy, KeptOnPrem
from orchestrator.sources.slurm_cli import expand_hostlist
from tests.builders import FixedClock, make_job, make_node
from tests.processes import READY_S
from tests.processes import wait_for as shared_wait_for
from tests.slurm_env import live_store, slurm, slurm_cluster  # noqa: F401 (fixtures)
from tests.slurm_env import slurm_policy

NOW = datetime(2026, 1, 1, tzinfo=UTC)
SLOTS = {f"burst-{i}" for i in range(1, 5)}
SPARE = {"wait_slo": "30m", "spare_room": {"enabled": True, "max_extension": 0}}


def _jobs(slurm) -> dict[str, dict]:
    return {str(j["job_id"]): j for j in slurm.jobs()}


def _excluded(slurm, job_id: str) -> set[str]:
    return set(expand_hostlist(_jobs(slurm)[job_id].get("excluded_nodes") or ""))


def _sbatch(slurm, tmp_path, name: str, *extra: str) -> str:
    return slurm.run("sbatch", "--parsable", "-D", str(tmp_path), "-J", name, "-p", "gpu",
                     "--gres=gpu:4", "-t", "60", *extra, "--wrap",
                     "sleep 120").strip().split(";")[0]


def _fill_onprem(slurm, tmp_path) -> None:
    fill = [_sbatch(slurm, tmp_path, f"fill-{i}") for i in (1, 2)]
    shared_wait_for(lambda: all(_jobs(slurm)[f]["job_state"] == "RUNNING" for f in fill),
                    READY_S, 0.1, "both on-prem nodes busy")


def _kept(*job_ids: str, busy: tuple[Busy, ...] = ()) -> KeptOnPrem:
    jobs = [make_job(j, gpus=4, duration_s=3600.0) for j in job_ids]
    return KeptOnPrem(tuple(job_ids), (), 0.0, jobs=jobs, busy=busy)


def test_a_kept_job_waits_for_onprem_while_a_slot_runs_the_job_it_joined_for(
        slurm, live_store, tmp_path):
    policy = slurm_policy(slurm.conf, trigger=SPARE, join="slot", slots=["burst-[1-4]"])
    fabric = SlurmFabric(live_store, {policy.name: policy}, FixedClock(NOW))
    _fill_onprem(slurm, tmp_path)
    # The kept job is the older, and raised first as the on-prem order would: left to Slurm it
    # would be the one to start on the burst node. Its own exclusion (onprem-1) stays.
    kept = _sbatch(slurm, tmp_path, "kept", "--exclude=onprem-1")
    due = _sbatch(slurm, tmp_path, "due")
    fabric.order_onprem(policy, (kept,))

    assert fabric.keep_off_burst(policy, _kept(kept)) == 1
    assert _excluded(slurm, kept) == {"onprem-1", *SLOTS}  # FUTURE slots named
    assert _excluded(slurm, due) == set()
    assert fabric.keep_off_burst(policy, _kept(kept)) == 0  # nothing to change

    node = make_node("n-slot", policy=policy.name, state=NodeState.JOINING)
    member = SlurmMember(fabric.join_spec(node, gpus=4), tmp_path)
    member.start()
    try:
        shared_wait_for(lambda: _jobs(slurm)[due]["job_state"] == "RUNNING", READY_S, 0.1,
                        "the due job running on the burst slot")
        assert _jobs(slurm)[due]["nodes"] == member.name
        time.sleep(1.5)  # (a scheduling pass or two)
        assert _jobs(slurm)[kept]["job_state"] == "PENDING"

        # The next plan keeps it no more (say it is due now): burst's names are lifted.
        assert fabric.keep_off_burst(policy, _kept()) == 1
        assert _excluded(slurm, kept) == {"onprem-1"}
    finally:
        member.stop()


def test_a_kept_job_may_take_the_node_the_plan_allows(slurm, live_store, tmp_path):
    policy = slurm_policy(slurm.conf, trigger=SPARE, join="slot", slots=["burst-[1-4]"])
    fabric = SlurmFabric(live_store, {policy.name: policy}, FixedClock(NOW))
    _fill_onprem(slurm, tmp_path)
    kept = _sbatch(slurm, tmp_path, "kept")
    nodes = [make_node(f"n-{i}", policy=policy.name, state=NodeState.JOINING) for i in (1, 2)]
    names = [fabric.join_spec(n, gpus=4)["node_name"] for n in nodes]
    # n-1's work lasts longer than the kept job: it may take room there, not on n-2.
    busy = (Busy("n-1", 8, 7200.0), Busy("n-2", 8, 60.0))
    fabric.keep_off_burst(policy, _kept(kept, busy=busy))
    assert _excluded(slurm, kept) == SLOTS - {names[0]}


def test_a_dynamic_node_joins_drained_until_the_kept_jobs_exclude_it(slurm, live_store, tmp_path):
    policy = slurm_policy(slurm.conf, trigger=SPARE)  # join: dynamic
    fabric = SlurmFabric(live_store, {policy.name: policy}, FixedClock(NOW))
    _fill_onprem(slurm, tmp_path)
    kept = _sbatch(slurm, tmp_path, "kept")
    due = _sbatch(slurm, tmp_path, "due")
    fabric.order_onprem(policy, (kept,))
    node = make_node("train-dyn1", policy=policy.name, state=NodeState.JOINING)
    spec = fabric.join_spec(node, gpus=4)
    assert spec["hold_reason"] == JOINING_REASON
    member = SlurmMember(spec, tmp_path)
    member.start()
    try:
        shared_wait_for(lambda: "train-dyn1" in slurm.nodes(), READY_S, 0.1, "slurmd -Z to register")
        time.sleep(1.5)
        state = slurm.nodes()["train-dyn1"]
        assert "DRAIN" in state["state_flags"] and held_joining(state)
        assert _jobs(slurm)[kept]["job_state"] == _jobs(slurm)[due]["job_state"] == "PENDING"
        assert not fabric.confirm_joined(node)

        assert fabric.keep_off_burst(policy, _kept(kept)) == 1  # excluded, then resumed
        assert _excluded(slurm, kept) == {"train-dyn1"}
        shared_wait_for(lambda: _jobs(slurm)[due]["job_state"] == "RUNNING", READY_S, 0.1,
                        "the due job running on the dynamic node")
        assert fabric.confirm_joined(node)
        assert _jobs(slurm)[kept]["job_state"] == "PENDING"
    finally:
        member.stop()
