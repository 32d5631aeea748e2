"""The ledger reach's kept group counts (orchestrator.store.reach_groups) on SQLite and
PostgreSQL: after every write of random histories (nodes added, launched, terminated, lines and
marks written one node at a time or in the roll-up's batch, rebuilds), the counts equal the
``GROUP BY`` of the reach from scratch, the budgets' accrual read from them equals the per-node
derivation to the micro-dollar and the live prices those of the node rows; a rebuild leaves them
as they were; a failure anywhere in a write leaves the reach and its counts as before it; writers
racing on the same nodes leave them right. Their version (orchestrator.store.reach_version) moves
with every write that changes them, in its transaction, and a store's kept groups are never served
once it has moved: not after a write of this store, of another store of the same database, or of
writers racing with readers."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.costs.spend import WindowSpend
from orchestrator.domain import NodeState
from orchestrator.lifecycle import NodeEvent, transition
from orchestrator.store import Store, reach_groups, reach_version, rollup_version
from orchestrator.store.ledger_batch import LedgerWrite
from tests.builders import make_node, make_offering
from tests.racing import race
from tests.integration.test_ledger_reach import (
    EPOCH,
    TABLES,
    T0,
    H,
    from_scratch,
    grouped,
    line,
    live_prices,
)

NODES = [f"n{i}" for i in range(4)]
S = NodeState

op_st = st.one_of(
    st.tuples(st.just("add"), st.sampled_from(NODES), st.sampled_from(["gpu", "big"]),
              st.sampled_from([None, "nlp"]), st.sampled_from([1.0, 9.5, 32.77, 1.2345678])),
    st.tuples(st.just("step"), st.sampled_from(NODES),
              st.sampled_from([S.LAUNCHING, S.BOOTING, S.TERMINATING, S.TERMINATED, S.FAILED])),
    st.tuples(st.just("step"), st.sampled_from(NODES),
              st.sampled_from([S.LAUNCHING, S.TERMINATING, S.TERMINATED])),
    st.tuples(st.just("lines"), st.sampled_from(NODES), st.integers(0, 4),
              st.one_of(st.none(), st.integers(-1, 5))),
    st.tuples(st.just("batch"), st.sets(st.sampled_from(NODES), min_size=1),
              st.integers(0, 4), st.one_of(st.none(), st.integers(-1, 5))),
    st.tuples(st.just("rebuild")),
)
# Each operation a few minutes and some microseconds after the one before: nodes launched and
# rolled at distinct instants accrue apart, some at the same one together.
gap_st = st.tuples(st.integers(0, 90), st.sampled_from([0, 0, 1800, 123_457, 30_000_001]))


def empty(store: Store) -> None:
    with store.engine.begin() as conn:
        for table in TABLES:
            conn.exec_driver_sql(f"DELETE FROM {table}")
        reach_version.bump(conn)  # the groups written around the store: stores read them again
        rollup_version.ROLLUPS.bump(conn)  # the roll-ups too: stores read their sums again


def lines_of(store: Store, node_id: str, hours: int, mark: int | None, at: datetime
             ) -> LedgerWrite | None:
    node = store.get_node(node_id)
    if node is None:
        return None
    base = at.replace(minute=0, second=0, microsecond=0) - 2 * H
    return LedgerWrite(node_id, [line(node_id, node.pool, node.project, base + k * H, k)
                                 for k in range(hours)],
                       since=EPOCH, mark=None if mark is None else base + mark * H)


def apply(store: Store, op: tuple, at: datetime) -> None:
    kind = op[0]
    if kind == "add":
        _, node_id, pool, project, price = op
        node = make_node(node_id, state=S.REQUESTED, pool=pool, project=project,
                         offering=make_offering(price=price), state_since=at, created_at=at)
        store.add_node(node, NodeEvent(node_id, at, None, S.REQUESTED, "test", {}))
    elif kind == "step":
        _, node_id, target = op
        node = store.get_node(node_id)
        if node is None or at < node.state_since:
            return
        try:
            new, event = transition(node, target, at=at, reason="test")
        except Exception:  # noqa: BLE001 - an edge the lifecycle refuses: nothing to write
            return
        assert store.save_transition(node, new, event)
    elif kind == "lines":
        _, node_id, hours, mark = op
        write = lines_of(store, node_id, hours, mark, at)
        if write is not None:
            store.write_ledger(node_id, write.lines, since=write.since, mark=write.mark, at=at)
    elif kind == "batch":
        _, node_ids, hours, mark = op
        writes = [w for w in (lines_of(store, n, hours, mark, at) for n in sorted(node_ids)) if w]
        store.write_ledgers(writes, at=at)
    else:
        store.rebuild_cost_rollups()


def counts(store: Store) -> Any:
    with store.engine.connect() as conn:
        kept = reach_groups.kept(conn)
        assert kept == reach_groups.derive(conn)
    return kept


def check_reads(store: Store, now: datetime) -> None:
    """The budgets' reads from the kept counts: accrual to the micro-dollar per (pool, project)
    as derived per node, for windows cut before, inside and after the nodes' lives; live prices
    as the node rows have them."""
    nodes = from_scratch(store)
    for since, until in ((T0 - 24 * H, T0 + 24 * H), (now - H, now + H),
                         (T0 + timedelta(minutes=47, microseconds=1800), now + H)):
        if since < until:
            assert WindowSpend(store, now).accrued(since, until) == \
                grouped(nodes, since, until, now)
    got = sorted(store.live_node_price_counts(), key=lambda r: (r[0], r[1] or "", r[2]))
    assert got == sorted(live_prices(store), key=lambda r: (r[0], r[1] or "", r[2]))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(op_st, gap_st), min_size=1, max_size=16))
def test_the_kept_counts_equal_the_grouped_reach_after_every_write(
        store: Store, ops: list[tuple[tuple, tuple[int, int]]]) -> None:
    empty(store)
    at = T0
    for node_id in NODES[:2]:  # two nodes from the start: more histories reach their end
        apply(store, ("add", node_id, "gpu", "nlp", 9.5), at)
    for op, (minutes, us) in ops:
        at += timedelta(minutes=minutes, microseconds=us)
        apply(store, op, at)
        kept = counts(store)
        check_reads(store, at + timedelta(minutes=3, microseconds=5400))
    store.rebuild_cost_rollups()
    assert counts(store) == kept


def _history(store: Store) -> None:
    for i, node_id in enumerate(NODES[:4]):
        at = T0 + timedelta(minutes=i, microseconds=1800 * i)
        apply(store, ("add", node_id, "gpu", "nlp", 9.5), at)
        apply(store, ("step", node_id, S.LAUNCHING), at + timedelta(seconds=5))
    apply(store, ("batch", set(NODES[:3]), 2, 1), T0 + 2 * H)
    apply(store, ("step", "n3", S.TERMINATING), T0 + 2 * H)


def _state(store: Store) -> tuple:
    with store.engine.connect() as conn:
        reach = sorted(tuple(r) for r in conn.execute(sa.text("SELECT * FROM ledger_reach")))
        nodes = sorted(tuple(r) for r in conn.execute(sa.text("SELECT id, state FROM nodes")))
    return (reach, sorted(counts(store).items(), key=lambda g: reach_groups.group_key(g[0])),
            nodes, version(store))


def version(store: Store) -> int | None:
    with store.engine.connect() as conn:
        return reach_version.read(conn)


def served(store: Store) -> tuple[list, list]:
    """The groups as ``store`` serves them to budgets (kept or read again), in one order."""
    kept = store.reach_group_set()
    return (sorted(kept.accrual, key=lambda g: reach_groups.group_key(g[:6])),
            sorted(kept.live, key=lambda g: reach_groups.group_key(g)))


def fresh(store: Store) -> tuple[list, list]:
    """The groups parsed from a read of the table, as no store has kept them."""
    from orchestrator.store.accrual import _budget_groups

    with store.engine.connect() as conn:
        accrual, live = _budget_groups(reach_groups.read(conn))
    return (sorted(accrual, key=lambda g: reach_groups.group_key(g[:6])),
            sorted(live, key=lambda g: reach_groups.group_key(g)))


@pytest.mark.parametrize(("write", "where"), [
    *((w, at) for w in ("transition", "batch") for at in ("before", "after", "flush")),
    ("rebuild", "flush")])
def test_a_failure_anywhere_in_a_write_leaves_the_reach_and_counts_as_they_were(
        store: Store, monkeypatch: pytest.MonkeyPatch, where: str, write: str) -> None:
    """The group counts are written in the transaction of the reach they count: a crash at the
    read before the write, the read after it or the counts' own upsert rolls back the write
    whole (node, reach and counts), and the next write starts clean."""
    empty(store)
    _history(store)
    before = _state(store)
    real_groups_of, real_apply = reach_groups.groups_of, reach_groups._apply
    calls = {"n": 0}

    def failing_groups_of(conn: Any, node_ids: Any) -> Any:
        calls["n"] += 1
        if (where == "before" and calls["n"] == 1) or (where == "after" and calls["n"] == 2):
            raise RuntimeError("crash")
        return real_groups_of(conn, node_ids)

    def failing_apply(conn: Any, delta: Any) -> None:
        raise RuntimeError("crash")

    if where == "flush":
        monkeypatch.setattr(reach_groups, "_apply", failing_apply)
    else:
        monkeypatch.setattr(reach_groups, "groups_of", failing_groups_of)
    with pytest.raises(RuntimeError, match="crash"):
        if write == "transition":
            apply(store, ("step", "n3", S.TERMINATED), T0 + 3 * H)
        elif write == "batch":
            apply(store, ("batch", set(NODES[:4]), 3, 2), T0 + 3 * H)
        else:
            monkeypatch.setattr(reach_groups, "rebuild", lambda conn: failing_apply(conn, None))
            store.rebuild_cost_rollups()
    monkeypatch.setattr(reach_groups, "groups_of", real_groups_of)
    monkeypatch.setattr(reach_groups, "_apply", real_apply)
    assert _state(store) == before
    apply(store, ("step", "n3", S.TERMINATED), T0 + 3 * H)  # the next write starts clean
    assert _state(store) != before
    check_reads(store, T0 + 4 * H)


def test_writers_racing_on_the_same_nodes_leave_the_counts_right(store: Store) -> None:
    """Threads writing lines of the same nodes in batches while others launch and terminate
    them (PostgreSQL: each before-read locks the rows, the counts go last in key order, so no
    writer reads a group another is changing and none deadlocks)."""
    empty(store)
    ids = [f"r{i}" for i in range(12)]
    for i, node_id in enumerate(ids):
        apply(store, ("add", node_id, "gpu", ["nlp", None][i % 2], 9.5),
              T0 + timedelta(microseconds=i))
    errors: list[BaseException] = []

    def launcher() -> None:
        try:
            for i, node_id in enumerate(ids):
                apply(store, ("step", node_id, S.LAUNCHING), T0 + timedelta(minutes=1, seconds=i))
            for node_id in ids[::3]:
                apply(store, ("step", node_id, S.TERMINATING), T0 + 3 * H)
                apply(store, ("step", node_id, S.TERMINATED), T0 + 3 * H)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def roller(k: int) -> None:
        try:
            for r in range(6):
                chosen = set(ids[k::2]) if r % 2 else set(ids)
                apply(store, ("batch", chosen, 2 + r % 2, 1), T0 + (2 + r) * H)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=launcher), threading.Thread(target=roller, args=(0,)),
               threading.Thread(target=roller, args=(1,))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    kept = counts(store)
    assert sum(kept.values()) > 0
    check_reads(store, T0 + 9 * H)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(op_st, gap_st), min_size=1, max_size=12))
def test_every_write_that_changes_the_groups_moves_their_version(
        store: Store, ops: list[tuple[tuple, tuple[int, int]]]) -> None:
    """Each write path (a node added, launched, terminated, lines of one node or of a batch, a
    rebuild): when the kept counts differ after it, the version is past what it was, and the
    store that kept the groups before it serves the new ones (a second store of the same
    database too); when nothing moved, the kept set is served again as it is."""
    empty(store)
    other = Store(store.url if store.dialect == "postgresql" else str(store.engine.url))
    try:
        at = T0
        apply(store, ("add", "n0", "gpu", "nlp", 9.5), at)
        for op, (minutes, us) in ops:
            before, was = counts(store), version(store)
            kept_before = store.reach_group_set()
            other.reach_group_set()  # the other store keeps them too
            at += timedelta(minutes=minutes, microseconds=us)
            apply(store, op, at)
            after, now = counts(store), version(store)
            assert was is not None and now is not None and now >= was
            if after != before:
                assert now > was, (op, before, after)
            if now == was:
                assert store.reach_group_set() is kept_before
            assert served(store) == fresh(store), op
            assert served(other) == fresh(store), op
    finally:
        other.close()


def test_a_write_around_the_store_is_seen_once_it_moves_the_version(store: Store) -> None:
    """The kept groups are what was read at their version: rows changed by raw SQL without
    the version are not seen (the documented rule for writes around the store), and are once
    the version moves; a rolled-back write moves neither; a rebuild moves it."""
    empty(store)
    _history(store)
    kept = served(store)
    assert kept == fresh(store) and kept[0]
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE ledger_reach_groups SET nodes = nodes + 5")
    assert served(store) == kept  # kept: the version did not move
    with pytest.raises(RuntimeError):
        with store.engine.begin() as conn:
            reach_version.bump(conn)
            raise RuntimeError("rolled back")
    assert served(store) == kept
    with store.engine.begin() as conn:
        reach_version.bump(conn)
    assert served(store) == fresh(store) != kept
    # A rebuild (burst db rebuild-rollups) moves it too: a price changed around the store.
    kept = served(store)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE nodes SET price_usd_hour = 2.5 WHERE id = 'n0'")
    store.rebuild_cost_rollups()
    assert served(store) == fresh(store) != kept


def test_readers_racing_with_writers_never_keep_stale_groups(store: Store) -> None:
    """Budget reads in threads while others launch, roll up and terminate nodes: every read
    serves groups whose version is no older than what the table held when it began, and once
    the writers stop, every store serves the groups as written."""
    empty(store)
    ids = [f"w{i}" for i in range(10)]
    for i, node_id in enumerate(ids):
        apply(store, ("add", node_id, "gpu", ["nlp", None][i % 2], [9.5, 1.2345678][i % 2]),
              T0 + timedelta(microseconds=i))
    reader = Store(store.url if store.dialect == "postgresql" else str(store.engine.url))

    def write() -> None:
        for i, node_id in enumerate(ids):
            apply(store, ("step", node_id, S.LAUNCHING), T0 + timedelta(minutes=1, seconds=i))
            apply(store, ("batch", set(ids[: i + 1]), 1 + i % 3, 1), T0 + (2 + i) * H)
        for node_id in ids[::3]:
            apply(store, ("step", node_id, S.TERMINATING), T0 + 20 * H)
            apply(store, ("step", node_id, S.TERMINATED), T0 + 20 * H)

    def read() -> None:
        began = version(reader)
        got = reader.reach_group_set()
        assert got.version is not None and began is not None
        assert got.version >= began

    try:
        race(write, read)
        assert served(reader) == fresh(store) == served(store)
        check_reads(reader, T0 + 21 * H)
    finally:
        reader.close()
