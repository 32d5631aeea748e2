"""The on-prem order (``trigger.onprem_order: longest-first``) applied to a real Slurm
mini-cluster (``priority/basic``, backfill): the jobs burst keeps for on-prem get a negative
nice, so Slurm lists them first in the planner's order and starts the first of them when GPUs
free up, ahead of older jobs; a job dropped from a later order gets its nice back to 0.
"""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator.fabric.onprem_order import signed_nice
from orchestrator.fabric.slurm import SlurmFabric
from tests.builders import FixedClock
from tests.processes import READY_S
from tests.processes import wait_for as shared_wait_for
from tests.slurm_env import slurm_policy
from tests.slurm_env import live_store, slurm, slurm_cluster  # noqa: F401 (fixtures)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _jobs(slurm) -> dict[str, dict]:
    return {str(j["job_id"]): j for j in slurm.jobs()}


def _sbatch(slurm, tmp_path, name: str, minutes: int, sleep: int = 120) -> str:
    return slurm.run("sbatch", "--parsable", "-D", str(tmp_path), "-J", name, "-p", "gpu",
                     "--gres=gpu:4", "-t", str(minutes), "--wrap",
                     f"sleep {sleep}").strip().split(";")[0]


def test_the_kept_jobs_start_first_in_the_planners_order(slurm, live_store, tmp_path):
    policy = slurm_policy(slurm.conf)
    fabric = SlurmFabric(live_store, {policy.name: policy}, FixedClock(NOW))
    fill = [_sbatch(slurm, tmp_path, f"fill-{i}", 5) for i in (1, 2)]
    shared_wait_for(lambda: all(_jobs(slurm)[f]["job_state"] == "RUNNING" for f in fill),
                    READY_S, 0.1, "both on-prem nodes busy")
    short, long, medium = (_sbatch(slurm, tmp_path, name, minutes)
                           for name, minutes in (("short", 10), ("long", 600), ("medium", 30)))
    before = _jobs(slurm)
    assert before[short]["priority"] > before[long]["priority"] > before[medium]["priority"]

    assert fabric.order_onprem(policy, (long, medium)) == 2
    after = _jobs(slurm)
    assert after[long]["priority"] > after[medium]["priority"] > after[short]["priority"]
    assert signed_nice(after[short]["nice"]) == 0
    assert fabric.order_onprem(policy, (long, medium)) == 0  # nothing to change

    slurm.run("scancel", fill[0])  # a node frees: the long job is the one Slurm starts
    shared_wait_for(lambda: _jobs(slurm)[long]["job_state"] == "RUNNING", READY_S, 0.1,
                    "the long job running")
    states = _jobs(slurm)
    assert states[short]["job_state"] == states[medium]["job_state"] == "PENDING"

    # A new order replaces the last: the medium job, no longer listed, gets its nice back.
    assert fabric.order_onprem(policy, (short,)) == 2
    last = _jobs(slurm)
    assert signed_nice(last[medium]["nice"]) == 0 and signed_nice(last[short]["nice"]) < 0
    assert last[short]["priority"] > last[medium]["priority"]
    assert fabric.order_onprem(policy, ()) == 0  # an empty order changes nothing
