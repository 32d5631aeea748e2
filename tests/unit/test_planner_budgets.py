"""The planner with budgets, quotas and fair share, scenario by scenario.

Base policy of ``tests.builders``: one 8-GPU on-demand offering at $10/h, no hysteresis, idle_for
10m; the default ``budget_commitment`` (overhead 10m, default runtime 1h). So a node launched for
a 1 h job commits $10 x 80 min = $13.333334, for a 2 h job $23.333334.
"""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest

from orchestrator.domain import BudgetSpend, Launch, NodeState, PolicyMemory, Rule
from orchestrator.domain.plan import ActionReason
from orchestrator.domain.snapshot_json import SnapshotError, load_snapshot_text, snapshot_to_json
from orchestrator.planner import plan
from orchestrator.planner.budgets import window_bounds
from orchestrator.planner.scaleup import MULTI_NODE
from orchestrator.policy import Market
from tests.builders import (
    POLICY,
    T0,
    make_job,
    make_node,
    make_offering,
    make_policy,
    make_snapshot,
    offering_spec,
)

S = NodeState
M = timedelta(minutes=1)
H = timedelta(hours=1)
D = Decimal
ONE_HOUR = D("13.333334")  # commitment of a node launched for a 1 h job
MONTH = (T0.replace(day=1, hour=0), T0.replace(month=4, day=1, hour=0))  # T0 is 2025-03-01 12:00


def job(i: int, gpus: int = 8, project: str = "research", hours: float | None = 1.0, **kw):
    return make_job(f"j{i}", gpus=gpus, project=project,
                    submitted_at=T0 - 10 * M + timedelta(seconds=i),
                    duration_s=None if hours is None else hours * 3600, **kw)


def budget(name: str = "research-monthly", limit: float = 100, project: str | None = "research",
           **extra) -> dict:
    out = {"name": name, "limit_usd": limit, **extra}
    if project is not None:
        out["project"] = project
    return out


def spent(usd: float, name: str = "research-monthly", window=MONTH) -> dict[str, BudgetSpend]:
    return {f"{POLICY}/{name}": BudgetSpend(D(str(usd)), D(0), *window)}


def run(jobs=(), nodes=(), budgets=(), spend=None, **policy):
    p = make_policy(budgets=list(budgets), **policy)
    result = plan(make_snapshot(jobs, nodes=nodes, budget_spend=spend), [p], T0)
    [decision] = result.decisions
    return result, decision


# -- commitments -----------------------------------------------------------------------------------

def test_every_launch_carries_its_commitment_and_jobs() -> None:
    result, decision = run([job(0, hours=2), job(1, hours=None)])
    assert [(lc.budget_commit_usd, lc.jobs) for lc in result.launches] == [
        (23.333334, ("j0",)), (13.333334, ("j1",))]  # no duration: the 1 h default
    assert "budgets" not in decision.inputs  # no budget, nothing recorded about budgets


def test_jobs_sharing_a_node_commit_the_longest_runtime() -> None:
    result, _ = run([job(0, 4, hours=1), job(1, 4, hours=3)])
    [launch] = result.launches
    assert launch.jobs == ("j0", "j1")
    assert launch.budget_commit_usd == 33.333334  # 3 h + overhead + idle tail


def test_default_runtime_comes_from_the_policy() -> None:
    result, _ = run([job(0, hours=None)], budget_commitment={"default_runtime": "3h"})
    assert result.launches[0].budget_commit_usd == 33.333334


def test_a_job_wider_than_one_node_commits_nothing() -> None:
    result, decision = run([job(0, 16, hours=1)])
    assert result.launches == [] and decision.held_back_by == (MULTI_NODE,)


def test_min_nodes_commit_the_default_runtime() -> None:
    result, _ = run(limits={"min_nodes": 1})
    assert [lc.budget_commit_usd for lc in result.launches] == [13.333334]


# -- the check a launch must pass ------------------------------------------------------------------

