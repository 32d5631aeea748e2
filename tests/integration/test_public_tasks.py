"""The public Celery tasks end to end: a real worker (in this process, solo pool) on the Redis at
127.0.0.1:6379 (broker db 11, results db 12, both flushed before and after), settings from
BURST_* variables pointing at a temporary SQLite store and tests/e2e/fast-policy.yaml.

Callers send tasks by name, as automation written by others does; bad arguments must come back
through ``result.get()`` as InvalidTaskArguments naming the argument, and never be retried.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from orchestrator.store import Store
from tests.integration.test_pool_operations import record_life

ROOT = Path(__file__).resolve().parents[2]
FAST_POLICY = ROOT / "tests" / "e2e" / "fast-policy.yaml"
BROKER = "redis://127.0.0.1:6379/11"
BACKEND = "redis://127.0.0.1:6379/12"
REDIS_START_HINT = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no'
)
TIMEOUT = 15


def _flush() -> None:
    for url in (BROKER, BACKEND):
        client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5)
        try:
            client.flushdb()
        finally:
            client.close()


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """BURST_* settings for the worker; yields the store URL."""
    probe = redis.Redis.from_url(BROKER, socket_connect_timeout=2, socket_timeout=5)
    try:
        probe.ping()
        reachable = True
    except redis.exceptions.ConnectionError:
        reachable = False
    finally:
        probe.close()
    if not reachable:
        pytest.fail(f"Redis at {BROKER} is not reachable; start it with: {REDIS_START_HINT}",
                    pytrace=False)
    state = tmp_path_factory.mktemp("public-tasks")
    url = f"sqlite:///{state / 'burst.db'}"
    with pytest.MonkeyPatch.context() as mp:
        for name, value in {
            "BURST_STATE_DIR": str(state), "BURST_DATABASE_URL": url,
            "BURST_POLICY_FILES": json.dumps([str(FAST_POLICY)]),
            "BURST_BROKER_URL": BROKER, "BURST_RESULT_BACKEND": BACKEND,
            "BURST_TICK_S": "5", "BURST_SECRET_KEY": "k" * 32,
        }.items():
            mp.setenv(name, value)
        mp.delenv("BURST_REDIS_URL", raising=False)
        mp.delenv("BURST_SETTINGS_FILE", raising=False)
        with Store(url) as store:
            store.upgrade()
        _flush()
        yield url
        _flush()


@pytest.fixture(scope="module")
def app(env: str) -> Iterator[Celery]:
    """The burst Celery app built from the environment, with a worker consuming its queue."""
    import celery.contrib.testing.tasks  # noqa: F401 - registers celery.ping for the ping check
    from celery.contrib.testing.worker import start_worker

    from orchestrator.automation.app import create_celery
    from orchestrator.automation.runtime import redis_client, runtime
    from orchestrator.wiring import Settings

    runtime.cache_clear()
    redis_client.cache_clear()
    application = create_celery(Settings())
    try:
        with start_worker(application, pool="solo", perform_ping_check=True, shutdown_timeout=10):
            yield application
    finally:
        runtime().close()
        runtime.cache_clear()
        redis_client.cache_clear()


@pytest.fixture
def store(env: str) -> Iterator[Store]:
    """The worker's store, emptied of pool controls, nodes and controller leases before each
    test."""
    with Store(env) as s:
        with s.engine.begin() as conn:
            for table in ("pool_controls", "node_events", "nodes", "decisions", "policy_memory",
                          "cost_lines", "cost_rollup_hours", "cost_rollup_days", "cost_rollup_months",
                          "ledger_marks", "leases"):
                conn.exec_driver_sql(f"DELETE FROM {table}")
        yield s


def _forget_tick_periods() -> None:
    from orchestrator.automation.runtime import redis_client
    from orchestrator.automation.tasks import TICK_PREFIX

    for key in redis_client().scan_iter(f"{TICK_PREFIX}*"):
        redis_client().delete(key)


def call(app: Celery, name: str, **kwargs: Any) -> Any:
    return app.send_task(name, kwargs=kwargs).get(timeout=TIMEOUT)


def iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


# -- each task works -------------------------------------------------------------------------------


def test_pause_prewarm_evaluate_resume_drain(app: Celery, store: Store) -> None:
    paused = call(app, "burst.pool.pause", pool="gpu", reason="cluster maintenance")
    assert paused["paused"] is True and paused["reason"] == "cluster maintenance"
    assert store.pool_control("gpu").paused

    until = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    warm = call(app, "burst.pool.prewarm", pool="gpu", gpus=8, until=iso(until))
    assert warm["gpus"] == 8 and warm["until"] == iso(until) and warm["paused"] is True
    control = store.pool_control("gpu")
    assert (control.prewarm_gpus, control.prewarm_until) == (8, until)

    # Evaluated through the tick task's path (leader lease, fenced store): paused, so the
    # pre-warm is held and nothing is launched.
    result = call(app, "burst.policy.evaluate", policy="fast")
    assert result["policy"] == "fast" and result["leader"] is True and result["launch"] == 0
    assert result["decision"]["rule"] == "paused"
    assert "pre-warming 8 GPUs" in result["decision"]["summary"]
    assert store.get_decision(result["decision"]["id"]) is not None

    resumed = call(app, "burst.pool.resume", pool="gpu")
    assert resumed == {"pool": "gpu", "paused": False, "was_paused": True,
                       "paused_since": paused["paused_at"]}
    assert not store.pool_control("gpu").paused

    drained = call(app, "burst.pool.drain", pool="gpu")
    assert drained["drained"] == [] and drained["paused"] is True
    assert drained["prewarm_cleared"] is True
    control = store.pool_control("gpu")
    assert control.paused and control.prewarm_gpus is None


def test_spend_report(app: Celery, store: Store) -> None:
    # On the hour: the ledger's lines are hour buckets, selected by where their bucket starts.
    now = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    record_life(store, "a", now - timedelta(hours=3), now - timedelta(hours=2), price=4.1,
                project="vision")
    record_life(store, "b", now - timedelta(hours=2), now - timedelta(hours=1, minutes=30),
                price=4.1, project="nlp", provider="gcp")
    report = call(app, "burst.spend.report")
    assert report["group_by"] == ["project"]
    assert [(r["project"], r["cost_usd"]) for r in report["rows"]] == [("nlp", "2.05"),
                                                                      ("vision", "4.10")]
    assert report["total"]["cost_usd"] == "6.15"
    grouped = call(app, "burst.spend.report", since=iso(now - timedelta(hours=2)),
                   group_by="project,provider")
    assert [(r["project"], r["provider"]) for r in grouped["rows"]] == [("nlp", "gcp")]
    listed = call(app, "burst.spend.report", group_by=["provider", "day"])
    assert sum(Decimal(r["cost_usd"]) for r in listed["rows"]) == Decimal("6.15")


# -- each task refuses bad arguments ---------------------------------------------------------------

FUTURE = "2999-01-01T09:00:00Z"

BAD = [
    ("burst.policy.evaluate", {"policy": "nope"}, "policy"),
    ("burst.policy.evaluate", {}, "policy"),
    ("burst.pool.prewarm", {"pool": "cpu", "gpus": 8, "until": FUTURE}, "pool"),
    ("burst.pool.prewarm", {"pool": "gpu", "gpus": 0, "until": FUTURE}, "gpus"),
    ("burst.pool.prewarm", {"pool": "gpu", "gpus": "8", "until": FUTURE}, "gpus"),
    ("burst.pool.prewarm", {"pool": "gpu", "gpus": True, "until": FUTURE}, "gpus"),
    ("burst.pool.prewarm", {"pool": "gpu", "gpus": 8, "until": "2020-01-01T00:00:00Z"}, "until"),
    ("burst.pool.prewarm", {"pool": "gpu", "gpus": 8, "until": "2999-01-01T09:00:00"}, "until"),
    ("burst.pool.prewarm", {"pool": "gpu", "gpus": 8, "until": "next tuesday"}, "until"),
    ("burst.pool.prewarm", {"pool": "gpu", "gpus": 8}, "until"),
    ("burst.pool.prewarm", {"pool": "gpu", "gpu": 8, "until": FUTURE}, "gpu"),
    ("burst.pool.drain", {"pool": "cpu"}, "pool"),
    ("burst.pool.pause", {"pool": "cpu"}, "pool"),
    ("burst.pool.pause", {"pool": "gpu", "reason": 5}, "reason"),
    ("burst.pool.resume", {"pool": ""}, "pool"),
    ("burst.spend.report", {"group_by": "project,colour"}, "group_by"),
    ("burst.spend.report", {"group_by": 3}, "group_by"),
    ("burst.spend.report", {"since": "2026-13-01"}, "since"),  # a date is fine; not this one
    ("burst.spend.report", {"since": FUTURE}, "since"),
]


def test_bad_arguments_are_refused_naming_the_argument(app: Celery, store: Store) -> None:
    from orchestrator.automation.public import InvalidTaskArguments

    for name, kwargs, argument in BAD:
        result = app.send_task(name, kwargs=kwargs)
        with pytest.raises(InvalidTaskArguments) as info:
            result.get(timeout=TIMEOUT)
        assert isinstance(info.value, ValueError)
        assert str(info.value).startswith(f"{argument}: "), (name, kwargs, str(info.value))
        assert info.value.argument == argument
        assert result.state == "FAILURE"  # refused once, never retried
    assert store.pool_controls() == {}  # nothing was written


# -- one controller plans a pool (issue 13, finding 6) ---------------------------------------------


def test_evaluate_and_reconcile_do_not_act_while_an_embedded_loop_leads(app: Celery,
                                                                          store: Store) -> None:
    """Finding 6: a ``burst.policy.evaluate`` task planned a tick for a pool that an embedded
    ``burst run`` on the same store was ticking. Both now take the same store lease."""
    from orchestrator.automation.runtime import runtime
    from orchestrator.loop import ControlLoop

    loop = ControlLoop(runtime(), 5.0)  # an embedded loop on the worker's store
    ticked = loop.tick()
    assert ticked.skipped == {} and len(ticked.decisions) == 1
    decisions = len(store.decisions())
    try:
        result = call(app, "burst.policy.evaluate", policy="fast")
        assert result["leader"] is False
        assert "policy:fast is led by another live controller (burst-run:" in result["reason"]
        assert "decision" not in result
        assert len(store.decisions()) == decisions, "the evaluation planned beside the loop"
        reconciled = call(app, "burst.reconcile.run")
        assert reconciled["leader"] is False and "reconcile is led by" in reconciled["reason"]
    finally:
        loop.close()
    # Stopped cleanly: its leases are free at once, and the evaluation plans (in a tick period
    # not planned yet: an earlier test's evaluation may have planned this one).
    _forget_tick_periods()
    result = call(app, "burst.policy.evaluate", policy="fast")
    assert result["leader"] is True and result["decision"]["id"], result
    # ... and now the Celery deployment leads: the embedded loop skips the pool, reported.
    again = ControlLoop(runtime(), 5.0)
    report = again.tick()
    assert report.decisions == [] and report.skipped["policy:fast"].startswith("celery:")
    again.close()


# -- a launch group through Celery (issue 19): one task, all nodes or none ------------------------


def test_a_launch_group_is_one_task_that_launches_all_its_nodes_or_none(
        app: Celery, store: Store, tmp_path: Path) -> None:
    """The planner's task records a multi-node job's launch group; ``burst.provider.launch_group``
    launches every node of it (a repeat changes nothing), and when one node cannot be had the
    whole group falls back: no node of it is left running."""
    from orchestrator.automation.app import CONTROL_QUEUE
    from orchestrator.automation.runtime import runtime
    from orchestrator.domain.nodes import NodeState
    from orchestrator.domain.plan import ActionReason, Launch
    from orchestrator.groups import record_group
    from tests.builders import offering_of

    rt = runtime()
    policy = rt.policies["fast"]
    provider = rt.executor.providers["local"]._inner  # the local provider under its metrics
    offering = offering_of(policy)

    def group(name: str, *nodes: str) -> str:
        launches = [Launch(policy=policy.name, pool=policy.pool.name, node_id=n,
                           request_id=f"r-{n}", offering=offering, reason=ActionReason.DEMAND,
                           project="research", decision_id="d-group", group=name,
                           group_size=len(nodes)) for n in nodes]
        assert record_group(rt.executor, launches) is not None
        return name

    def launch_group(group_id: str) -> dict:
        # This module's worker consumes the control queue; the task's own route is the provider
        # queue (a worker there runs it the same way).
        return app.send_task("burst.provider.launch_group", kwargs={"group_id": group_id},
                             queue=CONTROL_QUEUE).get(timeout=TIMEOUT)

    def running(nodes: tuple[str, ...]) -> list[str]:
        return sorted(i.tags["burst:node-id"] for i in provider.list_owned(policy.cluster)
                      if i.state.value == "running" and i.tags.get("burst:node-id") in nodes)

    launched = ("g1-a", "g1-b")
    try:
        answer = launch_group(group("g1", *launched))
        assert answer["status"] == "launched" and sorted(answer["nodes"]) == list(launched)
        assert {store.get_node(n).state for n in launched} == {NodeState.LAUNCHING}
        assert running(launched) == list(launched)
        again = launch_group("g1")
        assert again["status"] == "already-done" and running(launched) == list(launched)

        # The offering runs out of capacity: the whole group falls back, nothing stranded.
        stockout = tmp_path / "stockout"
        stockout.write_text(offering.key + "\n")
        provider.capacity_file = stockout
        starved = ("g2-a", "g2-b")
        answer = launch_group(group("g2", *starved))
        assert answer["status"] == "capacity" and answer["offering"] == offering.key
        assert {store.get_node(n).state for n in starved} == {NodeState.TERMINATED}
        assert running(starved) == []
        assert launch_group("nope") == {
            "group": "nope", "status": "unknown-group"}
    finally:
        provider.capacity_file = None
        owned = [i.id for i in provider.list_owned(policy.cluster)
                 if i.tags.get("burst:node-id", "").startswith(("g1-", "g2-"))]
        provider.terminate(owned)
