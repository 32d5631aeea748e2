"""Cost roll-ups: the ledger's lines pre-summed per hour bucket, per UTC day and per UTC month, so
cost reports and budgets over a quarter read hundreds of rows instead of hundreds of thousands of
lines.

Three tables (``cost_rollup_hours``, ``cost_rollup_days``, ``cost_rollup_months``) hold, per
bucket and per (project,
user, provider, pool, policy), the sums a report shows: burst cost, idle cost, on-prem cost,
on-prem equivalent, burst GPU-seconds, instance-seconds and the number of lines.

**Kept as lines are written, in the same transaction.** :func:`apply_changes` is called by
``Ledger.write_ledger`` with the lines it deletes, the old versions of the lines it rewrites and
the new ones; it adds the difference to the three roll-ups in the transaction that changes the lines.
A line therefore reaches the roll-ups exactly when it reaches ``cost_lines``: a roll-up that
crashes rolls them all back, a retry that finds nothing changed writes nothing to either, and no
later task can count a line twice or miss one. (A separate roll-up task would need its own
mark per line version, and would lag the lines the budgets read.) Two writers of one subject are
serialised (SQLite's write lock; a transaction-scoped advisory lock per subject on PostgreSQL)
so the old versions a writer subtracts are the ones it replaces. Increments of a shared group
are ``INSERT ... ON CONFLICT DO UPDATE SET x = x + excluded.x``, atomic on both databases, in
key order (no deadlock between writers of different subjects).

**Exact.** Money is integer micro-dollars and seconds integer micro-seconds (each line's float
seconds rounded to the micro-second once), so adding and subtracting in any order is exact; a
group whose lines are all gone keeps a row of zeros with ``lines`` 0, which reads skip.

**No proration needed.** The attribution (``orchestrator.costs.attribution``) already splits a
node's or a job's time at hour boundaries: every line lies in one hour bucket, and windows
select lines by the start of their bucket. So the lines of a window are exactly those of the
hours from ``since`` rounded up to the hour to ``until`` rounded up: :func:`rollup_sums` reads
the month roll-up for the whole UTC months inside that span, the day roll-up for the whole days
at their edges and the hour roll-up for the hours at theirs (:func:`buckets`), and equals the
sum of the raw lines to the micro-dollar. (A 91-day report by project reads about 2 months and
30 days of rows rather than 91 days; a month budget one month's.) Groupings the roll-ups do
not carry (region, instance type, market, node, job, kind) are summed from the lines
(:data:`ROLLUP_KEYS` says which ones they carry).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.domain.costs import NO_PROJECT, CostKind, CostLine
from orchestrator.store import tables as T

ROLLUP_KEYS = frozenset({"project", "user", "provider", "pool", "policy", "day"})
_GROUP = ("project", "user", "provider", "pool", "policy")  # the roll-ups' own keys
SUMS = ("cost_micros", "idle_micros", "onprem_micros", "onprem_equiv_micros", "gpu_us",
        "instance_us", "lines")
_NONE = ""  # the key of a line of no project (or no user): a key column cannot be NULL
_HOUR = timedelta(hours=1)
_DAY = timedelta(days=1)
_US = 1_000_000

Sums = list[int]  # in SUMS order


def line_sums(line: CostLine, sign: int = 1) -> Sums:
    """What one line adds to its groups (``sign`` -1: what removing it takes away)."""
    onprem = line.kind == CostKind.ONPREM
    return [sign * v for v in (
        0 if onprem else line.cost_micros,
        line.cost_micros if line.kind == CostKind.IDLE else 0,
        line.cost_micros if onprem else 0,
        line.onprem_equiv_micros,
        0 if onprem else round(line.gpu_seconds * _US),
        round(line.instance_seconds * _US),
        1)]


def _group(line: CostLine) -> tuple[str, ...]:
    return (line.project or _NONE, line.user or _NONE, line.provider, line.pool, line.policy)


def lock_subject(conn: Connection, subject: str) -> None:
    """Serialise writers of one subject on PostgreSQL until the transaction ends (SQLite's write
    transaction is serialised already)."""
    if conn.dialect.name == "postgresql":
        key = int.from_bytes(hashlib.sha256(b"cost-lines:" + subject.encode()).digest()[:8],
                             "big", signed=True)
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


def apply_changes(conn: Connection, insert: Any, removed: Iterable[CostLine],
                  added: Iterable[CostLine]) -> None:
    """Add ``added`` and take away ``removed`` (old versions of lines deleted or rewritten) in
    both roll-ups, in ``conn``'s transaction. ``insert``: the store's dialect insert."""
    hours: dict[tuple[Any, ...], Sums] = {}
    days: dict[tuple[Any, ...], Sums] = {}
    months: dict[tuple[Any, ...], Sums] = {}
    for lines, sign in ((removed, -1), (added, 1)):
        for line in lines:
            delta = line_sums(line, sign)
            group = _group(line)
            day = line.day
            for table, key in ((hours, (line.period_start, day, *group)),
                               (days, (day, *group)), (months, (day[:7], *group))):
                have = table.get(key)
                table[key] = delta if have is None else [a + b for a, b in zip(have, delta,
                                                                              strict=True)]
    _upsert(conn, insert, T.cost_rollup_hours, ("period_start", "day", *_GROUP), hours)
    _upsert(conn, insert, T.cost_rollup_days, ("day", *_GROUP), days)
    _upsert(conn, insert, T.cost_rollup_months, ("month", *_GROUP), months)


# The increment statement per (dialect, table), built once: building its SET clause's
# expressions took more CPU than running it, once per subject written.
_INCREMENTS: dict[tuple[str, str], Any] = {}


def _upsert(conn: Connection, insert: Any, table: sa.Table, names: Sequence[str],
            deltas: dict[tuple[Any, ...], Sums]) -> None:
    rows = [{**dict(zip(names, key, strict=True)), **dict(zip(SUMS, sums, strict=True))}
            for key, sums in sorted(deltas.items(), key=lambda kv: kv[0])
            if any(sums)]
    if not rows:
        return
    stmt = _INCREMENTS.get((conn.dialect.name, table.name))
    if stmt is None:
        stmt = insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=[c.name for c in table.primary_key],
            set_={s: table.c[s] + stmt.excluded[s] for s in SUMS})
        _INCREMENTS[(conn.dialect.name, table.name)] = stmt
    conn.execute(stmt, rows)


def rebuild(conn: Connection) -> tuple[int, int, int]:
    """Make the three roll-ups exactly the sums of ``cost_lines`` (what migrations 0014 and 0016
    do on upgrade), in ``conn``'s transaction. Returns (hour rows, day rows, month rows)."""
    if conn.dialect.name == "postgresql":
        # No line written while the roll-ups are rebuilt from them (writers wait, readers read).
        conn.exec_driver_sql("LOCK TABLE cost_lines IN SHARE MODE")
    c = T.cost_lines.c
    burst = c.kind != CostKind.ONPREM.value

    def micro_s(col: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        return sa.cast(sa.func.round(col * _US), sa.BigInteger)

    sums = [
        sa.func.sum(sa.case((burst, c.cost_micros), else_=0)),
        sa.func.sum(sa.case((c.kind == CostKind.IDLE.value, c.cost_micros), else_=0)),
        sa.func.sum(sa.case((burst, 0), else_=c.cost_micros)),
        sa.func.sum(c.onprem_equiv_micros),
        sa.func.sum(sa.case((burst, micro_s(c.gpu_seconds)), else_=0)),
        sa.func.sum(micro_s(c.instance_seconds)),
        sa.func.count(),
    ]
    keys = [sa.func.coalesce(c.project, _NONE), sa.func.coalesce(c.user, _NONE), c.provider,
            c.pool, c.policy]
    counts = []
    for table, lead, lead_cols in (
            (T.cost_rollup_hours, ["period_start", "day"], [c.period_start, sa.func.min(c.day)]),
            (T.cost_rollup_days, ["day"], [c.day]),
            (T.cost_rollup_months, ["month"], [sa.func.substr(c.day, 1, 7)])):
        conn.execute(sa.delete(table))
        group_by = [lead_cols[0], *keys]
        select = sa.select(*lead_cols, *keys, *sums).group_by(*group_by)
        conn.execute(sa.insert(table).from_select([*lead, *_GROUP, *SUMS], select))
        counts.append(int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar()))
    return counts[0], counts[1], counts[2]


