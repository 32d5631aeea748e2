"""Which jobs may take a burst node's spare room (``trigger.spare_room``).

* The jobs the wait-aware rule keeps queued for on-prem are listed as kept, with a record of why
  for the first few (runtime, the node time a node may add, on how many ready burst nodes the job
  may start); the due and waiting jobs are not.
* The allowed extension: ``max_extension x gpus / node GPUs x runtime``; none for a job of unknown
  runtime or wider than the node; a wide job only on an exact fit with ``max_extension`` 1.
* Invariant (hypothesis): with no spare room on a ready burst node the rule changes nothing but
  the record (same split, same launches); always, the kept jobs are exactly the ones the split
  keeps for on-prem (up to ``MAX_KEPT``), none is launched for, and at most ``RECORDED`` are
  recorded.
* Off (the default), the decision is what it was: no ``spare_room`` record.
* The policy refuses it without ``wait_slo`` and a ``max_extension`` outside [0, 1].
* How long a node's work keeps it busy is the longest time left of its runs (hypothesis: the
  memo on the runs tuple answers as a fresh read, at any later instant).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.snapshot import BurstRun, OnPremRelease
from orchestrator.planner import plan
from orchestrator.planner.spare_room import (
    RECORDED,
    Busy,
    allowed_extension_s,
    busy_nodes,
    may_join,
    wide_allowed,
)
from orchestrator.policy import PolicyError
from tests.builders import (
    POOL,
    T0,
    make_job,
    make_node,
    make_offering,
    make_policy,
    make_snapshot,
    offering_spec,
)

M = timedelta(minutes=1)
H = timedelta(hours=1)
OFFERINGS = [offering_spec("g4", gpus=4, price=4)]


def _policy(spare=None, **trigger):
    extra = {} if spare is None else {"spare_room": spare}
    return make_policy(trigger={"wait_slo": "30m", "expected_boot": "5m", "wait_model": "nodes",
                                **extra, **trigger},
                       pool={"onprem": {"nodes": 2, "gpus_per_node": 4}}, offerings=OFFERINGS)


def _snapshot(jobs, free, releases, nodes=(), runs=()):
    """Two 4-GPU on-prem nodes with ``free`` GPUs each; ``releases``: (node, GPUs, end)."""
    snapshot = make_snapshot(jobs, onprem_free=free, onprem_total=8, taken_at=T0,
                             nodes=nodes, offerings=[make_offering("g4", gpus=4, price=4)])
    queue = snapshot.queues[POOL]
    rel = tuple(OnPremRelease(g, end, node) for node, g, end in releases)
    return dataclasses.replace(snapshot, burst_runs=tuple(runs), queues={
        POOL: dataclasses.replace(queue, onprem_releases=rel, running_onprem_jobs=len(rel))})


def _wait(result):
    return result.decisions[0].inputs["wait_aware"]


def _case():
    """A long and a short job the model starts on-prem at +10m, a job it cannot start within the
    SLO, and a ready 4-GPU burst node, all busy for another hour."""
    long = make_job("long", gpus=1, wait=2 * M, duration_s=10 * 3600)
    short = make_job("short", gpus=1, wait=2 * M, duration_s=1800)
    late = make_job("late", gpus=4, wait=M, duration_s=3 * 3600)
    node = make_node("n1", offering=make_offering("g4", gpus=4, price=4), gpus_busy=4,
                     running_jobs=1)
    run = BurstRun("other", "research", "n1", 4, T0 - H, 2 * 3600.0)
    # On-prem node 0 frees 2 GPUs at +10m; node 1 stays busy for 3 hours.
    snapshot = _snapshot([long, short, late], [0, 0], [(0, 2, T0 + 10 * M), (0, 2, T0 + 3 * H),
                                                       (1, 4, T0 + 3 * H)],
                         nodes=[node], runs=[run])
    return snapshot


def test_the_jobs_kept_for_on_prem_are_listed_with_why() -> None:
    result = plan(_case(), [_policy({"enabled": True})], T0)
    wait = _wait(result)
    assert wait["deferred_to_onprem_jobs"] == 2
    spare = wait["spare_room"]
    assert spare["kept"] == ["long", "short"] and spare["kept_jobs"] == 2
    assert spare["all_listed"] and spare["max_extension"] == 1.0
    by_job = {r["job"]: r for r in spare["records"]}
    # The burst node is busy for another hour: the 10-hour job would add 9 hours, more than its
    # share (1/4 of 10 h = 2.5 h); the half-hour job adds nothing.
    assert by_job["long"]["allowed_extension_s"] == {"4": 9000.0}
    assert by_job["long"]["burst_nodes_allowed"] == 0 and by_job["long"]["burst_nodes"] == 1
    assert by_job["short"]["burst_nodes_allowed"] == 1
    assert "late" not in spare["kept"]  # a job the split bursts is not touched
    assert "spare_room" in result.decisions[0].summary


def test_off_the_decision_has_no_spare_room_record() -> None:
    for policy in (_policy(), _policy({"enabled": False})):
        assert "spare_room" not in _wait(plan(_case(), [policy], T0))


def test_the_allowed_extension_is_the_jobs_share_of_the_node() -> None:
    assert allowed_extension_s(1, 3600, 4, 1.0) == 900.0
    assert allowed_extension_s(2, 3600, 8, 0.5) == 450.0
    assert allowed_extension_s(1, 3600, 4, 0.0) == 0.0
    assert allowed_extension_s(1, None, 4, 1.0) is None  # unknown runtime: not at all
    assert allowed_extension_s(8, 3600, 4, 1.0) is None  # wider than the node
    assert wide_allowed(8, 2, 4, 1.0) and not wide_allowed(6, 2, 4, 1.0)
    assert not wide_allowed(8, 2, 4, 0.99)
    busy = Busy("n1", 4, 3000.0)
    assert may_join(make_job("a", gpus=1, duration_s=3000), busy, 0.0)  # ends with the node
    assert not may_join(make_job("b", gpus=1, duration_s=3601), busy, 0.0)
    assert may_join(make_job("c", gpus=1, duration_s=4000), busy, 1.0)  # adds 1000 <= 1000
    assert not may_join(make_job("d", gpus=1), busy, 1.0)


def test_the_policy_refuses_what_it_cannot_apply() -> None:
    with pytest.raises(PolicyError, match="trigger.spare_room"):
        make_policy(trigger={"spare_room": {"enabled": True}})
    with pytest.raises(PolicyError, match="max_extension"):
        _policy({"enabled": True, "max_extension": 1.5})
    with pytest.raises(PolicyError, match="max_extension"):
        _policy({"enabled": True, "max_extension": -0.1})
    # The pooled model keeps jobs for on-prem too: it applies there.
    make_policy(trigger={"wait_slo": "30m", "spare_room": {"enabled": True}})


def _split_ids(result) -> dict[str, set[str]]:
    """The jobs the decision's launches are for, and the kept ones."""
    wait = result.decisions[0].inputs.get("wait_aware", {})
    return {"launched_for": {j for lc in result.launches for j in lc.jobs},
            "kept": set((wait.get("spare_room") or {}).get("kept") or ())}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(0, 40),
                          st.one_of(st.none(), st.integers(60, 72 * 3600))),
                min_size=1, max_size=30),
       st.lists(st.tuples(st.integers(0, 1), st.integers(1, 4), st.integers(0, 120)),
                max_size=6),
       st.lists(st.tuples(st.integers(0, 4), st.integers(-120, 600)), max_size=4),
       st.sampled_from([0.0, 0.5, 1.0]))
