"""Unit tests of the budget maths (``orchestrator.planner.budgets``) and the budget policy model:
windows at their boundaries, grades, commitments and outstanding commitments."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.domain import BillingRule, NodeState
from orchestrator.planner.budgets import (
    accrued_usd,
    commitment_usd,
    grade_in_force,
    job_runtime_s,
    outstanding_of,
    outstanding_usd,
    used_percent,
    window_bounds,
)
from orchestrator.policy import PolicyError, load_policy, load_policy_text
from orchestrator.policy.models import BudgetAction
from tests.builders import T0, make_node, make_offering, make_policy

D = Decimal


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def budget(**fields):
    return make_policy(budgets=[{"name": "b", "limit_usd": 100, **fields}]).budgets[0]


# -- windows ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("window, now, start, end", [
    ("day", utc(2025, 3, 1, 12), utc(2025, 3, 1), utc(2025, 3, 2)),
    ("day", utc(2025, 3, 1), utc(2025, 3, 1), utc(2025, 3, 2)),  # start is inclusive
    ("day", utc(2025, 3, 1, 23, 59, 59), utc(2025, 3, 1), utc(2025, 3, 2)),
    ("week", utc(2025, 3, 1, 12), utc(2025, 2, 24), utc(2025, 3, 3)),  # a Saturday: from Monday
    ("week", utc(2025, 3, 3), utc(2025, 3, 3), utc(2025, 3, 10)),  # Monday 00:00 starts one
    ("month", utc(2025, 3, 1, 12), utc(2025, 3, 1), utc(2025, 4, 1)),
    ("month", utc(2024, 2, 29, 23, 59, 59), utc(2024, 2, 1), utc(2024, 3, 1)),  # leap February
    ("month", utc(2025, 2, 28, 23), utc(2025, 2, 1), utc(2025, 3, 1)),
    ("month", utc(2025, 12, 31, 23, 59), utc(2025, 12, 1), utc(2026, 1, 1)),  # year boundary
    ("month", utc(2025, 4, 1), utc(2025, 4, 1), utc(2025, 5, 1)),  # end is exclusive
    # a local time is placed by its UTC instant: 23:30 at -02:00 on March 31st is April in UTC
    ("month", datetime(2025, 3, 31, 23, 30, tzinfo=timezone(timedelta(hours=-2))),
     utc(2025, 4, 1), utc(2025, 5, 1)),
])
def test_calendar_windows_in_utc(window: str, now: datetime, start: datetime, end: datetime) -> None:
    assert window_bounds(budget(window=window), now) == (start, end)


@pytest.mark.parametrize("now, start, end", [
    (utc(2026, 1, 1), utc(2026, 1, 1), utc(2026, 1, 15)),  # the anchor starts a window
    (utc(2026, 1, 20, 7), utc(2026, 1, 15), utc(2026, 1, 29)),
    (utc(2026, 1, 28, 23, 59), utc(2026, 1, 15), utc(2026, 1, 29)),
    (utc(2026, 1, 29), utc(2026, 1, 29), utc(2026, 2, 12)),
    (utc(2025, 12, 31, 23), utc(2025, 12, 18), utc(2026, 1, 1)),  # before the anchor too
    (utc(2025, 6, 1), utc(2025, 5, 22), utc(2025, 6, 5)),
])
def test_custom_windows_run_back_to_back_from_the_anchor(now, start, end) -> None:
    b = budget(window="custom", period="14d", starts="2026-01-01T00:00:00Z")
    assert window_bounds(b, now) == (start, end)


def test_custom_anchor_with_an_offset_is_taken_at_its_utc_instant() -> None:
    b = budget(window="custom", period="1d", starts="2026-01-01T02:00:00+02:00")  # 00:00 UTC
    assert window_bounds(b, utc(2026, 3, 5, 13)) == (utc(2026, 3, 5), utc(2026, 3, 6))


@pytest.mark.parametrize("fields, path, fragment", [
    ({"window": "custom"}, "budgets[0].period", "needs a period"),
    ({"window": "custom", "period": "14d"}, "budgets[0].starts", "needs starts"),
    ({"window": "custom", "period": "14d", "starts": "2026-01-01T00:00:00"},
     "budgets[0].starts", "timezone"),
    ({"window": "custom", "period": "90m", "starts": "2026-01-01T00:00:00Z"},
     "budgets[0].period", "whole number of hours"),
    ({"window": "custom", "period": "1d", "starts": "2026-01-01T00:30:00Z"},
     "budgets[0].starts", "whole UTC hour"),
    ({"period": "14d"}, "budgets[0].period", "only applies to window: custom"),
    ({"window": "day", "starts": "2026-01-01T00:00:00Z"}, "budgets[0].starts", "only applies"),
    ({"window": "fortnight"}, "budgets[0].window", "'day', 'week', 'month' or 'custom'"),
    ({"limit_usd": "$100"}, "budgets[0].limit_usd", "no currency sign"),
    ({"grades": [{"at_percent": 0, "action": "warn"}]}, "budgets[0].grades[0].at_percent",
     "greater than 0"),
    ({"grades": [{"at_percent": 90, "action": "warn"}, {"at_percent": 80, "action": "drain"}]},
     "budgets[0].grades[1].at_percent", "ascending"),
    ({"grades": [{"at_percent": 90, "action": "warn"}, {"at_percent": 90, "action": "spot-only"}]},
     "budgets[0].grades[1].at_percent", "only a drain grade may repeat"),
    ({"grades": [{"at_percent": 80, "action": "no-new-launches"},
                 {"at_percent": 90, "action": "warn"}]},
     "budgets[0].grades[1].action", "milder"),
    ({"grades": [{"at_percent": 80, "action": "panic"}]}, "budgets[0].grades[0].action", "'warn'"),
    ({"project": "Research"}, "budgets[0].project", "not a valid name"),
])
def test_bad_budgets_name_the_field(fields: dict, path: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        budget(**fields)
    [problem] = info.value.problems
    assert problem.path == path
    assert fragment in problem.message, problem.message


def test_budget_names_are_unique() -> None:
    with pytest.raises(PolicyError) as info:
        make_policy(budgets=[{"name": "b", "limit_usd": 1}, {"name": "b", "limit_usd": 2}])
    [problem] = info.value.problems
    assert problem.path == "budgets[1].name" and "duplicate budget 'b'" in problem.message


def test_defaults() -> None:
    b = budget()
    assert b.window == "month" and b.project is None and b.max_hourly_burn_usd is None
    assert [(g.at_percent, g.action) for g in b.grades] == [
        (80, BudgetAction.WARN), (90, BudgetAction.SPOT_ONLY),
        (100, BudgetAction.NO_NEW_LAUNCHES), (100, BudgetAction.DRAIN)]
    policy = make_policy()
    assert policy.budgets == []
    assert policy.budget_commitment.default_runtime == timedelta(hours=1)
    assert policy.budget_commitment.overhead == timedelta(minutes=10)
    assert policy.project_weight("anyone") == 1.0


# -- grades ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("percent, action", [
    ("0", None), ("79.999", None), ("80", "warn"), ("89.9", "warn"), ("90", "spot-only"),
    ("99.99", "spot-only"), ("100", "no-new-launches"), ("100.000001", "drain"), ("250", "drain"),
    ("Infinity", "drain"),
])
def test_default_grades(percent: str, action: str | None) -> None:
    grade = grade_in_force(budget().grades, D(percent))
    assert (grade.action if grade else None) == action


def test_custom_grades_and_an_empty_list() -> None:
    b = budget(grades=[{"at_percent": 50, "action": "spot-only"}, {"at_percent": 75, "action": "drain"}])
    assert grade_in_force(b.grades, D(75)).action is BudgetAction.SPOT_ONLY  # drain: strictly past
    assert grade_in_force(b.grades, D("75.5")).action is BudgetAction.DRAIN
    assert grade_in_force(budget(grades=[]).grades, D(500)) is None


def test_used_percent() -> None:
    assert used_percent(D(45), D(60)) == 75
    assert used_percent(D(0), D(0)) == 0  # a zero budget nothing has used
    assert used_percent(D("0.01"), D(0)).is_infinite()


# -- commitments -----------------------------------------------------------------------------------

def test_commitment_is_price_times_overhead_runtime_and_idle_tail() -> None:
    policy = make_policy()  # overhead 10m, idle_for 10m
    g8 = make_offering("g8", price=10)
    assert commitment_usd(policy, g8, 3600) == D("13.333334")  # 80 min, rounded up
    assert commitment_usd(policy, g8, 2 * 3600) == D("23.333334")
    assert commitment_usd(policy, g8, 0) == D("3.333334")
    short = make_policy(scale_down={"idle_for": "1m"}, budget_commitment={"overhead": "0s"})
    assert commitment_usd(short, g8, 0) == D("0.166667")


def test_commitment_covers_the_minimum_billing_and_increment() -> None:
    policy = make_policy(scale_down={"idle_for": "1m"}, budget_commitment={"overhead": "0s"})
    g8 = make_offering("g8", price=10)
    hourly_minimum = replace(g8, billing=BillingRule(minimum_s=3600))
    assert commitment_usd(policy, hourly_minimum, 60) == D(10)  # 2 min billed as an hour
    per_hour = replace(g8, billing=BillingRule(minimum_s=60, increment_s=3600))
    assert commitment_usd(policy, per_hour, 3600 + 1) == D(20)  # 1h02m billed as two hours


def test_job_runtime_defaults_to_the_policy() -> None:
    policy = make_policy(budget_commitment={"default_runtime": "2h"})
    assert job_runtime_s(policy, None) == 7200
    assert job_runtime_s(policy, 0) == 7200
    assert job_runtime_s(policy, 90.0) == 90


def test_outstanding_commitment_of_live_nodes() -> None:
    young = make_node("n1", created_at=T0 - timedelta(minutes=30), budget_commit_usd=13.333334)
    assert accrued_usd(young, T0) == 5
    assert outstanding_usd(young, T0) == D("8.333334")
    old = make_node("n2", created_at=T0 - timedelta(hours=5), budget_commit_usd=13.333334)
    assert outstanding_usd(old, T0) == 0  # outlived its commitment: owes nothing more here
    asked = make_node("n3", state=NodeState.REQUESTED, created_at=T0 - timedelta(minutes=5),
                      budget_commit_usd=7.5)
    assert outstanding_usd(asked, T0) == D("7.5")  # not launched yet: nothing accrued
    gone = make_node("n4", state=NodeState.TERMINATED, created_at=T0, budget_commit_usd=7.5)
    assert outstanding_usd(gone, T0) == 0
    legacy = make_node("n5", created_at=T0)  # launched before commitments were recorded
    assert outstanding_usd(legacy, T0) == 0


_PRICES = st.floats(-5.0, 200.0, allow_nan=False) | st.sampled_from([0.0, 4.1, 32.77, 98.32])
_COMMITS = st.floats(-1.0, 500.0, allow_nan=False) | st.sampled_from([0.0, 13.333334, 7.5])


@given(st.sampled_from(list(NodeState)), _COMMITS, _PRICES,
       st.floats(-3600.0, 400_000.0, allow_nan=False) | st.sampled_from([0.0, 1800.0, 3600.0]))
def test_outstanding_of_is_the_exact_decimal_sum_whatever_its_shortcuts(
        state: NodeState, commit: float, price: float, age_s: float) -> None:
    # The shortcuts (no commitment; accrued past it by a float margin) give the exact answer:
    # max(commit - price x age, 0) in Decimals, 0 for states that do not count.
    created = T0 - timedelta(seconds=age_s)
    got = outstanding_of(state, commit, price, created, T0)
    if not state.counts_toward_limits:
        assert got == 0
        return
    accrued = (Decimal(0) if state is NodeState.REQUESTED else
               Decimal(repr(price)) * Decimal(repr(max((T0 - created).total_seconds(), 0.0)))
               / Decimal(3600))
    assert got == max(Decimal(repr(commit)) - accrued, Decimal(0))


# -- the shipped examples --------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def test_default_policy_budget_example_validates_once_uncommented() -> None:
    text = (ROOT / "orchestrator" / "policy" / "default.yaml").read_text(encoding="utf-8")
    head, commented = text.split("# budgets:\n")
    block = "budgets:\n" + "".join(line[2:] + "\n" for line in commented.splitlines())
    policy = load_policy_text(head + block, "default.yaml")
    [b] = policy.budgets
    assert (b.name, b.project, b.window, b.limit_usd) == ("research-monthly", "research", "month",
                                                          Decimal(2000))
    assert b.grades == budget().grades  # the defaults, written out


def test_multi_project_example_has_budgets() -> None:
    policy = load_policy(ROOT / "policies" / "examples" / "multi-project.yaml")
    by_name = {b.name: b for b in policy.budgets}
    assert by_name["research-monthly"].project == "research"
    assert by_name["pool-monthly"].project is None
    eval_window = by_name["eval-fortnight"]
    assert window_bounds(eval_window, utc(2026, 1, 20)) == (utc(2026, 1, 19), utc(2026, 2, 2))
