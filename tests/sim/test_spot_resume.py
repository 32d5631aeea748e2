"""Spot in the simulator: measured spot markets, resuming from checkpoints, learned capacity."""

from __future__ import annotations

import random

import pytest

from orchestrator.domain.capacity import CapacityLearner, bucket_hazard
from orchestrator.sim.spotdata import availability_series, spot_markets
from orchestrator.sim.traces import trace_dir
from providers.sim import SpotMarket
from tests.builders import make_offering


def test_a_market_refuses_launches_with_no_capacity_and_interrupts_at_a_drop():
    market = SpotMarket(10.0, bytes([1, 1, 0, 0, 1, 1, 1, 0]), keep=1.0)
    assert market.available(0) and not market.available(25)
    rng = random.Random(1)
    assert market.next_interruption(0.0, rng) == 20.0  # the drop at tick 2
    assert market.next_interruption(45.0, rng) == 70.0  # the drop at tick 7
    assert market.next_interruption(75.0, rng) == 100.0  # the loop's next pass: tick 10 = 2
    assert SpotMarket(10.0, bytes([1, 0]), keep=0.0).next_interruption(0.0, rng) is None


# The Spot Advisor and SkyPilot files live in ../shared/data beside the checkout (or
# $BURST_TRACE_DIR), which a bare checkout does not carry.
@pytest.mark.skipif(not (trace_dir() / "aws-spot-advisor").is_dir(),
                    reason="../shared/data (or $BURST_TRACE_DIR) with aws-spot-advisor is not here")
def test_the_shared_data_gives_every_spot_offering_a_seeded_market():
    offerings = [make_offering("g5.12xlarge", gpus=4, market="spot", region="us-east-1"),
                 make_offering("g5.12xlarge", gpus=4, market="on-demand", region="us-east-1")]
    markets = spot_markets(offerings, seed=0, root=trace_dir())
    assert list(markets) == [offerings[0].key]
    [market] = markets.values()
    assert market.keep == 1.0  # g5.12xlarge us-east-1 is in the >20 % bucket
    assert spot_markets(offerings, seed=0, root=trace_dir()) == markets
    assert len(availability_series(trace_dir())) == 9


def test_the_learner_moves_from_the_published_prior_to_what_it_sees_and_forgets():
    prior = bucket_hazard(4)
    learner = CapacityLearner({"k": prior}, half_life_h=24.0)
    assert learner.health("k", 0.0).preemptions_per_hour == float(f"{prior:.2g}")
    for hour in range(100):
        learner.ran("k", 1.0, float(hour), interrupted=hour % 2 == 0)
        learner.launch("k", float(hour), refused=hour % 4 == 0)
    seen = learner.health("k", 100.0)
    assert 0.2 < seen.preemptions_per_hour < 0.5 and 0.15 < seen.stockout_odds < 0.3
    later = learner.health("k", 100.0 + 24 * 20)
    assert later.preemptions_per_hour < seen.preemptions_per_hour / 2


def test_interrupted_jobs_resume_from_their_checkpoint_on_the_next_node():
    from orchestrator.sim.controllers import PolicyController
    from tests.sim.helpers import job, run_with, sim_policy, trace

    spot = {"provider": "sim", "region": "r1", "instance_type": "s8", "gpus": 8,
            "price_usd_hour": 3, "market": "spot"}
    policy = sim_policy(offerings=[spot], projects=[{"name": "ckpt", "checkpoint_every": "10m"}],
                        spot={"by_expected_cost": True, "restart_overhead": "2m"})
    jobs = trace(("a", 0.0, 6 * 3600.0, 8, "ckpt"), ("b", 0.0, 6 * 3600.0, 8, "plain"),
                 ("c", 0.0, 6 * 3600.0, 8, "ckpt"))
    engine = run_with(lambda p: PolicyController(p, "spot"), policy, jobs, nodes=1,
                      rates={"interruptions_per_hour": 0.5}, seed=3)
    assert engine.counters.interruptions > 0
    resumed = [job(engine, i) for i in ("a", "c") if job(engine, i).restarts]
    assert resumed, "no checkpointing job was interrupted"
    for j in resumed:
        assert j.state == 2 and 0 < j.max_loss_s <= 600.0  # done, at most one interval lost
        assert j.remaining_s < j.trace.duration_s  # it went on from a checkpoint
    plain = job(engine, "b")
    assert plain.remaining_s == plain.trace.duration_s  # no checkpoint: from the beginning
    # The planner learned the hazard from the interruptions it saw.
    key = engine.store.nodes(include_terminated=True)[0].offering_key
    assert engine.learner.health(key, engine.now / 3600).preemptions_per_hour > 0
