"""Spot or on-demand per job by expected cost (orchestrator.planner.spot, ``spot`` policy section)."""

from __future__ import annotations

import math
from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.snapshot import OfferingHealth
from orchestrator.planner import plan
from orchestrator.planner.offerings import Candidate
from orchestrator.planner.spot import expected_work_s, poisson_tail, price_job
from orchestrator.policy import Market
from tests.builders import T0, make_job, make_offering, make_policy, make_snapshot, offering_spec

SPOT = offering_spec("g8s", price=4, market="spot")
ON_DEMAND = offering_spec("g8", price=10)
REGION_B = offering_spec("g8s", price=5, market="spot", region="us-west-2")


def _policy(**spot):
    return make_policy(offerings=[SPOT, ON_DEMAND, REGION_B],
                       spot={"by_expected_cost": True, **spot})


def _snapshot(jobs, health):
    snap = make_snapshot(jobs, onprem_total=0)
    return replace(snap, offering_health=health)


def _key(policy, index):
    return policy.offerings[index].key


@settings(max_examples=200, deadline=None)
@given(work=st.floats(60, 200_000), hazard_h=st.floats(0, 5), restart=st.floats(0, 3600),
       checkpoint=st.one_of(st.none(), st.floats(60, 50_000)))
def test_expected_work_is_at_least_the_work_and_grows_with_the_hazard(work, hazard_h, restart,
                                                                      checkpoint):
    base, n0 = expected_work_s(work, checkpoint, restart, hazard_h / 3600)
    more, n1 = expected_work_s(work, checkpoint, restart, (hazard_h + 0.5) / 3600)
    assert base >= work * (1 - 1e-9) and n0 >= 0
    assert more >= base and n1 >= n0
    # What an interruption costs is bounded by one checkpoint interval plus the restart: the
    # expected loss never exceeds interruptions x (interval + restart).
    segment = min(checkpoint or work, work)
    assert base - work <= n0 * (segment + restart) * (1 + 1e-6) + 1e-6


def test_no_hazard_means_no_loss_and_checkpoints_cut_the_loss():
    assert expected_work_s(3600, None, 300, 0.0) == (3600, 0.0)
    hazard = 0.5 / 3600
    none, _ = expected_work_s(10 * 3600, None, 300, hazard)
    hourly, _ = expected_work_s(10 * 3600, 3600, 300, hazard)
    assert hourly < none
    # closed form for one segment: (e^{λx} - 1)(1/λ + K)
    assert math.isclose(none, math.expm1(hazard * 36000) * (1 / hazard + 300))


def test_price_job_shares_a_node_and_adds_the_slo_risk():
    spot = Candidate(make_offering("g8s", price=4, market="spot"), None)
    health = OfferingHealth(spot.key, preemptions_per_hour=0.2, stockout_odds=0.5)
    p = price_job(2, 3600, 600, spot, health, restart_s=180, boot_s=300, delay_usd_per_gpu_hour=1.25)
    assert p.nodes == 0.25 and p.interruptions > 0 and p.stockout_odds == 0.5
    assert p.risk_usd > 0 and math.isclose(p.expected_cost_usd, p.run_usd + p.risk_usd)
    calm = price_job(2, 3600, 600, spot, None, 180, 300, 1.25)
    assert calm.risk_usd == 0 and calm.interruptions == 0 and calm.run_usd < p.run_usd


def test_a_long_job_without_checkpoints_goes_on_demand_and_a_checkpointed_one_spot():
    policy = _policy()
    health = {_key(policy, 0): OfferingHealth(_key(policy, 0), 0.5, 0.0),
              _key(policy, 2): OfferingHealth(_key(policy, 2), 0.5, 0.0)}
    long_job = make_job("long", gpus=8, duration_s=20 * 3600)
    result = plan(_snapshot([long_job], health), [policy], T0)
    [launch] = result.launches
    assert launch.offering.key == _key(policy, 1)  # on-demand: 20 h with no checkpoint
    checkpointed = _policy(checkpoint_every="30m")
    result = plan(_snapshot([long_job], health), [checkpointed], T0)
    [launch] = result.launches
    assert launch.offering.key == _key(checkpointed, 0)  # the cheaper spot region
    [decision] = result.decisions
    [choice] = decision.inputs["spot_choice"]
    assert choice["chosen"] == launch.offering.key and choice["checkpoint_s"] == 1800
    costs = [a["expected_cost_usd"] for a in choice["alternatives"]]
    assert costs == sorted(costs) and len(costs) == 3


