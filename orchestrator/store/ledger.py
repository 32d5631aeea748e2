"""The cost ledger in the store: cost lines, roll-up marks, and the sums reports read.

The roll-up (``orchestrator.costs.ledger``) owns the maths; this module owns the SQL:

* which nodes still need rolling up (live, or terminated but not final through their end);
* the job usages of nodes (from the run history, ``job_runs``) and of on-prem pools in a window;
* :meth:`Ledger.write_ledger`: replace one subject's lines from a bucket on, and advance its
  mark, in one transaction. It compares first and writes nothing when nothing changed, so
  running a roll-up twice writes nothing the second time; lines are upserted on their unique
  ``line_key``, so two roll-ups racing on one subject converge instead of failing;
* grouped sums over the cost roll-ups (:mod:`orchestrator.store.rollups`, kept in the
  transaction that writes the lines) or, for groupings they do not carry, over ``cost_lines``
  (``GROUP BY`` in SQL, integers for money), and the spend of a window. (What the lines have
  not reached yet, for budgets, is :mod:`orchestrator.store.accrual`'s, which ``write_ledger``
  keeps too.)

Times are passed in, never read from a clock.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.domain.costs import NO_PROJECT, NONE, CostKind, CostLine, JobUsage
from orchestrator.domain.jobs import Placement
from orchestrator.domain.nodes import NodeState
from orchestrator.store import accrual, rollups
from orchestrator.store import tables as T
from orchestrator.store.accrual import AccrualNode
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.jobruns import run_usages
from orchestrator.store.rawread import driver_rows, utc
from orchestrator.store.ticknodes import TickNodes

_LINE_UPSERTS: dict[str, Any] = {}  # dialect -> the upsert of cost lines on their line_key
ONPREM_SUBJECT = "onprem:"  # prefix of the subjects (and marks) of on-prem work, + pool name
_CHUNK = 500  # ids per IN (...) list: well inside every driver's parameter limit

_c = T.cost_lines.c
_STATES: dict[str, NodeState] = {s.value: s for s in NodeState}


def _key(column: sa.ColumnElement[Any], missing: str = "") -> sa.ColumnElement[Any]:
    # An expression, not the bare column, even for NOT NULL ones: given GROUP BY pool, SQLite
    # would walk the (pool, ...) index to skip the sort and fetch every row through it, three
    # times slower on a million lines than scanning the table and sorting. Project and day stay
    # bare: the covering (project, day, ...) index streams them in order with no table access.
    return sa.func.coalesce(column, missing)


# Report keys -> what they group by (lines without a node or job show "-").
GROUP_COLUMNS: dict[str, sa.ColumnElement[Any]] = {
    "project": _c.project,
    "user": _c.user,
    "pool": _key(_c.pool),
    "policy": _key(_c.policy),
    "provider": _key(_c.provider),
    "region": _key(_c.region),
    "instance_type": _key(_c.instance_type),
    "market": _key(_c.market),
    "node": _key(_c.node_id, NONE),
    "job": _key(_c.job_id, NONE),
    "kind": _key(_c.kind),
    "day": _c.day,
}
_LINE_FIELDS = (
    "line_key", "subject", "node_id", "period_start", "period_end", "kind", "project", "job_id",
    "policy", "pool", "provider", "region", "instance_type", "market", "price_usd_hour",
    "instance_seconds", "gpu_seconds", "cost_micros", "onprem_equiv_micros", "final", "user",
)


@dataclass(frozen=True, slots=True)
class LedgerNode:
    """A node as the roll-up sees it: the node row's billing facts, when it started costing
    (``launched``: its first ``launching`` event; None: never launched) and when its termination
    was confirmed (``ended``), and how far its lines are final (``mark``)."""

    node_id: str
    policy: str
    pool: str
    provider: str
    offering_key: str
    instance_type: str
    market: str
    gpus: int
    price_usd_hour: float
    project: str | None
    state: NodeState
    state_since: datetime
    launched: datetime | None
    ended: datetime | None
    mark: datetime | None
    # How far its lines reach (``ledger_reach.covered_us``: the mark, or the end of its last line
    # past the mark; for a live node, the ``now`` of its last roll-up). None: not known.
    reach: datetime | None = None


@dataclass(frozen=True, slots=True)
class FreshNode:
    """A live node a roll-up's ``fresh`` test passed on its own facts (:meth:`Ledger.
    ledger_candidates`): left as the driver's row, made a :class:`LedgerNode` only if the caller
    asks (:meth:`Ledger.ledger_node`). At 10,000 live nodes a tick leaves nearly all of them."""

    node_id: str
    reach_us: int  # how far its lines reach
    since_us: int  # its mark, or its launch where it has none: its runs from here matter
    row: tuple


# fresh(node_id, offering_key, state, mark_us, reach_us, launched_us, ended_us): whether a node's
# own facts say only the clock moved for it (times in whole microseconds since the epoch; None
# where unknown).
FreshTest = Callable[[str, str, str, "int | None", "int | None", "int | None", "int | None"], bool]


@dataclass(frozen=True, slots=True)
class CostSums:
    """Sums of the cost lines of one group (money in micro-dollars)."""

    keys: tuple[str | None, ...]  # None: lines of no project, or of no (known) user
    cost_micros: int  # burst (cloud) lines: usage, idle, minimum
    idle_micros: int
    onprem_micros: int
    onprem_equiv_micros: int
    gpu_seconds: float  # of burst lines
    instance_seconds: float
    lines: int


LINE_COLUMNS = (*_LINE_FIELDS, "day", "rolled_at")  # what a line's upsert sets


def line_upsert(dialect: str, insert: Any) -> Any:
    """The upsert of cost lines on their ``line_key`` (``insert``: the store's dialect insert),
    built once per dialect: its SET clause cost more CPU than running it."""
    stmt = _LINE_UPSERTS.get(dialect)
    if stmt is None:
        stmt = insert(T.cost_lines)
        stmt = stmt.on_conflict_do_update(
            index_elements=["line_key"],
            set_={name: stmt.excluded[name] for name in LINE_COLUMNS if name != "line_key"})
        _LINE_UPSERTS[dialect] = stmt
    return stmt


def line_values(line: CostLine) -> dict[str, Any]:
    """A line's column values (``rolled_at`` aside)."""
    values = {name: getattr(line, name) for name in _LINE_FIELDS}
    values["kind"] = CostKind(line.kind).value
    values["day"] = line.day
    return values


def line_from_row(row: sa.Row[Any]) -> CostLine:
    """The line of a ``cost_lines`` row."""
    m = row._mapping
    values = {name: m[name] for name in _LINE_FIELDS}
    values["kind"] = CostKind(values["kind"])
    values["final"] = bool(values["final"])
    values["cost_micros"] = int(values["cost_micros"])
    values["onprem_equiv_micros"] = int(values["onprem_equiv_micros"])
    return CostLine(**values)


LINE_SELECT = tuple(T.cost_lines.c[name] for name in _LINE_FIELDS)  # what line_from_driver reads
_KINDS: dict[str, CostKind] = {k.value: k for k in CostKind}


def line_from_driver(values: Sequence[Any]) -> CostLine:
    """The line of a row of :data:`LINE_SELECT` as the driver returns it (SQLite: times as naive
    UTC text, ``final`` as 0 or 1): what :func:`line_from_row` makes of the typed row."""
    (line_key, subject, node_id, start, end, kind, project, job_id, policy, pool, provider,
     region, instance_type, market, price, instance_s, gpu_s, cost, equiv, final, user) = values
    return CostLine(line_key, subject, node_id, utc(start), utc(end),  # type: ignore[arg-type]
                    _KINDS[kind], project, job_id, policy, pool, provider, region,
                    instance_type, market, price, instance_s, gpu_s, int(cost), int(equiv),
                    bool(final), user)


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i:i + _CHUNK]


class Ledger(StoreBase):
    """The cost-ledger methods of the Store."""

    # -- what to roll up ---------------------------------------------------------------------------

    def ledger_candidates(self, policies: Collection[str] | None = None,
                          fresh: FreshTest | None = None, nodes: TickNodes | None = None
                          ) -> list[LedgerNode | FreshNode]:
        """Nodes whose ledger is not final through their end: every node not yet terminated, and
        terminated nodes whose mark does not reach their termination (or that have none).
        ``policies``: only nodes of these policies. ``fresh``: a node it passes comes as a
        :class:`FreshNode` (its row, not made into a LedgerNode). ``nodes``: the tick's read of
        the nodes (:meth:`~orchestrator.store.ticknodes.TickNodesRead.tick_nodes`), which holds
        these rows already: they are taken from it, not read again."""
        if nodes is not None:
            rows = nodes.candidates(policies)
            missing = [r[0] for r in rows if r[14] is None]
            spans: Mapping[str, tuple[datetime | None, datetime | None]] = {}
            if missing:
                with self._read() as conn:
                    spans = _spans(conn, missing)
            return self._candidates(rows, spans, fresh)
        n, m, reach = T.nodes.c, T.ledger_marks.c, accrual.ledger_reach.c
        query = (
            sa.select(n.id, n.policy, n.pool, n.provider, n.offering_key, n.instance_type,
                      n.market, n.gpus, n.price_usd_hour, n.project, n.state, n.state_since,
                      m.final_through, reach.covered_us, reach.node_id, reach.launched_us,
                      reach.ended_us)
            .select_from(T.nodes.outerjoin(T.ledger_marks, m.subject == n.id)
                         .outerjoin(accrual.ledger_reach, reach.node_id == n.id))
            .where(sa.or_(n.state != NodeState.TERMINATED.value, m.final_through.is_(None),
                          m.final_through < n.state_since))
            .order_by(n.created_at, n.id)
        )
        if policies is not None:
            query = query.where(n.policy.in_(sorted(policies)))
        with self._read() as conn:
            # Straight through the driver (a tick reads every live node here), and the launch
            # and end from the node's ledger_reach row, kept as its events are written; only a
            # node without one (written around add_node) has its events grouped here.
            rows = driver_rows(conn, query)
            spans = _spans(conn, [r[0] for r in rows if r[14] is None])
        return self._candidates(rows, spans, fresh)

    def _candidates(self, rows: Sequence[tuple], spans: Mapping[str, tuple[datetime | None,
                    datetime | None]], fresh: FreshTest | None) -> list[LedgerNode | FreshNode]:
        out: list[LedgerNode | FreshNode] = []
        marks: dict[Any, int] = {}  # marks are whole hours: a few distinct values among many rows
        for row in rows:
            mark, covered, kept, launched_us = row[12], row[13], row[14], row[15]
            if fresh is not None and kept is not None and launched_us is not None:
                mark_us = None
                if mark is not None:
                    mark_us = marks.get(mark)
                    if mark_us is None:
                        mark_us = marks[mark] = accrual.epoch_us(utc(mark))  # type: ignore[arg-type]
                if fresh(row[0], row[4], row[10], mark_us, covered, launched_us, row[16]):
                    out.append(FreshNode(row[0], covered, launched_us if mark_us is None
                                         else mark_us, row))
                    continue
            out.append(self.ledger_node(row, spans))
        return out

    @staticmethod
    def ledger_node(row: tuple, spans: Mapping[str, tuple[datetime | None, datetime | None]]
                    | None = None) -> LedgerNode:
        """The :class:`LedgerNode` of a row of :meth:`ledger_candidates` (``spans``: launch and
        end by node, for a node without a ledger reach row)."""
        (node_id, policy, pool, provider, offering_key, instance_type, market, gpus, price,
         project, state, state_since, mark, covered, kept, launched_us, ended_us) = row
        if kept is None:
            launched, ended = (spans or {}).get(node_id, (None, None))
        else:
            launched, ended = accrual.from_us(launched_us), accrual.from_us(ended_us)
        return LedgerNode(
            node_id=node_id, policy=policy, pool=pool, provider=provider,
            offering_key=offering_key, instance_type=instance_type, market=market,
            gpus=gpus, price_usd_hour=price, project=project, state=_STATES[state],
            state_since=utc(state_since), launched=launched, ended=ended, mark=utc(mark),
            reach=accrual.from_us(covered))

    def ledger_mark(self, subject: str) -> datetime | None:
        """How far ``subject``'s lines are final (None: nothing is)."""
        m = T.ledger_marks.c
        with self._read() as conn:
            return conn.execute(sa.select(m.final_through).where(m.subject == subject)).scalar()

    def ledger_marks(self, subjects: Collection[str] | None = None) -> dict[str, datetime]:
        """The marks of ``subjects`` that have one (None: every mark)."""
        m = T.ledger_marks.c
        query = sa.select(m.subject, m.final_through)
        if subjects is not None:
            query = query.where(m.subject.in_(sorted(subjects)))
        with self._read() as conn:
            return {r.subject: r.final_through for r in conn.execute(query)}

    # -- job usages --------------------------------------------------------------------------------

    def burst_job_usages(self, node_ids: Collection[str], since: datetime | None = None
                         ) -> dict[str, list[JobUsage]]:
        """Per node, every run of a job on it (``job_runs``: built-in and Slurm jobs, each run of
        a job requeued from one node to another) still running at ``since`` or started after it
        (None: all). A job that ran twice on a node has a usage per run."""
        with self._read() as conn:
            return run_usages(conn, node_ids, since)

    def onprem_job_usages(self, pools: Collection[str], since: datetime | None = None
                          ) -> dict[str, list[JobUsage]]:
        """Per pool, the jobs that ran on-prem and had not finished by ``since`` (None: all)."""
        c = T.jobs.c
        query = (
            sa.select(c.id, c.project, c.user, c.gpus, c.started_at, c.finished_at, c.pool)
            .where(c.placement == Placement.ONPREM.value, c.started_at.is_not(None),
                   c.pool.in_(sorted(pools)))
        )
        if since is not None:
            query = query.where(sa.or_(c.finished_at.is_(None),
                                       c.finished_at > require_aware(since, "since")))
        out: dict[str, list[JobUsage]] = {}
        with self._read() as conn:
            for r in conn.execute(query):
                out.setdefault(r.pool, []).append(
                    JobUsage(r.id, r.project, r.gpus, r.started_at, r.finished_at, r.user))
        return out

    # -- lines -------------------------------------------------------------------------------------

    def ledger_lines(self, subject: str | None = None, since: datetime | None = None
                     ) -> list[CostLine]:
        """The lines of ``subject`` (None: all) in buckets from ``since`` on, by bucket and key."""
        query = sa.select(T.cost_lines).order_by(_c.period_start, _c.line_key)
        if subject is not None:
            query = query.where(_c.subject == subject)
        if since is not None:
            query = query.where(_c.period_start >= require_aware(since, "since"))
        with self._read() as conn:
            return [line_from_row(r) for r in conn.execute(query)]

    def write_ledger(self, subject: str, lines: Sequence[CostLine], *, since: datetime,
                     mark: datetime | None, at: datetime) -> tuple[int, int]:
        """Make ``subject``'s lines in buckets from ``since`` on exactly ``lines``, and advance its
        mark to ``mark`` (a mark never moves back), in one transaction. Returns (lines written,
        lines deleted); (0, 0) when the ledger already said exactly this."""
        require_aware(since, "since")
        require_aware(at, "at")
        if mark is not None:
            require_aware(mark, "mark")
        wanted: dict[str, CostLine] = {}
        for line in lines:
            if line.subject != subject or line.period_start < since:
                raise ValueError(f"line {line.line_key} is not of subject {subject!r} from "
                                 f"{since.isoformat()}")
            if line.line_key in wanted:
                raise ValueError(f"line key {line.line_key} given twice")
            wanted[line.line_key] = line
        with self._read() as conn:
            if _diff(conn, subject, since, wanted, mark) is None:
                return 0, 0  # nothing changed: no write transaction (and no write lock) at all
        with self._write() as conn:
            # One writer of a subject at a time (on PostgreSQL; SQLite's write lock is whole):
            # the old lines the roll-ups lose below must be the ones this transaction replaces.
            rollups.lock_subject(conn, subject)
            # Re-read the mark under the write transaction (locked on PostgreSQL): a newer roll-up
            # may have finalised buckets after this one read its mark. Final buckets are never
            # rewritten, so this run writes only from the mark as it stands now.
            query = sa.select(T.ledger_marks.c.final_through).where(
                T.ledger_marks.c.subject == subject)
            if conn.dialect.name == "postgresql":
                query = query.with_for_update()
            current = conn.execute(query).scalar()
            if current is not None and current > since:
                since = current
                wanted = {k: line for k, line in wanted.items() if line.period_start >= current}
            diff = _diff(conn, subject, since, wanted, mark)
            if diff is None:
                return 0, 0
            stale, changed, move_mark, have = diff
            for chunk in _chunks(sorted(stale)):
                conn.execute(sa.delete(T.cost_lines).where(_c.line_key.in_(chunk)))
            if changed:
                rows = [{**line_values(wanted[key]), "rolled_at": at} for key in sorted(changed)]
                conn.execute(line_upsert(self.dialect, self._insert), rows)
            rollups.apply_changes(
                conn, self._insert, [have[k] for k in sorted(stale | (changed & set(have)))],
                [wanted[k] for k in sorted(changed)])
            if move_mark:
                m = T.ledger_marks.c
                stmt = self._insert(T.ledger_marks).values(subject=subject, final_through=mark,
                                                           updated_at=at)
                stmt = stmt.on_conflict_do_update(index_elements=["subject"], set_={
                    # Never backwards, even if a slower roll-up commits after a faster one.
                    "final_through": sa.case((stmt.excluded.final_through > m.final_through,
                                              stmt.excluded.final_through),
                                             else_=m.final_through),
                    "updated_at": stmt.excluded.updated_at,
                })
                conn.execute(stmt)
            if not subject.startswith(ONPREM_SUBJECT):
                accrual.on_lines(conn, subject)  # the node's reach, for budgets' accrual
        return len(changed), len(stale)

    def rebuild_cost_rollups(self) -> tuple[int, int, int]:
        """Rebuild the hour, day and month roll-ups from the lines, and the nodes' ledger reach
        (:mod:`orchestrator.store.accrual`) from nodes, events, marks and lines (what migrations
        0014, 0016 and 0019 did on upgrade; for rows loaded around ``write_ledger`` or
        ``add_node``, e.g. by a bulk load), in one transaction. Returns the roll-ups' row counts
        (hours, days, months)."""
        with self._write() as conn:
            counts = rollups.rebuild(conn)
            accrual.rebuild(conn, self._insert)
            return counts

    def set_ledger_mark(self, subject: str, mark: datetime, at: datetime) -> None:
        """Advance ``subject``'s mark to ``mark`` (never backwards) without touching lines."""
        self.write_ledger(subject, [], since=mark, mark=mark, at=at)

    # -- sums --------------------------------------------------------------------------------------

    def cost_sums(self, group_by: Sequence[str], *, since: datetime | None = None,
                  until: datetime | None = None, projects: Collection[str] | None = None,
                  pool: str | None = None, users: Collection[str] | None = None,
                  from_lines: bool = False) -> list[CostSums]:
        """Sums of the lines whose bucket starts in [since, until), grouped by ``group_by`` (keys
        of :data:`GROUP_COLUMNS`; none: one group of everything), ordered by the keys (a key of
        None, lines of no project or user, after the named ones). ``projects``: only these
        (None: every project); ``users``: only lines of these users (None: everyone's). An
        unknown name matches nothing: no groups, not an error.

        Read from the roll-ups when every key is one they carry
        (:data:`~orchestrator.store.rollups.ROLLUP_KEYS`), else from the lines;
        ``from_lines``: from the lines whatever the keys (the same sums: what tests compare)."""
        unknown = [k for k in group_by if k not in GROUP_COLUMNS]
        if unknown:
            raise ValueError(f"group_by: unknown key(s) {unknown}; choose from "
                             f"{', '.join(GROUP_COLUMNS)}")
        if (projects is not None and not projects) or (users is not None and not users):
            return []
        if not from_lines and rollups.ROLLUP_KEYS.issuperset(group_by):
            with self._read() as conn:
                groups = rollups.rollup_sums(conn, group_by, since=since, until=until,
                                             projects=projects, pool=pool, users=users)
            return sorted((_rollup_row(k, v) for k, v in groups.items()),
                          key=lambda s: key_order(s.keys))
        burst = _c.kind != CostKind.ONPREM.value
        keys = [GROUP_COLUMNS[k].label(f"k{i}") for i, k in enumerate(group_by)]
        query = sa.select(
            *keys,
            sa.func.sum(sa.case((burst, _c.cost_micros), else_=0)).label("cost"),
            sa.func.sum(sa.case((_c.kind == CostKind.IDLE.value, _c.cost_micros), else_=0))
            .label("idle"),
            sa.func.sum(sa.case((burst, 0), else_=_c.cost_micros)).label("onprem"),
            sa.func.sum(_c.onprem_equiv_micros).label("equiv"),
            sa.func.sum(sa.case((burst, _c.gpu_seconds), else_=0.0)).label("gpu_s"),
            sa.func.sum(_c.instance_seconds).label("inst_s"),
            sa.func.count().label("lines"),
        )
        query = _window(query, since, until, projects, pool)
        if users is not None:
            query = query.where(_c.user.in_(sorted(users)))
        if keys:
            query = query.group_by(*[sa.literal_column(str(i + 1)) for i in range(len(keys))])
        with self._read() as conn:
            rows = conn.execute(query).all()
        out = []
        for r in rows:
            if not keys and not r.lines:
                continue  # no lines at all: no group
            out.append(CostSums(
                keys=tuple(None if r[i] is None else str(r[i]) for i in range(len(keys))),
                cost_micros=int(r.cost or 0),
                idle_micros=int(r.idle or 0), onprem_micros=int(r.onprem or 0),
                onprem_equiv_micros=int(r.equiv or 0), gpu_seconds=float(r.gpu_s or 0.0),
                instance_seconds=float(r.inst_s or 0.0), lines=int(r.lines)))
        # Ordered here, by code point: the same order on every database whatever its collation
        # (the order decides ties when cents are allocated).
        return sorted(out, key=lambda s: key_order(s.keys))

    def ledger_cost_micros(self, *, since: datetime, until: datetime, pool: str | None = None,
                           project: str | None = None) -> int:
        """Micro-dollars of burst (not on-prem) lines whose bucket starts in [since, until),
        from the roll-ups."""
        with self._read() as conn:
            groups = rollups.rollup_sums(
                conn, (), since=require_aware(since, "since"), until=require_aware(until, "until"),
                projects=None if project is None else [project], pool=pool, users=None)
        return groups[()][0] if groups else 0

    def live_node_prices_by_group(self) -> dict[tuple[str, str | None], list[float]]:
        """Hourly prices of the nodes not yet terminated per (pool, project launched for): what
        every budget's burn rate adds up, in one read."""
        n = T.nodes.c
        query = sa.select(n.pool, n.project, n.price_usd_hour) \
            .where(n.state != NodeState.TERMINATED.value)
        out: dict[tuple[str, str | None], list[float]] = {}
        with self._read() as conn:
            for pool, project, price in conn.execute(query):
                out.setdefault((pool, project), []).append(float(price))
        return out

    def live_node_prices(self, *, pool: str | None = None, project: str | None = None
                         ) -> list[float]:
        """Hourly prices of the nodes not yet terminated."""
        n = T.nodes.c
        query = sa.select(n.price_usd_hour).where(n.state != NodeState.TERMINATED.value)
        if pool is not None:
            query = query.where(n.pool == pool)
        if project is not None:
            query = query.where(n.project == project)
        with self._read() as conn:
            return [float(p) for p in conn.execute(query).scalars()]


def _rollup_row(keys: tuple[str | None, ...], sums: list[int]) -> CostSums:
    cost, idle, onprem, equiv, gpu_us, instance_us, lines = sums
    return CostSums(keys=keys, cost_micros=cost, idle_micros=idle, onprem_micros=onprem,
                    onprem_equiv_micros=equiv, gpu_seconds=gpu_us / 1e6,
                    instance_seconds=instance_us / 1e6, lines=lines)


def key_order(keys: Sequence[str | None]) -> tuple[tuple[bool, str], ...]:
    """Sort key of a group's keys: by code point, a None (no project, no user) after the names."""
    return tuple((k is None, k or "") for k in keys)


def _window(query: Any, since: datetime | None, until: datetime | None,
            projects: Collection[str] | None, pool: str | None) -> Any:
    if since is not None:
        query = query.where(_c.period_start >= require_aware(since, "since"))
    if until is not None:
        query = query.where(_c.period_start < require_aware(until, "until"))
    if projects is not None:
        wanted = sorted(projects)
        match = _c.project == wanted[0] if len(wanted) == 1 else _c.project.in_(wanted)
        if NO_PROJECT in projects:  # "-", no project: nodes launched for none, and jobs of none
            match = sa.or_(match, _c.project.is_(None))
        query = query.where(match)
    if pool is not None:
        query = query.where(_c.pool == pool)
    return query


def _spans(conn: Connection, node_ids: Sequence[str]
           ) -> dict[str, tuple[datetime | None, datetime | None]]:
    """Per node: its first ``launching`` and its ``terminated`` event times."""
    e = T.node_events.c
    at = sa.type_coerce(e.at, T.UtcDateTime())
    launched = sa.func.min(sa.case((e.to_state == NodeState.LAUNCHING.value, at)))
    ended = sa.func.min(sa.case((e.to_state == NodeState.TERMINATED.value, at)))
    out: dict[str, tuple[datetime | None, datetime | None]] = {}
    for chunk in _chunks(list(node_ids)):
        query = (
            sa.select(e.node_id, sa.type_coerce(launched, T.UtcDateTime()).label("launched"),
                      sa.type_coerce(ended, T.UtcDateTime()).label("ended"))
            .where(e.node_id.in_(chunk))
            .group_by(e.node_id)
        )
        for r in conn.execute(query):
            out[r.node_id] = (r.launched, r.ended)
    return out


def _diff(conn: Connection, subject: str, since: datetime, wanted: dict[str, CostLine],
          mark: datetime | None) -> tuple[set[str], set[str], bool, dict[str, CostLine]] | None:
    """What :meth:`Ledger.write_ledger` must do: (keys to delete, keys to upsert, advance the
    mark?, the lines as they are now), or None for nothing."""
    rows = conn.execute(sa.select(T.cost_lines).where(_c.subject == subject,
                                                      _c.period_start >= since)).all()
    have = {r.line_key: line_from_row(r) for r in rows}
    stale = set(have) - set(wanted)
    changed = {key for key, line in wanted.items() if have.get(key) != line}
    current = conn.execute(sa.select(T.ledger_marks.c.final_through)
                           .where(T.ledger_marks.c.subject == subject)).scalar()
    move_mark = mark is not None and (current is None or mark > current)
    if not stale and not changed and not move_mark:
        return None
    return stale, changed, move_mark, have


__all__ = ["GROUP_COLUMNS", "ONPREM_SUBJECT", "AccrualNode", "CostSums", "Ledger", "LedgerNode",
           "key_order"]