def test_the_rule_keeps_only_jobs_on_prem_starts_in_time(specs, releases, nodes, share) -> None:
    jobs = [make_job(f"j{i}", gpus=g, wait=w * M, duration_s=d)
            for i, (g, w, d) in enumerate(specs)]
    held = [0, 0]
    rel = []
    for node, gpus, end in releases:
        gpus = min(gpus, 4 - held[node])
        if gpus > 0:
            held[node] += gpus
            rel.append((node, gpus, T0 + end * M))
    burst, runs = [], []
    for k, (busy, ends) in enumerate(nodes):
        burst.append(make_node(f"n{k}", offering=make_offering("g4", gpus=4, price=4),
                               gpus_busy=busy, running_jobs=1 if busy else 0,
                               state=NodeState.READY))
        if busy:
            runs.append(BurstRun(f"r{k}", "research", f"n{k}", busy, T0 - H, 3600 + ends * 60.0))
    snapshot = _snapshot(jobs, [4 - h for h in held], rel, nodes=burst, runs=runs)
    plain = plan(snapshot, [_policy()], T0)
    result = plan(snapshot, [_policy({"enabled": True, "max_extension": share})], T0)
    off = plain.decisions[0].inputs.get("wait_aware", {})
    on = result.decisions[0].inputs.get("wait_aware", {})
    if all(n.gpus_busy == n.gpus for n in burst):
        # No spare room: the same split and launches; the record is all that is added.
        for key in ("deferred_to_onprem_jobs", "waiting_jobs", "due_jobs",
                    "earliest_burst_deadline"):
            assert on.get(key) == off.get(key)
        assert [lc.jobs for lc in result.launches] == [lc.jobs for lc in plain.launches]
    if on.get("deferred_to_onprem_jobs"):
        spare = on["spare_room"]
        # The kept jobs are the ones the split keeps for on-prem (well under MAX_KEPT here):
        # never one it bursts, so the SLO never waits on the rule.
        assert spare["kept_jobs"] == on["deferred_to_onprem_jobs"]
        assert not _split_ids(result)["kept"] & _split_ids(result)["launched_for"]
        assert len(spare["records"]) <= RECORDED
        assert all(r["job"] in spare["kept"] for r in spare["records"])
    # (Where a ready node has room, the jobs refused it join the split and can hold on-prem
    # GPUs in the model, so other jobs' predicted starts may move: not claimed unchanged.)


