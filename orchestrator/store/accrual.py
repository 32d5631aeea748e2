"""The ledger's reach of each node, kept as it is written, and the accrual budgets read from it.

Budgets add to the ledger's lines what a node has cost past where its lines reach (the roll-up
lags). Deriving that per node on every read (its first ``launching`` and ``terminated`` events,
its mark, its lines past the mark: three index lookups a node) cost about 0.15 s per request at
10,000 live nodes. Instead ``ledger_reach`` holds, per node the ledger is not final for, exactly
those facts, written in the transactions that change them:

* :meth:`Store.add_node <orchestrator.store.repo.Store.add_node>` inserts the row
  (:func:`on_add`); a state change (``_save_transition_in``) records the first ``launching`` and
  ``terminated`` times and when the node was confirmed terminated (:func:`on_event`);
* :meth:`~orchestrator.store.ledger.Ledger.write_ledger` records the subject's mark and how far
  its lines reach past it (:func:`on_lines`);
* a row goes once its node is terminated and its mark reaches the termination: the ledger is
  final for it, it accrues nothing more (the roll-up's own rule for a node to roll up);
* :func:`rebuild` derives every row from nodes, events, marks and lines (migration 0019 on
  upgrade, ``burst db rebuild-rollups`` after a load around the store).

Times are integer microseconds since the epoch and prices whole micro-dollars an hour, so the
accrual of every node, ``round_half_even(price x span / 3600)`` micro-dollars exactly as
:func:`orchestrator.costs.attribution.usd_micros` rounds it, is one ``SUM ... GROUP BY pool,
project`` in integer SQL (:func:`accrual_by_group`) on SQLite and PostgreSQL alike. A price that
is no whole number of micro-dollars, or too large for the 64-bit products, has no
``price_micros``: those few nodes come back as :class:`AccrualNode` for Python to add.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.orm import Mapped, mapped_column

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_HOUR_US = 3_600_000_000
# price_micros x (span % hour) must stay within a signed 64-bit integer: up to $2,000 an hour
# here (2e9 x 3.6e9 = 7.2e18 < 9.2e18); a dearer node is summed in Python.
MAX_SQL_PRICE_MICROS = 2_000_000_000


class LedgerReachRow(T.Base):
    """Per node the ledger is not final for: what the budgets' accrual needs (see the module)."""

    __tablename__ = "ledger_reach"

    node_id: Mapped[str] = mapped_column(sa.String(T.STR_ID), primary_key=True)
    pool: Mapped[str] = mapped_column(sa.String(T.STR_NAME))
    project: Mapped[str | None] = mapped_column(sa.String(T.STR_NAME))
    price_usd_hour: Mapped[float] = mapped_column(sa.Float)
    # The price in whole micro-dollars an hour (NULL: not whole, or over MAX_SQL_PRICE_MICROS).
    price_micros: Mapped[int | None] = mapped_column(sa.BigInteger)
    launched_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # first launching event
    ended_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # first terminated event
    terminated_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # state_since, terminated
    mark_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # ledger_marks.final_through
    covered_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # how far its lines reach


ledger_reach: sa.Table = LedgerReachRow.__table__  # type: ignore[assignment]
_r = ledger_reach.c
# The roll-up's rule for a node to roll up (Ledger.ledger_candidates): not terminated, or its
# mark short of the termination. A row that fails it is deleted (:func:`_prune`).
_OPEN = sa.or_(_r.terminated_us.is_(None), _r.mark_us.is_(None),
               _r.mark_us < _r.terminated_us)


@dataclass(frozen=True, slots=True)
class AccrualNode:
    """A node whose cost the ledger may not have reached yet: its price, when it started and
    stopped costing, and how far its lines reach (None: it has none)."""

    node_id: str
    project: str | None
    price_usd_hour: float
    launched: datetime
    ended: datetime | None
    covered_through: datetime | None
    pool: str = ""


@dataclass(frozen=True, slots=True)
class CommitNode:
    """A live node that may still owe part of its launch commitment (budget status)."""

    pool: str
    project: str | None
    state: NodeState
    price_usd_hour: float
    budget_commit_usd: float
    created_at: datetime


def epoch_us(moment: datetime) -> int:
    """Whole microseconds since the epoch (exact: integer arithmetic on the timedelta)."""
    return (moment - EPOCH) // _US


