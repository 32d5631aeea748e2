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
serialised (SQLite's write lock; on PostgreSQL a transaction-scoped advisory lock per stripe of
subjects, :func:`lock_subjects`) so the old versions a writer subtracts are the ones it replaces.
The batched writer (:mod:`orchestrator.store.ledger_batch`) calls :func:`apply_changes` once for
every subject it writes. Increments of a shared group
are ``INSERT ... ON CONFLICT DO UPDATE SET x = x + excluded.x``, atomic on both databases, in
key order (no deadlock between writers of different subjects).

**Exact.** Money is integer micro-dollars and seconds integer micro-seconds (each line's float
seconds rounded to the micro-second once), so adding and subtracting in any order is exact; a
group whose lines are all gone keeps a row of zeros with ``lines`` 0, which reads skip.

**No proration needed.** The attribution (``orchestrator.costs.attribution``) already splits a
node's or a job's time at hour boundaries: every line lies in one hour bucket, and windows
select lines by the start of their bucket. So the lines of a window are exactly those of the
hours from ``since`` rounded up to the hour to ``until`` rounded up: :func:`rollup_sums` reads
the month roll-up for the whole UTC months inside that span and, at each edge, the cheaper of
the finer buckets up to it and the whole edge bucket less its finer buckets outside the window
(:func:`cover`: November 1-29 is November less November 30; today up to now is today less its
hours after now), and equals the sum of the raw lines to the micro-dollar (integer sums
subtract exactly). A 91-day report by project reads five buckets' rows instead of 91 days'; a
month budget one month's. Groupings the roll-ups do
not carry (region, instance type, market, node, job, kind) are summed from the lines
(:data:`ROLLUP_KEYS` says which ones they carry).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.domain.costs import NO_PROJECT, CostKind, CostLine
from orchestrator.store import rollup_version
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


STRIPES = 64  # advisory locks the subjects are spread over (PostgreSQL)
_STRIPE_KEYS = [int.from_bytes(hashlib.sha256(b"cost-lines-stripe:%d" % i).digest()[:8], "big",
                               signed=True) for i in range(STRIPES)]


def stripe(subject: str) -> int:
    """Which of the :data:`STRIPES` locks serialises the writers of ``subject``."""
    return int.from_bytes(hashlib.sha256(subject.encode()).digest()[:8], "big") % STRIPES


def lock_subject(conn: Connection, subject: str) -> None:
    """Serialise writers of one subject on PostgreSQL until the transaction ends (SQLite's write
    transaction is serialised already)."""
    lock_subjects(conn, (subject,))


def lock_subjects(conn: Connection, subjects: Iterable[str]) -> None:
    """Serialise writers of ``subjects`` on PostgreSQL until the transaction ends: a
    transaction-scoped advisory lock per stripe of them (at most :data:`STRIPES`, whatever their
    number: a lock per subject would overflow the server's lock table at 10,000 nodes), taken in
    stripe order by one statement (the locks of a sorted array, unnested in its order), so a
    batch of every node and a writer of one never deadlock. Writers of two subjects of one
    stripe wait for each other; nothing else does."""
    if conn.dialect.name == "postgresql":
        keys = [_STRIPE_KEYS[i] for i in sorted({stripe(s) for s in subjects})]
        conn.execute(_LOCK_STRIPES, {"keys": keys})


_LOCK_STRIPES = sa.text("SELECT pg_advisory_xact_lock(k) FROM unnest(CAST(:keys AS bigint[])) AS k")