def test_stockout_odds_move_the_job_to_another_region_not_to_on_demand():
    policy = _policy(checkpoint_every="30m")
    health = {_key(policy, 0): OfferingHealth(_key(policy, 0), 0.1, 0.9),
              _key(policy, 2): OfferingHealth(_key(policy, 2), 0.1, 0.05)}
    job = make_job("j", gpus=8, duration_s=4 * 3600)
    [launch] = plan(_snapshot([job], health), [policy], T0).launches
    assert launch.offering.key == _key(policy, 2)


def test_project_and_job_checkpoint_intervals_win_over_the_default():
    policy = make_policy(projects=[{"name": "research", "checkpoint_every": "10m"}],
                         spot={"checkpoint_every": "1h"})
    assert policy.checkpoint_every_s("research") == 600
    assert policy.checkpoint_every_s("other") == 3600
    assert policy.checkpoint_every_s("research", 120.0) == 120
    assert make_policy().checkpoint_every_s("x") is None


def test_off_by_default_plans_as_before():
    policy = make_policy(offerings=[SPOT, ON_DEMAND, REGION_B])
    assert policy.spot.by_expected_cost is False
    job = make_job("j", gpus=8, duration_s=20 * 3600)
    result = plan(_snapshot([job], {}), [policy], T0)
    assert "spot_choice" not in result.decisions[0].inputs
    assert result.launches[0].offering.key == _key(policy, 0)  # cheapest by price
    assert policy.spot.restart_overhead == timedelta(minutes=3)


def test_a_zero_checkpoint_interval_is_refused_naming_the_field():
    import pytest

    from orchestrator.policy import PolicyError

    with pytest.raises(PolicyError, match="checkpoint_every"):
        make_policy(projects=[{"name": "a", "checkpoint_every": "0s"}])
    with pytest.raises(PolicyError, match="spot.checkpoint_every"):
        make_policy(spot={"checkpoint_every": "0s"})


# -- the SLO guard (spot.max_slo_miss_odds) ------------------------------------------------------

def _guarded_policy(**spot):
    return make_policy(offerings=[SPOT, ON_DEMAND, REGION_B],
                       trigger={"wait_slo": "30m", "expected_boot": "5m"},
                       spot={"by_expected_cost": True, "checkpoint_every": "30m",
                             "max_slo_miss_odds": 0.01, **spot})


def _calm_and_stormy(policy, hazard_h):
    return {_key(policy, 0): OfferingHealth(_key(policy, 0), hazard_h, 0.0),
            _key(policy, 2): OfferingHealth(_key(policy, 2), hazard_h, 0.0)}


@settings(max_examples=200, deadline=None)
@given(mean=st.floats(0, 50), k=st.integers(0, 60))
def test_poisson_tail_is_odds_falling_with_k_and_rising_with_the_mean(mean, k):
    odds = poisson_tail(mean, k)
    assert 0.0 <= odds <= 1.0
    assert poisson_tail(mean, k + 1) <= odds + 1e-12
    assert poisson_tail(mean + 0.5, k) >= odds - 1e-12
    assert math.isclose(poisson_tail(mean, 0), -math.expm1(-mean), abs_tol=1e-12)


def test_the_guard_sends_a_long_job_on_demand_where_expected_cost_alone_picks_spot():
    # 20 h on a node interrupted 0.5 times an hour: ~10 restarts, far more than 30 min absorb.
    job = make_job("long", gpus=8, duration_s=20 * 3600, wait=timedelta(minutes=25))
    unguarded = _policy(checkpoint_every="30m")
    [launch] = plan(_snapshot([job], _calm_and_stormy(unguarded, 0.5)), [unguarded], T0).launches
    assert launch.offering.market is Market.SPOT
    policy = _guarded_policy()
    result = plan(_snapshot([job], _calm_and_stormy(policy, 0.5)), [policy], T0)
    [launch] = result.launches
    assert launch.offering.key == _key(policy, 1)  # on-demand
    [choice] = result.decisions[0].inputs["spot_choice"]
    assert choice["restarts_allowed"] == 0 and choice["max_slo_miss_odds"] == 0.01
    spot_rows = [a for a in choice["alternatives"] if a["market"] == "spot"]
    assert spot_rows and all(a["slo_guard"] and a["slo_miss_odds"] > 0.01 for a in spot_rows)
    assert choice["alternatives"][0]["slo_guard"] is False


