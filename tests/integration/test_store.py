"""The state store against real SQLite files and a real PostgreSQL database (no mocks).

Each test runs on both backends through the ``store`` / ``store_url`` fixtures in conftest.py.
Races are real: threads released together by a barrier, and for SQLite forked processes.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from orchestrator.domain import (
    CapacityBlock, Decision, Node, NodeState, OfferingOption, PolicyMemory, Rule,
)
from orchestrator.domain.jobs import JobState, Placement
from orchestrator.lifecycle import NodeEvent, transition
from orchestrator.policy.models import Market
from orchestrator.store import JobRecord, Store, default_sqlite_url, upgrade
from orchestrator.store.migrate import current_revision, head_revision
from orchestrator.store.tables import Base

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
S = NodeState


def make_node(n: int = 1, *, request_id: str | None = None, policy: str = "train",
              at: datetime = T0) -> tuple[Node, NodeEvent]:
    node = Node(
        id=f"n-{n}", policy=policy, pool="a100", provider="aws",
        offering_key="aws/us-east-1/-/p4d.24xlarge/spot", instance_type="p4d.24xlarge",
        market=Market.SPOT, gpus=8, price_usd_hour=11.57, state=S.REQUESTED, state_since=at,
        created_at=at, request_id=request_id or f"r-{n}", project="vision",
    )
    return node, NodeEvent(node.id, at, None, S.REQUESTED, "demand", {"decision": "d-1"})


def race(n: int, fn: Callable[[int], Any]) -> list[Any]:
    """Run fn(0..n-1) in n threads released at the same instant; return their results."""
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n
    errors: list[BaseException] = []

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    if errors:
        raise errors[0]
    return results


# -- schema ------------------------------------------------------------------------------------


def test_migrations_to_head_on_empty_db_match_models(store_url: str) -> None:
    store = Store(store_url)
    try:
        store.downgrade("base")  # PostgreSQL's session database may hold an earlier test's schema
        assert set(sa.inspect(store.engine).get_table_names()) <= {"alembic_version"}

        upgrade(store_url)  # the module-level entry point, with its own engine
        upgrade(store_url)  # at head already: a no-op

        inspector = sa.inspect(store.engine)
        tables = set(inspector.get_table_names()) - {"alembic_version"}
        assert tables == set(Base.metadata.tables)
        for name, table in Base.metadata.tables.items():
            assert {c["name"] for c in inspector.get_columns(name)} == set(table.columns.keys())
            indexes = {i["name"] for i in inspector.get_indexes(name)
                       if not i.get("duplicates_constraint")}  # PostgreSQL lists UNIQUE's index
            assert indexes == {i.name for i in table.indexes}
            uniques = {u["name"] for u in inspector.get_unique_constraints(name)}
            declared = {c.name for c in table.constraints if isinstance(c, sa.UniqueConstraint)}
            assert uniques == declared
        with store.engine.connect() as conn:
            assert current_revision(conn) == head_revision()
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
    finally:
        store.close()


def test_urls(tmp_path: Path, pg_url: str) -> None:
    url = default_sqlite_url(tmp_path / "deep" / "state")
    with Store(url) as store:
        store.upgrade()
        assert (tmp_path / "deep" / "state" / "burst.db").exists()
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    with Store(plain) as store:
        assert store.url.startswith("postgresql+psycopg://")
    with pytest.raises(ValueError, match="unsupported"):
        Store("mysql://x@localhost/db")


# -- nodes -------------------------------------------------------------------------------------


def test_add_node_is_idempotent_on_id_and_request_id(store: Store) -> None:
    node, event = make_node(1)
    assert store.add_node(node, event) is True
    assert store.add_node(node, event) is False
    other, other_event = make_node(2, request_id="r-1")  # a re-delivered intent with a new node id
    assert store.add_node(other, other_event) is False
    assert store.nodes() == [node]
    assert store.events() == [event]
    assert store.get_node("n-1") == node
    assert store.node_by_request("r-1") == node
    assert store.get_node("n-2") is None


def test_node_queries(store: Store) -> None:
    for n, policy in ((1, "train"), (2, "train"), (3, "infer")):
        store.add_node(*make_node(n, policy=policy, at=T0 + timedelta(seconds=n)))
    node = store.get_node("n-2")
    assert node is not None
    launching, ev = transition(node, S.LAUNCHING, at=T0, reason="accepted")
    assert store.save_transition(node, launching, ev)
    with_instance = store.update_node(launching, instance_id="i-abc")
    assert store.node_by_instance("i-abc") == with_instance
    assert store.node_by_instance("i-none") is None

    assert [n.id for n in store.nodes()] == ["n-1", "n-2", "n-3"]
    assert [n.id for n in store.nodes(policy="train")] == ["n-1", "n-2"]
    assert [n.id for n in store.nodes(states=[S.LAUNCHING])] == ["n-2"]

    n3 = store.get_node("n-3")
    assert n3 is not None
    gone, ev = transition(n3, S.TERMINATED, at=T0, reason="never created")
    assert store.save_transition(n3, gone, ev)
    assert [n.id for n in store.nodes()] == ["n-1", "n-2"]
    assert [n.id for n in store.nodes(include_terminated=True)] == ["n-1", "n-2", "n-3"]
    assert [n.id for n in store.nodes(states=[S.TERMINATED])] == ["n-3"]


def test_save_transition_is_compare_and_set(store: Store) -> None:
    node, event = make_node()
    store.add_node(node, event)
    launching, ev1 = transition(node, S.LAUNCHING, at=T0 + timedelta(seconds=5), reason="ok")
    failed, ev2 = transition(node, S.FAILED, at=T0 + timedelta(seconds=6), reason="capacity")
    assert store.save_transition(node, launching, ev1) is True
    assert store.save_transition(node, failed, ev2) is False  # same old version: loses
    assert store.get_node(node.id) == launching
    assert store.events(node.id) == [event, ev1]
    with pytest.raises(ValueError, match="version"):
        store.save_transition(launching, launching, ev1)


def test_save_transition_race_between_threads(store: Store) -> None:
    node, event = make_node()
    store.add_node(node, event)
    targets = [S.LAUNCHING, S.FAILED]

    def write(i: int) -> bool:
        new, ev = transition(node, targets[i], at=T0, reason=f"writer {i}")
        return store.save_transition(node, new, ev)

    results = race(2, write)
    assert sorted(results) == [False, True]
    winner = targets[results.index(True)]
    stored = store.get_node(node.id)
    assert stored is not None and stored.state == winner and stored.version == 1
    assert [e.to_state for e in store.events(node.id)] == [S.REQUESTED, winner]


def test_update_node(store: Store) -> None:
    node, event = make_node()
    store.add_node(node, event)
    beat = store.update_node(node, last_heartbeat=T0 + timedelta(seconds=30), gpus_busy=4)
    assert beat is not None and beat.version == 1 and beat.gpus_busy == 4
    assert store.get_node(node.id) == beat
    assert store.update_node(node, gpus_busy=8) is None  # stale version
    for field in ("state", "state_since", "version"):
        with pytest.raises(ValueError):
            store.update_node(beat, **{field: getattr(beat, field)})
    assert store.get_node(node.id) == beat
    assert len(store.events(node.id)) == 1  # non-state updates write no events


def test_events_are_appended_in_order(store: Store) -> None:
    node, event = make_node()
    store.add_node(node, event)
    expected = [event]
    current = node
    for i, target in enumerate([S.LAUNCHING, S.BOOTING, S.JOINING, S.READY, S.DRAINING]):
        new, ev = transition(current, target, at=T0 + timedelta(minutes=i), reason=target.value,
                             step=i, at_time=T0)
        assert store.save_transition(current, new, ev)
        expected.append(ev)
        current = new
    other, other_event = make_node(2)
    store.add_node(other, other_event)

    stored = store.events(node.id)
    assert [e.to_state for e in stored] == [e.to_state for e in expected]
    assert [e.from_state for e in stored] == [e.from_state for e in expected]
    assert stored[3].details == {"step": 2, "at_time": T0.isoformat()}  # JSON form of a time
    assert store.events()[-1] == other_event
    assert [e.to_state for e in store.events(node.id, limit=2)] == [S.READY, S.DRAINING]


# -- join tokens and credentials ---------------------------------------------------------------


def test_join_token_is_single_use(store: Store) -> None:
    node, event = make_node()
    store.add_node(node, event)
    assert store.set_join_token("n-missing", "h", T0) is False
    assert store.set_join_token(node.id, "hash-1", T0 + timedelta(minutes=10)) is True

    now = T0 + timedelta(minutes=1)
    assert store.consume_join_token("n-missing", "hash-1", now) == "unknown-node"
    assert store.consume_join_token(node.id, "hash-x", now) == "wrong-token"
    assert store.consume_join_token(node.id, "hash-1", now) == "ok"
    assert store.consume_join_token(node.id, "hash-1", now) == "replayed"
    assert store.consume_join_token(node.id, "hash-x", now) == "wrong-token"

    store.set_join_token(node.id, "hash-2", T0 + timedelta(minutes=10))
    assert store.consume_join_token(node.id, "hash-2", T0 + timedelta(minutes=10)) == "expired"

    store.record_join_attempt(node.id, now, True, "ok", remote="10.0.0.7")
    store.record_join_attempt(None, now, False, "unknown-node")
    attempts = store.join_attempts()
    assert [(a["node_id"], a["ok"], a["reason"]) for a in attempts] == [
        ("n-1", True, "ok"), (None, False, "unknown-node"),
    ]
    assert attempts[0]["remote"] == "10.0.0.7" and attempts[0]["at"] == now
    assert len(store.join_attempts(node.id)) == 1


def test_join_token_concurrent_consume_has_one_winner(store: Store) -> None:
    node, event = make_node()
    store.add_node(node, event)
    store.set_join_token(node.id, "hash-1", T0 + timedelta(minutes=10))
    results = race(4, lambda _: store.consume_join_token(node.id, "hash-1", T0))
    assert sorted(results) == ["ok", "replayed", "replayed", "replayed"]


def test_credentials(store: Store) -> None:
    node, event = make_node()
    store.add_node(node, event)
    assert store.check_credential(node.id, "cred") is False  # none set yet
    assert store.set_credential(node.id, "cred") is True
    assert store.check_credential(node.id, "cred") is True
    assert store.check_credential(node.id, "nope") is False
    assert store.check_credential("n-missing", "cred") is False
    assert store.set_credential("n-missing", "cred") is False


# -- decisions, memory, capacity blocks --------------------------------------------------------


def make_decision(i: int, policy: str = "train") -> Decision:
    return Decision(
        id=f"d-{i}", policy=policy, at=T0 + timedelta(seconds=i), rule=Rule.SCALE_UP,
        summary=f"launch {i}", inputs={"pending_gpus": {"vision": 16}, "wait_s": 912.5,
                                       "over": [1, 2], "note": None},
        options=(
            OfferingOption("aws/us-east-1/-/p4d.24xlarge/spot", 8, 11.57, 2, 46.28),
            OfferingOption("gcp/us-central1/a/a2-highgpu-8g/on-demand", 8, 29.39, 2, 117.56,
                           rejected="dearer"),
        ),
        chosen="aws/us-east-1/-/p4d.24xlarge/spot", held_back_by=("max_nodes",),
        actions=("launch n-1", "launch n-2"),
    )


def test_decisions_round_trip(store: Store) -> None:
    first = make_decision(1)
    store.add_decision(first)
    store.add_decision(first)  # a re-delivered tick: no-op
    store.add_decision(make_decision(2, policy="infer"))
    store.add_decision(make_decision(3))

    assert store.get_decision("d-1") == first
    assert store.get_decision("d-missing") is None
    got = store.get_decision("d-1")
    assert got is not None and got.at.tzinfo == UTC and got.rule is Rule.SCALE_UP
    assert [d.id for d in store.decisions()] == ["d-3", "d-2", "d-1"]
    assert [d.id for d in store.decisions(policy="train")] == ["d-3", "d-1"]
    assert [d.id for d in store.decisions(limit=1)] == ["d-3"]


def test_a_repeated_decision_counts_on_its_row_instead_of_adding_one(store: Store) -> None:
    def steady(i: int, summary: str = "held back: budget vision-day") -> Decision:
        return Decision(id=f"d-{i}", policy="train", at=T0 + timedelta(seconds=10 * i),
                        rule=Rule.LIMITED, summary=summary, inputs={"tick": i},
                        held_back_by=("budgets[vision-day]",))

    assert store.add_decision(steady(1)) == "d-1"
    assert store.add_decision(steady(2)) == "d-1"  # same rule, summary, actions: counted
    assert store.add_decision(steady(3)) == "d-1"
    assert store.add_decision(steady(3)) == "d-1"  # a re-delivered tick counts once
    assert store.add_decision(make_decision(4, policy="infer")) == "d-4"  # other policy: no effect
    assert store.add_decision(steady(5)) == "d-1"

    [row, other] = store.decisions()
    assert (row.id, row.repeats, row.last_seen) == ("d-1", 4, T0 + timedelta(seconds=50))
    assert row.inputs == {"tick": 1} and row.at == T0 + timedelta(seconds=10)  # the first's record
    assert other.id == "d-4" and other.repeats == 1 and other.last_seen_at is None
    assert store.get_decision("d-5") == row  # the latest repeat's id finds its row
    assert store.get_decision("d-2") is None  # a repeat between first and last keeps no id

    assert store.add_decision(steady(6, "held back: max_nodes")) == "d-6"  # a change: a new row
    assert store.add_decision(steady(7)) == "d-7"  # back to before: a new row, not d-1's
    assert [(d.id, d.repeats) for d in store.decisions(policy="train")] == [
        ("d-7", 1), ("d-6", 1), ("d-1", 4)]


def test_prune_decisions_drops_rows_last_seen_before_the_cut(store: Store) -> None:
    for i in (1, 2, 3):
        store.add_decision(make_decision(i))
    old = Decision(id="d-9", policy="infer", at=T0, rule=Rule.NO_DEMAND, summary="idle")
    store.add_decision(old)
    store.add_decision(replace(old, id="d-10", at=T0 + timedelta(seconds=30)))  # seen late
    assert store.prune_decisions(T0 + timedelta(seconds=2, milliseconds=500)) == 2  # d-1, d-2
    assert [d.id for d in store.decisions()] == ["d-9", "d-3"]
    assert store.latest_decisions(["train", "infer", "none"]).keys() == {"train", "infer"}


def test_memory_upsert(store: Store) -> None:
    assert store.load_memory() == {}
    first = PolicyMemory(trigger_since=T0)
    store.save_memory("train", first)
    store.save_memory("infer", PolicyMemory())
    assert store.load_memory() == {"train": first, "infer": PolicyMemory()}
    second = PolicyMemory(trigger_since=None, last_launch_at=T0, last_drain_at=T0)
    store.save_memory("train", second)
    assert store.load_memory()["train"] == second


def test_capacity_blocks_expire(store: Store) -> None:
    key, other = "aws/us-east-1/-/p4d.24xlarge/spot", "gcp/us-central1/a/a2-highgpu-8g/spot"
    store.add_capacity_block(CapacityBlock(key, T0 + timedelta(minutes=5), "short"), T0)
    store.add_capacity_block(CapacityBlock(key, T0 + timedelta(minutes=15), "long"), T0)
    store.add_capacity_block(CapacityBlock(other, T0 + timedelta(minutes=10), "x"), T0)

    assert store.capacity_blocks(T0) == [
        CapacityBlock(key, T0 + timedelta(minutes=15), "long"),
        CapacityBlock(other, T0 + timedelta(minutes=10), "x"),
    ]
    at_boundary = T0 + timedelta(minutes=10)  # `until` is exclusive
    assert store.capacity_blocks(at_boundary) == [
        CapacityBlock(key, T0 + timedelta(minutes=15), "long"),
    ]
    assert store.capacity_blocks(T0 + timedelta(hours=1)) == []


# -- built-in queue ----------------------------------------------------------------------------


def test_job_lifecycle(store: Store) -> None:
    low = store.submit_job("vision", "a100", 8, 0, 3600.0, "train.py", T0)
    high = store.submit_job("nlp", "a100", 4, 5, None, None, T0 + timedelta(seconds=1))
    later = store.submit_job("vision", "a100", 8, 0, None, None, T0 + timedelta(seconds=2))
    elsewhere = store.submit_job("vision", "h100", 8, 0, None, None, T0)
    assert low.id.startswith("j-") and len(low.id) == 12 and low.state is JobState.PENDING
    assert store.get_job(low.id) == low
    assert [j.id for j in store.jobs(pool="a100")] == [high.id, low.id, later.id]
    assert low.to_domain().duration_s == 3600.0 and low.to_domain().state is JobState.PENDING

    running = store.start_job(low, placement="burst", node_id="n-1", at=T0 + timedelta(minutes=1))
    assert running is not None
    assert (running.state, running.placement, running.attempts, running.version) == (
        JobState.RUNNING, Placement.BURST, 1, 1)
    assert store.get_job(low.id) == running
    assert store.start_job(low, placement="onprem", node_id=None, at=T0) is None  # stale
    assert [j.id for j in store.jobs(node_id="n-1")] == [low.id]

    requeued = store.requeue_job(running, T0 + timedelta(minutes=2))
    assert requeued is not None and requeued.state is JobState.PENDING
    assert (requeued.node_id, requeued.placement, requeued.started_at, requeued.attempts) == (
        None, None, None, 1)
    assert store.requeue_job(running, T0) is None

    again = store.start_job(requeued, placement="onprem", node_id=None,
                            at=T0 + timedelta(minutes=3))
    assert again is not None and again.attempts == 2
    with pytest.raises(ValueError):
        store.finish_job(again, state=JobState.CANCELLED, exit_code=None, at=T0)
    done = store.finish_job(again, state=JobState.DONE, exit_code=0, at=T0 + timedelta(hours=1))
    assert done is not None and store.get_job(low.id) == done
    assert store.finish_job(again, state=JobState.FAILED, exit_code=1, at=T0) is None

    assert store.cancel_job(later.id) is True
    assert store.cancel_job(later.id) is False
    assert store.cancel_job(low.id) is False  # done, not pending
    assert store.cancel_job("j-missing") is False
    assert [j.id for j in store.jobs(states=[JobState.PENDING])] == [high.id, elsewhere.id]
    assert [j.id for j in store.jobs(limit=1)] == [high.id]


def test_job_claim_race_between_threads(store: Store) -> None:
    job = store.submit_job("vision", "a100", 8, 0, None, None, T0)
    results: list[JobRecord | None] = race(
        2, lambda i: store.start_job(job, placement="burst", node_id=f"n-{i}", at=T0))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    stored = store.get_job(job.id)
    assert stored == winners[0] and stored.attempts == 1


def _submit_many(url: str, n: int) -> None:
    with Store(url) as store:
        for i in range(n):
            store.submit_job("p", "a100", 1, 0, None, None, T0 + timedelta(seconds=i))


def test_concurrent_writers_serialise(store: Store, store_url: str) -> None:
    """Writers on separate engines (and, for SQLite, separate processes) wait, never error."""
    race(3, lambda _: _submit_many(store_url, 15))
    if store.dialect == "sqlite":
        # spawn, not fork: a forked child inherits whatever sockets earlier tests left open (e.g. a
        # Celery worker's Redis connection, whose after-fork hook then blocks the child forever).
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_submit_many, args=(store_url, 15)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=30)
        assert [p.exitcode for p in procs] == [0, 0]
    expected = 45 + (30 if store.dialect == "sqlite" else 0)
    assert len(store.jobs()) == expected


# -- time --------------------------------------------------------------------------------------


def test_datetimes_round_trip_tz_aware_utc(store: Store) -> None:
    paris = timezone(timedelta(hours=2))
    at = datetime(2025, 6, 1, 14, 30, 15, 123456, tzinfo=paris)
    node, event = make_node(at=at)
    node_with_beat = Node(**{**{f: getattr(node, f) for f in node.__dataclass_fields__},
                             "last_heartbeat": at})
    store.add_node(node_with_beat, event)
    stored = store.get_node(node.id)
    assert stored is not None
    for value in (stored.state_since, stored.created_at, stored.last_heartbeat,
                  store.events(node.id)[0].at):
        assert value == at and value.tzinfo == UTC and value.hour == 12
    assert stored.idle_since is None

    job = store.submit_job("p", "a100", 1, 0, None, None, at)
    got = store.get_job(job.id)
    assert got is not None and got.submitted_at == at and got.submitted_at.tzinfo == UTC

    naive, naive_event = make_node(2, at=datetime(2025, 6, 1, 12, 0))
    with pytest.raises(ValueError, match="naive"):
        store.add_node(naive, naive_event)
    with pytest.raises(ValueError, match="naive"):
        store.save_memory("train", PolicyMemory(trigger_since=datetime(2025, 6, 1)))
