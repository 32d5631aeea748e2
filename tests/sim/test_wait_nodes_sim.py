"""The per-node wait model, displacement and the learned boot through the simulator: the real
planner and executor on the virtual clock (tests.sim.helpers).

One 8-GPU on-prem node is busy for 10 minutes; a 1-GPU one-hour job queues, then an 8-GPU
two-hour job. Without displacement the small job takes the node when it frees and the wide one
is burst on the dear 8-GPU offering; with it the small job is burst (on the cheap 1-GPU
offering) and the wide one starts on-prem, for less money and no wait past the SLO.
"""

from __future__ import annotations

from orchestrator.sim.controllers import PolicyController
from tests.sim.helpers import job, run_with, sim_policy, trace

OFFERINGS = [
    {"provider": "sim", "region": "r1", "instance_type": "s1", "gpus": 1, "price_usd_hour": 1},
    {"provider": "sim", "region": "r1", "instance_type": "s8", "gpus": 8, "price_usd_hour": 32},
]
JOBS = trace(("busy", 0, 600, 8), ("small", 60, 3600, 1), ("wide", 120, 7200, 8))


def _run(**trigger):
    policy = sim_policy(offerings=OFFERINGS, trigger={"wait_slo": "30m", "expected_boot": "2m",
                                                      "wait_model": "nodes", **trigger})
    return run_with(lambda p: PolicyController(p, "t"), policy, JOBS)


def _cost(engine) -> float:
    return sum(b.cost_micro_usd for b in engine.provider.bills()) / 1e6


def test_displacement_bursts_the_small_job_so_the_wide_one_starts_on_prem() -> None:
    plain = _run()
    assert (job(plain, "small").where, job(plain, "wide").where) == ("onprem", "burst")
    moved = _run(displacement={"enabled": True})
    assert (job(moved, "small").where, job(moved, "wide").where) == ("burst", "onprem")
    assert job(moved, "wide").wait_s < 1800 and job(moved, "small").wait_s < 1800
    assert _cost(moved) < _cost(plain) / 4


def test_longest_first_keeps_the_long_job_on_prem_and_the_world_follows() -> None:
    # One 8-GPU node busy 10 minutes; an 8-GPU one-hour job queues, then an 8-GPU ten-hour one.
    # In submit order the short job takes the node and the long one is burst for ten hours;
    # longest first, the long one is kept and the on-prem scheduler is told to start it first.
    jobs = trace(("busy", 0, 600, 8), ("short", 60, 3600, 8), ("long", 120, 36_000, 8))
    offerings = [OFFERINGS[1]]

    def run(**trigger):
        policy = sim_policy(offerings=offerings, trigger={
            "wait_slo": "30m", "expected_boot": "2m", "wait_model": "nodes", **trigger})
        return run_with(lambda p: PolicyController(p, "t"), policy, jobs)

    plain = run()
    assert (job(plain, "short").where, job(plain, "long").where) == ("onprem", "burst")
    kept = run(onprem_order="longest-first")
    assert (job(kept, "short").where, job(kept, "long").where) == ("burst", "onprem")
    assert job(kept, "long").wait_s < 1800 and job(kept, "short").wait_s < 1800
    assert _cost(kept) < _cost(plain) / 5


def test_the_run_learns_boots_from_its_nodes_only_when_asked() -> None:
    assert _run().boot_learner is None
    engine = _run(learn_boot=True)
    [key] = engine.boot_learner.keys()  # the one node launched: the 8-GPU one, for the wide job
    assert key.endswith("/s8/on-demand")
    assert engine.boot_learner.estimate(key, 10.0).boot_s == 100.0  # the fixed boot model
