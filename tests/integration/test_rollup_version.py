"""The cost roll-ups' version (orchestrator.store.rollup_version) and the window sums a store keeps
under it, on SQLite and PostgreSQL: every write that changes the roll-ups (lines of one node, the
roll-up's batch, a rebuild) moves the version in its transaction, a write that changes nothing and
a rolled-back one do not, and the budgets' window sums a store serves are always the roll-ups'
sums as a store that keeps nothing reads them (after a write of this store, of another store of
the same database, and once writers racing with readers stop). Reads of one statement run
without a transaction on PostgreSQL (``Store._peek``), and leave no connection of the pool in
autocommit."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.domain import NodeState
from orchestrator.store import Store, rollup_version
from orchestrator.store.accrual import _window_cost
from orchestrator.store.versions import read_versions
from tests.integration.test_ledger_reach import T0, H
from tests.integration.test_reach_groups import apply, empty, gap_st, op_st
from tests.racing import race

S = NodeState
ROLLUP_TABLES = ("cost_rollup_hours", "cost_rollup_days", "cost_rollup_months")
# Windows cut at the hour, inside hours, around the histories' lines, and unbounded on none.
WINDOWS = ((T0 - 24 * H, T0 + 48 * H), (T0 + timedelta(minutes=30), T0 + 3 * H),
           (T0 + 2 * H, T0 + 2 * H + timedelta(microseconds=1)), (T0 - 30 * 24 * H, T0 + H))


def other_store(store: Store) -> Store:
    return Store(store.url if store.dialect == "postgresql" else str(store.engine.url))


def version(store: Store) -> int | None:
    with store.engine.connect() as conn:
        return rollup_version.ROLLUPS.read(conn)


def rollup_rows(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    with store.engine.connect() as conn:
        return {t: sorted(tuple(r) for r in conn.execute(sa.text(
            f"SELECT * FROM {t} WHERE lines <> 0"))) for t in ROLLUP_TABLES}


def served(store: Store) -> dict[tuple[datetime, datetime], dict[Any, int]]:
    """Each window's sums as ``store`` serves them to budgets (kept or read again)."""
    return dict(store.budget_inputs(T0 + 30 * H, WINDOWS).lines)


def fresh(store: Store) -> dict[tuple[datetime, datetime], dict[Any, int]]:
    """Each window's sums read from the roll-ups, as no store has kept them (that the roll-ups
    are the lines' sums is tests/integration/test_cost_rollups.py's)."""
    with store.engine.connect() as conn:
        return {w: _window_cost(conn, *w) for w in sorted(WINDOWS)}


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(ops=st.lists(st.tuples(op_st, gap_st), min_size=1, max_size=12))
def test_every_write_that_changes_the_rollups_moves_their_version(
        store: Store, ops: list[tuple[tuple, tuple[int, int]]]) -> None:
    """Each write path (a node added or moved, lines of one node or of a batch, a rebuild):
    when the roll-ups differ after it, their version is past what it was; the sums this store
    and a second one of the same database serve, both having kept them before the write, are
    what the roll-ups hold; when the version did not move, what is served is the very
    dictionary kept before."""
    empty(store)
    other = other_store(store)
    try:
        at = T0
        apply(store, ("add", "n0", "gpu", "nlp", 9.5), at)
        apply(store, ("step", "n0", S.LAUNCHING), at + timedelta(seconds=1))
        for op, (minutes, us) in ops:
            before, was = rollup_rows(store), version(store)
            kept_before = served(store)
            served(other)  # the other store keeps them too
            at += timedelta(minutes=minutes, microseconds=us)
            apply(store, op, at)
            after, now = rollup_rows(store), version(store)
            assert was is not None and now is not None
            if after != before:
                assert now != was, (op, before, after)
            got = served(store)
            if now == was:
                assert all(got[w] is kept_before[w] for w in got), op
            assert got == fresh(store), op
            assert served(other) == fresh(store), op
    finally:
        other.close()


def _history(store: Store) -> None:
    for i, node_id in enumerate(("n0", "n1", "n2")):
        at = T0 + timedelta(minutes=i)
        apply(store, ("add", node_id, "gpu", ["nlp", None][i % 2], 9.5), at)
        apply(store, ("step", node_id, S.LAUNCHING), at + timedelta(seconds=5))
    apply(store, ("batch", {"n0", "n1", "n2"}, 3, 1), T0 + 3 * H)


