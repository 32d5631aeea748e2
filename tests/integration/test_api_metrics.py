"""``/metrics`` over real HTTP on a real store (SQLite and PostgreSQL): parsed with
prometheus_client's own text parser, every family present, values computed from the store at
scrape time; and tick timing recorded by the embedded loop and by an operator's evaluate.
"""

from __future__ import annotations

from datetime import timedelta

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.api.metrics import failure_kind
from orchestrator.automation import operations as ops
from orchestrator.domain import NodeState
from orchestrator.loop import ControlLoop
from orchestrator.store import Store
from orchestrator.wiring import Runtime
from tests.builders import POOL, Rig, offering_of
from tests.integration.api_support import (
    Tokens,
    add_node,
    bearer,
)

S = NodeState
FAMILIES = {
    "burst_nodes", "burst_node_launches", "burst_node_failures", "burst_spend_rate_usd_per_hour",
    "burst_budget_used_ratio", "burst_budget_spent_usd", "burst_budget_limit_usd",
    "burst_queue_pending_jobs", "burst_queue_pending_gpus", "burst_queue_oldest_wait_seconds",
    "burst_queue_mean_wait_seconds", "burst_tick_duration_seconds",
    "burst_tick_last_duration_seconds", "burst_tick_last_timestamp_seconds", "burst_scrape_errors",
}


def scrape(client: httpx.Client, secret: str) -> dict[str, dict[tuple, float]]:
    """Family name -> {(sample name, sorted labels): value}."""
    response = client.get("/metrics", headers=bearer(secret))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(response.text):
        samples = out.setdefault(family.name, {})
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_report_the_store_at_scrape_time(
        client: httpx.Client, rig: Rig, store: Store, tokens: Tokens) -> None:
    add_node(rig, 1, "research", S.BOOTING, S.JOINING, S.READY)
    add_node(rig, 2, "vision", S.BOOTING)
    add_node(rig, 3, "vision", failed_reason="boot-timeout")
    rig.provider.capacity_keys.add(offering_of(rig.policy).key)
    rig.executor.run([rig.launch_action(4)])  # CapacityError: failed, then terminated
    assert rig.node("n4").state is S.TERMINATED
    store.submit_job("research", POOL, 8, 0, 600.0, None, rig.now - timedelta(minutes=10))
    store.submit_job("vision", POOL, 16, 0, 600.0, None, rig.now - timedelta(minutes=30))
    store.record_tick("train", rig.now, 0.5)
    store.record_tick("train", rig.now + timedelta(seconds=10), 1.5)

    m = scrape(client, tokens.admin)
    assert FAMILIES <= set(m), FAMILIES - set(m)

    def value(family: str, sample: str | None = None, **labels: str) -> float:
        return m[family][(sample or family, tuple(sorted(labels.items())))]

    place = {"provider": "aws", "pool": POOL}
    assert value("burst_nodes", state="ready", **place) == 1
    assert value("burst_nodes", state="booting", **place) == 1
    assert value("burst_nodes", state="failed", **place) == 1
    assert value("burst_nodes", state="draining", **place) == 0
    assert not any(dict(k[1]).get("state") == "terminated" for k in m["burst_nodes"])
    assert value("burst_node_launches", "burst_node_launches_total", **place) == 3
    assert value("burst_node_failures", "burst_node_failures_total",
                 provider="aws", reason="boot-timeout") == 1
    assert value("burst_node_failures", "burst_node_failures_total",
                 provider="aws", reason="capacity") == 1
    assert value("burst_spend_rate_usd_per_hour", pool=POOL) == 30.0  # n1-n3 at $10/h
    assert value("burst_queue_pending_jobs", pool=POOL) == 2
    assert value("burst_queue_pending_gpus", pool=POOL) == 24
    assert value("burst_queue_oldest_wait_seconds", pool=POOL) == 1800
    assert value("burst_queue_mean_wait_seconds", pool=POOL) == 1200
    assert value("burst_tick_duration_seconds", "burst_tick_duration_seconds_count",
                 policy="train") == 2
    assert value("burst_tick_duration_seconds", "burst_tick_duration_seconds_sum",
                 policy="train") == 2.0
    assert value("burst_tick_last_duration_seconds", policy="train") == 1.5
    assert value("burst_tick_last_timestamp_seconds", policy="train") == (
        rig.now + timedelta(seconds=10)).timestamp()
    assert all(v == 0 for v in m["burst_scrape_errors"].values()), m["burst_scrape_errors"]

    # Computed at scrape time: the next scrape sees the node that became ready since.
    rig.move("n2", S.JOINING, S.READY)
    assert scrape(client, tokens.admin)["burst_nodes"][
        ("burst_nodes", tuple(sorted({"state": "ready", **place}.items())))] == 2


def test_metrics_are_for_admins_only(client: httpx.Client, tokens: Tokens) -> None:
    assert client.get("/metrics").status_code == 401
    for secret in (tokens.viewer, tokens.submitter):
        assert client.get("/metrics", headers=bearer(secret)).status_code == 403


def test_ticks_are_timed_by_the_loop_and_by_evaluate(rt: Runtime, store: Store) -> None:
    loop = ControlLoop(rt, 1.0)
    loop.tick()
    loop.close()  # stopped: its leases are free for the evaluation
    [stat] = store.tick_stats()
    assert stat.policy == "train" and stat.ticks == 1 and stat.last_at == rt.clock.now()
    assert stat.last_duration_s > 0 and stat.total_duration_s == stat.last_duration_s
    ops.evaluate(rt, "train")
    [again] = store.tick_stats()
    assert again.ticks == 2
    assert again.total_duration_s == pytest.approx(stat.total_duration_s + again.last_duration_s)


@pytest.mark.parametrize(("reason", "kind"), [
    ("capacity error: no capacity for p4d in us-east-1a", "capacity"),
    ("quota error: vCPU limit", "quota"),
    ("AuthError: bad keys", "auth"),
    ("provider gcp: provider not configured", "provider-unavailable"),
    ("boot-timeout", "boot-timeout"),
    ("heartbeat-lost", "heartbeat-lost"),
    ("instance vanished at the provider", "vanished"),
    ("something new and odd", "other"),
])
def test_failure_reasons_are_reduced_to_bounded_kinds(reason: str, kind: str) -> None:
    assert failure_kind(reason) == kind
