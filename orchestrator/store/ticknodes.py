"""The tick's nodes: every node row a planning pass needs, read once.

A planning pass (:func:`orchestrator.tick.planning_pass`) needs the nodes twice: the cost
roll-up's candidates (every live node, and terminated ones whose ledger is not final through
their end, with their mark and ledger reach: :meth:`Ledger.ledger_candidates`) and the snapshot's
live nodes (:meth:`Store.node_fields`, made into ``Node``\\ s by :mod:`orchestrator.observe`). At
10,000 live nodes each read cost 40-50 ms of a tick's CPU on PostgreSQL, for the same rows.
:meth:`TickNodesRead.tick_nodes` reads them once, as the driver's tuples (:mod:`rawread`): each
node's columns in ``NODE_FIELDS`` order, then its mark and ledger reach (what the candidates
add), ordered by creation as both readers were. The roll-up takes its candidates from it and the
snapshot its live nodes; nothing between the two in a pass writes a node row.

The rows stay the driver's: a reader converts only the rows it needs (:func:`node_values`, what
:meth:`Store.node_fields` gives per row), and one that keeps what it made from a row last tick
(:mod:`orchestrator.kept`) compares the raw rows, so an unchanged node is not converted again.
On PostgreSQL the times (the nodes' and the mark) come as whole microseconds since the epoch
(:func:`~orchestrator.store.rawread.epoch_us_column`): psycopg made six aware datetimes a row,
27 against 15 ms of CPU for 10,000 nodes, and every reader converts them with ``rawread.utc``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from operator import itemgetter
from typing import Any

import sqlalchemy as sa

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.policy.models import Market
from orchestrator.store import accrual
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase
from orchestrator.store.rawread import driver_rows, epoch_us_column, utc

NODE_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Node))
_N = len(NODE_FIELDS)

# A driver's node row (NODE_FIELDS order) as a Node's field values, by position.
_STATES: dict[str, NodeState] = {s.value: s for s in NodeState}
_MARKETS: dict[str, Market] = {m.value: m for m in Market}
_TIME_AT = tuple(i for i, name in enumerate(NODE_FIELDS)
                 if isinstance(T.nodes.c[name].type, T.UtcDateTime))
_STATE_AT, _MARKET_AT = NODE_FIELDS.index("state"), NODE_FIELDS.index("market")
_BOOL_AT = tuple(i for i, name in enumerate(NODE_FIELDS)
                 if isinstance(T.nodes.c[name].type, sa.Boolean))
_LAUNCHED_FOR_AT = NODE_FIELDS.index("launched_for")
_TERMINATED = NodeState.TERMINATED.value
_POLICY_AT, _POOL_AT, _PROJECT_AT, _PRICE_AT = (
    NODE_FIELDS.index(name) for name in ("policy", "pool", "project", "price_usd_hour"))


def launched_for(raw: Any) -> tuple[str, ...]:
    """The driver's JSON list of job ids (SQLite hands back its text) as the Node keeps it."""
    if isinstance(raw, str):
        raw = json.loads(raw)  # ('null' for a node launched for no job)
    return tuple(raw or ())


def node_values(row: tuple[Any, ...]) -> list[Any]:
    """A driver's node row (its first ``len(NODE_FIELDS)`` values) as the Node's field values
    (``Node(*values)`` makes the node)."""
    values = list(row[:_N])
    for i in _TIME_AT:
        values[i] = utc(values[i])
    for i in _BOOL_AT:
        values[i] = bool(values[i])
    values[_STATE_AT] = _STATES[values[_STATE_AT]]
    values[_MARKET_AT] = _MARKETS[values[_MARKET_AT]]
    values[_LAUNCHED_FOR_AT] = launched_for(values[_LAUNCHED_FOR_AT])
    return values


# The roll-up's candidate row (Ledger.ledger_candidates' order) out of a tick row.
_CANDIDATE_AT = tuple(NODE_FIELDS.index(name) for name in (
    "id", "policy", "pool", "provider", "offering_key", "instance_type", "market", "gpus",
    "price_usd_hour", "project", "state", "state_since")) + tuple(range(_N, _N + 5))
candidate_row = itemgetter(*_CANDIDATE_AT)


