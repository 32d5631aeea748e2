"""Data staging in the burst decision (:mod:`orchestrator.planner.staging`, ``pool.storage``).

* A job whose data would take longer to stage than its predicted on-prem wait is not burst, and
  the decision names it with both figures; a job with a longer wait (or none in view) is burst,
  and the decision records its staging time and egress next to its compute cost.
* A job's own annotation (``dataset_gb``) wins over its project's storage, which wins over the
  pool's.
* Property: a job is held exactly when its staging time exceeds its predicted on-prem start, and
  its egress is (datasets + checkpoints) x the rate.
* Bad storage input is a policy error naming the field.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.plan import Launch, Rule
from orchestrator.domain.snapshot import OnPremRelease
from orchestrator.planner import plan
from orchestrator.planner.forecast import predict_onprem_starts
from orchestrator.planner.staging import HELD_BY, staging_of
from orchestrator.policy.loader import PolicyError, load_policy_text
from tests.builders import POOL, T0, make_job, make_policy, make_snapshot, policy_dict

STORAGE = {"datasets": [{"uri": "nfs://fs/imagenet", "size_gb": 1000}],
           "checkpoints": "s3://ckpt/train", "checkpoint_size_gb": 50,
           "egress_usd_per_gb": 0.09, "bandwidth_gbps": 10}


def _policy(storage=STORAGE, **overrides):
    return make_policy(pool={"name": POOL, "onprem": {"nodes": 1, "gpus_per_node": 8},
                             "storage": storage}, **overrides)


def _snapshot(jobs, release_s: float | None):
    snapshot = make_snapshot(jobs, onprem_free=(0,), onprem_total=8)
    queue = snapshot.queues[POOL]
    releases = () if release_s is None else (OnPremRelease(8, T0 + timedelta(seconds=release_s)),)
    queue = dataclasses.replace(queue, onprem_releases=releases)
    return dataclasses.replace(snapshot, queues={POOL: queue})


def _decision(policy, snapshot):
    result = plan(snapshot, [policy], T0)
    return result, result.decisions[0]


def test_a_job_whose_staging_outlasts_its_on_prem_wait_is_not_burst() -> None:
    # 1000 GB at 10 Gbit/s: 800 s of staging; on-prem frees its 8 GPUs in 600 s.
    job = make_job("big", gpus=8, duration_s=3600, wait=timedelta(minutes=10))
    result, decision = _decision(_policy(), _snapshot([job], 600))
    assert not [a for a in result.actions if isinstance(a, Launch)]
    assert decision.rule is Rule.LIMITED
    assert HELD_BY in decision.held_back_by
    assert "big (1000 GB: 800s > 600s)" in decision.summary
    row = decision.inputs["staging"]["jobs"]["big"]
    assert row["burst"] is False and row["staging_s"] == 800.0
    assert row["predicted_onprem_start_s"] == 600.0


def test_a_job_that_waits_longer_is_burst_with_its_staging_and_egress_recorded() -> None:
    job = make_job("big", gpus=8, duration_s=3600, wait=timedelta(minutes=10))
    result, decision = _decision(_policy(), _snapshot([job], 7200))
    launches = [a for a in result.actions if isinstance(a, Launch)]
    assert [lc.jobs for lc in launches] == [("big",)]
    row = decision.inputs["staging"]["jobs"]["big"]
    # Egress: 1000 GB in + 50 GB of checkpoints back at $0.09; compute: 8 GPUs x 1 h x $10/8.
    assert row == {"dataset_gb": 1000.0, "checkpoint_gb": 50.0, "bandwidth_gbps": 10.0,
                   "staging_s": 800.0, "egress_gb": 1050.0, "egress_usd": 94.5,
                   "predicted_onprem_start_s": 7200.0, "burst": True, "compute_usd": 10.0,
                   "total_usd": 104.5}
    assert decision.inputs["staging"]["egress_usd"] == 94.5


def test_a_job_never_started_on_prem_is_always_worth_staging() -> None:
    job = make_job("big", gpus=8, duration_s=3600, wait=timedelta(minutes=10))
    result, decision = _decision(_policy(), _snapshot([job], None))
    assert [a.jobs for a in result.actions if isinstance(a, Launch)] == [("big",)]
    assert decision.inputs["staging"]["jobs"]["big"]["predicted_onprem_start_s"] is None


def test_the_job_annotation_wins_over_project_and_pool_storage() -> None:
    policy = _policy(projects=[{"name": "research", "storage": {
        "datasets": [{"uri": "s3://research/data", "size_gb": 10}], "bandwidth_gbps": 1}}])
    pool_job = make_job("p", project="other")
    project_job = make_job("r", project="research")
    annotated = dataclasses.replace(make_job("a", project="research"), dataset_gb=2.5)
    assert staging_of(policy, pool_job).staging_s == 800.0
    assert staging_of(policy, project_job).staging_s == 80.0
    assert staging_of(policy, annotated).staging_s == 20.0
    assert staging_of(policy, project_job).egress_usd == 0  # the project's storage sets no rate


def test_a_policy_without_storage_records_no_staging() -> None:
    job = make_job("j", gpus=8, duration_s=3600, wait=timedelta(minutes=10))
    _, decision = _decision(make_policy(), _snapshot([job], 600))
    assert "staging" not in decision.inputs


@settings(max_examples=25, deadline=None)
@given(sizes=st.lists(st.floats(0, 5000, allow_nan=False), min_size=1, max_size=6),
       release=st.one_of(st.none(), st.integers(0, 20_000)), rate=st.sampled_from([0, 0.02, 0.12]))
def test_held_exactly_when_staging_outlasts_the_predicted_start(sizes, release, rate) -> None:
    policy = _policy({**STORAGE, "egress_usd_per_gb": rate})
    jobs = [dataclasses.replace(make_job(f"j{i}", gpus=8, duration_s=1800,
                                         wait=timedelta(minutes=10 + i)), dataset_gb=size)
            for i, size in enumerate(sizes)]
    _, decision = _decision(policy, _snapshot(jobs, release))
    staging = decision.inputs["staging"]
    snapshot = _snapshot(jobs, release)
    ordered = sorted(jobs, key=lambda j: j.submitted_at)  # scheduling order: oldest first
    starts = predict_onprem_starts(ordered, (), snapshot.queues[POOL], T0, [j.id for j in jobs])
    for job in jobs:
        row = staging["jobs"].get(job.id)
        start = starts[job.id] if job.dataset_gb else None
        should_hold = start is not None and job.dataset_gb * 0.8 > start
        if should_hold:
            assert row is not None and row["burst"] is False
        elif row is not None:
            assert row["burst"] is True
            assert row["egress_usd"] == pytest.approx((job.dataset_gb + 50) * rate, abs=1e-3)
    assert staging["held_jobs"] == sum(1 for r in staging["jobs"].values() if not r["burst"])


@pytest.mark.parametrize(("storage", "field"), [
    ({"datasets": [{"uri": "imagenet", "size_gb": 1}]}, "pool.storage.datasets[0].uri"),
    ({"datasets": [{"uri": "nfs://x", "size_gb": -1}]}, "pool.storage.datasets[0].size_gb"),
    ({"bandwidth_gbps": 0}, "pool.storage.bandwidth_gbps"),
    ({"checkpoints": "/local/path"}, "pool.storage.checkpoints"),
    ({"egress_usd_per_gb": -0.1}, "pool.storage.egress_usd_per_gb"),
    ({"bandwith_gbps": 10}, "pool.storage.bandwith_gbps"),
])
def test_bad_storage_names_the_field(storage, field) -> None:
    text = yaml.safe_dump(policy_dict(pool={"storage": storage}), sort_keys=False)
    with pytest.raises(PolicyError) as info:
        load_policy_text(text, "p.yaml")
    assert field in str(info.value)


def test_a_booting_node_is_not_taken_on_paper_by_a_held_job() -> None:
    # "big" (older: first in order) is held for staging; "small" got the booting node last tick.
    # Absorption must leave the node to "small", not launch a second node for it.
    from orchestrator.domain.nodes import NodeState
    from tests.builders import make_node

    big = make_job("big", gpus=8, duration_s=3600, wait=timedelta(minutes=20))
    small = dataclasses.replace(make_job("small", gpus=8, duration_s=3600,
                                         wait=timedelta(minutes=10)), dataset_gb=1.0)
    snapshot = dataclasses.replace(_snapshot([big, small], 600),
                                   nodes=(make_node("n1", state=NodeState.BOOTING),))
    result, decision = _decision(_policy(), snapshot)
    assert not [a for a in result.actions if isinstance(a, Launch)], decision.summary
    assert HELD_BY in decision.held_back_by and "big (1000 GB" in decision.summary
