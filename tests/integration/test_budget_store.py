"""Budgets against a real store (SQLite and PostgreSQL): the executor records each launch's
commitment, the Observer fills ``Snapshot.budget_spend`` from the cost ledger, and
``budget_statuses`` reports where each budget stands, its burn and commitments equal to those of
every live node's record (hypothesis)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.costs.budgets import budget_statuses
from orchestrator.domain import NodeState
from orchestrator.lifecycle import NodeEvent
from orchestrator.observe import Observer
from orchestrator.planner import plan
from orchestrator.planner.budgets import MICRO, outstanding_usd
from orchestrator.store import Store, reach_version
from tests.builders import POLICY, T0, make_node, make_offering, make_policy, make_rig

BUDGETS = [
    {"name": "research-monthly", "project": "research", "limit_usd": 40},
    {"name": "pool-daily", "window": "day", "limit_usd": 500, "max_hourly_burn_usd": 100},
]


def test_the_executor_records_the_commitment(store: Store) -> None:
    rig = make_rig(store)
    action = replace(rig.launch_action(1), budget_commit_usd=13.333334, jobs=("j1",))
    rig.executor.record_launch(action)
    node = rig.node("n1")
    assert node.state is NodeState.REQUESTED and node.budget_commit_usd == 13.333334
    [event] = store.events("n1")
    assert event.details["budget_commit_usd"] == 13.333334


def test_spend_reaches_the_planner_and_the_status(store: Store) -> None:
    policy = make_policy(budgets=BUDGETS)
    rig = make_rig(store, policy=policy)
    rig.executor.run([replace(rig.launch_action(1), budget_commit_usd=20.0)])
    assert rig.node("n1").state is NodeState.LAUNCHING
    now = rig.clock.advance(minutes=30)
    observer = Observer(store, rig.queue, {rig.provider.name: rig.provider}, policies=[policy])

    snapshot = observer.snapshot(now)
    monthly = snapshot.budget_spend[f"{POLICY}/research-monthly"]
    # half an hour at $10/h, from the launch to now, as the ledger's live accrual counts it
    assert monthly.spent_usd == Decimal(5)
    assert monthly.burn_usd_hour == Decimal(10)
    assert (monthly.window_start, monthly.window_end) == (
        datetime(2025, 3, 1, tzinfo=UTC), datetime(2025, 4, 1, tzinfo=UTC))
    daily = snapshot.budget_spend[f"{POLICY}/pool-daily"]
    assert daily.spent_usd == Decimal(5)
    assert daily.window_start == T0.replace(hour=0)

    decision = plan(snapshot, [policy], now).decisions[0]
    record = decision.inputs["budgets"]["research-monthly"]
    assert (record["spent_usd"], record["committed_usd"], record["limit_usd"]) == (5, 15, 40)
    assert record["spend_observed"] is True and record["grade"] is None

    by_name = {s.budget: s for s in budget_statuses(store, [policy], now)}
    status = by_name["research-monthly"]
    assert status.key == f"{POLICY}/research-monthly" and status.project == "research"
    assert status.spent_usd == Decimal(5) and status.committed_usd == Decimal(15)
    assert status.remaining_usd == Decimal(20) and status.used_fraction == 0.5
    assert status.burn_usd_hour == Decimal(10) and status.grade is None
    hours_left = Decimal((datetime(2025, 4, 1, tzinfo=UTC) - now).total_seconds()) / 3600
    assert status.forecast_usd == (Decimal(5) + 10 * hours_left).quantize(Decimal("0.000001"))
    pool = by_name["pool-daily"]
    assert pool.project is None and pool.max_hourly_burn_usd == Decimal(100)
    assert pool.as_json()["window_start"] == "2025-03-01T00:00:00Z"
    assert pool.as_json()["limit_usd"] == "500.000000"


def test_status_grades_and_no_budgets(store: Store) -> None:
    policy = make_policy(budgets=[{"name": "tight", "project": "research", "limit_usd": 4}])
    rig = make_rig(store, policy=policy)
    rig.executor.run([rig.launch_action(1)])  # no commitment recorded
    now = rig.clock.advance(minutes=30)
    [status] = budget_statuses(store, [policy], now)
    assert status.spent_usd == Decimal(5) and status.grade == "drain"  # $5 of $4: past it
    assert status.remaining_usd == Decimal(-1)
    assert budget_statuses(store, [make_policy()], now) == []
    later = now + timedelta(days=31)  # April: a new window
    assert budget_statuses(store, [policy], later)[0].window_start == datetime(2025, 4, 1, tzinfo=UTC)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(nodes=st.lists(st.fixed_dictionaries({
    "state": st.sampled_from([NodeState.REQUESTED, NodeState.LAUNCHING, NodeState.READY]),
    "project": st.sampled_from([None, "research", "other"]),
    "price": st.sampled_from([0.0, 1.0, 9.5, 10.35, 1.2345678]),
    "commit": st.sampled_from([0.0, 0.5, 5.0, 13.333334, 40.0]),
    "age_s": st.integers(0, 8 * 3600),
}), max_size=8))
def test_burn_and_commitments_equal_those_of_every_live_node(store: Store, nodes: list) -> None:
    """Budget status reads live prices grouped and commitments of young nodes only: the same
    burn and committed USD as summing every live node's record."""
    with store.engine.begin() as conn:
        for table in ("ledger_reach_groups", "ledger_reach", "node_events", "nodes"):
            conn.exec_driver_sql(f"DELETE FROM {table}")
        reach_version.bump(conn)  # the groups written around the store: stores read them again
    policy = make_policy(budgets=[{"name": "pool", "limit_usd": 1000},
                                  {"name": "research", "project": "research", "limit_usd": 50}])
    now = T0 + timedelta(hours=9)
    for i, d in enumerate(nodes):
        created = now - timedelta(seconds=d["age_s"])
        node = make_node(f"n{i}", state=d["state"], project=d["project"],
                         offering=make_offering(price=d["price"]), state_since=created,
                         created_at=created, budget_commit_usd=d["commit"])
        assert store.add_node(node, NodeEvent(node.id, created, None, d["state"], "t", {}))
    live = store.nodes()
    for status in budget_statuses(store, [policy], now):
        scope = [n for n in live if status.project is None or n.project == status.project]
        assert status.burn_usd_hour == sum((Decimal(str(n.price_usd_hour)) for n in scope),
                                           Decimal(0))
        assert status.committed_usd == sum((outstanding_usd(n, now) for n in scope),
                                           Decimal(0)).quantize(MICRO)
