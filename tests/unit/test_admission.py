"""Admission of work onto burst nodes (``orchestrator.planner.admission``) and what the planner
counts with it (issue 13, findings 2, 5 and 7): a budget is a cap whatever its grades, a project's
work on another project's node is its spend and uses its quota, and a node that may not run a
pending job does not count as covering it (so it is drained once idle, never kept for it)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

from orchestrator.domain import BudgetSpend, Rule
from orchestrator.domain.snapshot import BurstRun
from orchestrator.planner import plan
from orchestrator.planner.admission import Admission, extension_usd, held_gpus
from orchestrator.planner.budgets import BudgetBook
from tests.builders import POLICY, T0, make_job, make_node, make_policy, make_snapshot

H = timedelta(hours=1)
M = timedelta(minutes=1)
# 8-GPU $10/h nodes; idle tail 10 min (idle_for) + 0 (cooldown)


def budgets(*specs: dict) -> list[dict]:
    return [dict(s) for s in specs]


def spend(name: str, usd: float) -> dict:
    return {f"{POLICY}/{name}": BudgetSpend(Decimal(repr(usd)))}


def idle_node(**kw):
    return make_node("n1", idle_since=T0 - 30 * M, state_since=T0 - H, **kw)


def test_grades_none_still_cap_work_on_a_node_already_up() -> None:
    """Finding 2: with grades [] a node already up took any work: now a job its budget cannot
    pay for is not counted as absorbed, the idle node is drained, and nothing launches."""
    policy = make_policy(budgets=budgets({"name": "pool", "limit_usd": 40, "grades": []}))
    job = make_job("j1", gpus=8, duration_s=3600)
    snapshot = make_snapshot([job], nodes=[idle_node()], budget_spend=spend("pool", 39.0))
    result = plan(snapshot, [policy], T0)
    [decision] = result.decisions
    assert [a.node_id for a in result.drains] == ["n1"], decision.summary
    assert result.launches == []
    assert decision.rule is Rule.LIMITED and decision.held_back_by == ("budgets[pool]",)


def test_only_no_new_launches_also_stops_dispatch_to_running_nodes() -> None:
    policy = make_policy(budgets=budgets({"name": "pool", "limit_usd": 40, "grades": [
        {"at_percent": 50, "action": "no-new-launches"}]}))
    book = BudgetBook.build(policy, make_snapshot(budget_spend=spend("pool", 25.0)), T0)
    verdict = Admission(policy, book, T0).check(make_job(gpus=1, duration_s=60), idle_node())
    assert not verdict.admitted and verdict.blocker == "budgets[pool]"


def test_a_job_within_the_budget_is_admitted_and_commits_the_node_extension() -> None:
    policy = make_policy(budgets=budgets({"name": "pool", "limit_usd": 40, "grades": []}))
    node = idle_node()  # created an hour ago, nothing committed
    book = BudgetBook.build(policy, make_snapshot(budget_spend=spend("pool", 10.0)), T0)
    admission = Admission(policy, book, T0)
    verdict = admission.admit(make_job(gpus=8, duration_s=1800), node)
    assert verdict.admitted
    # kept from its creation 1 h ago until 30 min of run + 10 min idle from now: 1h40 at $10/h
    assert verdict.extension_usd == Decimal("16.666667")
    assert book.states[0].tick == verdict.extension_usd
    # a second job at the same instant sees the first one's commitment
    assert not admission.check(make_job("j2", gpus=8, duration_s=3 * 3600), node).admitted


def test_a_node_whose_commitment_covers_the_job_commits_nothing_more() -> None:
    policy = make_policy()
    node = idle_node(budget_commit_usd=100.0)  # 10 h paid for
    assert extension_usd(policy, node, 3600, T0) == 0


def test_work_on_another_projects_node_is_checked_against_its_own_budget() -> None:
    """The production-path case: vision's $0.02 budget stops its job on research's node."""
    policy = make_policy(budgets=budgets({"name": "vision", "project": "vision",
                                          "limit_usd": 0.02, "grades": []}))
    book = BudgetBook.build(policy, make_snapshot(), T0)
    admission = Admission(policy, book, T0)
    node = idle_node(project="research")
    assert not admission.check(make_job(project="vision", gpus=8, duration_s=3600), node).admitted
    assert admission.check(make_job(project="research", gpus=8, duration_s=3600), node).admitted
    # 1/8 of $10/h for 60 s: $0.020834, just over; 50 s fits
    assert not admission.check(make_job(project="vision", gpus=1, duration_s=60), node).admitted
    assert admission.check(make_job(project="vision", gpus=1, duration_s=50), node).admitted


def test_a_running_foreign_job_counts_as_committed_for_its_project() -> None:
    policy = make_policy(budgets=budgets({"name": "vision", "project": "vision",
                                          "limit_usd": 10, "grades": []}))
    node = make_node("n1", project="research", state_since=T0 - H)
    run = BurstRun("j9", "vision", "n1", 4, T0 - 30 * M, 3600.0)  # 30 min left of 4/8 of $10/h
    book = BudgetBook.build(policy, replace(make_snapshot(nodes=[node]), burst_runs=(run,)), T0)
    assert book.states[0].runs == Decimal("2.5")
    assert book.inputs()["vision"]["committed_runs_usd"] == 2.5


def test_quotas_count_a_projects_work_on_anothers_node() -> None:
    """Finding 7: nlp's node running vision's work counted for nlp, holding nlp's own jobs back."""
    nlp_node = make_node("n1", project="nlp", gpus_busy=8, running_jobs=1)
    runs = (BurstRun("v1", "vision", "n1", 8, T0 - 10 * M, 3600.0),)
    assert held_gpus([nlp_node], runs) == {"nlp": 0, "vision": 8}
    policy = make_policy(projects=[{"name": "nlp", "max_burst_gpus": 8},
                                   {"name": "vision", "max_burst_gpus": 8}])
    snapshot = replace(make_snapshot([make_job("n-job", project="nlp", gpus=8)],
                                     nodes=[nlp_node]), burst_runs=runs)
    result = plan(snapshot, [policy], T0)
    assert [lc.project for lc in result.launches] == ["nlp"], result.decisions[0].summary
    # and vision, at its quota through nlp's node, may not take more of others' nodes
    admission = Admission(policy, None, T0, held_gpus([nlp_node], runs))
    other = make_node("n2", project="nlp")
    verdict = admission.check(make_job(project="vision", gpus=1), other)
    assert not verdict.admitted and verdict.blocker == "projects[vision].max_burst_gpus"