# -- reads ------------------------------------------------------------------------------------------

def _hour_ceil(moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    floor = moment.replace(minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + _HOUR


def _day_ceil(moment: datetime) -> datetime:
    floor = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + _DAY


def _day_floor(moment: datetime) -> datetime:
    return moment.replace(hour=0, minute=0, second=0, microsecond=0)


def spans(since: datetime | None, until: datetime | None
          ) -> tuple[tuple[datetime | None, datetime | None] | None,
                     list[tuple[datetime | None, datetime | None]]]:
    """The window's whole UTC days (a [start, end) of day starts, None: unbounded; None: no whole
    day) and its edge hours ([start, end) spans of hour buckets), which together hold exactly
    the buckets that start in [since, until)."""
    lo = None if since is None else _hour_ceil(since)
    hi = None if until is None else _hour_ceil(until)
    d0 = None if lo is None else _day_ceil(lo)
    d1 = None if hi is None else _day_floor(hi)
    if d0 is not None and d1 is not None and d0 >= d1:
        return None, ([(lo, hi)] if lo < hi else [])  # type: ignore[operator]
    edges = []
    if lo is not None and d0 is not None and lo < d0:
        edges.append((lo, d0))
    if hi is not None and d1 is not None and d1 < hi:
        edges.append((d1, hi))
    return (d0, d1), edges


@dataclass(frozen=True, slots=True)
class Buckets:
    """What of each roll-up a window reads: whole UTC months (a [start, end) of month starts,
    None: unbounded; None: no whole month), whole days at their edges and hours at the days'
    edges ([start, end) spans), which together hold exactly the hour buckets that start in
    [since, until)."""

    months: tuple[datetime | None, datetime | None] | None
    days: list[tuple[datetime | None, datetime | None]]
    hours: list[tuple[datetime, datetime]]


def _month_ceil(day: datetime) -> datetime:
    return day if day.day == 1 else _next_month(day.replace(day=1))


def _next_month(month: datetime) -> datetime:
    return (month + timedelta(days=32)).replace(day=1)


def buckets(since: datetime | None, until: datetime | None, *, months: bool = True) -> Buckets:
    """:func:`spans`, with the whole months inside its whole days read from the month roll-up
    (``months`` False: none, for a grouping by day)."""
    days, hours = spans(since, until)
    if days is None:
        return Buckets(None, [], hours)  # type: ignore[arg-type]  # edges are bounded
    if not months:
        return Buckets(None, [days], hours)  # type: ignore[arg-type]
    d0, d1 = days
    m0 = None if d0 is None else _month_ceil(d0)
    m1 = None if d1 is None else d1.replace(day=1)
    if m0 is not None and m1 is not None and m0 >= m1:
        return Buckets(None, [days], hours)  # type: ignore[arg-type]
    edges: list[tuple[datetime | None, datetime | None]] = []
    if d0 is not None and m0 is not None and d0 < m0:
        edges.append((d0, m0))
    if d1 is not None and m1 is not None and m1 < d1:
        edges.append((m1, d1))
    return Buckets((m0, m1), edges, hours)  # type: ignore[arg-type]


def _range(column: sa.ColumnElement[Any], span: tuple[datetime | None, datetime | None],
           text: str) -> list[sa.ColumnElement[bool]]:
    lo, hi = span
    return [*([] if lo is None else [column >= lo.strftime(text)]),
            *([] if hi is None else [column < hi.strftime(text)])]


def rollup_sums(conn: Connection, group_by: Sequence[str], *, since: datetime | None,
                until: datetime | None, projects: Collection[str] | None, pool: str | None,
                users: Collection[str] | None, sums: Sequence[str] = SUMS
                ) -> dict[tuple[str | None, ...], Sums]:
    """Sums (``sums``, default :data:`SUMS`, in that order) per group of the lines whose bucket
    starts in [since, until), read from the roll-ups (``group_by`` within :data:`ROLLUP_KEYS`);
    the filters as ``Ledger.cost_sums`` takes them. Groups of no line are left out."""
    span = buckets(since, until, months="day" not in group_by)  # a month has no day key
    out: dict[tuple[str | None, ...], Sums] = {}
    parts: list[tuple[sa.Table, list[sa.ColumnElement[bool]]]] = []
    if span.months is not None:
        t = T.cost_rollup_months
        parts.append((t, _range(t.c.month, span.months, "%Y-%m")))
    for days in span.days:
        t = T.cost_rollup_days
        parts.append((t, _range(t.c.day, days, "%Y-%m-%d")))
    for lo, hi in span.hours:
        t = T.cost_rollup_hours
        parts.append((t, [t.c.period_start >= lo, t.c.period_start < hi]))
    width = len(group_by)
    for table, where in parts:
        keys = [table.c[k].label(f"k{i}") for i, k in enumerate(group_by)]
        query = sa.select(*keys, *(sa.func.sum(table.c[s]) for s in sums)) \
            .where(*where, *_filters(table, projects, pool, users))
        if keys:
            query = query.group_by(*keys)
        query = query.having(sa.func.sum(table.c.lines) > 0)
        # Plain tuples from the driver: no Row mapping per group.
        for row in conn.execute(query):
            key = tuple(_key(k, row[i]) for i, k in enumerate(group_by))
            values = [int(v or 0) for v in row[width:]]
            have = out.get(key)
            out[key] = values if have is None else [a + b for a, b in zip(have, values,
                                                                          strict=True)]
    return out


def _key(name: str, value: Any) -> str | None:
    if value is None or (name in ("project", "user") and value == _NONE):
        return None
    return str(value)


def _filters(table: sa.Table, projects: Collection[str] | None, pool: str | None,
             users: Collection[str] | None) -> list[sa.ColumnElement[bool]]:
    where = []
    if projects is not None:
        wanted = set(projects)
        if NO_PROJECT in wanted:  # "-": nodes launched for none, and jobs of none
            wanted.add(_NONE)
        where.append(table.c.project.in_(sorted(wanted)))
    if pool is not None:
        where.append(table.c.pool == pool)
    if users is not None:
        where.append(table.c.user.in_(sorted(users)))
    return where


__all__ = ["ROLLUP_KEYS", "SUMS", "Buckets", "apply_changes", "buckets", "line_sums",
           "lock_subject", "rebuild", "rollup_sums", "spans"]
