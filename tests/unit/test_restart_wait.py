"""The SLO guard's restart wait per launch-group size: the boot learner's group percentiles
(orchestrator.domain.boot), their choice (orchestrator.planner.boot.group_boot_s), and the room
the spot chooser counts with them (orchestrator.planner.spot, ``spot.learn_restart_wait``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from orchestrator.domain.boot import GROUP_SIZES, BootLearner
from orchestrator.domain.snapshot import BootEstimate
from orchestrator.planner.boot import MIN_SAMPLES, group_boot_s
from orchestrator.planner.offerings import Candidate
from orchestrator.planner.spot import TICK_S, SpotChooser
from orchestrator.policy.models import SpotChoice
from tests.builders import T0, make_job, make_offering, make_policy, offering_spec

SPOT = offering_spec("g4s", gpus=4, price=4, market="spot")


def _policy(**spot):
    return make_policy(offerings=[SPOT], trigger={"wait_slo": "30m", "expected_boot": "10m"},
                       spot={"by_expected_cost": True, "max_slo_miss_odds": 0.01, **spot})


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(30, 1200), min_size=1, max_size=64))
def test_a_group_waits_at_least_as_long_as_a_smaller_one(boots):
    learner = BootLearner()
    for i, seconds in enumerate(boots):
        learner.booted("k", seconds, i / 100)
    estimate = learner.estimate("k", len(boots) / 100)
    sizes = [n for n, _ in estimate.groups]
    assert sizes == list(GROUP_SIZES)
    waits = [estimate.boot_s] + [s for _, s in estimate.groups]
    assert waits == sorted(waits)  # one node's p90 <= the slowest of 2 <= of 4 ...
    assert waits[-1] <= max(boots) + 0.05


def test_the_slowest_of_n_boots_is_one_boots_p90_to_the_nth_root():
    learner = BootLearner()
    for i in range(50):  # boots of 1..50 s, all of the same weight
        learner.booted("k", float(i + 1), 0.0)
    estimate = learner.estimate("k", 0.0)
    assert estimate.boot_s == 45.0
    groups = dict(estimate.groups)
    assert groups[2] == 48.0  # 0.9 ** (1/2) = 0.9487 of 50
    assert groups[8] == 50.0  # 0.9 ** (1/8) = 0.9869 of 50
    assert groups[64] == 50.0


def test_an_estimate_answers_a_group_by_the_next_size_up():
    estimate = BootEstimate("k", 100.0, 10.0, groups=((2, 120.0), (4, 150.0), (8, 200.0)))
    assert estimate.group_boot_s(1) == 100.0
    assert estimate.group_boot_s(2) == 120.0
    assert estimate.group_boot_s(3) == 150.0
    assert estimate.group_boot_s(8) == 200.0
    assert estimate.group_boot_s(20) == 200.0  # past the largest: the largest's
    assert BootEstimate("k", 100.0, 10.0).group_boot_s(8) == 100.0  # none worked out


def test_the_learned_group_boot_needs_the_flag_and_enough_boots():
    key = _policy().offerings[0].key
    estimates = {key: BootEstimate(key, 200.0, MIN_SAMPLES, groups=((2, 250.0), (4, 300.0)))}
    assert group_boot_s(_policy(), estimates, 4) == 600.0  # expected_boot: 10m
    policy = _policy(learn_restart_wait=True)
    assert group_boot_s(policy, estimates, 1) == 200.0
    assert group_boot_s(policy, estimates, 3) == 300.0
    few = {key: BootEstimate(key, 200.0, MIN_SAMPLES - 1, groups=((2, 250.0),))}
    assert group_boot_s(policy, few, 2) == 600.0
    assert group_boot_s(policy, {}, 2) == 600.0


def _chooser(policy, estimates, now):
    candidates = [Candidate(make_offering("g4s", gpus=4, price=4, market="spot"), None)]
    return SpotChooser(policy, candidates, {}, now, policy.trigger.expected_boot.total_seconds(),
                       lambda n: group_boot_s(policy, estimates, n))


def test_a_wide_job_has_room_for_a_restart_for_less_long_than_a_narrow_one():
    # One node boots in 200 s at p90; the slowest of 8 in 400 s. After 10 min of wait, a job on
    # one node has 30 - 10 - 3.3 = 16.7 min of slack (a restart: 4.3 min); one on 8 nodes
    # 30 - 10 - 6.7 = 13.3 (a restart: 7.7 min): both have room. After 17 min, the wide one no
    # longer has: 30 - 17 - 6.7 = 6.3 < 7.7, while the narrow one does: 9.7 >= 4.3.
    policy = _policy(learn_restart_wait=True)
    key = _policy().offerings[0].key
    groups = tuple((n, 200.0 if n == 1 else 400.0) for n in GROUP_SIZES)
    estimates = {key: BootEstimate(key, 200.0, MIN_SAMPLES, groups=groups)}
    narrow = make_job("n", gpus=4, duration_s=3600, wait=timedelta(minutes=17))
    wide = make_job("w", gpus=32, duration_s=3600, wait=timedelta(minutes=17))
    chooser = _chooser(policy, estimates, T0)
    assert chooser.restarts_allowed(narrow) == 1
    assert chooser.restarts_allowed(wide) == 0
    assert chooser.room_left_s(wide) == pytest.approx(1800 - 17 * 60 - 400 - (400 + TICK_S))
    # a relaunch kept in reserve (deferred jobs) needs one more group boot and tick
    assert chooser.room_left_s(wide, 1) == pytest.approx(chooser.room_left_s(wide) - 400 - TICK_S)
    [row] = [r for r in (chooser.rank(wide), chooser.record())[1]]
    assert row["restart_wait_s"] == 400 + TICK_S
    # without the flag, the policy's 10 minutes: neither has room (30 - 17 - 10 < 11)
    fixed = _chooser(_policy(), estimates, T0)
    assert fixed.restarts_allowed(narrow) == 0 and fixed.restarts_allowed(wide) == 0


def test_learn_restart_wait_is_a_boolean():
    with pytest.raises(ValidationError, match="learn_restart_wait"):
        SpotChoice.model_validate({"learn_restart_wait": "sometimes"})