def test_launch_needs_room_for_its_commitment() -> None:
    result, decision = run([job(0, hours=2)], budgets=[budget(limit=20)])
    assert result.launches == []
    assert decision.rule is Rule.LIMITED
    assert decision.held_back_by == ("budgets[research-monthly]",)
    record = decision.inputs["budgets"]["research-monthly"]
    assert record["limit_usd"] == 20 and record["spent_usd"] == 0 and record["grade"] is None
    assert record["committed_usd"] == 0 and record["committed_this_tick_usd"] == 0


def test_spent_and_live_commitments_count() -> None:
    node = make_node("n1", created_at=T0, gpus_busy=8, running_jobs=1, budget_commit_usd=20)
    room = budget(limit=50)
    held, decision = run([job(0)], [node], [room], spent(20))  # 20 + 20 + 13.33 > 50
    assert held.launches == [] and decision.held_back_by == ("budgets[research-monthly]",)
    record = decision.inputs["budgets"]["research-monthly"]
    assert (record["spent_usd"], record["committed_usd"], record["remaining_usd"]) == (20, 20, 10)
    fits, decision = run([job(0)], [node], [room], spent(16))  # 16 + 20 + 13.33 <= 50
    assert len(fits.launches) == 1
    assert decision.inputs["budgets"]["research-monthly"]["committed_this_tick_usd"] == 13.333334


def test_a_node_that_spent_part_of_its_commitment_owes_the_rest() -> None:
    # launched 30 min ago at $10/h, committed $20: $5 is in the spend, $15 still owed
    node = make_node("n1", created_at=T0 - 30 * M, gpus_busy=8, running_jobs=1, budget_commit_usd=20)
    result, decision = run([job(0)], [node], [budget(limit=33)], spent(5))
    assert result.launches == []  # 5 + 15 + 13.33 > 33
    assert decision.inputs["budgets"]["research-monthly"]["committed_usd"] == 15
    result, _ = run([job(0)], [node], [budget(limit=34)], spent(5))
    assert len(result.launches) == 1  # 5 + 15 + 13.33 <= 34


def test_this_ticks_launches_commit_in_turn() -> None:
    result, decision = run([job(i) for i in range(3)], budgets=[budget(limit=30)])
    assert len(result.launches) == 2  # 13.33 + 13.33 fit in 30, a third does not
    assert decision.rule is Rule.SCALE_UP
    assert decision.held_back_by == ("budgets[research-monthly]",)


def test_a_longer_job_cannot_stretch_a_node_past_the_budget() -> None:
    result, decision = run([job(0, 4, hours=1), job(1, 4, hours=3)], budgets=[budget(limit=20)])
    [launch] = result.launches
    assert launch.jobs == ("j0",) and launch.budget_commit_usd == 13.333334
    assert decision.held_back_by == ("budgets[research-monthly]",)


def test_a_project_budget_holds_back_only_its_project() -> None:
    result, decision = run([job(0), job(1, project="prod")], budgets=[budget(limit=5)])
    assert [lc.project for lc in result.launches] == ["prod"]
    assert decision.held_back_by == ("budgets[research-monthly]",)


def test_a_pool_budget_covers_every_project_and_other_policies_nodes() -> None:
    other = make_node("o1", policy="other", project="prod", created_at=T0, gpus_busy=8,
                      running_jobs=1, budget_commit_usd=30)
    result, decision = run([job(0), job(1, project="prod")], [other],
                           [budget("pool-daily", limit=45, project=None, window="day")],
                           spent(0, "pool-daily", (T0.replace(hour=0), T0.replace(day=2, hour=0))))
    assert len(result.launches) == 1  # 30 + 13.33 fits, + 13.33 more does not
    assert decision.held_back_by == ("budgets[pool-daily]",)
    assert decision.inputs["budgets"]["pool-daily"]["committed_usd"] == 30


def test_earlier_policies_launches_commit_against_the_same_pool() -> None:
    first = make_policy(name="first", budgets=[budget("pool", limit=20, project=None)])
    second = make_policy(name="second", budgets=[budget("pool", limit=20, project=None)])
    result = plan(make_snapshot([job(0)]), [first, second], T0)
    # both see the same pending job; the second's budget counts the first's commitment
    assert [lc.policy for lc in result.launches] == ["first"]
    assert result.decisions[1].held_back_by == ("budgets[pool]",)


