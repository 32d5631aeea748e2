"""BudgetBook.build works out each live node's figures once for all budgets: the same sums, to
the last digit, as summing over each budget's scope in snapshot order (hypothesis)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain import NodeState
from orchestrator.planner.budgets import BudgetBook, in_scope, outstanding_usd, usd
from orchestrator.policy import Market
from tests.builders import POOL, T0, make_node, make_offering, make_policy, make_snapshot

PROJECTS = ("a", "b", "c")


@st.composite
def books(draw):
    budgets = []
    for name, project in (("pool", None), ("a", "a"), ("b", "b"), ("c", "c")):
        if draw(st.booleans()):
            budgets.append({"name": f"{name}-budget", "limit_usd": 1000,
                            **({"project": project} if project else {})})
    nodes = []
    for i in range(draw(st.integers(0, 30))):
        price = draw(st.sampled_from([0.37, 1.1, 9.5, 12.0, 31.07]))
        offering = make_offering("g8", gpus=8, price=price,
                                 market=draw(st.sampled_from([Market.ON_DEMAND, Market.SPOT])))
        nodes.append(make_node(
            f"n{i}", offering=offering,
            state=draw(st.sampled_from(list(NodeState))),
            pool=draw(st.sampled_from([POOL, POOL, "other"])),
            project=draw(st.sampled_from((*PROJECTS, None))),
            created_at=T0 - timedelta(seconds=draw(st.integers(0, 90_000))),
            budget_commit_usd=draw(st.sampled_from([0.0, 5.5, 13.333334, 40.0, 1e-6]))))
    return make_policy(budgets=budgets), make_snapshot(nodes=nodes)


@settings(max_examples=200, deadline=None)
@given(books())
def test_each_budget_sums_its_scope_in_snapshot_order(case) -> None:
    policy, snapshot = case
    book = BudgetBook.build(policy, snapshot, T0)
    live = [n for n in snapshot.nodes if n.state.counts_toward_limits and n.pool == POOL]
    assert [s.name for s in book.states] == [b.name for b in policy.budgets]
    for state, budget in zip(book.states, policy.budgets):
        scoped = [n for n in live if in_scope(budget, POOL, n.pool, n.project)]
        assert state.outstanding == sum((outstanding_usd(n, T0) for n in scoped), Decimal(0))
        assert state.burn == sum((usd(n.price_usd_hour) for n in scoped), Decimal(0))
