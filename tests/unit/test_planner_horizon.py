"""``Decision.holds_until`` (orchestrator.planner.horizon): until when a tick's answer holds.

* Each bound on its own, and tight to the minute: the trigger's ``oldest_wait_above``,
  ``sustained_for``, the scale-up cooldown, a node reaching ``idle_for``, a drain's deadline, a
  capacity block's end, a waiting job's ``wait_slo`` burst time (pooled and node model), the
  start the node model placed a deferred job at.
* No claim where the tick acts, its memory moves (the trigger fires), or the clock is read in a
  way not bounded (budgets); for ever where nothing read moves with the clock.
* Property (hypothesis): on random queues, on-prem schedules and burst nodes (pooled and node
  model, displacement on and off), the same snapshot planned at every whole minute before
  ``holds_until`` acts on nothing, keeps the memory, and decides by the same rule with the same
  limits held back by.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.plan import Hold
from orchestrator.domain.snapshot import BurstRun, CapacityBlock, OnPremRelease, PolicyMemory
from orchestrator.planner import plan
from orchestrator.planner.horizon import FOREVER
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
LONG = 6 * H  # how far a claim "for ever" is checked


def _snapshot(jobs=(), free=(0, 0), releases=(), size=4, memory=None, nodes=(), blocks=(),
              offerings=None):
    """On-prem nodes of ``size`` GPUs with ``free`` GPUs each; ``releases``: (node, GPUs, end)."""
    snapshot = make_snapshot(jobs, onprem_free=free, onprem_total=size * len(free), nodes=nodes,
                             memory=memory, capacity_blocks=blocks, offerings=offerings)
    queue = snapshot.queues[POOL]
    rel = tuple(OnPremRelease(g, end, node) for node, g, end in releases)
    return dataclasses.replace(snapshot, queues={
        POOL: dataclasses.replace(queue, onprem_releases=rel, running_onprem_jobs=len(rel))})


def _fired(policy, since=T0 - H):
    return {policy.name: PolicyMemory(trigger_since=since)}


def _answer(result):
    [decision] = result.decisions
    kept = None if decision.kept_off is None else decision.kept_off.kept  # (trigger.spare_room)
    return ([a for a in result.actions if not isinstance(a, Hold)], result.memory,
            decision.rule, decision.held_back_by, kept)


def _planned(snapshot, policy, at):
    return plan(dataclasses.replace(snapshot, taken_at=at), [policy], at)


def _holds(snapshot, policy):
    """The plan at T0 and its holds_until, after checking the claim at every whole minute
    before it (up to ``LONG``)."""
    first = _planned(snapshot, policy, T0)
    until = first.decisions[0].holds_until
    if until is not None:
        acts, memory, rule, held_back, kept = _answer(first)
        assert not acts
        assert memory[policy.name] == snapshot.memory.get(policy.name, PolicyMemory())
        at = T0 + M
        while at < min(until, T0 + LONG):
            again = _answer(_planned(snapshot, policy, at))
            assert again == ([], memory, rule, held_back, kept), f"differs at {at - T0}"
            at += M
    return first, until


def _changes_by(snapshot, policy, at):
    """Whether the answer at ``at`` differs from the one at T0."""
    return _answer(_planned(snapshot, policy, at)) != _answer(_planned(snapshot, policy, T0))


def test_nothing_pending_and_no_node_holds_for_ever():
    _, until = _holds(_snapshot(), make_policy())
    assert until == FOREVER


def test_the_trigger_fires_by_the_oldest_wait():
    policy = make_policy(trigger={"pending_gpus_above": 100, "oldest_wait_above": "10m"})
    snapshot = _snapshot([make_job("j", gpus=4, wait=2 * M)])
    first, until = _holds(snapshot, policy)
    assert str(first.decisions[0].rule) == "trigger-not-met"
    assert until == T0 + 8 * M  # submitted at T0 - 2m, fires once it waited more than 10m
    assert not _changes_by(snapshot, policy, until)  # (waited exactly 10m: not more)
    assert _changes_by(snapshot, policy, until + M)


def test_a_firing_trigger_changes_the_memory_so_no_claim():
    policy = make_policy(trigger={"sustained_for": "5m"})
    _, until = _holds(_snapshot([make_job("j", gpus=4)]), policy)
    assert until is None


def test_sustaining_holds_until_sustained_for():
    policy = make_policy(trigger={"sustained_for": "5m"})
    half = timedelta(seconds=30)
    snapshot = _snapshot([make_job("j", gpus=4)], memory=_fired(policy, T0 - half))
    first, until = _holds(snapshot, policy)
    assert str(first.decisions[0].rule) == "sustaining"
    assert until == T0 + timedelta(minutes=4, seconds=30)
    assert _changes_by(snapshot, policy, T0 + 5 * M)


def test_the_scale_up_cooldown():
    policy = make_policy(trigger={"sustained_for": "0s"}, cooldowns={"scale_up": "5m"})
    memory = {policy.name: PolicyMemory(trigger_since=T0 - H, last_launch_at=T0 - 2 * M)}
    snapshot = _snapshot([make_job("j", gpus=4)], memory=memory)
    first, until = _holds(snapshot, policy)
    assert str(first.decisions[0].rule) == "cooldown"
    assert until == T0 + 3 * M
    assert _changes_by(snapshot, policy, until)


def test_an_idle_node_reaching_idle_for_and_a_drain_deadline():
    policy = make_policy(scale_down={"idle_for": "10m"})
    idle = make_node("n1", idle_since=T0 - 7 * M)
    _, until = _holds(_snapshot(nodes=[idle]), policy)
    assert until == T0 + 3 * M
    assert _changes_by(_snapshot(nodes=[idle]), policy, until)
    draining = make_node("n2", state=NodeState.DRAINING, drain_deadline=T0 + 12 * M,
                         running_jobs=1, gpus_busy=8)
    _, until = _holds(_snapshot(nodes=[draining]), policy)
    assert until == T0 + 12 * M
    assert _changes_by(_snapshot(nodes=[draining]), policy, until)


def test_a_capacity_block_ends():
    policy = make_policy()
    offering = make_offering()
    block = CapacityBlock(offering.key, T0 + 7 * M)
    _, until = _holds(_snapshot(blocks=[block], offerings=[offering]), policy)
    assert until == T0 + 7 * M


def test_an_acting_plan_and_budgets_make_no_claim():
    policy = make_policy(trigger={"sustained_for": "0s"})
    snapshot = _snapshot([make_job("j", gpus=4)], memory=_fired(policy))
    first, until = _holds(snapshot, policy)
    assert first.launches and until is None
    budgeted = make_policy(budgets=[{"name": "b", "limit_usd": 1000}])
    _, until = _holds(_snapshot(), budgeted)
    assert until is None


def _wait_policy(**trigger):
    return make_policy(trigger={"wait_slo": "30m", "expected_boot": "5m", "sustained_for": "0s",
                                **trigger},
                       pool={"onprem": {"nodes": 2, "gpus_per_node": 4}},
                       offerings=[offering_spec(gpus=4, price=4)])


def test_a_waiting_job_holds_until_its_burst_time():
    # No on-prem room for two hours: the job is late, burst at submit + 30m - 5m less a tick.
    for model in ("pooled", "nodes"):
        policy = _wait_policy(wait_model=model)
        snapshot = _snapshot([make_job("j", gpus=4, wait=M, duration_s=3600)], free=(0, 0),
                             releases=[(0, 4, T0 + 2 * H), (1, 4, T0 + 2 * H)],
                             memory=_fired(policy))
        first, until = _holds(snapshot, policy)
        assert first.decisions[0].inputs["wait_aware"]["waiting_jobs"] == 1
        assert until == T0 + 23 * M, model
        assert _changes_by(snapshot, policy, until)


def test_a_deferred_job_holds_until_its_predicted_start():
    # Node 0 frees at +12m: the job is deferred to it; until then, the same split.
    for model in ("pooled", "nodes"):
        policy = _wait_policy(wait_model=model)
        snapshot = _snapshot([make_job("j", gpus=4, wait=M, duration_s=3600)], free=(0, 0),
                             releases=[(0, 4, T0 + 12 * M), (1, 4, T0 + 2 * H)],
                             memory=_fired(policy))
        first, until = _holds(snapshot, policy)
        assert first.decisions[0].inputs["wait_aware"]["deferred_to_onprem_jobs"] == 1
        assert until == T0 + 12 * M, model


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8, 16]),
                          st.one_of(st.integers(0, 20), st.integers(0, 40)),
                          st.one_of(st.none(), st.integers(60, 7200))), min_size=1, max_size=10),
       st.lists(st.tuples(st.integers(0, 3), st.integers(1, 4), st.integers(-5, 120)),
                max_size=8),
       st.lists(st.tuples(st.sampled_from([0, 2, 4, 4]), st.one_of(st.none(), st.integers(0, 30))),
                max_size=3),
       st.sampled_from(["pooled", "nodes", "displace", "spare", "none"]),
       st.sampled_from([(None, "0s"), (60, "0s"), (2, "3m")]),
       st.sampled_from([1, 4]), st.booleans())
def test_the_same_answer_at_every_minute_before_holds_until(specs, runs, nodes, model, trigger_at,
                                                            max_nodes, full):
    jobs = [make_job(f"j{i}", gpus=g, wait=w * M, duration_s=d)
            for i, (g, w, d) in enumerate(specs)]
    held = [0] * 4
    releases = []
    for node, gpus, end in runs:
        gpus = min(gpus, 4 - held[node])
        if gpus > 0:
            held[node] += gpus
            releases.append((node, gpus, T0 + end * M))
    if full:  # no on-prem GPU free now: nothing starts there this tick
        for node in range(4):
            if held[node] < 4:
                releases.append((node, 4 - held[node], T0 + (25 + 10 * node) * M))
                held[node] = 4
    burst = [make_node(f"n{i}", offering=make_offering("g4", gpus=4, price=4), gpus_busy=busy,
                       running_jobs=1 if busy else 0,
                       idle_since=None if busy or idle is None else T0 - idle * M)
             for i, (busy, idle) in enumerate(nodes)]
    since, sustain = trigger_at  # the trigger fired that many minutes ago (None: not fired)
    trigger = {"sustained_for": sustain, "oldest_wait_above": "10m"}
    if model != "none":
        trigger |= {"wait_slo": "30m", "expected_boot": "5m",
                    "wait_model": "pooled" if model == "pooled" else "nodes"}
        if model == "displace":
            trigger |= {"displacement": {"enabled": True, "max_displaced": 4, "lookahead": "30m"}}
        if model == "spare":
            trigger |= {"spare_room": {"enabled": True, "max_extension": 0.5}}
    policy = make_policy(trigger=trigger, pool={"onprem": {"nodes": 4, "gpus_per_node": 4}},
                         offerings=[offering_spec("g4", gpus=4, price=4),
                                    offering_spec("g8", gpus=8, price=30)],
                         limits={"max_nodes": max_nodes}, cooldowns={"scale_up": "2m"})
    memory = None if since is None else _fired(policy, T0 - since * M)
    snapshot = _snapshot(jobs, free=tuple(4 - h for h in held), releases=releases, nodes=burst,
                         memory=memory)
    # The busy burst nodes' work ends at their own times (spare room's allowance moves with it).
    runs = tuple(BurstRun(f"r{i}", "research", f"n{i}", busy, T0 - 10 * M, 600.0 * (i + 1) + 90)
                 for i, (busy, _) in enumerate(nodes) if busy)
    _holds(dataclasses.replace(snapshot, burst_runs=runs), policy)


def test_spare_room_holds_until_a_job_let_onto_a_node_would_lengthen_it_too_much():
    # A burst node with 2 GPUs free whose work ends in 2,200 s; a 1-GPU job of 2,400 s that
    # on-prem cannot start for hours. It adds 200 s to the node, within its share (0.5 x 1/4 x
    # 2,400 = 300 s): absorbed there. 100 s later it would add more: refused, so the answer
    # changes then, and no claim may reach past it.
    job = make_job("j", gpus=1, wait=2 * M, duration_s=2400)
    node = make_node("n0", offering=make_offering("g4", gpus=4, price=4), gpus_busy=2,
                     running_jobs=1)
    run = BurstRun("r", "research", "n0", 2, T0 - 10 * M, 600 + 2200.0)
    policy = _wait_policy(wait_model="nodes", spare_room={"enabled": True, "max_extension": 0.5})
    snapshot = dataclasses.replace(
        _snapshot([job], free=(0, 0), releases=[(0, 4, T0 + 5 * H), (1, 4, T0 + 5 * H)],
                  nodes=[node], memory=_fired(policy)), burst_runs=(run,))
    first, until = _holds(snapshot, policy)
    # (A tick that covers jobs records their forecast, which makes no claim today; the bound
    # holds whatever makes the claim.)
    assert until is None or until <= T0 + timedelta(seconds=100)
    assert first.decisions[0].inputs["absorbed_burst_gpus"] == 1
    assert _changes_by(snapshot, policy, T0 + 2 * M)  # refused there: the answer changes