def test_hourly_burn_cap() -> None:
    busy = make_node("n1", created_at=T0, gpus_busy=8, running_jobs=1)
    result, decision = run([job(0)], [busy], [budget(max_hourly_burn_usd=15)])
    assert result.launches == []
    assert decision.held_back_by == ("budgets[research-monthly].max_hourly_burn_usd",)
    assert decision.inputs["budgets"]["research-monthly"]["burn_usd_hour"] == 10
    result, _ = run([job(0)], [busy], [budget(max_hourly_burn_usd=20)])
    assert len(result.launches) == 1


def test_spend_of_another_window_does_not_count() -> None:
    last_month = (MONTH[0].replace(month=2), MONTH[0])
    result, decision = run([job(0)], budgets=[budget(limit=20)], spend=spent(500, window=last_month))
    assert len(result.launches) == 1
    record = decision.inputs["budgets"]["research-monthly"]
    assert record["spend_observed"] is False and record["spent_usd"] == 0
    assert record["window"] == ["2025-03-01T00:00:00Z", "2025-04-01T00:00:00Z"]


def test_zero_budget_never_launches() -> None:
    result, decision = run([job(0)], budgets=[budget(limit=0)])
    assert result.launches == [] and decision.held_back_by == ("budgets[research-monthly]",)


# -- grades ----------------------------------------------------------------------------------------

def test_warn_is_recorded() -> None:
    result, decision = run([job(0)], budgets=[budget(limit=100)], spend=spent(75))
    assert len(result.launches) == 1  # 75 + 13.33 still fits
    # the record is of the end of the tick, this launch's commitment included
    assert decision.inputs["budgets"]["research-monthly"]["grade"] == "warn"
    assert "budget research-monthly at 88.3% (warn)" in decision.summary


def test_spot_only_grade_keeps_on_demand_out() -> None:
    offerings = [offering_spec("g8", price=10), offering_spec("g8s", price=11, market="spot")]
    roomy = budget(limit=200)
    cheap, _ = run([job(0)], budgets=[roomy], spend=spent(100), offerings=offerings)
    assert [lc.offering.market for lc in cheap.launches] == [Market.ON_DEMAND]
    result, decision = run([job(0)], budgets=[roomy], spend=spent(180), offerings=offerings)
    assert [lc.offering.market for lc in result.launches] == [Market.SPOT]
    assert decision.inputs["budgets"]["research-monthly"]["grade"] == "spot-only"
    assert "budgets[research-monthly]" in decision.held_back_by  # it kept on-demand out
    only_on_demand, decision = run([job(0)], budgets=[roomy], spend=spent(180))
    assert only_on_demand.launches == [] and decision.rule is Rule.LIMITED
    assert decision.held_back_by == ("budgets[research-monthly]",)


def test_pool_spot_only_applies_to_min_nodes_too() -> None:
    offerings = [offering_spec("g8", price=10), offering_spec("g8s", price=11, market="spot")]
    result, _ = run(budgets=[budget("pool", limit=200, project=None)], spend=spent(182, "pool"),
                    offerings=offerings, limits={"min_nodes": 1})
    assert [(lc.offering.market, lc.reason) for lc in result.launches] == [
        (Market.SPOT, ActionReason.MIN_NODES)]


def test_no_new_launches_at_100_percent_without_draining() -> None:
    ready = make_node("n1", created_at=T0 - H, gpus_busy=8, running_jobs=1)
    result, decision = run([job(0)], [ready], [budget()], spent(100))
    assert result.launches == [] and result.drains == []
    assert decision.inputs["budgets"]["research-monthly"]["grade"] == "no-new-launches"
    assert decision.held_back_by == ("budgets[research-monthly]",)


