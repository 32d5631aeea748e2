"""The wait-aware scale-up rule (``trigger.wait_slo``, :mod:`orchestrator.planner.wait`).

* A job on-prem will start within the SLO (GPUs free up at a running job's expected end) is not
  burst; it is recorded as deferred to on-prem.
* A job on-prem will not start in time is burst at its deadline (submit + SLO - expected boot,
  less one tick) and not before; the decision records the deadline meanwhile.
* Unset, the rule changes nothing: the same plan with and without the field, with and without
  the release profile in the snapshot.
* The release profile survives the snapshot's JSON form, and the built-in queue reports it.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

import pytest

from orchestrator.domain.plan import Rule
from orchestrator.domain.snapshot import OnPremRelease
from orchestrator.domain.snapshot_json import load_snapshot_text, snapshot_to_json
from orchestrator.planner import plan
from orchestrator.planner.wait import split_unmet
from orchestrator.sources.builtin import BuiltinQueue
from orchestrator.store import Store
from tests.builders import POOL, T0, make_job, make_node, make_policy, make_snapshot

M = timedelta(minutes=1)
ONPREM = {"pool": {"onprem": {"nodes": 1, "gpus_per_node": 8}}}


def _policy(**trigger):
    return make_policy(trigger=trigger, **ONPREM)


def _snapshot(jobs, ends, *, at=T0, free=0):
    """One 8-GPU on-prem node with ``8 - free`` GPUs held by running jobs ending at ``ends``."""
    snapshot = make_snapshot(jobs, onprem_free=[free], onprem_total=8, taken_at=at)
    queue = snapshot.queues[POOL]
    releases = tuple(OnPremRelease(gpus, end) for gpus, end in ends)
    return dataclasses.replace(snapshot, queues={POOL: dataclasses.replace(
        queue, onprem_releases=releases, running_onprem_jobs=len(releases))})


def test_a_job_on_prem_starts_within_the_slo_is_not_burst() -> None:
    job = make_job("j1", gpus=4, wait=M, duration_s=3600)
    snapshot = _snapshot([job], [(8, T0 + 10 * M)])  # on-prem frees at +10m; deadline +24m
    assert plan(snapshot, [_policy()], T0).launches  # today: burst at once

    result = plan(snapshot, [_policy(wait_slo="30m")], T0)
    decision = result.decisions[0]
    assert not result.launches
    assert decision.rule is Rule.NO_DEMAND
    assert decision.inputs["wait_aware"]["deferred_to_onprem_jobs"] == 1
    assert decision.inputs["wait_aware"]["due_jobs"] == 0
    assert "1 unmet job(s) deferred to on-prem" in decision.summary


def test_a_job_on_prem_cannot_start_in_time_is_burst_at_its_deadline_and_not_before() -> None:
    job = make_job("j1", gpus=4, wait=M, duration_s=3600)  # submitted T0 - 1m
    ends = [(8, T0 + 2 * 60 * M)]  # on-prem busy for two hours
    policy = _policy(wait_slo="30m", expected_boot="5m")
    deadline = T0 - M + 30 * M - 5 * M  # submit + SLO - boot
    due = deadline - M  # one tick before: waiting longer would miss it

    first = plan(_snapshot([job], ends), [policy], T0)
    assert not first.launches
    wait_inputs = first.decisions[0].inputs["wait_aware"]
    assert wait_inputs["waiting_jobs"] == 1 and wait_inputs["deferred_to_onprem_jobs"] == 0
    assert wait_inputs["earliest_burst_deadline"] == due.isoformat()
    assert "1 late job(s) to burst from" in first.decisions[0].summary

    before = plan(_snapshot([job], ends, at=due - M), [policy], due - M)
    assert not before.launches
    at_deadline = plan(_snapshot([job], ends, at=due), [policy], due)
    assert [lc.offering.gpus for lc in at_deadline.launches] == [8]
    assert at_deadline.decisions[0].rule is Rule.SCALE_UP
    assert at_deadline.decisions[0].inputs["wait_aware"]["due_jobs"] == 1


def test_jobs_queue_behind_each_other_in_scheduling_order() -> None:
    # 8 GPUs free at +10m for 50 minutes: the older 8-GPU job takes them, the younger one is late.
    old = make_job("old", gpus=8, wait=2 * M, duration_s=3000)
    young = make_job("young", gpus=8, wait=M, duration_s=3000)
    snapshot = _snapshot([young, old], [(8, T0 + 10 * M)])
    split = split_unmet((old, young), (), snapshot.queues[POOL], _policy(wait_slo="30m"), T0)
    assert split.deferred == (old,) and split.waiting == (young,) and split.due == ()


def test_a_job_past_its_deadline_is_due_whatever_the_prediction() -> None:
    # Pooled GPUs say it fits now, but it is unmet (fragmentation): past its deadline, burst it.
    job = make_job("j1", gpus=4, wait=40 * M, duration_s=600)
    snapshot = _snapshot([job], [], free=8)
    split = split_unmet((job,), (), snapshot.queues[POOL], _policy(wait_slo="30m"), T0)
    assert split.due == (job,)


def _without_burst_wait(result):
    decisions = tuple(dataclasses.replace(d, inputs={k: v for k, v in d.inputs.items()
                                                     if k != "burst_wait"})
                      for d in result.decisions)
    return dataclasses.replace(result, decisions=decisions)


def test_without_wait_slo_the_plan_is_unchanged() -> None:
    jobs = [make_job(f"j{i}", gpus=g, wait=w * M, duration_s=d)
            for i, (g, w, d) in enumerate([(1, 1, 600), (4, 12, None), (8, 40, 3600), (16, 3, 60)])]
    scenarios = [
        make_snapshot(jobs, onprem_free=[2, 0], onprem_total=16),
        make_snapshot(jobs[:2], nodes=[make_node("b1")]),
        make_snapshot([], nodes=[make_node("b1")]),
        _snapshot(jobs, [(8, T0 + 10 * M)]),
    ]
    plain, explicit = _policy(), _policy(wait_slo=None)
    assert plain.trigger.wait_slo is None
    for snapshot in scenarios:
        expected = plan(snapshot, [plain], T0)
        assert plan(snapshot, [explicit], T0) == expected
        # The release profile is read only by the rule and by the on-prem start recorded for
        # launched-for jobs (inputs.burst_wait): without the rule it changes nothing else.
        queue = snapshot.queues[POOL]
        stripped = dataclasses.replace(snapshot, queues={POOL: dataclasses.replace(
            queue, onprem_releases=())})
        assert _without_burst_wait(plan(stripped, [plain], T0)) == _without_burst_wait(expected)
        assert "wait_aware" not in expected.decisions[0].inputs


def test_the_release_profile_round_trips_through_json() -> None:
    snapshot = _snapshot([make_job("j1", duration_s=60)], [(8, T0 + 10 * M), (2, T0 + M)])
    again = load_snapshot_text(json.dumps(snapshot_to_json(snapshot)))
    assert again.queues[POOL].onprem_releases == snapshot.queues[POOL].onprem_releases


@pytest.mark.parametrize("duration", [3600.0, None])
def test_the_builtin_queue_reports_running_jobs_expected_ends(store: Store,
                                                              duration: float | None) -> None:
    policy = make_policy(**ONPREM)
    queue = BuiltinQueue(store, [policy])
    store.submit_job("nlp", POOL, 4, 0, duration, None, T0)
    assert len(queue.dispatch_onprem(T0)) == 1
    releases = queue.observe(T0 + M)[POOL].onprem_releases
    if duration is None:  # no time limit: no expected end to report
        assert releases == ()
    else:
        assert [(r.gpus, r.ends_at) for r in releases] == [(4, T0 + timedelta(seconds=duration))]