def from_us(value: int | None) -> datetime | None:
    return None if value is None else EPOCH + timedelta(microseconds=int(value))


def price_micros(price: float) -> int | None:
    """``price`` in whole micro-dollars an hour as ``attribution.rate`` reads it (a float through
    its shortest text), or None when it is not whole or too large for the SQL sum."""
    value = Decimal(str(price)) * 1_000_000
    if value < 0 or value != value.to_integral_value() or value > MAX_SQL_PRICE_MICROS:
        return None
    return int(value)


def _us(moment: datetime | None) -> int | None:
    return None if moment is None else epoch_us(moment)


# -- upkeep, inside the writer's transaction --------------------------------------------------------

def on_add(conn: Connection, insert: Any, node: Node, event_state: NodeState,
           event_at: datetime) -> None:
    """The row of a node just inserted with its first event."""
    conn.execute(insert(ledger_reach).values(
        node_id=node.id, pool=node.pool, project=node.project,
        price_usd_hour=node.price_usd_hour, price_micros=price_micros(node.price_usd_hour),
        launched_us=_us(event_at) if event_state is NodeState.LAUNCHING else None,
        ended_us=_us(event_at) if event_state is NodeState.TERMINATED else None,
        terminated_us=_us(node.state_since) if node.state is NodeState.TERMINATED else None,
        mark_us=None, covered_us=None).on_conflict_do_nothing())


def on_event(conn: Connection, node_id: str, to_state: NodeState, at: datetime,
             state_since: datetime) -> None:
    """A state change of ``node_id``: its first launch and termination, when it was confirmed
    terminated. Other states change nothing here."""
    at_us = epoch_us(at)
    if to_state is NodeState.LAUNCHING:
        conn.execute(sa.update(ledger_reach).where(
            _r.node_id == node_id, sa.or_(_r.launched_us.is_(None), _r.launched_us > at_us))
            .values(launched_us=at_us))
    elif to_state is NodeState.TERMINATED:
        conn.execute(sa.update(ledger_reach).where(_r.node_id == node_id).values(
            ended_us=sa.case((sa.or_(_r.ended_us.is_(None), _r.ended_us > at_us), at_us),
                             else_=_r.ended_us),
            terminated_us=epoch_us(state_since)))
        _prune(conn, node_id)


def on_lines(conn: Connection, subject: str) -> None:
    """``subject``'s mark and lines just changed: how far they reach now (what the budgets'
    accrual read derived per node: the mark, or the last line past it when that is later)."""
    m, c = T.ledger_marks.c, T.cost_lines.c
    mark = conn.execute(sa.select(m.final_through).where(m.subject == subject)).scalar()
    query = sa.select(sa.type_coerce(sa.func.max(c.period_end), T.UtcDateTime())) \
        .where(c.subject == subject)
    if mark is not None:
        query = query.where(c.period_start >= mark)
    reach = conn.execute(query).scalar()
    covered = reach if mark is None else (mark if reach is None or reach < mark else reach)
    conn.execute(sa.update(ledger_reach).where(_r.node_id == subject)
                 .values(mark_us=_us(mark), covered_us=_us(covered)))
    _prune(conn, subject)


def _prune(conn: Connection, node_id: str) -> None:
    conn.execute(sa.delete(ledger_reach).where(_r.node_id == node_id, sa.not_(_OPEN)))


def rebuild(conn: Connection, insert: Any) -> int:
    """Make ``ledger_reach`` what the upkeep would have made it from the nodes, their events,
    marks and lines as they are now, in ``conn``'s transaction. Returns its row count."""
    if conn.dialect.name == "postgresql":
        # No upkeep while the rows are derived (it waits, then applies to the rebuilt rows).
        conn.exec_driver_sql("LOCK TABLE ledger_reach IN EXCLUSIVE MODE")
    conn.execute(sa.delete(ledger_reach))
    rows = list(derive(conn))
    for i in range(0, len(rows), 1000):
        conn.execute(insert(ledger_reach), rows[i:i + 1000])
    return len(rows)