def test_a_write_that_changes_nothing_or_rolls_back_keeps_the_version(store: Store) -> None:
    """The same lines written again change no roll-up and move nothing; a write that fails after
    its roll-ups moves neither them nor their version; a rebuild moves it."""
    empty(store)
    _history(store)
    kept, was = served(store), version(store)
    assert any(kept.values())
    apply(store, ("batch", {"n0", "n1", "n2"}, 3, 1), T0 + 3 * H)  # the same lines again
    assert version(store) == was
    assert all(served(store)[w] is kept[w] for w in kept)

    real = rollup_version.ROLLUPS.bump

    def failing(conn: Any) -> None:
        real(conn)
        raise RuntimeError("the disk filled at the commit")

    rollup_version.ROLLUPS.bump = failing  # type: ignore[method-assign]
    try:
        with pytest.raises(RuntimeError):
            apply(store, ("batch", {"n0", "n1"}, 4, 2), T0 + 5 * H)
    finally:
        rollup_version.ROLLUPS.bump = real  # type: ignore[method-assign]
    assert version(store) == was
    assert served(store) == kept == fresh(store)
    store.rebuild_cost_rollups()
    assert version(store) != was
    assert served(store) == fresh(store)


def test_a_write_around_the_store_is_seen_once_it_moves_the_version(store: Store) -> None:
    """Roll-up rows changed by raw SQL without the version are not seen by a store that kept
    their sums (the documented rule for writes around the store), and are once it moves."""
    empty(store)
    _history(store)
    kept = served(store)
    with store.engine.begin() as conn:
        for table in ROLLUP_TABLES:
            conn.exec_driver_sql(f"UPDATE {table} SET cost_micros = cost_micros + 7")
    assert served(store) == kept
    with store.engine.begin() as conn:
        rollup_version.ROLLUPS.bump(conn)
    assert served(store) == fresh(store) != kept


def test_readers_racing_with_writers_never_keep_stale_sums(store: Store) -> None:
    """Budget reads in threads of one store while another rolls nodes up: a read no roll-up
    write committed around serves the roll-ups' sums as they are, and once the writers stop,
    every store serves them as written."""
    empty(store)
    ids = [f"w{i}" for i in range(8)]
    for i, node_id in enumerate(ids):
        apply(store, ("add", node_id, "gpu", ["nlp", None][i % 2], [9.5, 1.2345678][i % 2]),
              T0 + timedelta(microseconds=i))
        apply(store, ("step", node_id, S.LAUNCHING), T0 + timedelta(minutes=1, seconds=i))
    reader = other_store(store)

    def write() -> None:
        for i, node_id in enumerate(ids):
            apply(store, ("batch", set(ids[: i + 1]), 1 + i % 4, i % 3), T0 + (2 + i) * H)
            apply(store, ("lines", node_id, 2, None), T0 + (2 + i) * H)

    def read() -> None:
        began = version(reader)
        got, now = served(reader), fresh(reader)
        if version(reader) == began:  # no roll-up committed around the read: served is current
            assert got == now

    try:
        race(write, read)
        assert served(reader) == fresh(store) == served(store)
    finally:
        reader.close()


def test_versions_are_read_together_and_a_missing_row_keeps_nothing(store: Store) -> None:
    """Both counters in one statement; with a counter's row gone (a schema emptied around the
    store) nothing is kept under it, and the next write brings the row back."""
    from orchestrator.store.reach_version import REACH

    empty(store)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM cost_rollup_version")
    with store.engine.connect() as conn:
        reach, rolled = read_versions(conn, (REACH, rollup_version.ROLLUPS))
    assert reach is not None and rolled is None
    _history(store)  # moves it: the row is back
    assert version(store) is not None
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM cost_rollup_version")
    first = served(store)
    assert first == fresh(store)
    with store.engine.begin() as conn:
        for table in ROLLUP_TABLES:
            conn.exec_driver_sql(f"UPDATE {table} SET cost_micros = cost_micros + 7")
    assert served(store) == fresh(store) != first  # nothing was kept


def test_reads_without_a_transaction_leave_the_pool_as_it_was(store: Store) -> None:
    """After many reads of one statement (the token check, the budgets' inputs), a write
    transaction that fails still rolls back: no connection went back to the pool in
    autocommit."""
    empty(store)
    _history(store)
    for _ in range(30):
        served(store)
        assert store.check_api_token("no-such-token", T0)[1] == "unknown"
    before = rollup_rows(store)
    with pytest.raises(RuntimeError):
        with store._write() as conn:  # noqa: SLF001 - the store's own transaction
            conn.exec_driver_sql("DELETE FROM cost_rollup_hours")
            raise RuntimeError("rolled back")
    assert rollup_rows(store) == before