@dataclass(frozen=True, slots=True)
class TickNodes:
    """The node rows of one tick (see the module docstring): ``rows`` as the driver gave them,
    each a node's columns in ``NODE_FIELDS`` order, then its mark (``final_through``), its
    ledger reach's ``covered_us``, ``node_id`` (None: no reach row), ``launched_us`` and
    ``ended_us``. Every node not terminated, and the terminated ones the roll-up still needs."""

    rows: tuple[tuple[Any, ...], ...]

    def live(self) -> list[tuple[Any, ...]]:
        """The rows of the nodes not terminated (what ``Store.node_fields()`` reads), in order."""
        state = _STATE_AT
        return [r for r in self.rows if r[state] != _TERMINATED]

    def live_prices_by_group(self) -> dict[tuple[str, str | None], list[float]]:
        """Hourly prices of the nodes not yet terminated per (pool, project launched for), as
        :meth:`Ledger.live_node_prices_by_group` reads them (budgets' burn rates)."""
        out: dict[tuple[str, str | None], list[float]] = {}
        state, pool, project, price = _STATE_AT, _POOL_AT, _PROJECT_AT, _PRICE_AT
        for r in self.rows:
            if r[state] != _TERMINATED:
                out.setdefault((r[pool], r[project]), []).append(float(r[price]))
        return out

    def candidates(self, policies: Any = None) -> list[tuple[Any, ...]]:
        """The roll-up's candidate rows (:meth:`Ledger.ledger_candidates`), of ``policies``
        only where given."""
        if policies is None:
            return [candidate_row(r) for r in self.rows]
        wanted, at = set(policies), _POLICY_AT
        return [candidate_row(r) for r in self.rows if r[at] in wanted]


_SQL: dict[str, str] = {}  # dialect -> the statement, compiled once


def _node_columns(dialect: str) -> list[sa.ColumnElement[Any]]:
    """The nodes' columns in NODE_FIELDS order, times as :func:`rawread.epoch_us_column` reads
    them (on PostgreSQL whole microseconds: half the driver's cost of aware datetimes)."""
    n = T.nodes.c
    return [epoch_us_column(n[name], dialect) if i in _TIME_AT else n[name]
            for i, name in enumerate(NODE_FIELDS)]


def _statement(dialect: sa.Dialect) -> str:
    sql = _SQL.get(dialect.name)
    if sql is None:
        n, m, reach = T.nodes.c, T.ledger_marks.c, accrual.ledger_reach.c
        query = (
            sa.select(*_node_columns(dialect.name),
                      epoch_us_column(m.final_through, dialect.name), reach.covered_us,
                      reach.node_id, reach.launched_us, reach.ended_us)
            .select_from(T.nodes.outerjoin(T.ledger_marks, m.subject == n.id)
                         .outerjoin(accrual.ledger_reach, reach.node_id == n.id))
            # the roll-up's rule (Ledger.ledger_candidates), which every live node passes
            .where(sa.or_(n.state != _TERMINATED, m.final_through.is_(None),
                          m.final_through < n.state_since))
            .order_by(n.created_at, n.id))
        sql = _SQL[dialect.name] = str(query.compile(
            dialect=dialect, compile_kwargs={"literal_binds": True}))
    return sql


def _live_statement(dialect: sa.Dialect) -> str:
    key = "live:" + dialect.name
    sql = _SQL.get(key)
    if sql is None:
        n = T.nodes.c
        query = (sa.select(*_node_columns(dialect.name)).where(n.state != _TERMINATED)
                 .order_by(n.created_at, n.id))
        sql = _SQL[key] = str(query.compile(
            dialect=dialect, compile_kwargs={"literal_binds": True}))
    return sql


class TickNodesRead(StoreBase):
    """The tick's one read of the nodes, a method of the Store."""

    def tick_nodes(self) -> TickNodes:
        """Every node a planning pass needs, read once (see the module docstring)."""
        with self._read() as conn:
            return TickNodes(tuple(driver_rows(conn, _statement(conn.dialect))))

    def live_node_rows(self) -> list[tuple[Any, ...]]:
        """The rows of the nodes not terminated, as :meth:`TickNodes.live` gives them (a
        snapshot taken outside a planning pass)."""
        with self._read() as conn:
            return driver_rows(conn, _live_statement(conn.dialect))


__all__ = ["NODE_FIELDS", "TickNodes", "TickNodesRead", "candidate_row", "launched_for",
           "node_values"]
