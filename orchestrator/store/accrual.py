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
  its lines reach past it (:func:`on_lines`), and the batched writer
  (:mod:`orchestrator.store.ledger_batch`) the same for all the nodes it writes at once
  (:func:`on_lines_many`);
* a row goes once its node is terminated and its mark reaches the termination: the ledger is
  final for it, it accrues nothing more (the roll-up's own rule for a node to roll up);
* :func:`rebuild` derives every row from nodes, events, marks and lines (migrations 0019-0020 on
  upgrade, ``burst db rebuild-rollups`` after a load around the store).

Times are integer microseconds since the epoch. Budgets read the rows grouped
(:meth:`Accrual.budget_groups`): nodes of one pool, project and price whose unbilled time
starts at the same instant (``start_us``: where their lines reach, or their launch when they have
none) and ends at the same one accrue exactly the same micro-dollars, so Python works out
``usd_micros`` once per group and multiplies by its count. The groups are counted as the rows are
written (``ledger_reach_groups``, :mod:`orchestrator.store.reach_groups`), so a read is a few rows
whatever the number of nodes: a roll-up pass brings every live node it rolls up to the same
reach, so a site of 10,000 live nodes has a few groups per (pool, project, price) and tick it was
rolled at; nodes that all differ (never rolled up, launched at different instants) are one group
each, as many rows as nodes. A store keeps the groups it parsed, with their accrual as columns
(:mod:`orchestrator.store.accrual_table`), until their version moves
(:mod:`orchestrator.store.reach_version`): a request between two writes of the groups reads one
row of them, not every group.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.orm import Mapped, mapped_column

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.store import reach_groups, reach_version, rollup_version, rollups
from orchestrator.store import tables as T
from orchestrator.store.accrual_table import ReachGroupSet
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.keysets import among
from orchestrator.store.rawwrite import driver_executemany
from orchestrator.store.versions import read_versions

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_HOUR_US = 3_600_000_000


class LedgerReachRow(T.Base):
    """Per node the ledger is not final for: what the budgets' accrual needs (see the module)."""

    __tablename__ = "ledger_reach"

    node_id: Mapped[str] = mapped_column(sa.String(T.STR_ID), primary_key=True)
    pool: Mapped[str] = mapped_column(sa.String(T.STR_NAME))
    project: Mapped[str | None] = mapped_column(sa.String(T.STR_NAME))
    price_usd_hour: Mapped[float] = mapped_column(sa.Float)
    launched_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # first launching event
    ended_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # first terminated event
    terminated_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # state_since, terminated
    mark_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # ledger_marks.final_through
    covered_us: Mapped[int | None] = mapped_column(sa.BigInteger)  # how far its lines reach
    # What budgets group by, kept with the above: where unbilled time starts (covered_us, else
    # launched_us; NULL while never launched, lines or not), whether lines cover it (covered_us is set: no billing
    # minimum), and whether the node is not yet terminated (its price is burning).
    start_us: Mapped[int | None] = mapped_column(sa.BigInteger)
    billed: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    live: Mapped[bool] = mapped_column(sa.Boolean, default=True, server_default=sa.true())

    __table_args__ = (
        # Covering, in the budgets' GROUP BY order: the read streams it with no sort.
        sa.Index("ix_ledger_reach_groups", "pool", "project", "price_usd_hour", "start_us",
                 "billed", "ended_us", "live"),
    )


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


class AccrualGroup(NamedTuple):
    """Nodes of one pool, project and price whose unbilled time starts and ends at the same
    instants (so they accrue the same in any window), in whole microseconds since the epoch, as
    a budget's status reads them: no datetime is made per group (at 10,000 live nodes rolled up
    at spread instants there are a few thousand groups)."""

    pool: str
    project: str | None
    price_usd_hour: float
    launched_us: int  # the start of unbilled time
    ended_us: int | None
    covered_us: int | None  # the same as launched_us when lines cover the node, else None
    count: int

    def node(self) -> AccrualNode:
        """The group as one node standing for it (no id)."""
        return AccrualNode("", self.project, self.price_usd_hour,
                           from_us(self.launched_us),  # type: ignore[arg-type]
                           from_us(self.ended_us), from_us(self.covered_us), self.pool)

    @classmethod
    def of_node(cls, node: AccrualNode, count: int = 1) -> AccrualGroup:
        return cls(node.pool, node.project, node.price_usd_hour, epoch_us(node.launched),
                   _us(node.ended), _us(node.covered_through), count)


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


def _us(moment: datetime | None) -> int | None:
    return None if moment is None else epoch_us(moment)


# -- upkeep, inside the writer's transaction --------------------------------------------------------

def on_add(conn: Connection, insert: Any, node: Node, event_state: NodeState,
           event_at: datetime) -> None:
    """The row of a node just inserted with its first event."""
    launched = _us(event_at) if event_state is NodeState.LAUNCHING else None
    with reach_groups.changing(conn, (node.id,)):
        conn.execute(insert(ledger_reach).values(
            node_id=node.id, pool=node.pool, project=node.project,
            price_usd_hour=node.price_usd_hour, launched_us=launched,
            ended_us=_us(event_at) if event_state is NodeState.TERMINATED else None,
            terminated_us=_us(node.state_since) if node.state is NodeState.TERMINATED else None,
            mark_us=None, covered_us=None, start_us=launched, billed=False,
            live=node.state is not NodeState.TERMINATED).on_conflict_do_nothing())


def on_event(conn: Connection, node_id: str, to_state: NodeState, at: datetime,
             state_since: datetime) -> None:
    """A state change of ``node_id``: its first launch and termination, when it was confirmed
    terminated. Other states change nothing here."""
    at_us = epoch_us(at)
    if to_state is NodeState.LAUNCHING:
        with reach_groups.changing(conn, (node_id,)):
            conn.execute(sa.update(ledger_reach).where(
                _r.node_id == node_id, sa.or_(_r.launched_us.is_(None), _r.launched_us > at_us))
                .values(launched_us=at_us, start_us=sa.func.coalesce(_r.covered_us, at_us)))
    elif to_state is NodeState.TERMINATED:
        with reach_groups.changing(conn, (node_id,)):
            conn.execute(sa.update(ledger_reach).where(_r.node_id == node_id).values(
                ended_us=sa.case((sa.or_(_r.ended_us.is_(None), _r.ended_us > at_us), at_us),
                                 else_=_r.ended_us),
                terminated_us=epoch_us(state_since), live=False))
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
    with reach_groups.changing(conn, (subject,)):
        conn.execute(sa.update(ledger_reach).where(_r.node_id == subject).values(
            mark_us=_us(mark), covered_us=_us(covered), billed=covered is not None,
            start_us=_r.launched_us if covered is None else sa.case(
                (_r.launched_us.is_(None), None), else_=_us(covered))))
        _prune(conn, subject)


def on_lines_many(conn: Connection, subjects: Collection[str]) -> None:
    """:func:`on_lines` for every one of ``subjects`` (nodes whose marks and lines just changed,
    in ``conn``'s transaction), in a constant number of statements whatever their number: one
    read of their marks, one grouped read of how far their lines past the mark reach, two
    ``UPDATE`` statements run once per node by the driver (``executemany``), one prune."""
    if not subjects:
        return
    dialect = conn.dialect.name
    m, c = T.ledger_marks.c, T.cost_lines.c
    marks = dict(conn.execute(sa.select(m.subject, m.final_through)
                              .where(among(dialect, m.subject, subjects))).all())
    reaches = dict(conn.execute(
        sa.select(c.subject, sa.type_coerce(sa.func.max(c.period_end), T.UtcDateTime()))
        .select_from(T.cost_lines.outerjoin(T.ledger_marks, m.subject == c.subject))
        .where(among(dialect, c.subject, subjects),
               sa.or_(m.final_through.is_(None), c.period_start >= m.final_through))
        .group_by(c.subject)).all())
    billed, bare = [], []
    for subject in sorted(subjects):
        mark, reach = marks.get(subject), reaches.get(subject)
        covered = reach if mark is None else (mark if reach is None or reach < mark else reach)
        if covered is None:
            bare.append({"b_node": subject})
        else:
            billed.append({"b_node": subject, "b_mark": _us(mark), "b_covered": _us(covered)})
    with reach_groups.changing(conn, subjects):
        _write_reaches(conn, billed, bare, subjects)


def _write_reaches(conn: Connection, billed: list[dict[str, Any]], bare: list[dict[str, Any]],
                   subjects: Collection[str]) -> None:
    dialect = conn.dialect.name
    # Plain integers and strings: straight through the driver (orchestrator.store.rawwrite).
    covered_us = sa.bindparam("b_covered", type_=sa.BigInteger())
    driver_executemany(conn, "ledger-reach-billed", sa.update(ledger_reach).where(
        _r.node_id == sa.bindparam("b_node")).values(
        mark_us=sa.bindparam("b_mark", type_=sa.BigInteger()), covered_us=covered_us,
        billed=sa.true(), start_us=sa.case((_r.launched_us.is_(None), sa.null()),
                                           else_=covered_us)),
        (), billed)
    driver_executemany(conn, "ledger-reach-bare", sa.update(ledger_reach).where(
        _r.node_id == sa.bindparam("b_node")).values(
        mark_us=sa.null(), covered_us=sa.null(), billed=sa.false(), start_us=_r.launched_us),
        (), bare)
    conn.execute(sa.delete(ledger_reach).where(among(dialect, _r.node_id, subjects),
                                               sa.not_(_OPEN)))


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
    reach_groups.rebuild(conn)
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
        yield {"node_id": r.id, "pool": r.pool, "project": r.project,
               "price_usd_hour": r.price_usd_hour, "launched_us": _us(launched),
               "ended_us": _us(ended), "terminated_us": _us(terminated), "mark_us": _us(mark),
               "covered_us": _us(covered),
               "start_us": None if launched is None else _us(covered or launched),
               "billed": covered is not None, "live": terminated is None}


# -- reads -------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BudgetInputs:
    """What :meth:`Accrual.budget_inputs` reads for every budget at once."""

    accrual: list[AccrualGroup]  # as ledger_accrual_groups, in microseconds
    live: list[tuple[str, str | None, float, int]]  # as live_node_price_counts
    commits: list[CommitNode]  # as nodes_committing
    # Burst micro-dollars per (pool, project) of each (since, until) window's lines.
    lines: dict[tuple[datetime, datetime], dict[tuple[str | None, str | None], int]]
    # The groups as read (accrual and live are its lists: read-only, the store keeps them),
    # with the accrual table built from them once per version of the groups.
    groups: ReachGroupSet


def _budget_groups(rows: Iterable[tuple[Any, ...]]
                   ) -> tuple[list[AccrualGroup], list[tuple[str, str | None, float, int]]]:
    """The kept group rows (:func:`reach_groups.read`) as the accrual groups (the live and the
    terminated of one group together) and the live nodes' price counts."""
    accrual: dict[tuple[Any, ...], int] = {}
    live: dict[tuple[str, str | None, float], int] = {}
    for pool, project, price, start, billed, ended, is_live, count in rows:
        if start is not None:
            key = (pool, project, float(price), start, bool(billed), ended)
            accrual[key] = accrual.get(key, 0) + count
        if is_live:
            group = (pool, project, float(price))
            live[group] = live.get(group, 0) + count
    return ([AccrualGroup(pool, project, price, int(start), None if ended is None else int(ended),
                          int(start) if billed else None, count)
             for (pool, project, price, start, billed, ended), count in accrual.items()],
            [(*group, count) for group, count in live.items()])


_COMMITTING: dict[str, sa.Select[Any]] = {}


def committing(conn: Connection, now: datetime) -> list[CommitNode]:
    """:meth:`Accrual.nodes_committing` in ``conn``'s transaction. The statement is built once
    per dialect (``now`` a bound parameter): building it cost more than running it."""
    dialect = conn.dialect.name
    query = _COMMITTING.get(dialect)
    if query is None:
        n = T.nodes.c
        if dialect == "postgresql":
            created = sa.extract("epoch", n.created_at)
        else:  # naive UTC text: julianday reads it, in days since noon of 4714 BC
            created = (sa.func.julianday(n.created_at) - 2440587.5) * 86400.0
        query = _COMMITTING[dialect] = (
            sa.select(n.pool, n.project, n.state, n.price_usd_hour, n.budget_commit_usd,
                      n.created_at)
            .where(n.state != NodeState.TERMINATED.value, n.budget_commit_usd > 0,
                   sa.or_(n.state == NodeState.REQUESTED.value, n.price_usd_hour <= 0,
                          created + n.budget_commit_usd * 3600.0 / n.price_usd_hour + 60.0
                          > sa.bindparam("now_s", type_=sa.Float())))
            .order_by(n.created_at, n.id))
    return [CommitNode(r.pool, r.project, NodeState(r.state), r.price_usd_hour,
                       r.budget_commit_usd, r.created_at)
            for r in conn.execute(query, {"now_s": epoch_us(now) / 1e6})]



def _node(r: Any) -> AccrualNode:
    return AccrualNode(r.node_id, r.project, r.price_usd_hour, from_us(r.launched_us),  # type: ignore[arg-type]
                       from_us(r.ended_us), from_us(r.covered_us), r.pool)


class Accrual(StoreBase):
    """The ledger-reach methods of the Store."""

    def ledger_accrual_nodes(self, *, pool: str | None = None, project: str | None = None
                             ) -> list[AccrualNode]:
        """Launched nodes whose ledger is not final through their end, with how far their lines
        reach (by node creation): what budgets add on top of the lines while the roll-up lags."""
        n = T.nodes.c
        query = (sa.select(ledger_reach).join(T.nodes, n.id == _r.node_id)
                 .where(_r.launched_us.is_not(None), _OPEN).order_by(n.created_at, n.id))
        if pool is not None:
            query = query.where(_r.pool == pool)
        if project is not None:
            query = query.where(_r.project == project)
        with self._read() as conn:
            return [_node(r) for r in conn.execute(query)]

    def ledger_accrual_groups(self) -> list[tuple[AccrualNode, int]]:
        """The launched nodes the ledger is not final for, as (a node standing for the group,
        how many nodes): nodes of one pool, project and price whose unbilled time starts and
        ends at the same instants, which accrue the same in any window. Read from the kept
        group counts (:mod:`orchestrator.store.reach_groups`): a few rows whatever the number of
        nodes. The group's node has no id; its ``launched`` is the start of unbilled time, its
        ``covered_through`` the same when lines cover it."""
        return [(group.node(), group.count) for group in self.budget_groups()[0]]

    def live_node_price_counts(self) -> list[tuple[str, str | None, float, int]]:
        """(pool, project launched for, hourly price, nodes) of the nodes not yet terminated:
        the burn rates of every budget, from the kept group counts of the ledger reach (every
        node has a row until the ledger is final for it, after its termination)."""
        return self.budget_groups()[1]

    def budget_groups(self) -> tuple[list[AccrualGroup],
                                     list[tuple[str, str | None, float, int]]]:
        """:meth:`ledger_accrual_groups` (as :class:`AccrualGroup`, in microseconds) and
        :meth:`live_node_price_counts` from one read of the kept group counts: what every
        budget's status needs of the nodes (kept by the store while their version holds:
        :meth:`_reach_groups`)."""
        with self._read() as conn:
            groups = self._reach_groups(conn)
        return list(groups.accrual), list(groups.live)

    def reach_group_set(self) -> ReachGroupSet:
        """The reach's groups as the store keeps them (:meth:`_reach_groups`): their lists are
        the store's own, to read, not change."""
        with self._read() as conn:
            return self._reach_groups(conn)

    def _reach_groups(self, conn: Connection) -> ReachGroupSet:
        """The reach's groups, parsed, as of ``conn``'s transaction: the ones this store read
        last while the groups' version (:mod:`orchestrator.store.reach_version`, one row read
        first) is still the one they were read at, else read and parsed again and kept. Groups
        read after the version are at least as new as it, so what is kept under a version is
        never older than that version's groups."""
        return self._reach_groups_at(conn, reach_version.read(conn))

    def _reach_groups_at(self, conn: Connection, version: int | None) -> ReachGroupSet:
        """:meth:`_reach_groups` with the version read already (first, by the caller)."""
        kept: ReachGroupSet | None = getattr(self, "_reach_kept", None)
        if version is not None and kept is not None and kept.version == version:
            return kept
        if version is None:  # no version row (a schema made around the migrations): no keeping
            return ReachGroupSet(version, *_budget_groups(reach_groups.read(conn)))
        # One thread reads them again at a time (every request in flight misses at once after
        # a write); the others find them kept under the version they read.
        with self._reach_reading:
            kept = getattr(self, "_reach_kept", None)
            if kept is not None and kept.version == version:
                return kept
            read = ReachGroupSet(version, *_budget_groups(reach_groups.read(conn)))
            self._reach_kept = read  # one reference swapped: a reader thread sees either one
            return read

    def nodes_committing(self, now: datetime) -> list[CommitNode]:
        """The live nodes (by creation) whose launch commitment may not all be accrued at
        ``now``: a commitment, and requested (nothing accrued yet) or younger than commitment /
        price plus a minute (a float bound in SQL that only ever keeps too many; the caller's
        exact Decimal sum of ``max(commit - accrued, 0)`` gives the others nothing anyway)."""
        require_aware(now, "now")
        with self._read() as conn:
            return committing(conn, now)

    def budget_inputs(self, now: datetime, windows: Iterable[tuple[datetime, datetime]]
                      ) -> BudgetInputs:
        """Everything every budget's status reads of the store, on one connection: the ledger
        reach's group counts, the nodes that may still owe part of their commitment, and each
        window's burst micro-dollars per (pool, project) from the roll-ups (``cost_sums`` by
        pool and project, its cost alone).

        The groups and the window sums are kept by the store while their versions hold (both
        read first, in one statement: :mod:`orchestrator.store.versions`), so between two writes
        a request reads two statements: the versions and the commitments. What is kept is the
        store's own (the caller reads it, never changes it). On PostgreSQL the read runs in
        autocommit (``_peek``): at READ COMMITTED a transaction gave its statements no common
        snapshot anyway, and kept values current by their versions are exactly the committed
        rows as of the versions' read."""
        require_aware(now, "now")
        wanted = sorted(set(windows))
        for since, until in wanted:
            require_aware(since, "since")
            require_aware(until, "until")
        with self._peek() as conn:
            # Both versions first, in one statement; then only what they say has moved.
            reach, rolled = read_versions(conn, (reach_version.REACH, rollup_version.ROLLUPS))
            groups = self._reach_groups_at(conn, reach)
            commits = committing(conn, now)
            lines = {(since, until): self._window_sums.get(
                rolled, rollups.hour_window(since, until),
                lambda since=since, until=until: _window_cost(conn, since, until))
                for since, until in wanted}
        return BudgetInputs(groups.accrual, groups.live, commits, lines,  # type: ignore[arg-type]
                            groups)

    def rebuild_ledger_reach(self) -> int:
        """Rebuild ``ledger_reach`` from the nodes, their events, marks and lines (what migration
        0019 did on upgrade). Returns its row count."""
        with self._write() as conn:
            return rebuild(conn, self._insert)


def _window_cost(conn: Connection, since: datetime, until: datetime
                 ) -> dict[tuple[str | None, ...], int]:
    """Burst micro-dollars per (pool, project) of the lines of [since, until), from the roll-ups."""
    return {key: sums[0] for key, sums in rollups.rollup_sums(
        conn, ("pool", "project"), since=since, until=until, projects=None, pool=None,
        users=None, sums=("cost_micros", "lines")).items()}


__all__ = ["Accrual", "AccrualNode", "BudgetInputs", "CommitNode", "committing", "derive", "epoch_us", "from_us", "ledger_reach",
           "on_add", "on_event", "on_lines", "on_lines_many", "rebuild"]