def test_past_100_percent_drains_the_projects_ready_nodes() -> None:
    nodes = [
        make_node("busy", created_at=T0 - H, gpus_busy=8, running_jobs=1),
        make_node("idle", created_at=T0 - H, idle_since=T0 - M),
        make_node("boot", state=S.BOOTING, created_at=T0 - M),
        make_node("prod", project="prod", created_at=T0 - H, gpus_busy=8, running_jobs=1),
        make_node("gone", state=S.DRAINING, drain_deadline=T0 + M, running_jobs=1, gpus_busy=8),
    ]
    result, decision = run([job(0)], nodes, [budget()], spent(100.01))
    assert sorted((d.node_id, d.reason) for d in result.drains) == [
        ("busy", ActionReason.BUDGET), ("idle", ActionReason.BUDGET)]
    # the existing drain path: running work is waited for, up to drain_grace
    assert {d.deadline for d in result.drains} == {T0 + timedelta(minutes=15)}
    assert result.launches == []
    assert decision.inputs["budgets"]["research-monthly"]["grade"] == "drain"
    assert "draining 2 node(s) past budget research-monthly" in decision.summary
    assert len(decision.actions) == len(result.actions)


def test_a_pool_budget_past_its_limit_drains_every_ready_node_of_the_policy() -> None:
    nodes = [make_node("a", project="research", created_at=T0 - H),
             make_node("b", project=None, created_at=T0 - H),
             make_node("c", policy="other", created_at=T0 - H)]  # another policy's: not ours
    result, _ = run(budgets=[budget("pool", project=None, limit=10)], nodes=nodes,
                    spend=spent(10.5, "pool"))
    assert sorted(d.node_id for d in result.drains) == ["a", "b"]


def test_commitments_alone_can_reach_a_grade() -> None:
    # nothing spent yet, but a booting node committed 95 of 100: spot-only already
    node = make_node("n1", state=S.BOOTING, created_at=T0, budget_commit_usd=95)
    _, decision = run(nodes=[node], budgets=[budget()])
    assert decision.inputs["budgets"]["research-monthly"]["grade"] == "spot-only"


# -- fair share ------------------------------------------------------------------------------------

def _by_project(result) -> dict[str, int]:
    out: dict[str, int] = {}
    for lc in result.launches:
        out[lc.project] = out.get(lc.project, 0) + 1
    return out


def test_equal_priority_projects_share_when_a_pool_limit_binds() -> None:
    jobs = [job(0), job(1), job(2), job(3, project="prod"), job(4, project="prod")]
    result, decision = run(jobs, limits={"max_nodes": 2})
    assert _by_project(result) == {"research": 1, "prod": 1}  # not research's two oldest
    assert decision.held_back_by == ("limits.max_nodes",)


def test_water_filling_counts_what_projects_already_hold() -> None:
    held = [make_node(f"r{i}", gpus_busy=8, running_jobs=1) for i in range(2)]  # research: 16
    jobs = [job(0), job(1), job(2, project="prod"), job(3, project="prod"), job(4, project="prod")]
    result, _ = run(jobs, held, limits={"max_nodes": 5})
    assert _by_project(result) == {"prod": 2, "research": 1}  # prod up to 16, then the oldest


def test_weights_skew_the_share() -> None:
    jobs = [job(i) for i in range(4)] + [job(10 + i, project="prod") for i in range(4)]
    projects = [{"name": "research", "weight": 2}, {"name": "prod", "weight": 1}]
    result, _ = run(jobs, projects=projects, limits={"max_nodes": 3})
    assert _by_project(result) == {"research": 2, "prod": 1}


def test_without_a_binding_limit_everyone_is_served_in_submit_order() -> None:
    jobs = [job(0), job(1), job(2, project="prod")]
    result, decision = run(jobs)
    assert [lc.project for lc in result.launches] == ["research", "research", "prod"]
    assert decision.held_back_by == ()


def test_priority_still_comes_before_fair_share() -> None:
    jobs = [job(0), job(1), job(2, project="prod"), job(3, project="ops")]
    projects = [{"name": "ops", "priority": 5}]
    result, _ = run(jobs, projects=projects, limits={"max_nodes": 3})
    assert _by_project(result) == {"ops": 1, "research": 1, "prod": 1}


def test_a_quota_bound_project_leaves_its_share_to_others() -> None:
    jobs = [job(0), job(1)] + [job(2 + i, project="prod") for i in range(4)]
    projects = [{"name": "research", "max_burst_gpus": 8}]
    result, decision = run(jobs, projects=projects, limits={"max_nodes": 4})
    assert _by_project(result) == {"research": 1, "prod": 3}
    assert set(decision.held_back_by) == {"projects[research].max_burst_gpus", "limits.max_nodes"}


