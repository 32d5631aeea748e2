"""The cost roll-up as the control plane runs it: ``burst.cost.rollup`` on a real worker (the
public-task fixtures: Redis, a solo worker in this process, a temporary SQLite store, the
``fast`` policy), the policy tick rolling up its own nodes before it observes, and beat's entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery

from orchestrator.automation.app import beat_schedule
from orchestrator.costs.report import CostQuery, GroupKey, cost_report
from orchestrator.store import Store
from orchestrator.wiring import Settings
from tests.integration.test_ledger import launch, terminate
from tests.integration.test_public_tasks import app, call, env  # noqa: F401 - fixtures

H = timedelta(hours=1)
TABLES = ("cost_lines", "cost_rollup_hours", "cost_rollup_days", "cost_rollup_months",
          "ledger_marks", "node_events", "nodes", "jobs", "job_runs", "decisions", "policy_memory", "pool_controls")


@pytest.fixture
def store(env: str) -> Iterator[Store]:  # noqa: F811 - the worker's store, emptied
    with Store(env) as s:
        with s.engine.begin() as conn:
            for table in TABLES:
                conn.exec_driver_sql(f"DELETE FROM {table}")
        yield s


def test_rollup_task_writes_the_ledger_once(app: Celery, store: Store) -> None:  # noqa: F811
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    launch(store, "a", hour - 3 * H, price=4.1, project="vision", policy="fast")
    terminate(store, "a", hour - 2 * H)
    launch(store, "b", hour - 2 * H, price=2.0, project="nlp", policy="retired", pool="old")
    terminate(store, "b", hour - H)

    first = call(app, "burst.cost.rollup")
    assert first["leader"] is True and first["fence"] >= 1
    assert (first["nodes"], first["lines_written"], first["skipped"]) == (2, 2, [])
    again = call(app, "burst.cost.rollup")  # a duplicate delivery: nothing new to write
    assert again["leader"] is True and (again["nodes"], again["lines_written"]) == (0, 0)
    result = cost_report(store, CostQuery(group_by=(GroupKey.PROJECT,)))
    assert [(r.keys["project"], str(r.cost_usd)) for r in result.rows] == [("nlp", "2.00"),
                                                                          ("vision", "4.10")]


def test_policy_tick_rolls_up_its_nodes_before_observing(
        app: Celery, store: Store) -> None:  # noqa: F811
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    launch(store, "mine", hour - 2 * H, price=4.1, policy="fast")
    terminate(store, "mine", hour - H)
    launch(store, "other", hour - 2 * H, price=1.0, policy="retired", pool="old")
    terminate(store, "other", hour - H)

    outcome = call(app, "burst.policy.evaluate", policy="fast")
    assert outcome["leader"] is True
    assert [x.cost_micros for x in store.ledger_lines("mine")] == [4_100_000]
    assert store.ledger_lines("other") == []  # another policy's node: its own tick or the task


def test_beat_schedules_the_rollup() -> None:
    schedule = beat_schedule(Settings(cost_rollup_s=120), ["fast"])
    entry = schedule["cost-rollup"]
    assert entry["task"] == "burst.cost.rollup" and entry["schedule"] == timedelta(seconds=120)
    assert Settings().cost_rollup_s == 300