def apply_changes(conn: Connection, insert: Any, removed: Iterable[CostLine],
                  added: Iterable[CostLine]) -> None:
    """Add ``added`` and take away ``removed`` (old versions of lines deleted or rewritten) in
    both roll-ups, in ``conn``'s transaction. ``insert``: the store's dialect insert."""
    hours: dict[tuple[Any, ...], Sums] = {}
    for lines, sign in ((removed, -1), (added, 1)):
        for line in lines:
            _add(hours, (line.period_start, line.day, *_group(line)), line_sums(line, sign))
    # A day's and a month's differences are their hours' (an hour lies in one day and month):
    # summed from the hours, not once more per line (a batch of 10,000 nodes changes 40,000).
    days: dict[tuple[Any, ...], Sums] = {}
    months: dict[tuple[Any, ...], Sums] = {}
    for (_, day, *group), sums in hours.items():
        _add(days, (day, *group), sums)
        _add(months, (day[:7], *group), sums)
    if _upsert(conn, insert, T.cost_rollup_hours, ("period_start", "day", *_GROUP), hours):
        _upsert(conn, insert, T.cost_rollup_days, ("day", *_GROUP), days)
        _upsert(conn, insert, T.cost_rollup_months, ("month", *_GROUP), months)
        rollup_version.moved(conn)  # their version moves with them (kept window sums)


def _add(table: dict[tuple[Any, ...], Sums], key: tuple[Any, ...], delta: Sums) -> None:
    have = table.get(key)
    table[key] = list(delta) if have is None else [a + b for a, b in zip(have, delta,
                                                                         strict=True)]


# The increment statement per (dialect, table), built once: building its SET clause's
# expressions took more CPU than running it, once per subject written.
_INCREMENTS: dict[tuple[str, str], Any] = {}


def _upsert(conn: Connection, insert: Any, table: sa.Table, names: Sequence[str],
            deltas: dict[tuple[Any, ...], Sums]) -> bool:
    """Add ``deltas`` to ``table``'s rows; False when every delta is zero (nothing written: a
    day's or month's deltas are their hours' sums, so they are all zero then too)."""
    rows = [{**dict(zip(names, key, strict=True)), **dict(zip(SUMS, sums, strict=True))}
            for key, sums in sorted(deltas.items(), key=lambda kv: kv[0])
            if any(sums)]
    if not rows:
        return False
    stmt = _INCREMENTS.get((conn.dialect.name, table.name))
    if stmt is None:
        stmt = insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=[c.name for c in table.primary_key],
            set_={s: table.c[s] + stmt.excluded[s] for s in SUMS})
        _INCREMENTS[(conn.dialect.name, table.name)] = stmt
    conn.execute(stmt, rows)
    return True


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
    rollup_version.moved(conn)
    return counts[0], counts[1], counts[2]


# -- reads ------------------------------------------------------------------------------------------

class Level(IntEnum):
    """A roll-up's bucket size, finest first."""

    HOUR = 0
    DAY = 1
    MONTH = 2


def _floor(moment: datetime, level: Level) -> datetime:
    moment = moment.replace(minute=0, second=0, microsecond=0)
    if level >= Level.DAY:
        moment = moment.replace(hour=0)
    return moment.replace(day=1) if level is Level.MONTH else moment


def _next(start: datetime, level: Level) -> datetime:
    """The start of the bucket after the one starting at ``start``."""
    if level is Level.HOUR:
        return start + _HOUR
    if level is Level.DAY:
        return start + _DAY
    return (start + timedelta(days=32)).replace(day=1)


def _ceil(moment: datetime, level: Level) -> datetime:
    floor = _floor(moment, level)
    return floor if floor == moment else _next(floor, level)


@dataclass(frozen=True, slots=True)
class Part:
    """One range read from one roll-up: its buckets [start, end) (None: unbounded), added
    (``sign`` 1) or taken away (-1)."""

    level: Level
    start: datetime | None
    end: datetime | None
    sign: int = 1

    @property
    def buckets(self) -> int:
        """How many buckets it reads (what choosing between two covers weighs); unbounded: many."""
        if self.start is None or self.end is None:
            return 1 << 30
        if self.level is Level.MONTH:
            return (self.end.year - self.start.year) * 12 + self.end.month - self.start.month
        return int((self.end - self.start) / (_DAY if self.level is Level.DAY else _HOUR))


