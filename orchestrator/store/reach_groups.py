"""The ledger reach counted per group of nodes that accrue alike, kept as the reach is written.

Budgets read the ledger reach (:mod:`orchestrator.store.accrual`) as groups: nodes of one pool,
project and price whose unbilled time starts (``start_us``) and ends (``ended_us``) at the same
instants, billed or not by lines (``billed``), accrue the same micro-dollars in any window, and
the live ones (``live``) burn the same price. A ``GROUP BY`` of the reach read every node's row
on every request (about 2 ms at 10,000 live nodes on SQLite, two scans). ``ledger_reach_groups``
holds that ``GROUP BY`` itself, one row per group with its node count, so a budget read is a
read of a few rows whatever the number of nodes.

Exact by construction: a group is the same set of nodes the ``GROUP BY`` made, and its
micro-dollars are still one node's, rounded half to even on its own, times the count. (A sum of
start times per (pool, project, price) would make the read independent of how many distinct
starts there are, but not exact: each node's accrual rounds to the micro-dollar on its own, so a
group's rounded total differs from the sum of its nodes' by up to half a micro-dollar a node.)

Upkeep, in the writer's transaction (:func:`changing`): the group of each row a write changes is
read before the write (``FOR UPDATE`` on PostgreSQL, so a concurrent writer of the same node
waits and then reads what the first one wrote) and after it, and the difference goes to the
transaction's pending counts. ``Store._write`` applies them as its transaction's last
statements (:func:`flush`): one upsert of the changed groups' counts, in key order (so writers
that share groups take their rows in one order and never deadlock), and one delete of the groups
left empty. A crash anywhere rolls back the reach and its counts together. A write outside
``Store._write`` (a test, a script) applies its counts at once. :func:`rebuild` makes the table
the ``GROUP BY`` of the reach again (``burst db rebuild-rollups``, migration 0021). Every write
of the counts also moves their version (:mod:`orchestrator.store.reach_version`, migration 0022)
in its transaction, so a store that keeps the groups it read knows when to read them again.

Only rows that count somewhere are kept: launched (``start_us`` set: they accrue) or live
(their price burns). A node refused at launch and terminated is neither.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite

from orchestrator.store import reach_version
from orchestrator.store import tables as T
from orchestrator.store.keysets import among
from orchestrator.store.rawread import driver_rows, driver_rows_bound

# The group of a reach row: pool, project, price, start_us, billed, ended_us, live.
Group = tuple[str, str | None, float, int | None, bool, int | None, bool]
GROUP_COLUMNS = ("pool", "project", "price_usd_hour", "start_us", "billed", "ended_us", "live")
PENDING = "burst.reach_groups.pending"  # Connection.info key: the transaction's pending counts

ledger_reach_groups = sa.Table(
    "ledger_reach_groups", T.Base.metadata,
    # The group's columns as one text (group_key): a unique key over nullable columns.
    sa.Column("group_key", sa.String(600), primary_key=True),
    sa.Column("pool", sa.String(T.STR_NAME), nullable=False),
    sa.Column("project", sa.String(T.STR_NAME)),
    sa.Column("price_usd_hour", sa.Float, nullable=False),
    sa.Column("start_us", sa.BigInteger),
    sa.Column("billed", sa.Boolean, nullable=False),
    sa.Column("ended_us", sa.BigInteger),
    sa.Column("live", sa.Boolean, nullable=False),
    sa.Column("nodes", sa.Integer, nullable=False),
)
_g = ledger_reach_groups.c


def _reach() -> sa.Table:
    """``ledger_reach`` (the accrual module's table, which imports this one)."""
    return T.Base.metadata.tables["ledger_reach"]


def group_key(group: Group) -> str:
    """The text key of ``group`` (JSON: the float price as its shortest repr, exact)."""
    return json.dumps(group, separators=(",", ":"))


def group_of(row: Any) -> Group:
    """A reach row's group, from its columns in ``GROUP_COLUMNS`` order, normalised (SQLite
    gives its booleans as integers)."""
    pool, project, price, start, billed, ended, live = row
    return (pool, project, float(price), None if start is None else int(start), bool(billed),
            None if ended is None else int(ended), bool(live))


def counts(group: Group) -> bool:
    """Whether nodes of ``group`` count anywhere: launched (they accrue) or live (they burn)."""
    return group[3] is not None or group[6]


# -- upkeep ------------------------------------------------------------------------------------

def groups_of(conn: Connection, node_ids: Collection[str]) -> Counter[Group]:
    """How many of ``node_ids``' reach rows are in each group, as ``conn``'s transaction sees
    them; on PostgreSQL the rows are locked (in key order) until it ends."""
    dialect = conn.dialect.name
    if len(node_ids) == 1:  # a state change, a node's write: one statement built once
        rows: Iterable[Any] = conn.execute(_one(dialect), {"node_id": next(iter(node_ids))})
    else:  # the roll-up's batch: its thousands of rows as the driver gives them
        r = _reach().c
        query = sa.select(*(r[name] for name in GROUP_COLUMNS)).where(
            among(dialect, r.node_id, node_ids))
        if dialect == "postgresql":
            query = query.order_by(r.node_id).with_for_update()
        rows = driver_rows_bound(conn, query)
    found: Counter[Group] = Counter()
    for row in rows:
        group = group_of(row)
        if counts(group):
            found[group] += 1
    return found


_STATEMENTS: dict[tuple[str, str], Any] = {}


def _one(dialect: str) -> Any:
    """The group columns of one node's reach row (``:node_id``), locked on PostgreSQL."""
    stmt = _STATEMENTS.get((dialect, "one"))
    if stmt is None:
        r = _reach().c
        stmt = sa.select(*(r[name] for name in GROUP_COLUMNS)).where(
            r.node_id == sa.bindparam("node_id"))
        if dialect == "postgresql":
            stmt = stmt.with_for_update()
        _STATEMENTS[(dialect, "one")] = stmt
    return stmt


@contextmanager
def changing(conn: Connection, node_ids: Collection[str]) -> Iterator[None]:
    """Around a write of ``node_ids``' reach rows: their groups before and after it go to the
    transaction's pending counts (applied by :func:`flush` at its end)."""
    if not node_ids:
        yield
        return
    before = groups_of(conn, node_ids)
    yield
    after = groups_of(conn, node_ids)
    after.subtract(before)
    pending = conn.info.get(PENDING)
    if pending is None:  # not in Store._write: apply at once
        _apply(conn, after)
    else:
        pending.update(after)


def begin(conn: Connection) -> None:
    """Start collecting the pending counts of ``conn``'s transaction (``Store._write``)."""
    conn.info[PENDING] = Counter()


def flush(conn: Connection) -> None:
    """Apply the pending counts of ``conn``'s transaction; its last statements."""
    pending = conn.info.pop(PENDING, None)
    if pending:
        _apply(conn, pending)


def discard(conn: Connection) -> None:
    """Forget the pending counts (the transaction rolled back)."""
    conn.info.pop(PENDING, None)


def _apply(conn: Connection, delta: Counter[Group]) -> None:
    changed = sorted(((group_key(g), g, n) for g, n in delta.items() if n), key=lambda c: c[0])
    if not changed:
        return
    upsert, delete = _writes(conn.dialect.name)
    # In key order (an executemany runs them in the order given).
    conn.execute(upsert, [dict(zip(("group_key", *GROUP_COLUMNS, "nodes"), (key, *g, n)))
                          for key, g, n in changed])
    emptied = [key for key, _, n in changed if n < 0]  # only a decrement can empty a group
    if emptied:
        conn.execute(delete, {"keys": emptied})
    reach_version.bump(conn)  # last, after the group rows (orchestrator.store.reach_version)


def _writes(dialect: str) -> tuple[Any, Any]:
    """The counts' upsert (an increment) and the delete of the groups left empty (``:keys``),
    built once per dialect."""
    both = _STATEMENTS.get((dialect, "writes"))
    if both is None:
        insert = (pg.insert if dialect == "postgresql" else sqlite.insert)(ledger_reach_groups)
        upsert = insert.on_conflict_do_update(
            index_elements=[_g.group_key], set_={"nodes": _g.nodes + insert.excluded.nodes})
        delete = sa.delete(ledger_reach_groups).where(
            _g.group_key.in_(sa.bindparam("keys", expanding=True)), _g.nodes <= 0)
        both = _STATEMENTS[(dialect, "writes")] = (upsert, delete)
    return both


def rebuild(conn: Connection) -> int:
    """Make ``ledger_reach_groups`` the ``GROUP BY`` of ``ledger_reach`` as ``conn``'s
    transaction sees it (the caller holds the reach still). Returns its row count."""
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("LOCK TABLE ledger_reach_groups IN EXCLUSIVE MODE")
    conn.execute(sa.delete(ledger_reach_groups))
    rows = [dict(zip(("group_key", *GROUP_COLUMNS, "nodes"), (group_key(g), *g, n)))
            for g, n in derive(conn).items()]
    rows.sort(key=lambda row: row["group_key"])
    for i in range(0, len(rows), 1000):
        conn.execute(sa.insert(ledger_reach_groups), rows[i:i + 1000])
    reach_version.bump(conn)
    return len(rows)


def derive(conn: Connection) -> Counter[Group]:
    """The groups ``ledger_reach`` holds now, counted from scratch."""
    r = _reach().c
    cols = [r[name] for name in GROUP_COLUMNS]
    out: Counter[Group] = Counter()
    for *row, n in conn.execute(sa.select(*cols, sa.func.count()).group_by(*cols)):
        group = group_of(row)
        if counts(group):
            out[group] += int(n)
    return out


def kept(conn: Connection) -> Counter[Group]:
    """The groups as ``ledger_reach_groups`` holds them."""
    return Counter({group_of(row[:-1]): int(row[-1]) for row in conn.execute(
        sa.select(*(_g[name] for name in GROUP_COLUMNS), _g.nodes))})


def read(conn: Connection) -> list[tuple[Any, ...]]:
    """Every group row as the driver gives it (``GROUP_COLUMNS`` then the node count): the
    budgets' one read."""
    return driver_rows(conn, _READ)


_READ = f"SELECT {', '.join(GROUP_COLUMNS)}, nodes FROM ledger_reach_groups"  # (no binds)


__all__ = ["GROUP_COLUMNS", "Group", "begin", "changing", "counts", "derive", "discard", "flush",
           "group_key", "group_of", "groups_of", "kept", "ledger_reach_groups", "read", "rebuild"]