def derive(conn: Connection) -> Iterable[dict[str, Any]]:
    """Every row ``ledger_reach`` should hold, derived from scratch."""
    n, m, e, c = T.nodes.c, T.ledger_marks.c, T.node_events.c, T.cost_lines.c
    at = sa.type_coerce(e.at, T.UtcDateTime())
    spans = {r.node_id: (r.launched, r.ended) for r in conn.execute(
        sa.select(e.node_id,
                  sa.type_coerce(sa.func.min(sa.case((e.to_state == NodeState.LAUNCHING.value,
                                                      at))), T.UtcDateTime()).label("launched"),
                  sa.type_coerce(sa.func.min(sa.case((e.to_state == NodeState.TERMINATED.value,
                                                      at))), T.UtcDateTime()).label("ended"))
        .group_by(e.node_id))}
    marks = {r.subject: r.final_through for r in conn.execute(
        sa.select(m.subject, m.final_through))}
    reaches = {r.subject: r.reach for r in conn.execute(
        sa.select(c.subject, sa.type_coerce(sa.func.max(c.period_end), T.UtcDateTime())
                  .label("reach"))
        .select_from(T.cost_lines.outerjoin(T.ledger_marks, m.subject == c.subject))
        .where(sa.or_(m.final_through.is_(None), c.period_start >= m.final_through))
        .group_by(c.subject))}
    for r in conn.execute(sa.select(n.id, n.pool, n.project, n.price_usd_hour, n.state,
                                    n.state_since)):
        mark, reach = marks.get(r.id), reaches.get(r.id)
        terminated = r.state_since if r.state == NodeState.TERMINATED.value else None
        if terminated is not None and mark is not None and mark >= terminated:
            continue  # final through its end
        covered = reach if mark is None else (mark if reach is None or reach < mark else reach)
        launched, ended = spans.get(r.id, (None, None))
        yield dict(node_id=r.id, pool=r.pool, project=r.project, price_usd_hour=r.price_usd_hour,
                   price_micros=price_micros(r.price_usd_hour), launched_us=_us(launched),
                   ended_us=_us(ended), terminated_us=_us(terminated), mark_us=_us(mark),
                   covered_us=_us(covered))


# -- reads -------------------------------------------------------------------------------------------

def _accrual_sql(dialect: str, minimum_us: int, increment_us: int) -> str:
    """The accrual of every node with an SQL price, per (pool, project), in integer SQL:
    ``attribution.usd_micros(rate(price), span)`` with the span split at whole hours so every
    product fits 64 bits, and half to even as Python's ``round``."""
    lo, hi = ("LEAST", "GREATEST") if dialect == "postgresql" else ("MIN", "MAX")
    billed = f"{hi}(e - s, {minimum_us})"
    if increment_us > 0:
        billed = f"(({billed} + {increment_us - 1}) / {increment_us}) * {increment_us}"
    h = _HOUR_US
    whole = f"(p * (span / {h}) + (p * (span % {h})) / {h})"
    left = f"((p * (span % {h})) % {h})"
    return f"""
SELECT pool, project, SUM({whole} + CASE WHEN 2 * {left} > {h}
                                          OR (2 * {left} = {h} AND {whole} % 2 = 1)
                                     THEN 1 ELSE 0 END)
FROM (SELECT pool, project, p,
             CASE WHEN covered_us IS NULL AND s = launched_us THEN {billed} ELSE e - s END
             AS span
      FROM (SELECT pool, project, price_micros AS p, covered_us, launched_us,
                   {lo}(COALESCE(ended_us, :now), :now, :until) AS e,
                   {hi}(COALESCE(covered_us, launched_us), :since) AS s
            FROM ledger_reach
            WHERE launched_us IS NOT NULL AND price_micros IS NOT NULL
              AND (terminated_us IS NULL OR mark_us IS NULL OR mark_us < terminated_us)) w
      WHERE e > s) x
GROUP BY pool, project"""


def _node(r: Any) -> AccrualNode:
    return AccrualNode(r.node_id, r.project, r.price_usd_hour, from_us(r.launched_us),  # type: ignore[arg-type]
                       from_us(r.ended_us), from_us(r.covered_us), r.pool)