def cover(lo: datetime | None, hi: datetime | None, level: Level = Level.MONTH) -> list[Part]:
    """Parts of the roll-ups no coarser than ``level`` whose signed sum is exactly the hour buckets
    in [lo, hi) (hour starts, UTC; None: unbounded), reading as few buckets as it can: the whole
    buckets of ``level`` inside the range, and at each edge the cheaper of the finer buckets up to
    it or the whole edge bucket less its finer buckets outside the range (days 1-29 of a month
    are the month less its day 30; the hours of today up to now, today less the hours after)."""
    if lo is not None and hi is not None and lo >= hi:
        return []
    if level is Level.HOUR:
        return [Part(Level.HOUR, lo, hi)]
    finer = Level(level - 1)
    c0 = None if lo is None else _ceil(lo, level)
    c1 = None if hi is None else _floor(hi, level)
    if lo is not None and hi is not None and c0 > c1:  # type: ignore[operator]
        # Inside one bucket [c1, c0) of this level.
        return _cheaper(cover(lo, hi, finer), _complement(c1, lo, hi, level))  # type: ignore[arg-type]
    out = []
    if c0 is None or c1 is None or c0 < c1:
        out.append(Part(level, c0, c1))
    if lo is not None and lo < c0:  # type: ignore[operator]
        out += _cheaper(cover(lo, c0, finer), _complement(_floor(lo, level), lo, c0, level))
    if hi is not None and c1 < hi:  # type: ignore[operator]
        out += _cheaper(cover(c1, hi, finer), _complement(c1, c1, hi, level))  # type: ignore[arg-type]
    return out


def _complement(start: datetime, lo: datetime, hi: datetime, level: Level) -> list[Part]:
    """The bucket of ``level`` at ``start`` less its hours outside [lo, hi)."""
    end = _next(start, level)
    outside = [*cover(start, lo, Level(level - 1)), *cover(hi, end, Level(level - 1))]
    return [Part(level, start, end), *(Part(p.level, p.start, p.end, -p.sign) for p in outside)]


def _cheaper(direct: list[Part], complement: list[Part]) -> list[Part]:
    return complement if sum(p.buckets for p in complement) < sum(p.buckets for p in direct) \
        else direct


_TABLES = {Level.HOUR: (T.cost_rollup_hours, "period_start", None),
           Level.DAY: (T.cost_rollup_days, "day", "%Y-%m-%d"),
           Level.MONTH: (T.cost_rollup_months, "month", "%Y-%m")}

# The statement per shape of read (its parts' levels, bounds and signs, the keys, which filters),
# built once: building a UNION of grouped selects cost more CPU than running it.
_READS: dict[tuple[Any, ...], Any] = {}


def _bound(part: Part, moment: datetime) -> Any:
    text = _TABLES[part.level][2]
    return moment if text is None else moment.strftime(text)


