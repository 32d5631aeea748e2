"""The operator families of ``/metrics`` (issue 18) over real HTTP on a real store: lifecycle
latency histograms, launch failures per offering, nodes past a timeout, budget grade and forecast,
cumulative cost, leader tenures, build info; and the process-side instruments (provider calls,
decisions, launches held back, tick histogram), merged across processes in multiprocess mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

from orchestrator import instruments
from orchestrator.domain import NodeState
from orchestrator.loop import ControlLoop
from orchestrator.store import Store
from orchestrator.wiring import Runtime
from tests.builders import Rig, offering_of
from tests.integration.api_support import Tokens, add_node, bearer
from tests.integration.test_api_metrics import scrape

S = NodeState
NEW_FAMILIES = {
    "burst_node_launch_to_ready_seconds", "burst_node_ready_to_drain_seconds",
    "burst_node_drain_duration_seconds", "burst_launch_failures", "burst_nodes_past_timeout",
    "burst_budget_grade", "burst_budget_forecast_usd", "burst_budget_burn_usd_per_hour",
    "burst_budget_window_end_timestamp_seconds", "burst_cost_usd", "burst_leader_tenures",
    "burst_build_info", "burst_provider_call_duration_seconds", "burst_provider_call_errors",
    "burst_decisions", "burst_launches_held_back", "burst_tick_seconds",
    "burst_leaked_instances_collected",
}


def sample(m: dict, family: str, name: str | None = None, **labels: str) -> float:
    return m[family][(name or family, tuple(sorted(labels.items())))]


def test_lifecycle_histograms_failures_and_stuck_nodes(
        client: httpx.Client, rig: Rig, tokens: Tokens) -> None:
    key = offering_of(rig.policy).key
    add_node(rig, 1, "research")  # launching at T0
    rig.clock.advance(minutes=4)
    rig.move("n1", S.BOOTING, S.JOINING, S.READY)  # ready after 240 s
    rig.clock.advance(hours=2)
    rig.move("n1", S.DRAINING)  # served 7,200 s
    rig.clock.advance(minutes=3)
    rig.move("n1", S.TERMINATING)  # drained in 180 s
    add_node(rig, 2, "vision", S.BOOTING)  # booting since now
    rig.provider.capacity_keys.add(key)
    rig.executor.run([rig.launch_action(3)])  # refused: failed before it booted
    rig.clock.advance(hours=1)  # n2 is booting past the policy's boot timeout

    m = scrape(client, tokens.admin)
    assert NEW_FAMILIES - {"burst_leaked_instances_collected", "burst_provider_call_errors",
                           "burst_provider_call_duration_seconds"} <= set(m), NEW_FAMILIES - set(m)
    place = {"provider": "aws", "offering": key}
    ready = "burst_node_launch_to_ready_seconds"
    assert sample(m, ready, f"{ready}_count", **place) == 1
    assert sample(m, ready, f"{ready}_sum", **place) == 240
    assert sample(m, ready, f"{ready}_bucket", le="120.0", **place) == 0
    assert sample(m, ready, f"{ready}_bucket", le="300.0", **place) == 1
    served = "burst_node_ready_to_drain_seconds"
    assert sample(m, served, f"{served}_sum", **place) == 7200
    drain = "burst_node_drain_duration_seconds"
    assert sample(m, drain, f"{drain}_sum", **place) == 180
    assert sample(m, "burst_launch_failures", "burst_launch_failures_total",
                  reason="capacity", **place) == 1
    assert sample(m, "burst_nodes_past_timeout", policy="train", state="booting",
                  provider="aws") == 1
    rig.move("n2", S.JOINING)  # moved on: joining since now, within its timeout
    again = scrape(client, tokens.admin)
    assert sample(again, "burst_nodes_past_timeout", policy="train", state="booting",
                  provider="aws") == 0
    assert sample(again, "burst_nodes_past_timeout", policy="train", state="joining",
                  provider="aws") == 0
    [(labels, one)] = [(dict(k[1]), v) for k, v in m["burst_build_info"].items()]
    assert one == 1 and labels["version"] and labels["python"]


@pytest.fixture
def rig(store: Store) -> Rig:
    from tests.builders import make_policy, make_rig

    policy = make_policy(budgets=[{"name": "day", "project": "research", "window": "day",
                                   "limit_usd": 100}])
    return make_rig(store, policy=policy)


def test_budget_grade_forecast_and_cost(client: httpx.Client, rig: Rig, rt: Runtime,
                                        tokens: Tokens) -> None:
    add_node(rig, 1, "research", S.BOOTING, S.JOINING, S.READY)
    rig.clock.advance(hours=3)
    ControlLoop(rt, 1.0).tick()  # rolls the ledger up: 3 h at $10/h
    m = scrape(client, tokens.admin)
    key = {"policy": "train", "budget": "day", "project": "research"}
    grades = {dict(k[1])["grade"]: v for k, v in m["burst_budget_grade"].items()}
    assert sum(grades.values()) == 1 and set(grades) >= {"none", "warn"}
    assert sample(m, "burst_budget_burn_usd_per_hour", **key) == 10
    forecast = sample(m, "burst_budget_forecast_usd", **key)
    assert forecast > 30  # what is spent plus the burn for the rest of the day
    cost = sample(m, "burst_cost_usd", "burst_cost_usd_total", provider="aws", project="research")
    assert cost == pytest.approx(30, abs=0.01)
    # The loop's own pass is counted by the process-side instruments.
    decisions = {dict(k[1])["rule"]: v for k, v in m["burst_decisions"].items()
                 if k[0] == "burst_decisions_total" and dict(k[1])["policy"] == "train"}
    assert sum(decisions.values()) >= 1
    assert sample(m, "burst_tick_seconds", "burst_tick_seconds_count", policy="train") >= 1
    tenures = {dict(k[1])["scope"]: v for k, v in m["burst_leader_tenures"].items()}
    assert tenures and all(v >= 1 for v in tenures.values())


def test_instrumented_provider_times_calls_and_counts_errors(rig: Rig) -> None:
    def value(name: str, **labels: str) -> float:
        return instruments.REGISTRY.get_sample_value(name, labels) or 0.0

    wrapped = instruments.InstrumentedProvider(rig.provider)
    assert wrapped.name == rig.provider.name and wrapped.inner is rig.provider
    calls = value("burst_provider_call_duration_seconds_count", provider="aws",
                  operation="list_owned")
    wrapped.list_owned(rig.policy.cluster)
    errors = {"provider": "aws", "operation": "launch", "error": "CapacityError"}
    failed = value("burst_provider_call_errors_total", **errors)
    rig.provider.capacity_keys.add(offering_of(rig.policy).key)
    assert rig.executor.record_launch(rig.launch_action(9)) is not None
    rig.executor.providers = {"aws": wrapped}
    rig.executor.launch_recorded("n9")  # refused by the provider: counted by error class
    assert value("burst_provider_call_errors_total", **errors) == failed + 1
    assert value("burst_provider_call_duration_seconds_count", provider="aws",
                 operation="list_owned") == calls + 1
    assert instruments.held_back_kind("limits.max_nodes") == "limit"
    assert instruments.held_back_kind("budgets[day].max_hourly_burn_usd") == "budget"
    assert instruments.held_back_kind("projects[research].max_burst_gpus") == "quota"


CHILD = """
from orchestrator import instruments
instruments.DECISIONS.labels("train", "scale-up").inc()
instruments.TICK_SECONDS.labels("train").observe(0.2)
"""


def test_worker_processes_are_merged_in_multiprocess_mode(tmp_path: Path) -> None:
    """Forked workers each write their samples; one collector over the directory sums them."""
    directory = tmp_path / "prom"
    directory.mkdir()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(directory),
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", CHILD], env=env, check=True, timeout=120)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    assert registry.get_sample_value("burst_decisions_total",
                                     {"policy": "train", "rule": "scale-up"}) == 2
    assert registry.get_sample_value("burst_tick_seconds_count", {"policy": "train"}) == 2


def test_every_metric_the_rules_and_dashboard_query_is_exported(
        client: httpx.Client, tokens: Tokens) -> None:
    from tests.unit.test_monitoring_assets import metric_names_used

    response = client.get("/metrics", headers=bearer(tokens.admin))
    exported = set()
    for family in text_string_to_metric_families(response.text):
        exported.add(family.name)
        exported.update(s.name for s in family.samples)
        if family.type == "counter":
            exported.add(f"{family.name}_total")
        if family.type == "histogram":
            exported.update(f"{family.name}_{suffix}" for suffix in ("bucket", "sum", "count"))
    used = metric_names_used()
    assert len(used) > 20
    assert used <= exported, sorted(used - exported)