class Accrual(StoreBase):
    """The ledger-reach methods of the Store."""

    def ledger_accrual_nodes(self, *, pool: str | None = None, project: str | None = None,
                             sql_priced: bool = True) -> list[AccrualNode]:
        """Launched nodes whose ledger is not final through their end, with how far their lines
        reach (by node creation): what budgets add on top of the lines while the roll-up lags.
        ``sql_priced=False``: only those :meth:`ledger_accrual_by_group` leaves to Python."""
        n = T.nodes.c
        query = (sa.select(ledger_reach).join(T.nodes, n.id == _r.node_id)
                 .where(_r.launched_us.is_not(None), _OPEN).order_by(n.created_at, n.id))
        if pool is not None:
            query = query.where(_r.pool == pool)
        if project is not None:
            query = query.where(_r.project == project)
        if not sql_priced:
            query = query.where(_r.price_micros.is_(None))
        with self._read() as conn:
            return [_node(r) for r in conn.execute(query)]

    def ledger_accrual_by_group(self, *, since: datetime, until: datetime, now: datetime,
                                minimum_s: int, increment_s: int
                                ) -> tuple[dict[tuple[str, str | None], int], list[AccrualNode]]:
        """Micro-dollars the ledger's lines have not reached in [since, min(now, until)), per
        (pool, project launched for), of every node with an SQL price, in one aggregate (a node
        never rolled up counts its billing minimum: ``minimum_s``, ``increment_s``); and the
        nodes without one, for the caller to add."""
        params = {"since": epoch_us(require_aware(since, "since")),
                  "until": epoch_us(require_aware(until, "until")),
                  "now": epoch_us(require_aware(now, "now"))}
        sql = sa.text(_accrual_sql(self.dialect, minimum_s * 1_000_000, increment_s * 1_000_000))
        with self._read() as conn:
            groups = {(pool, project): int(total)
                      for pool, project, total in conn.execute(sql, params) if total}
            rest = [_node(r) for r in conn.execute(
                sa.select(ledger_reach).where(_r.launched_us.is_not(None), _OPEN,
                                              _r.price_micros.is_(None)))]
        return groups, rest

    def live_node_price_counts(self) -> list[tuple[str, str | None, float, int]]:
        """(pool, project launched for, hourly price, nodes) of the nodes not yet terminated:
        the burn rates of every budget in one ``GROUP BY``, not a row per node."""
        n = T.nodes.c
        query = (sa.select(n.pool, n.project, n.price_usd_hour, sa.func.count())
                 .where(n.state != NodeState.TERMINATED.value)
                 .group_by(n.pool, n.project, n.price_usd_hour))
        with self._read() as conn:
            return [(pool, project, float(price), int(count))
                    for pool, project, price, count in conn.execute(query)]

    def nodes_committing(self, now: datetime) -> list[CommitNode]:
        """The live nodes (by creation) whose launch commitment may not all be accrued at
        ``now``: a commitment, and requested (nothing accrued yet) or younger than commitment /
        price plus a minute (a float bound in SQL that only ever keeps too many; the caller's
        exact Decimal sum of ``max(commit - accrued, 0)`` gives the others nothing anyway)."""
        n = T.nodes.c
        if self.dialect == "postgresql":
            created = sa.extract("epoch", n.created_at)
        else:  # naive UTC text: julianday reads it, in days since noon of 4714 BC
            created = (sa.func.julianday(n.created_at) - 2440587.5) * 86400.0
        now_s = epoch_us(require_aware(now, "now")) / 1e6
        query = (
            sa.select(n.pool, n.project, n.state, n.price_usd_hour, n.budget_commit_usd,
                      n.created_at)
            .where(n.state != NodeState.TERMINATED.value, n.budget_commit_usd > 0,
                   sa.or_(n.state == NodeState.REQUESTED.value, n.price_usd_hour <= 0,
                          created + n.budget_commit_usd * 3600.0 / n.price_usd_hour + 60.0
                          > now_s))
            .order_by(n.created_at, n.id))
        with self._read() as conn:
            return [CommitNode(r.pool, r.project, NodeState(r.state), r.price_usd_hour,
                               r.budget_commit_usd, r.created_at) for r in conn.execute(query)]

    def rebuild_ledger_reach(self) -> int:
        """Rebuild ``ledger_reach`` from the nodes, their events, marks and lines (what migration
        0019 did on upgrade). Returns its row count."""
        with self._write() as conn:
            return rebuild(conn, self._insert)


__all__ = ["MAX_SQL_PRICE_MICROS", "Accrual", "AccrualNode", "CommitNode", "derive", "epoch_us", "from_us",
           "ledger_reach", "on_add", "on_event", "on_lines", "price_micros", "rebuild"]
