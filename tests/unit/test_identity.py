"""Identity on jobs, without a store: user names, the Slurm source's project and user, and the
planner's decision inputs, which name whose work is unmet (project and user, null for none) and
treat a job of no project as its own bucket, never under a made-up name."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from orchestrator.domain.jobs import NO_PROJECT_LABEL, check_user
from orchestrator.planner import MAX_OWNER_SCAN, MAX_OWNERS_IN_RECORD, _owners, plan
from orchestrator.sources.slurm import job_project, job_user
from tests.builders import T0, make_job, make_policy, make_snapshot

M = timedelta(minutes=1)


@pytest.mark.parametrize("name", ["ada", "a.lovelace", "ada@example.org", "svc_train-1", "u+x"])
def test_user_names_that_burst_accepts(name: str) -> None:
    assert check_user(name) == name


@pytest.mark.parametrize("name", ["", " ada", "ada lovelace", "a,b", "-ada", "x" * 129, "é"])
def test_user_names_that_burst_refuses_say_what_one_is(name: str) -> None:
    with pytest.raises(ValueError, match="is not a user name"):
        check_user(name)


def test_slurm_project_is_the_account_else_the_qos_never_the_user() -> None:
    assert job_project({"account": "nlp", "qos": "high", "user_name": "ada"}) == "nlp"
    assert job_project({"account": "", "qos": "high", "user_name": "ada"}) == "high"
    assert job_project({"account": "", "qos": "", "user_name": "ada"}) is None
    assert job_user({"user_name": "ada"}) == "ada"
    assert job_user({"user_name": ""}) is None and job_user({}) is None


def _jobs():
    return [make_job("a1", gpus=8, project="research", user="ada", wait=9 * M),
            make_job("a2", gpus=8, project="research", user="ada", wait=8 * M),
            make_job("b1", gpus=8, project="research", user="bob", wait=7 * M),
            make_job("n1", gpus=8, project=None, user="carol", wait=6 * M),
            make_job("u1", gpus=8, project=None, user=None, wait=5 * M)]


def test_decision_inputs_name_the_unmet_work_per_project_and_user() -> None:
    policy = make_policy()
    result = plan(make_snapshot(_jobs()), [policy], T0)
    decision = result.decisions[0]
    assert str(decision.rule) == "scale-up"
    inputs = decision.inputs
    assert inputs["unmet_gpus_by_project"] == {"research": 24, NO_PROJECT_LABEL: 16}
    assert inputs["unmet_by_owner"] == [
        {"project": "research", "user": "ada", "gpus": 16, "jobs": 2},
        {"project": "research", "user": "bob", "gpus": 8, "jobs": 1},
        {"project": None, "user": "carol", "gpus": 8, "jobs": 1},
        {"project": None, "user": None, "gpus": 8, "jobs": 1}]
    assert inputs["unmet_owners_omitted"] == 0 and inputs["unmet_owner_jobs_counted"] == 5
    # The record is JSON as it is stored and served: nulls stay nulls.
    assert json.loads(json.dumps(inputs))["unmet_by_owner"][3] == {
        "project": None, "user": None, "gpus": 8, "jobs": 1}
    # A launch for work of no project is for no project (not "None", not a user's name).
    assert {a.project for a in result.launches} <= {"research", None}


def test_a_project_quota_does_not_apply_to_work_of_no_project() -> None:
    policy = make_policy(projects=[{"name": "research", "max_burst_gpus": 0}])
    result = plan(make_snapshot(_jobs()), [policy], T0)
    assert result.launches and {a.project for a in result.launches} == {None}
    assert "projects[research].max_burst_gpus" in result.decisions[0].held_back_by


def test_the_owners_listed_are_capped_and_the_rest_counted() -> None:
    jobs = [make_job(f"j{i}", gpus=1, user=f"u{i:03d}", wait=M) for i in range(60)]
    inputs = plan(make_snapshot(jobs), [make_policy()], T0).decisions[0].inputs
    assert len(inputs["unmet_by_owner"]) == MAX_OWNERS_IN_RECORD
    assert inputs["unmet_owners_omitted"] == 60 - MAX_OWNERS_IN_RECORD
    assert inputs["unmet_by_owner"][0]["user"] == "u000"  # equal GPUs: by name


def test_a_project_budget_does_not_hold_work_of_no_project_but_a_pool_budget_does() -> None:
    from decimal import Decimal

    from orchestrator.domain import BudgetSpend

    window = (T0.replace(day=1, hour=0), T0.replace(month=4, day=1, hour=0))
    jobs = [make_job("r1", gpus=8, project="research", duration_s=3600.0),
            make_job("n1", gpus=8, project=None, user="carol", duration_s=3600.0)]
    research = {"name": "research-monthly", "limit_usd": 100, "project": "research"}
    pool = {"name": "pool-monthly", "limit_usd": 100}

    def run(budget: dict):
        spend = {f"{make_policy().name}/{budget['name']}": BudgetSpend(
            Decimal("100"), Decimal(0), *window)}  # spent up to its limit
        return plan(make_snapshot(jobs, budget_spend=spend), [make_policy(budgets=[budget])], T0)

    held = run(research)
    assert {a.project for a in held.launches} == {None}  # the work of no project still bursts
    assert held.decisions[0].held_back_by == ("budgets[research-monthly]",)
    stopped = run(pool)
    assert stopped.launches == [] and stopped.decisions[0].held_back_by == (
        "budgets[pool-monthly]",)


def test_a_snapshot_carries_jobs_of_no_project_and_their_users_and_names_a_bad_user() -> None:
    from orchestrator.domain.snapshot_json import (
        SnapshotError,
        load_snapshot_text,
        snapshot_to_json,
    )

    snap = make_snapshot([make_job("a", project=None, user="ada@example.org")])
    loaded = load_snapshot_text(json.dumps(snapshot_to_json(snap)), "f.json")
    [job] = next(iter(loaded.queues.values())).pending
    assert (job.project, job.user) == (None, "ada@example.org")
    bad = make_snapshot([make_job("b", user="x y")])
    with pytest.raises(SnapshotError, match=r"f\.json: queues\.\w+\.pending\.0\.user: "):
        load_snapshot_text(json.dumps(snapshot_to_json(bad)), "f.json")


def test_a_long_queue_counts_the_owners_of_the_jobs_served_first() -> None:
    first = [make_job(f"a{i}", gpus=2, user="ada") for i in range(MAX_OWNER_SCAN)]
    rest = [make_job("z", gpus=8, user="zed")]
    rows, omitted, counted = _owners(tuple(first + rest))
    assert counted == MAX_OWNER_SCAN and omitted == 0
    assert rows == [{"project": "research", "user": "ada", "gpus": 2 * MAX_OWNER_SCAN,
                     "jobs": MAX_OWNER_SCAN}]


def test_explain_shows_whose_work_is_unmet_on_one_line() -> None:
    from orchestrator.cli.plan_cmd import owners_text

    inputs = plan(make_snapshot(_jobs()), [make_policy()], T0).decisions[0].inputs
    assert owners_text(inputs["unmet_by_owner"]) == (
        "research/ada 16 GPUs (2 jobs), research/bob 8 GPUs (1 jobs), "
        "(no project)/carol 8 GPUs (1 jobs), (no project)/(no user) 8 GPUs (1 jobs)")
    assert owners_text([]) == "-" and owners_text("odd") == "odd"
