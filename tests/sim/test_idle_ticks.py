"""Skipping the ticks at which ``plan()`` provably does nothing (orchestrator.sim.idletick), and
those before the last plan's ``holds_until`` while nothing changed (the planner's own statement,
orchestrator.planner.horizon), changes no outcome: every job's start, end, place and wait, every
node's life, the cost and the decisions counted by rule and by the limits that held launches back
(but for the ticks that only hold, counted apart) are those of planning every tick; and with
every skipped tick planned and checked (``IdleMode.CHECK``) no plan does anything the rule or the
statement said it would not.

Slices: the ITP sample and a day of the full ITP trace under the sized default (the node wait
model, displacement and ``trigger.spare_room``), with capacity errors and spot interruptions,
and without ``spare_room`` (``itp-no-spare``); the ITP sample under the
pooled wait model (``itp-ondemand``) and under a trigger that waits for the oldest job
(``itp-wait``); the ITP sample, the Alibaba trace and Philly's days 30-32 under the shipped
default (``limits.max_nodes`` binding; the simulator's queue reports its nodes, so the node model
runs there too). No budgets (their spend moves with the clock: such runs plan every tick)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.policy import DEFAULT_POLICY_PATH, load_policy
from orchestrator.sim import load_trace
from orchestrator.sim.controllers import PolicyController
from orchestrator.sim.idletick import IdleMode
from orchestrator.sim.replay import as_simulated, replay, size_onprem
from orchestrator.sim.traces import Trace, TraceError
from tests.sim.helpers import options, run_with, sim_policy, trace

ITP_DEFAULT = Path(__file__).resolve().parents[2] / "bench" / "policies" / "itp-default.yaml"
SAMPLE = load_trace("itp-sample")


def _outcome(engine, by_rule: bool = True):
    return (
        [(j.trace.job_id, j.state, j.start_s, j.end_s, j.where, j.wait_s, j.burst_nodes,
          j.restarts) for j in engine.world.jobs],
        [(n.id, n.offering_key, n.created_at, n.state_since, n.state, n.launched_for)
         for n in engine.store.nodes(include_terminated=True)],
        sum(b.cost_micro_usd for b in engine.provider.bills()),
        (dict(engine.store.rules), dict(engine.store.held_back)) if by_rule else None,
        engine.store.predictions,
    )


def _replay_modes(policy, jobs: Trace, node_gpus: int | None = None, sized_on: Trace | None = None,
                  **option_overrides):
    """The engine of each mode, on-prem at the p70 of the demand of ``sized_on`` (the trace)."""
    opts = options(onprem="p70", node_gpus=node_gpus, **option_overrides)
    sizing = size_onprem(sized_on or jobs, policy, opts.onprem, opts.node_gpus)
    sim = as_simulated(policy, sizing)
    return {mode: replay(PolicyController(sim, policy.name, idle_ticks=mode), policy, sim, jobs,
                         sizing, opts) for mode in IdleMode}


def _assert_same(engines, held: bool = False, slept: bool = False, idle: bool = True) -> None:
    """Same outcomes in every mode; ``held``: the second rule (ticks that only hold) is
    exercised, and those ticks are not counted by rule (their rule moves with the clock);
    ``slept``: ticks before a plan's ``holds_until`` are skipped (counted by its rule);
    ``idle``: idle ticks are (where ``held`` is not)."""
    planned = engines[IdleMode.PLAN]
    skipped = engines[IdleMode.SKIP]
    by_rule = not held
    assert _outcome(skipped, by_rule) == _outcome(planned, by_rule)
    assert _outcome(engines[IdleMode.CHECK]) == _outcome(planned)
    assert planned.counters.idle_ticks == planned.counters.held_ticks == 0
    assert planned.counters.slept_ticks == 0
    counters = skipped.counters
    assert (counters.plans + counters.idle_ticks + counters.held_ticks + counters.slept_ticks
            == planned.counters.plans)
    assert (sum(skipped.store.rules.values())
            == counters.plans + counters.idle_ticks + counters.slept_ticks)
    if held or idle:  # (the case is exercised)
        assert (counters.held_ticks if held else counters.idle_ticks) > 0
    if slept:
        assert counters.slept_ticks > 0


@pytest.mark.parametrize("node_gpus", [4, 8])
def test_the_itp_sample_under_the_sized_default(node_gpus):
    _assert_same(_replay_modes(load_policy(ITP_DEFAULT), SAMPLE, node_gpus), slept=True)


def test_the_itp_sample_without_spare_room():
    # The sized default keeps its kept jobs off spare room (trigger.spare_room: its holds claim,
    # skipped ticks' plans keep the same jobs, checked too); without the rule, longest-first alone.
    no_spare = ITP_DEFAULT.parent / "itp-no-spare.yaml"
    _assert_same(_replay_modes(load_policy(no_spare), SAMPLE, 4), slept=True)


def test_the_itp_sample_with_capacity_errors_and_spot_interruptions():
    # Capacity blocks in force (the rule plans through them) and nodes that go away, handing
    # their jobs back to the queue.
    rates = {"spot_capacity_error": 0.2, "interruptions_per_hour": 0.3}
    _assert_same(_replay_modes(load_policy(ITP_DEFAULT), SAMPLE, 4, rates=rates, seed=3),
                 slept=True)


def test_the_itp_sample_under_the_shipped_default_whose_max_nodes_binds():
    # Six nodes, all busy, while a queue waits: the ticks that only hold again are skipped.
    rates = {"spot_capacity_error": 0.2, "interruptions_per_hour": 0.3}
    _assert_same(_replay_modes(load_policy(DEFAULT_POLICY_PATH), SAMPLE, tick_s=300.0,
                               rates=rates, seed=3), held=True, slept=True)


def test_idle_nodes_reaching_idle_for_at_a_tick_and_min_nodes():
    # Nodes go idle at odd instants and reach idle_for (10 min) exactly at ticks; busy nodes
    # with nothing pending between the bursts; min_nodes keeps one.
    jobs = trace(("a", 0, 600, 8), ("b", 0, 1260, 8), ("c", 0, 3000, 8), ("d", 30, 7200, 8),
                 ("e", 4000, 600, 8), ("f", 4020, 600, 8), ("g", 9000, 300, 8))
    for policy in (sim_policy(), sim_policy(limits={"min_nodes": 1, "max_nodes": 20})):
        engines = {mode: run_with(lambda p, m=mode: PolicyController(p, "t", idle_ticks=m),
                                  policy, jobs) for mode in IdleMode}
        _assert_same(engines)


def test_a_day_of_the_full_itp_trace():
    try:
        full = load_trace("itp")
    except TraceError:
        pytest.skip("the full ITP trace is not in the shared data")
    start = full.jobs[0].submit_s
    day = Trace("itp[1d]", tuple(j for j in full.jobs if j.submit_s < start + 86400), full.source)
    _assert_same(_replay_modes(load_policy(ITP_DEFAULT), day, 4), slept=True)


@pytest.mark.parametrize("name", ["itp-ondemand", "itp-wait"])
def test_the_itp_sample_under_the_pooled_model_and_a_waiting_trigger(name):
    # itp-ondemand: wait_slo on pooled on-prem GPUs (its timeline in whole minutes);
    # itp-wait: no wait_slo, the trigger fires once the oldest job waited 25 minutes.
    policy = load_policy(ITP_DEFAULT.parent / f"{name}.yaml")
    _assert_same(_replay_modes(policy, SAMPLE, 4), slept=True)


def _shared(name: str) -> Trace:
    try:
        return load_trace(name)
    except TraceError:
        pytest.skip(f"the {name} trace is not in the shared data")


def test_the_alibaba_trace_under_the_shipped_default():
    # Six 4-GPU nodes at most while a queue waits from day 109 on: most ticks only hold
    # (limits.max_nodes) or wait for a job's wait_slo deadline. Ticks of 5 minutes keep the
    # three replays short.
    full = _shared("alibaba")
    _assert_same(_replay_modes(load_policy(DEFAULT_POLICY_PATH), full, None, tick_s=300.0),
                 held=True, slept=True)


def test_days_30_to_32_of_philly_under_the_shipped_default():
    # 37 jobs, some wider than any burst node, queued for weeks: nearly every tick waits.
    full = _shared("philly")
    days = Trace("philly[30-32d]", tuple(j for j in full.jobs if 30 <= j.submit_s / 86400 < 32),
                 full.source)
    _assert_same(_replay_modes(load_policy(DEFAULT_POLICY_PATH), days, None, tick_s=300.0),
                 slept=True, idle=False)