def test_a_short_late_job_whose_choice_is_spot_bursts_at_once_not_at_its_deadline():
    policy = _guarded_policy()
    job = make_job("short", gpus=8, duration_s=600, wait=timedelta(minutes=1))
    result = plan(_snapshot([job], _calm_and_stormy(policy, 0.05)), [policy], T0)
    [launch] = result.launches
    assert launch.offering.market is Market.SPOT
    inputs = result.decisions[0].inputs
    assert inputs["wait_aware"]["spot_early_jobs"] == 1
    [choice] = inputs["spot_choice"]
    assert choice["restarts_allowed"] == 1  # (30 - 1 - 5) min of slack: room for a restart (6 min)
    assert "burst before their deadline" in result.decisions[0].summary


def test_a_long_job_with_room_for_a_restart_starts_on_spot_at_once():
    # Interrupted, it is requeued with no room assumed, and the guard then keeps it off spot.
    policy = _guarded_policy()
    job = make_job("long", gpus=8, duration_s=20 * 3600, wait=timedelta(minutes=1))
    result = plan(_snapshot([job], _calm_and_stormy(policy, 0.5)), [policy], T0)
    [launch] = result.launches
    assert launch.offering.market is Market.SPOT
    [choice] = result.decisions[0].inputs["spot_choice"]
    assert choice["alternatives"][0]["slo_miss_odds"] <= 0.01


def test_a_late_job_whose_guarded_choice_is_on_demand_waits_for_its_deadline():
    policy = _guarded_policy()
    # 20 min waited: 5 min of slack, no room for a 6-minute restart; its deadline is at 25 min
    job = make_job("long", gpus=8, duration_s=20 * 3600, wait=timedelta(minutes=20))
    result = plan(_snapshot([job], _calm_and_stormy(policy, 0.5)), [policy], T0)
    assert not result.launches
    assert result.decisions[0].inputs["wait_aware"]["spot_early_jobs"] == 0
    assert result.decisions[0].inputs["wait_aware"]["waiting_jobs"] == 1


def test_where_only_guarded_spot_is_on_offer_it_is_still_used():
    policy = make_policy(offerings=[SPOT], trigger={"wait_slo": "30m", "expected_boot": "5m"},
                         spot={"by_expected_cost": True, "checkpoint_every": "30m",
                               "max_slo_miss_odds": 0.01})
    job = make_job("long", gpus=8, duration_s=20 * 3600, wait=timedelta(minutes=25))
    health = {_key(policy, 0): OfferingHealth(_key(policy, 0), 0.5, 0.0)}
    [launch] = plan(_snapshot([job], health), [policy], T0).launches
    assert launch.offering.key == _key(policy, 0)


def test_a_requeued_job_that_reports_its_earlier_run_keeps_its_room_for_a_restart():
    policy = _guarded_policy()
    # Submitted 3 h ago, ran 2 h 55 min before its node went away: 5 min of wait so far.
    ran = make_job("requeued", gpus=8, duration_s=20 * 3600, wait=timedelta(hours=3))
    reported = replace(ran, ran_s=3 * 3600 - 300)
    health = _calm_and_stormy(policy, 0.5)
    [spot] = plan(_snapshot([reported], health), [policy], T0).launches
    assert spot.offering.market is Market.SPOT
    [unreported] = plan(_snapshot([ran], health), [policy], T0).launches
    assert unreported.offering.key == _key(policy, 1)  # counted as waiting: no room, on demand


# -- deferred jobs in their last tick of room for a restart (SLO guard) -------------------------