def _read(parts: Sequence[Part], group_by: Sequence[str], sums: Sequence[str],
          filters: tuple[bool, bool, bool]) -> Any:
    """One statement for the signed sum of ``parts``: a ``UNION ALL`` of one grouped select per
    part (each scans its roll-up's range alone, through its index), grouped again over the few
    rows they give; groups of no line left out (``HAVING``). Parameters ``lo{i}``/``hi{i}`` per
    part, and ``projects``, ``pool``, ``users`` for the ``filters`` present."""
    shape = (tuple((p.level, p.start is None, p.end is None, p.sign) for p in parts),
             tuple(group_by), tuple(sums), filters)
    stmt = _READS.get(shape)
    if stmt is not None:
        return stmt
    selects = []
    for i, part in enumerate(parts):
        table, name, _ = _TABLES[part.level]
        column = table.c[name]
        where = [*([] if part.start is None else [column >= sa.bindparam(f"lo{i}")]),
                 *([] if part.end is None else [column < sa.bindparam(f"hi{i}")])]
        if filters[0]:
            where.append(table.c.project.in_(sa.bindparam("projects", expanding=True)))
        if filters[1]:
            where.append(table.c.pool == sa.bindparam("pool"))
        if filters[2]:
            where.append(table.c.user.in_(sa.bindparam("users", expanding=True)))
        keys = [table.c[k].label(f"k{j}") for j, k in enumerate(group_by)]
        select = sa.select(*keys, *((sa.func.sum(table.c[x]) * part.sign).label(x) for x in sums))
        select = select.where(*where)
        if keys:
            select = select.group_by(*keys)
        selects.append(select)
    both = sa.union_all(*selects).subquery() if len(selects) > 1 else selects[0].subquery()
    keys = [both.c[f"k{j}"] for j in range(len(group_by))]
    stmt = sa.select(*keys, *(sa.func.sum(both.c[x]) for x in sums))
    if keys:
        stmt = stmt.group_by(*keys)
    stmt = stmt.having(sa.func.sum(both.c.lines) > 0)
    _READS[shape] = stmt
    return stmt


def rollup_sums(conn: Connection, group_by: Sequence[str], *, since: datetime | None,
                until: datetime | None, projects: Collection[str] | None, pool: str | None,
                users: Collection[str] | None, sums: Sequence[str] = SUMS
                ) -> dict[tuple[str | None, ...], Sums]:
    """Sums (``sums``, default :data:`SUMS`, in that order; ``lines`` among them) per group of the
    lines whose bucket starts in [since, until), read from the roll-ups (``group_by`` within
    :data:`ROLLUP_KEYS`; a grouping by day reads no month) in one statement; the filters as
    ``Ledger.cost_sums`` takes them. Groups of no line (all gone, or a month's lines all in the
    days taken away) are left out."""
    if "lines" not in sums:
        raise ValueError("sums: needs lines (groups of no line are left out by it)")
    lo, hi = hour_window(since, until)
    parts = cover(lo, hi, Level.DAY if "day" in group_by else Level.MONTH)
    if not parts:
        return {}
    params: dict[str, Any] = {}
    for i, part in enumerate(parts):
        if part.start is not None:
            params[f"lo{i}"] = _bound(part, part.start)
        if part.end is not None:
            params[f"hi{i}"] = _bound(part, part.end)
    if projects is not None:
        wanted = set(projects)
        if NO_PROJECT in wanted:  # "-": nodes launched for none, and jobs of none
            wanted.add(_NONE)
        params["projects"] = sorted(wanted)
    if pool is not None:
        params["pool"] = pool
    if users is not None:
        params["users"] = sorted(users)
    stmt = _read(parts, group_by, sums, (projects is not None, pool is not None,
                                         users is not None))
    width = len(group_by)
    out: dict[tuple[str | None, ...], Sums] = {}
    for row in conn.execute(stmt, params):
        key = tuple(_key(k, row[i]) for i, k in enumerate(group_by))
        out[key] = [int(v or 0) for v in row[width:]]
    return out


def hour_window(since: datetime | None, until: datetime | None
                ) -> tuple[datetime | None, datetime | None]:
    """The window [since, until) as :func:`rollup_sums` reads it: both ends rounded up to the
    hour (UTC). Two windows of one hour window have the same sums."""
    return (None if since is None else _hour_ceil(since),
            None if until is None else _hour_ceil(until))


def _hour_ceil(moment: datetime) -> datetime:
    moment = moment.astimezone(UTC)
    floor = moment.replace(minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + _HOUR


def _key(name: str, value: Any) -> str | None:
    if value is None or (name in ("project", "user") and value == _NONE):
        return None
    return str(value)


__all__ = ["ROLLUP_KEYS", "SUMS", "Level", "Part", "apply_changes", "cover", "hour_window",
           "line_sums",
           "lock_subject", "lock_subjects", "rebuild", "rollup_sums", "stripe"]