def test_absorption_refuses_a_burst_nodes_room_to_a_kept_job_that_would_outlast_it() -> None:
    # Two idle ready 4-GPU burst nodes: an 8-GPU ten-hour job the model starts on-prem at +10m
    # would take them both for ten hours. Counted as covered by them it would never reach the
    # split; with the rule absorption refuses it, and the split keeps it for on-prem.
    wide = make_job("wide", gpus=8, wait=2 * M, duration_s=10 * 3600)
    idle = [make_node(f"n{k}", offering=make_offering("g4", gpus=4, price=4)) for k in range(2)]
    snapshot = _snapshot([wide], [0, 0], [(0, 4, T0 + 10 * M), (1, 4, T0 + 10 * M)], nodes=idle)
    slurm = {"queue": {"source": "slurm"}}  # (a fabric that spans nodes)

    def policy(spare):
        extra = {} if spare is None else {"spare_room": spare}
        return make_policy(trigger={"wait_slo": "30m", "expected_boot": "5m",
                                    "wait_model": "nodes", **extra},
                           pool={"onprem": {"nodes": 2, "gpus_per_node": 4}},
                           offerings=OFFERINGS, **slurm)

    plain = plan(snapshot, [policy(None)], T0).decisions[0]
    assert "wait_aware" not in plain.inputs  # absorbed by the idle nodes: no unmet job
    kept = plan(snapshot, [policy({"enabled": True, "max_extension": 0.0})], T0).decisions[0]
    assert kept.inputs["wait_aware"]["spare_room"]["kept"] == ["wide"]
    # With max_extension 1 the exact fit (8 GPUs on two 4-GPU nodes) costs no more than its own
    # nodes would: allowed, so it is absorbed as before.
    fits = plan(snapshot, [policy({"enabled": True, "max_extension": 1.0})], T0).decisions[0]
    assert "wait_aware" not in fits.inputs


RUN = st.tuples(st.sampled_from(["n1", "n2", "n3"]), st.integers(-7200, 0),
                st.none() | st.integers(1, 14_400).map(float))


@given(st.lists(RUN, max_size=8), st.lists(st.integers(0, 20_000), min_size=1, max_size=3))
def test_a_nodes_busy_time_is_its_longest_run_left_at_any_instant(specs, laters) -> None:
    runs = tuple(BurstRun(f"j{i}", "research", node, 1, T0 + timedelta(seconds=start), duration)
                 for i, (node, start, duration) in enumerate(specs))
    nodes = [make_node(n, state=NodeState.READY) for n in ("n1", "n2", "n3")]
    for later in laters:  # one runs tuple, read again as the clock moves
        now = T0 + timedelta(seconds=later)
        expected = {}
        for node in ("n1", "n2", "n3"):
            lefts = [float("inf") if r.duration_s is None
                     else (r.started_at - now).total_seconds() + r.duration_s
                     for r in runs if r.node_id == node]
            expected[node] = max([0.0, *lefts])
        assert {b.node: b.busy_for_s for b in busy_nodes(nodes, runs, now)} == expected
        assert busy_nodes(nodes, list(runs), now) == busy_nodes(nodes, runs, now)
