"""The on-prem start the planner predicts for the jobs it bursts (:mod:`orchestrator.planner.forecast`).

* Jobs queue in scheduling order behind the releases of running on-prem jobs; a job wider than
  the on-prem pool, or behind a job that holds GPUs for ever, gets no prediction.
* Property: the predicted schedule never uses more GPUs than the profile has free at any moment,
  and every job starts at the earliest moment it could given the jobs ahead of it.
* Property: the profile built in one sort has the steps and free GPUs of adding each absorbed
  job and release one by one.
* A scale-up decision records the prediction per launched-for job (``inputs.burst_wait``).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.snapshot import OnPremRelease, OnPremState, PoolQueue
from orchestrator.planner import plan
from orchestrator.planner.backfill import INF
from orchestrator.planner.forecast import _Profile, predict_onprem_starts
from tests.builders import POOL, T0, make_job, make_policy, make_snapshot

S = timedelta(seconds=1)


def _queue(free: int, total: int, releases=()) -> PoolQueue:
    return PoolQueue(pool=POOL, onprem=OnPremState(total, free, (free,)),
                     onprem_releases=tuple(OnPremRelease(g, T0 + s * S) for g, s in releases))


def test_jobs_queue_in_order_behind_the_releases() -> None:
    a = make_job("a", gpus=4, duration_s=50)
    b = make_job("b", gpus=4, duration_s=100)
    c = make_job("c", gpus=8, duration_s=10)
    queue = _queue(0, 8, [(4, 100), (4, 300)])
    starts = predict_onprem_starts([a, b, c], [], queue, T0, ["a", "b", "c"])
    # a takes the first 4 GPUs at +100 until +150; b follows at +150; c needs all 8: after b.
    assert starts == {"a": 100.0, "b": 150.0, "c": 300.0}


def test_a_job_that_cannot_start_on_prem_gets_no_prediction() -> None:
    wide = make_job("wide", gpus=16, duration_s=60)
    forever = make_job("forever", gpus=8)  # no expected runtime: holds its GPUs for ever
    after = make_job("after", gpus=1, duration_s=60)
    queue = _queue(8, 8)
    starts = predict_onprem_starts([wide, forever, after], [], queue, T0,
                                   ["wide", "forever", "after"])
    assert starts == {"wide": None, "forever": 0.0, "after": None}


def test_jobs_absorbed_on_prem_this_tick_hold_their_gpus() -> None:
    absorbed = make_job("now", gpus=8, duration_s=600)
    job = make_job("j", gpus=2, duration_s=60)
    assert predict_onprem_starts([job], [absorbed], _queue(8, 8), T0, ["j"]) == {"j": 600.0}


jobs_st = st.lists(st.tuples(st.integers(1, 8), st.integers(1, 5000)), min_size=1, max_size=12)
releases_st = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 5000)), max_size=4)


@settings(max_examples=60, deadline=None)
@given(free=st.integers(0, 8), jobs=jobs_st, releases=releases_st)
def test_the_predicted_schedule_fits_and_starts_each_job_as_early_as_it_can(free, jobs, releases):
    queue = _queue(free, free + sum(g for g, _ in releases), releases)
    unmet = [make_job(f"j{i}", gpus=g, duration_s=d) for i, (g, d) in enumerate(jobs)]
    starts = predict_onprem_starts(unmet, [], queue, T0, [j.id for j in unmet])

    def capacity(t: float) -> int:
        return free + sum(g for g, at in releases if at <= t)

    placed: list[tuple[float, float, int]] = []

    def fits(t: float, job) -> bool:
        moments = {t} | {s for s, _, _ in placed if t < s < t + job.duration_s} | {
            float(at) for _, at in releases if t < at < t + job.duration_s}
        return all(capacity(m) - sum(g for s, e, g in placed if s <= m < e) >= job.gpus
                   for m in moments)

    for job in unmet:
        start = starts[job.id]
        if start is None:
            assert job.gpus > capacity(float("inf"))
            continue
        assert fits(start, job)
        earlier = [0.0] + [e for _, e, _ in placed] + [float(at) for _, at in releases]
        assert not any(fits(t, job) for t in earlier if t < start)
        placed.append((start, start + job.duration_s, job.gpus))


def test_a_scale_up_records_the_predicted_on_prem_start_of_each_job_it_launches_for() -> None:
    jobs = [make_job("j1", gpus=4, duration_s=3600), make_job("j2", gpus=4, duration_s=600)]
    snapshot = make_snapshot(jobs, onprem_free=[0], onprem_total=8)
    queue = snapshot.queues[POOL]
    snapshot = dataclasses.replace(snapshot, queues={POOL: dataclasses.replace(
        queue, onprem_releases=(OnPremRelease(8, T0 + 1800 * S),))})
    result = plan(snapshot, [make_policy(pool={"onprem": {"nodes": 1, "gpus_per_node": 8}})], T0)
    assert result.launches
    record = result.decisions[0].inputs["burst_wait"]
    assert record == {"predicted_onprem_start_s": {"j1": 1800.0, "j2": 1800.0}}


def test_a_tick_that_launches_nothing_records_no_prediction() -> None:
    snapshot = make_snapshot([make_job("j1", gpus=1)], onprem_free=[8])
    result = plan(snapshot, [make_policy()], T0)
    assert not result.launches and "burst_wait" not in result.decisions[0].inputs


_TIMES = st.sampled_from([0.0, 1.0, 5.0, 60.0, 61.5, 600.0, 3600.0])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 64),
       st.lists(st.tuples(st.integers(1, 16), st.one_of(_TIMES.filter(bool), st.just(INF))),
                max_size=8),
       st.lists(st.tuples(_TIMES, st.integers(1, 16)), max_size=12))
def test_the_profile_built_at_once_is_the_one_added_up_step_by_step(free, taken, freed):
    stepwise = _Profile(free)
    for gpus, end in taken:
        stepwise.add(-gpus, 0.0, end)
    for start, gpus in freed:
        stepwise.add(gpus, start, INF)
    built = _Profile.build(free, taken, freed)
    assert (built.times, built.free) == (stepwise.times, stepwise.free)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.lists(st.booleans(), max_size=12),
                          st.lists(st.tuples(st.integers(1, 4),
                                             st.sampled_from([-60.0, 0.0, 0.5, 30.0, 59.999999,
                                                              60.0, 60.000001, 1e6 + 0.3])),
                                   max_size=5),
                          st.sampled_from([0.0, 30.0, 45.5, 60.0])), min_size=1, max_size=10),
       st.booleans())
def test_the_releases_kept_across_plans_free_what_each_release_read_afresh_frees(steps, fresh):
    # The GPUs freed per instant, from the ends kept across plans (a few releases change
    # between two plans), equal those of every release read afresh, at each plan's instant.
    from orchestrator.planner import forecast

    if fresh:
        forecast._last_ends[0] = None
    releases: tuple[OnPremRelease, ...] = ()
    for keep, new, at in steps:
        kept = tuple(r for r, k in zip(releases, keep + [True] * len(releases)) if k)
        releases = kept + tuple(OnPremRelease(g, T0 + s * S) for g, s in new)
        now = T0 + at * S
        expected: dict[float, int] = {}
        for r in releases:
            start = max((r.ends_at - now).total_seconds(), 0.0)
            expected[start] = expected.get(start, 0) + r.gpus
        assert forecast._freed(releases, now) == expected
