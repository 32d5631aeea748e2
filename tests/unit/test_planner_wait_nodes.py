"""The wait-aware rule on the on-prem nodes (``trigger.wait_model: nodes``), displacement
(``trigger.displacement``) and the learned boot time (``trigger.learn_boot``).

* Node by node, a job does not start on GPUs scattered over nodes (the pooled rule says it does);
  a wide job needs whole nodes; a snapshot without the releases' nodes falls back to pooled, and
  the decision says so.
* Displacement bursts cheaper queued jobs so a dearer one starts on-prem by its deadline, and
  records who went where for whom; it never displaces a job costlier than the one it helps, nor
  more than ``max_displaced``.
* Invariant (hypothesis): every unmet job lands in exactly one of due / deferred / waiting, in
  scheduling order, and the displaced ones are due.
* The boot learner's p90 and decay; the planner uses it once there are enough boots, and the
  decision names the value and its source.
* The policy refuses displacement without the node model.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.boot import BootLearner
from orchestrator.domain.snapshot import BootEstimate, OnPremRelease
from orchestrator.planner import plan
from orchestrator.planner.boot import MIN_SAMPLES, choose_boot
from orchestrator.planner.wait import NodeRules, split_unmet
from orchestrator.planner.wait_nodes import cheapest_cost
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


def _policy(nodes=2, gpus_per_node=4, offerings=None, **trigger):
    extra = {} if offerings is None else {"offerings": offerings}
    return make_policy(trigger={"wait_slo": "30m", "expected_boot": "5m", **trigger},
                       pool={"onprem": {"nodes": nodes, "gpus_per_node": gpus_per_node}}, **extra)


def _snapshot(jobs, free, releases, size=4, at=T0, boots=None):
    """On-prem nodes of ``size`` GPUs with ``free`` GPUs each; ``releases``: (node, GPUs, end)."""
    snapshot = make_snapshot(jobs, onprem_free=free, onprem_total=size * len(free), taken_at=at)
    queue = snapshot.queues[POOL]
    rel = tuple(OnPremRelease(g, end, node) for node, g, end in releases)
    return dataclasses.replace(snapshot, boot_estimates=boots or {}, queues={
        POOL: dataclasses.replace(queue, onprem_releases=rel, running_onprem_jobs=len(rel))})


def _wait(result):
    return result.decisions[0].inputs["wait_aware"]


def test_node_by_node_a_job_does_not_start_on_gpus_scattered_over_nodes() -> None:
    # Two 4-GPU nodes, each with 2 GPUs held until +2h and 2 free: 4 GPUs free, but not on one node.
    job = make_job("j4", gpus=4, wait=M, duration_s=3600)
    snapshot = _snapshot([job], [2, 2], [(0, 2, T0 + 2 * H), (1, 2, T0 + 2 * H)])
    # (nothing absorbs it on-prem now: the absorption already finds no node that holds it)
    pooled = plan(snapshot, [_policy()], T0)
    nodes = plan(snapshot, [_policy(wait_model="nodes")], T0)
    assert _wait(pooled)["deferred_to_onprem_jobs"] == 1  # pooled: 4 GPUs free from now
    assert _wait(nodes)["deferred_to_onprem_jobs"] == 0
    assert _wait(nodes)["waiting_jobs"] == 1  # burst at its deadline
    assert _wait(nodes)["onprem_model"] == "nodes"
    assert "onprem_model" not in _wait(pooled)  # the default's record is unchanged


def test_a_wide_job_waits_for_whole_nodes() -> None:
    job = make_job("j8", gpus=8, wait=M, duration_s=3600)
    # Node 0 frees at +10m, node 1 at +40m: the 8-GPU job starts at +40m, after its deadline.
    snapshot = _snapshot([job], [0, 0], [(0, 4, T0 + 10 * M), (1, 4, T0 + 40 * M)])
    policy = _policy(wait_model="nodes", offerings=[offering_spec(gpus=8)])
    assert _wait(plan(snapshot, [policy], T0))["waiting_jobs"] == 1
    sooner = _snapshot([job], [0, 0], [(0, 4, T0 + 10 * M), (1, 4, T0 + 15 * M)])
    assert _wait(plan(sooner, [policy], T0))["deferred_to_onprem_jobs"] == 1


def test_releases_without_their_node_fall_back_to_pooled_and_say_so() -> None:
    job = make_job("j4", gpus=4, wait=M, duration_s=3600)
    snapshot = _snapshot([job], [2, 2], [])
    queue = snapshot.queues[POOL]
    unnamed = dataclasses.replace(snapshot, queues={POOL: dataclasses.replace(
        queue, onprem_releases=(OnPremRelease(4, T0 + 2 * H),))})
    wait = _wait(plan(unnamed, [_policy(wait_model="nodes")], T0))
    assert wait["onprem_model"].startswith("pooled (")
    assert "without their node" in wait["onprem_model"]


def _displacement_case():
    """One 8-GPU node, busy until +10m. Queued: a 1-GPU 1h job (older, so ahead) and an 8-GPU 2h
    job. Node by node, the small one starts at +10m and the wide one only after it ends."""
    small = make_job("small", gpus=1, wait=10 * M, duration_s=3600)
    wide = make_job("wide", gpus=8, wait=2 * M, duration_s=7200)
    snapshot = _snapshot([small, wide], [0], [(0, 8, T0 + 10 * M)], size=8)
    offerings = [offering_spec("g1", gpus=1, price=1), offering_spec("g8", gpus=8, price=32)]
    return small, wide, snapshot, offerings


def test_displacement_bursts_the_cheaper_job_so_the_dearer_one_starts_on_prem() -> None:
    small, wide, snapshot, offerings = _displacement_case()
    plain = _policy(nodes=1, gpus_per_node=8, offerings=offerings, wait_model="nodes")
    before = _wait(plan(snapshot, [plain], T0))
    assert before["deferred_to_onprem_jobs"] == 1 and before["waiting_jobs"] == 1

    policy = _policy(nodes=1, gpus_per_node=8, offerings=offerings, wait_model="nodes",
                     displacement={"enabled": True})
    result = plan(snapshot, [policy], T0)
    wait = _wait(result)
    assert wait["displaced_jobs"] == 1
    [record] = wait["displaced"]
    assert record == {"job": "small", "displaced_for": "wide", "predicted_onprem_start_s": 600.0,
                      "cloud_cost_usd": 1.0, "for_predicted_onprem_start_s": 600.0,
                      "for_cloud_cost_usd": 64.0}
    assert wait["deferred_to_onprem_jobs"] == 1 and wait["due_jobs"] == 1
    assert [lc.offering.gpus for lc in result.launches] == [1]  # the small job, now
    assert "displaced to the cloud" in result.decisions[0].summary


def test_displacement_never_bursts_a_job_dearer_than_the_one_it_helps() -> None:
    small = make_job("small", gpus=1, wait=10 * M, duration_s=3600)
    wide = make_job("wide", gpus=8, wait=2 * M, duration_s=1800)
    snapshot = _snapshot([small, wide], [0], [(0, 8, T0 + 10 * M)], size=8)
    # The 1-GPU job's hour costs $32 at best (on the 8-GPU offering): more than the wide job's
    # half hour ($16).
    offerings = [offering_spec("g1", gpus=1, price=100), offering_spec("g8", gpus=8, price=32)]
    policy = _policy(nodes=1, gpus_per_node=8, offerings=offerings, wait_model="nodes",
                     displacement={"enabled": True})
    wait = _wait(plan(snapshot, [policy], T0))
    assert wait["displaced_jobs"] == 0 and wait["waiting_jobs"] == 1


def test_displacement_moves_at_most_max_displaced_jobs() -> None:
    smalls = [make_job(f"s{i}", gpus=1, wait=(10 - i) * M, duration_s=3600) for i in range(8)]
    wide = make_job("wide", gpus=8, wait=M, duration_s=7200)
    snapshot = _snapshot([*smalls, wide], [0], [(0, 8, T0 + 10 * M)], size=8)
    offerings = [offering_spec("g1", gpus=1, price=1), offering_spec("g8", gpus=8, price=32)]
    for cap, moved in ((8, 8), (4, 0)):  # all eight hold the node: four are not enough
        policy = _policy(nodes=1, gpus_per_node=8, offerings=offerings, wait_model="nodes",
                         displacement={"enabled": True, "max_displaced": cap})
        assert _wait(plan(snapshot, [policy], T0))["displaced_jobs"] == moved


def test_the_policy_refuses_displacement_without_the_node_model() -> None:
    with pytest.raises(PolicyError, match="trigger.displacement"):
        _policy(displacement={"enabled": True})
    with pytest.raises(PolicyError, match="lookahead"):
        _policy(wait_model="nodes", displacement={"enabled": True, "lookahead": "0s"})


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(0, 40),
                          st.integers(60, 7200)), min_size=1, max_size=12),
       st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(0, 120)),
                max_size=8),
       st.booleans(), st.sampled_from(["submit", "longest-first"]))
def test_every_unmet_job_lands_in_exactly_one_bucket(specs, runs, displace, onprem_order) -> None:
    jobs = tuple(make_job(f"j{i}", gpus=g, wait=w * M, duration_s=d)
                 for i, (g, w, d) in enumerate(specs))
    held = [0] * 4
    releases = []
    for node, gpus, end in runs:
        gpus = min(gpus, 4 - held[node])
        if gpus > 0:
            held[node] += gpus
            releases.append((node, gpus, T0 + end * M))
    snapshot = _snapshot(jobs, [4 - h for h in held], releases)
    policy = _policy(nodes=4, wait_model="nodes", displacement={"enabled": displace},
                     onprem_order=onprem_order)
    queue = snapshot.queues[POOL]
    rules = NodeRules(8, cheapest_cost([(1, 1.0), (8, 32.0)]))
    split = split_unmet(jobs, (), queue, policy, T0, rules=rules)
    ids = [j.id for j in split.due + split.deferred + split.waiting]
    assert sorted(ids) == sorted(j.id for j in jobs)
    order = {j.id: i for i, j in enumerate(jobs)}
    for bucket in (split.due, split.deferred, split.waiting):
        assert [order[j.id] for j in bucket] == sorted(order[j.id] for j in bucket)
    due = {j.id for j in split.due}
    assert all(r["job"] in due for r in split.displaced)
    # The on-prem order (longest-first only) lists exactly the deferred jobs, longest first.
    if onprem_order == "submit":
        assert split.onprem_order == ()
    else:
        assert sorted(split.onprem_order) == sorted(j.id for j in split.deferred)
        runtimes = {j.id: j.duration_s for j in jobs}
        listed = [runtimes[i] for i in split.onprem_order]
        assert listed == sorted(listed, reverse=True)
    assert not displace or len(split.displaced) <= policy.trigger.displacement.max_displaced * 8


def _order_case():
    """One 4-GPU node busy for 10 minutes; a one-hour 4-GPU job queued 5 minutes, then a ten-hour
    one queued 2: only one of them can start on-prem within the SLO (at +10m)."""
    short = make_job("short", gpus=4, wait=5 * M, duration_s=3600)
    long = make_job("long", gpus=4, wait=2 * M, duration_s=36_000)
    return _snapshot([short, long], [0], [(0, 4, T0 + 10 * M)])


def test_longest_first_keeps_the_long_job_on_prem_and_bursts_the_short_one() -> None:
    snapshot = _order_case()
    offerings = [offering_spec("g4", gpus=4, price=4)]
    submit = plan(snapshot, [_policy(nodes=1, offerings=offerings, wait_model="nodes")], T0)
    assert _wait(submit)["deferred_to_onprem_jobs"] == 1 and "onprem_order" not in _wait(submit)
    assert submit.decisions[0].onprem_order == ()
    policy = _policy(nodes=1, offerings=offerings, wait_model="nodes",
                     onprem_order="longest-first")
    result = plan(snapshot, [policy], T0)
    wait = _wait(result)
    assert wait["onprem_order"] == {"order": "longest-first", "applied": True, "jobs": 1,
                                    "first": ["long"]}
    assert wait["deferred_to_onprem_jobs"] == 1 and wait["waiting_jobs"] == 1
    assert result.decisions[0].onprem_order == ("long",)  # for the on-prem scheduler
    assert "kept longest first" in result.decisions[0].summary
    # The order is an instruction, not part of the decision's identity (as holds_until).
    assert dataclasses.replace(result.decisions[0], onprem_order=()) == result.decisions[0]


def test_longest_first_keeps_project_classes_and_puts_unknown_runtimes_last() -> None:
    from orchestrator.planner.wait import longest_first
    policy = make_policy(projects=[{"name": "prod", "priority": 20}])
    jobs = [make_job("a", duration_s=600), make_job("b", duration_s=None),
            make_job("c", duration_s=7200), make_job("d", project="prod", duration_s=60),
            make_job("e", duration_s=7200, priority=5), make_job("f", duration_s=7200)]
    order = longest_first(list(range(len(jobs))), jobs, policy)
    # prod first (project priority), then the longest (ties in the given order: a job's own
    # priority is no class), and the job of unknown runtime last of its class.
    assert [jobs[i].id for i in order] == ["d", "c", "e", "f", "a", "b"]


def test_longest_first_stands_down_where_the_pooled_model_stands_in() -> None:
    job = make_job("j", gpus=4, wait=M, duration_s=3600)
    snapshot = _snapshot([job], [0], [(0, 4, T0 + 10 * M)])
    queue = snapshot.queues[POOL]
    no_nodes = dataclasses.replace(snapshot, queues={POOL: dataclasses.replace(
        queue, onprem_releases=tuple(dataclasses.replace(r, node=None)
                                     for r in queue.onprem_releases))})
    policy = _policy(nodes=1, wait_model="nodes", onprem_order="longest-first")
    result = plan(no_nodes, [policy], T0)
    assert _wait(result)["onprem_order"]["applied"] is False
    assert result.decisions[0].onprem_order == ()


def test_the_policy_refuses_longest_first_without_the_node_model() -> None:
    with pytest.raises(PolicyError, match="trigger.onprem_order"):
        _policy(onprem_order="longest-first")
    with pytest.raises(PolicyError, match="trigger.onprem_order"):
        _policy(onprem_order="shortest-first")


def test_the_boot_learner_reads_a_decayed_p90() -> None:
    learner = BootLearner(half_life_h=24.0)
    for i in range(10):
        learner.booted("aws/r/-/g8/spot", 100.0 + 10 * i, 0.0)  # 100..190 s
    now = learner.estimate("aws/r/-/g8/spot", 0.0)
    assert now.boot_s == 180.0 and now.samples == 10.0  # p90 of ten: the ninth
    # A day later ten slow boots outweigh the old ones (half weight): p90 among the new.
    for _ in range(10):
        learner.booted("aws/r/-/g8/spot", 600.0, 24.0)
    later = learner.estimate("aws/r/-/g8/spot", 24.0)
    assert later.boot_s == 600.0 and later.samples == 15.0
    assert learner.estimate("aws/r/-/other/spot", 24.0) is None


def test_the_planner_uses_the_learned_boot_once_there_are_enough_boots() -> None:
    policy = _policy(learn_boot=True, offerings=[offering_spec("g8", gpus=8)])
    key = "aws/us-east-1/-/g8/on-demand"
    few = {key: BootEstimate(key, 120.0, MIN_SAMPLES - 1)}
    enough = {key: BootEstimate(key, 120.0, MIN_SAMPLES)}
    assert choose_boot(policy, few).source == "policy"
    chosen = choose_boot(policy, enough)
    assert (chosen.seconds, chosen.source, chosen.offering) == (120.0, "learned", key)
    # The learned 2 minutes instead of 5 leaves on-prem 3 more minutes: a job whose on-prem start
    # is at +26m (deadline +24m with 5m, +27m with 2m) is deferred instead of waiting.
    job = make_job("j1", gpus=4, wait=M, duration_s=3600)
    ends = [(0, 4, T0 + 26 * M), (1, 4, T0 + 26 * M)]
    fixed = _wait(plan(_snapshot([job], [0, 0], ends, boots=few), [policy], T0))
    learned = _wait(plan(_snapshot([job], [0, 0], ends, boots=enough), [policy], T0))
    assert fixed["expected_boot_source"] == "policy" and fixed["waiting_jobs"] == 1
    assert learned["expected_boot_source"] == "learned"
    assert learned["expected_boot_s"] == 120.0 and learned["expected_boot_samples"] == MIN_SAMPLES
    assert learned["deferred_to_onprem_jobs"] == 1
    # Off (the default): the policy's value, and no new keys in the record.
    off = _wait(plan(_snapshot([job], [0, 0], ends, boots=enough), [_policy()], T0))
    assert "expected_boot_source" not in off and off["expected_boot_s"] == 300.0


def test_a_job_no_burst_node_holds_is_helped_by_displacement_at_any_price() -> None:
    # A 16-GPU job on two 8-GPU nodes: no offering holds it (8 GPUs at most), so without
    # displacement it waits for whole nodes behind the 1-GPU job on node 1.
    small = make_job("small", gpus=1, wait=10 * M, duration_s=3600)
    wide = make_job("wide", gpus=16, wait=2 * M, duration_s=7200)
    snapshot = _snapshot([small, wide], [0, 0], [(0, 8, T0 + 10 * M), (1, 8, T0 + 10 * M)],
                         size=8)
    offerings = [offering_spec("g8", gpus=8, price=32)]
    policy = _policy(nodes=2, gpus_per_node=8, offerings=offerings, wait_model="nodes",
                     displacement={"enabled": True})
    wait = _wait(plan(snapshot, [policy], T0))
    [record] = wait["displaced"]
    assert (record["job"], record["displaced_for"], record["for_cloud_cost_usd"]) == (
        "small", "wide", None)
    assert wait["deferred_to_onprem_jobs"] == 1


# -- trigger.onprem_margin: the on-prem bound apart from the launch deadline ---------------------

def _margin_policy(**trigger):
    return _policy(wait_model="nodes", offerings=[offering_spec("g4", gpus=4)], **trigger)


@pytest.mark.parametrize(("frees_at", "deferred"), [(26, True), (28, True), (29, False)])
def test_onprem_margin_keeps_on_prem_a_job_that_starts_within_the_slo(frees_at, deferred) -> None:
    # Submitted at T0 - 1m: the launch deadline (5m boot) is T0 + 24m, the on-prem bound with a
    # 1-minute margin T0 + 28m. Both nodes free at ``frees_at``.
    job = make_job("j4", gpus=4, wait=M, duration_s=3600)
    ends = [(0, 4, T0 + frees_at * M), (1, 4, T0 + frees_at * M)]
    snapshot = _snapshot([job], [0, 0], ends)
    old = _wait(plan(snapshot, [_margin_policy()], T0))
    assert old["deferred_to_onprem_jobs"] == 0 and old["waiting_jobs"] == 1  # bound = deadline
    assert "onprem_margin_s" not in old  # unset: the record is as before
    wait = _wait(plan(snapshot, [_margin_policy(onprem_margin="1m")], T0))
    assert wait["onprem_margin_s"] == 60.0
    assert wait["deferred_to_onprem_jobs"] == (1 if deferred else 0)
    if not deferred:  # burst at the launch deadline as before, not at the on-prem bound
        assert wait["waiting_jobs"] == 1
        assert wait["earliest_burst_deadline"] == (T0 + 23 * M).isoformat()


@pytest.mark.parametrize(("frees_at", "where"), [(1, "deferred"), (3, "due")])
def test_past_its_launch_deadline_a_job_still_starting_on_prem_in_time_stays(frees_at, where):
    # Submitted at T0 - 27m: the launch deadline passed 2 minutes ago; the on-prem bound is +2m.
    job = make_job("j4", gpus=4, wait=27 * M, duration_s=3600)
    ends = [(0, 4, T0 + frees_at * M), (1, 4, T0 + frees_at * M)]
    snapshot = _snapshot([job], [0, 0], ends)
    assert _wait(plan(snapshot, [_margin_policy()], T0))["due_jobs"] == 1  # unset: due
    result = plan(snapshot, [_margin_policy(onprem_margin="1m")], T0)
    wait = _wait(result)
    key = "deferred_to_onprem_jobs" if where == "deferred" else "due_jobs"
    assert wait[key] == 1
    assert bool(result.launches) == (where == "due")


def test_onprem_margin_stands_down_where_the_pooled_model_stands_in() -> None:
    # Releases without their node: pooled, which ignores how jobs fit nodes, keeps the launch
    # deadline as its bound, and the record says the margin did not apply.
    job = make_job("j4", gpus=4, wait=M, duration_s=3600)
    snapshot = _snapshot([job], [0, 0], [])
    queue = snapshot.queues[POOL]
    unnamed = dataclasses.replace(snapshot, queues={POOL: dataclasses.replace(
        queue, onprem_releases=(OnPremRelease(4, T0 + 26 * M), OnPremRelease(4, T0 + 26 * M)))})
    wait = _wait(plan(unnamed, [_margin_policy(onprem_margin="1m")], T0))
    assert wait["onprem_model"].startswith("pooled (")
    assert wait["onprem_margin_s"] is None
    assert wait["waiting_jobs"] == 1 and wait["deferred_to_onprem_jobs"] == 0


def test_the_policy_refuses_an_onprem_margin_it_cannot_apply() -> None:
    with pytest.raises(PolicyError, match="trigger.onprem_margin"):
        _policy(onprem_margin="1m")  # pooled
    with pytest.raises(PolicyError, match="trigger.onprem_margin.*longer than wait_slo"):
        _policy(wait_model="nodes", onprem_margin="31m")


def test_a_launch_group_costs_its_nodes() -> None:
    cost = cheapest_cost([(4, 4.0), (8, 32.0)], [(4, 4.0), (8, 32.0)], max_nodes=4)
    assert cost(make_job("w8", gpus=8, duration_s=3600)) == 8.0  # two 4-GPU nodes, not one 8
    assert cost(make_job("w16", gpus=16, duration_s=7200)) == 32.0  # four 4-GPU nodes, 2 h
    assert cost(make_job("w24", gpus=24, duration_s=3600)) == 96.0  # 6 x 4 > 4 nodes: 3 x 8
    assert cost(make_job("w40", gpus=40, duration_s=3600)) is None  # more than 4 nodes of any
    one_node = cheapest_cost([(4, 4.0), (8, 32.0)])  # the built-in queue: one node per job
    assert one_node(make_job("w8", gpus=8, duration_s=3600)) == 32.0


def test_on_a_fabric_that_spans_nodes_a_wide_job_is_priced_as_its_launch_group() -> None:
    small = make_job("small", gpus=1, wait=10 * M, duration_s=3600)
    wide = make_job("wide", gpus=16, wait=2 * M, duration_s=7200)
    snapshot = _snapshot([small, wide], [0, 0], [(0, 8, T0 + 10 * M), (1, 8, T0 + 10 * M)],
                         size=8)
    offerings = [offering_spec("g1", gpus=1, price=1), offering_spec("g8", gpus=8, price=32)]
    policy = make_policy(trigger={"wait_slo": "30m", "expected_boot": "5m", "wait_model": "nodes",
                                  "displacement": {"enabled": True}},
                         pool={"onprem": {"nodes": 2, "gpus_per_node": 8}},
                         queue={"source": "slurm"}, offerings=offerings)
    [record] = _wait(plan(snapshot, [policy], T0))["displaced"]
    # Two 8-GPU nodes for 2 hours: $128 (on the built-in queue no node holds it: None).
    assert (record["job"], record["for_cloud_cost_usd"]) == ("small", 128.0)


def test_the_shipped_default_on_a_queue_without_nodes_decides_as_the_pooled_rule() -> None:
    # The built-in queue reports no node per running job: the shipped default's node model,
    # margin, displacement and longest-first order stand down, on the columns' fast path as on a tuple of jobs, and
    # the plan is the pooled rule's, its record naming why.
    from orchestrator.domain.pending import PendingColumns
    from orchestrator.policy import DEFAULT_POLICY_PATH, load_policy, load_policy_text
    import yaml

    shipped = load_policy(DEFAULT_POLICY_PATH)
    assert shipped.trigger.wait_model.value == "nodes" and shipped.trigger.onprem_margin == M
    doc = yaml.safe_load(DEFAULT_POLICY_PATH.read_text(encoding="utf-8"))
    for key in ("wait_model", "onprem_margin", "displacement", "onprem_order"):
        doc["trigger"].pop(key)
    pooled = load_policy_text(yaml.safe_dump(doc), "pooled.yaml")
    jobs = [make_job(f"j{i}", gpus=g, wait=w * M, duration_s=3600)
            for i, (g, w) in enumerate([(4, 1), (2, 12), (4, 25), (1, 3), (8, 40)])]
    snapshot = make_snapshot(jobs, onprem_free=(), onprem_total=8, taken_at=T0)
    queue = snapshot.queues[POOL]
    snapshot = dataclasses.replace(snapshot, queues={POOL: dataclasses.replace(
        queue, onprem_releases=(OnPremRelease(4, T0 + 26 * M), OnPremRelease(4, T0 + 50 * M)))})
    as_columns = dataclasses.replace(snapshot, queues={POOL: dataclasses.replace(
        snapshot.queues[POOL], pending=PendingColumns.from_jobs(jobs, POOL))})
    for snap in (snapshot, as_columns):
        ours, theirs = plan(snap, [shipped], T0), plan(snap, [pooled], T0)
        wait, base = _wait(ours), _wait(theirs)
        assert wait.pop("onprem_model").startswith("pooled (")
        assert wait.pop("onprem_margin_s") is None
        assert (wait.pop("displaced_jobs"), wait.pop("displaced")) == (0, [])
        assert wait.pop("onprem_order") == {"order": "longest-first", "applied": False,
                                            "jobs": 0, "first": []}
        assert ours.decisions[0].onprem_order == ()
        assert wait == base
        assert [a.offering.key for a in ours.launches] == [a.offering.key for a in theirs.launches]


def test_longest_first_keeps_its_jobs_off_the_nodes_on_their_way_for_others() -> None:
    # Slurm raises the kept job above every pending job: a burst node booting for the short job
    # must not go to it when it joins; a ready node (its launch served) may take it.
    from orchestrator.domain.nodes import NodeState

    offerings = [offering_spec("g4", gpus=4, price=4)]
    booting = dataclasses.replace(make_node("n-boot", offering=make_offering("g4", gpus=4, price=4),
                                            state=NodeState.BOOTING), launched_for=("short",))
    ready = make_node("n-ready", offering=make_offering("g4", gpus=4, price=4), gpus_busy=4,
                      running_jobs=1)  # (full: it absorbs nothing)
    snapshot = dataclasses.replace(_order_case(), nodes=(booting, ready))
    policy = _policy(nodes=1, offerings=offerings, wait_model="nodes",
                     onprem_order="longest-first")
    [decision] = plan(snapshot, [policy], T0).decisions
    kept = decision.kept_off
    assert kept is not None and kept.only_launched and kept.kept == decision.onprem_order == ("long",)
    assert kept.allowed_nodes() == {"long": frozenset({"n-ready"})}
    # Without the order (submit), nothing is kept off: the fabric is not asked.
    plain = _policy(nodes=1, offerings=offerings, wait_model="nodes")
    assert plan(snapshot, [plain], T0).decisions[0].kept_off is None