# -- the snapshot carries spend --------------------------------------------------------------------

def test_budget_spend_round_trips_through_the_snapshot_json() -> None:
    b = make_policy(budgets=[budget()]).budgets[0]
    start, end = window_bounds(b, T0)
    snapshot = make_snapshot([job(0)], budget_spend={
        f"{POLICY}/research-monthly": BudgetSpend(D("99.5"), D("12.25"), start, end)})
    text = json.dumps(snapshot_to_json(snapshot))
    again = load_snapshot_text(text)
    assert again.budget_spend == snapshot.budget_spend
    result = plan(again, [make_policy(budgets=[budget()])], T0)
    assert result.launches == []  # 99.5 spent: the 100 limit has no room for 13.33


def test_snapshot_budget_spend_times_need_a_timezone() -> None:
    data = snapshot_to_json(make_snapshot())
    data["budget_spend"] = {"train/b": {"spent_usd": "1", "window_start": "2025-03-01T00:00:00"}}
    with pytest.raises(SnapshotError, match="budget_spend.train/b.window_start: times need a timezone"):
        load_snapshot_text(json.dumps(data), "s.json")


def test_launch_types_are_unchanged_for_the_executor() -> None:
    result, _ = run([job(0)])
    [launch] = result.launches
    assert isinstance(launch, Launch) and launch.offering == make_offering("g8")


def test_the_scale_down_cooldown_holds_a_budgeted_idle_node_only_so_long() -> None:
    # the pool launched a minute ago (cooldown 5m), the node has idled an hour: a budget paid
    # for idle_for + the cooldown of idling, so it goes; without a budget the cooldown holds it
    memory = {POLICY: PolicyMemory(last_launch_at=T0 - M)}
    idle = make_node("n1", created_at=T0 - 2 * H, idle_since=T0 - H)
    policy = {"cooldowns": {"scale_down": "5m"}}
    held = plan(make_snapshot(nodes=[idle], memory=memory), [make_policy(**policy)], T0)
    assert held.drains == []
    budgeted = make_policy(budgets=[budget()], **policy)
    result = plan(make_snapshot(nodes=[idle], memory=memory), [budgeted], T0)
    assert [(d.node_id, d.reason) for d in result.drains] == [("n1", ActionReason.IDLE)]
    recent = make_node("n1", created_at=T0 - 2 * H, idle_since=T0 - 14 * M)  # < 10m + 5m
    result = plan(make_snapshot(nodes=[recent], memory=memory), [budgeted], T0)
    assert result.drains == []


def test_the_idle_tail_includes_the_scale_down_cooldown() -> None:
    result, _ = run([job(0)], cooldowns={"scale_down": "5m"})
    assert result.launches[0].budget_commit_usd == 14.166667  # 10m + 1h + 10m + 5m at $10/h


def test_the_worked_example_of_docs_budgets() -> None:
    """docs/budgets.md, "Fair share: a worked example"."""
    projects = [{"name": "ops", "priority": 20}, {"name": "research", "priority": 10},
                {"name": "vision", "priority": 10, "weight": 2}]
    held = [make_node("r1", project="research", gpus_busy=8, running_jobs=1)]
    jobs = ([job(i, project="research") for i in range(4)]
            + [job(10 + i, project="vision") for i in range(4)] + [job(20, project="ops")])
    result, decision = run(jobs, held, projects=projects, limits={"max_nodes": 5})
    assert [lc.project for lc in result.launches] == ["ops", "vision", "vision", "research"]
    assert decision.held_back_by == ("limits.max_nodes",)


def test_a_launch_never_takes_its_budget_into_draining() -> None:
    grades = [{"at_percent": 50, "action": "warn"}, {"at_percent": 60, "action": "drain"}]
    result, decision = run([job(0)], budgets=[budget(limit=100, grades=grades)], spend=spent(50))
    assert result.launches == []  # 50 + 13.33 is past 60%: it would drain what it launched
    assert decision.held_back_by == ("budgets[research-monthly]",)
    result, _ = run([job(0)], budgets=[budget(limit=100, grades=grades)], spend=spent(46))
    assert len(result.launches) == 1  # 46 + 13.33 is under 60%