def _deferred_snapshot(policy, job, at, hazard_h=0.1):
    """On-prem: one 8-GPU node, busy until T0 + 20 min (the job is predicted to start there
    within its SLO: deferred)."""
    from orchestrator.domain.snapshot import OnPremRelease, PolicyMemory
    snap = make_snapshot([job], onprem_free=(0,), onprem_total=8, taken_at=at,
                         memory={policy.name: PolicyMemory(trigger_since=T0 - timedelta(hours=1))})
    queue = snap.queues[next(iter(snap.queues))]
    queue = replace(queue, onprem_releases=(OnPremRelease(8, T0 + timedelta(minutes=20), 0),),
                    running_onprem_jobs=1)
    return replace(snap, queues={queue.pool: queue},
                   offering_health=_calm_and_stormy(policy, hazard_h))


def test_a_deferred_job_bursts_on_spot_in_its_last_tick_of_room():
    # SLO 30 min, boot 5 min, a restart (or a relaunch) 6 min: waited 1 min at T0, the job has
    # room for a restart and a relaunch until it has waited 30 - 5 - 2 x 6 = 13 min: T0 + 12 min.
    policy = _guarded_policy()
    policy = policy.model_copy(update={"trigger": policy.trigger.model_copy(
        update={"sustained_for": timedelta(0)})})
    job = make_job("long", gpus=8, duration_s=20 * 3600, wait=timedelta(minutes=1))
    first = plan(_deferred_snapshot(policy, job, T0), [policy], T0)
    assert not first.launches
    wait = first.decisions[0].inputs["wait_aware"]
    assert wait["deferred_to_onprem_jobs"] == 1 and wait["spot_last_room_jobs"] == 0
    at = T0 + timedelta(minutes=11)  # room for one more tick: still deferred
    assert not plan(_deferred_snapshot(policy, job, at), [policy], at).launches
    at = T0 + timedelta(minutes=12)
    last = plan(_deferred_snapshot(policy, job, at), [policy], at)
    [launch] = last.launches
    assert launch.offering.market is Market.SPOT
    wait = last.decisions[0].inputs["wait_aware"]
    assert wait["spot_last_room_jobs"] == 1 and wait["deferred_to_onprem_jobs"] == 0
    assert "last tick of room" in last.decisions[0].summary
    # a minute later that room is gone: deferred again (on-prem may take it; else on demand)
    at = T0 + timedelta(minutes=13)
    after = plan(_deferred_snapshot(policy, job, at), [policy], at)
    assert not after.launches
    assert after.decisions[0].inputs["wait_aware"]["spot_last_room_jobs"] == 0


def test_a_deferred_job_whose_choice_with_room_is_on_demand_stays_deferred():
    # Interrupted several times an hour on 2 nodes' worth: even with room the guard says on demand.
    policy = _guarded_policy()
    job = make_job("long", gpus=8, duration_s=20 * 3600, wait=timedelta(minutes=1))
    at = T0 + timedelta(minutes=12)
    result = plan(_deferred_snapshot(policy, job, at, hazard_h=1e6), [policy], at)
    assert not result.launches
    assert result.decisions[0].inputs["wait_aware"]["spot_last_room_jobs"] == 0


def test_with_the_guard_the_delay_is_not_priced_unless_the_policy_prices_it():
    # The guard bounds the SLO risk of restarts; the delay's dollar value on top would count it
    # twice. Without the guard, or with an explicit delay price, the risk is priced.
    job = make_job("wide", gpus=16, duration_s=10 * 3600, wait=timedelta(minutes=1))
    for policy, priced in ((_guarded_policy(), False), (_policy(checkpoint_every="30m"), True),
                           (_guarded_policy(delay_usd_per_gpu_hour=2), True)):
        result = plan(_snapshot([job], _calm_and_stormy(policy, 0.2)), [policy], T0)
        [choice] = result.decisions[0].inputs["spot_choice"]
        spot_rows = [a for a in choice["alternatives"] if a["market"] == "spot"]
        assert spot_rows and all((a["risk_usd"] > 0) == priced for a in spot_rows)


def test_an_unpriced_infinite_delay_is_no_risk_not_nan():
    offering = make_offering("g8s", price=4, market="spot")
    price = price_job(8, 10 * 3600, None, Candidate(offering, None),
                      OfferingHealth(offering.key, 1e6, 0.0), 180, 300, 0.0)
    assert price.risk_usd == 0.0 and math.isinf(price.run_usd)
    assert math.isinf(price.expected_cost_usd)
