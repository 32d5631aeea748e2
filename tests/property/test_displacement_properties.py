"""Displacement (``trigger.displacement``) on generated queues of the node model:

* a displaced job is always cheaper in the cloud than the job it was displaced for (or that job
  no burst node holds: its cost is recorded as None);
* the work is bounded: at most ``MAX_TRIES`` late jobs helped per tick, each by at most
  ``max_displaced`` jobs, and at most ``RECORDED`` records;
* every displaced job is burst now (due), and the job it was displaced for is kept for on-prem.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.snapshot import OnPremRelease
from orchestrator.planner.wait import NodeRules, split_unmet
from orchestrator.planner.wait_nodes import MAX_TRIES, RECORDED, cheapest_cost
from tests.builders import POOL, T0, make_job, make_policy, make_snapshot

M = timedelta(minutes=1)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(0, 40),
                          st.integers(60, 4 * 3600)), min_size=1, max_size=24),
       st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(0, 120)),
                max_size=8),
       st.integers(1, 8))
def test_a_displaced_job_is_cheaper_than_the_one_it_is_for(specs, runs, cap) -> None:
    jobs = tuple(make_job(f"j{i}", gpus=g, wait=w * M, duration_s=d)
                 for i, (g, w, d) in enumerate(specs))
    held = [0] * 4
    releases = []
    for node, gpus, end in runs:
        gpus = min(gpus, 4 - held[node])
        if gpus > 0:
            held[node] += gpus
            releases.append(OnPremRelease(gpus, T0 + end * M, node))
    snapshot = make_snapshot(jobs, onprem_free=[4 - h for h in held], onprem_total=16)
    queue = dataclasses.replace(snapshot.queues[POOL], onprem_releases=tuple(releases))
    policy = make_policy(trigger={"wait_slo": "30m", "expected_boot": "5m", "wait_model": "nodes",
                                  "displacement": {"enabled": True, "max_displaced": cap}},
                         pool={"onprem": {"nodes": 4, "gpus_per_node": 4}})
    cost = cheapest_cost([(1, 1.0), (4, 4.0), (8, 32.0)])
    split = split_unmet(jobs, (), queue, policy, T0, rules=NodeRules(4, cost))
    due = {j.id for j in split.due}
    deferred = {j.id for j in split.deferred}
    helped = {r["displaced_for"] for r in split.displaced}
    assert len(helped) <= MAX_TRIES
    assert len(split.displaced) <= RECORDED
    for r in split.displaced:
        assert r["job"] in due and r["displaced_for"] in deferred
        if r["for_cloud_cost_usd"] is not None:
            by_id = {j.id: j for j in jobs}
            assert cost(by_id[r["job"]]) < cost(by_id[r["displaced_for"]])
    per = {}
    for r in split.displaced:
        per[r["displaced_for"]] = per.get(r["displaced_for"], 0) + 1
    assert all(n <= cap for n in per.values())
