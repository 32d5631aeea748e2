"""The cost report: the ledger's lines summed by any grouping, reconciled to the cent.

The HTTP API (``GET /v1/costs``) and the CLI (``burst report``) both call :func:`cost_report`.
Sums run in SQL (``GROUP BY`` over the hour, day and month roll-ups of the lines,
``orchestrator.store.rollups``, or over ``cost_lines`` for groupings the roll-ups do not carry)
on integer micro-dollars, so they are exact. The window selects lines by the start of their hour bucket: a line counts when its bucket
starts in ``[since, until)``, so adjacent windows never count a line twice or lose one.

Each money column is then rounded to cents by largest remainder: every row is floored to the
cent and the cents left over go to the rows with the largest remainders (the earlier row on a
tie), so the rows' cents add up to the total's cents exactly, for any grouping (the total is the
exact sum rounded half to even). ``cost_usd_exact`` keeps the micro-dollars.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from enum import StrEnum

from orchestrator.store import Store
from orchestrator.store.ledger import CostSums

CENT = Decimal("0.01")
_MICROS = Decimal(1_000_000)


class GroupKey(StrEnum):
    """What a cost report can group by."""

    PROJECT = "project"  # the job's project (idle and minimum: the project the node was for);
    # null: work of a job of no project
    POOL = "pool"
    POLICY = "policy"
    PROVIDER = "provider"  # "onprem" for on-prem lines
    REGION = "region"
    INSTANCE_TYPE = "instance_type"
    MARKET = "market"  # spot / on-demand
    NODE = "node"  # node id ("-" for on-prem lines)
    JOB = "job"  # job id ("-" for idle and minimum lines)
    KIND = "kind"  # usage / idle / minimum / onprem
    DAY = "day"  # UTC date of the hour bucket
    USER = "user"  # who submitted the job; null: lines of no job, or of no known user


@dataclass(frozen=True)
class CostQuery:
    """What to report: lines whose bucket starts in [since, until) (None: unbounded), grouped by
    ``group_by``, of ``projects`` only (None: every project; auth scoping), ``pool`` and of
    ``users`` only (None: everyone's). An unknown project or user is an empty report."""

    since: datetime | None = None
    until: datetime | None = None
    group_by: tuple[GroupKey, ...] = (GroupKey.PROJECT,)
    projects: frozenset[str] | None = None
    pool: str | None = None
    users: frozenset[str] | None = None

    def __post_init__(self) -> None:
        for name in ("since", "until"):
            moment = getattr(self, name)
            if moment is not None and (moment.tzinfo is None or moment.utcoffset() is None):
                raise ValueError(f"{name}: needs a timezone (got {moment.isoformat()})")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError(f"since: {_iso(self.since)} must be before until ({_iso(self.until)})")
        keys = tuple(GroupKey(k) for k in self.group_by)
        if len(set(keys)) != len(keys):
            raise ValueError(f"group_by: names a key twice ({', '.join(keys)})")
        object.__setattr__(self, "group_by", keys)


@dataclass(frozen=True)
class CostRow:
    """One group of a report. Money in USD: ``cost_usd`` is what the cloud billed (usage, idle
    and minimum lines) to the cent, reconciled with the other rows; ``cost_usd_exact`` the same
    to the micro-dollar; ``idle_cost_usd`` the part of it no job used; ``onprem_cost_usd`` the
    amortised cost of on-prem work; ``onprem_equiv_usd`` what the burst work (usage lines) would
    have cost on-prem. ``gpu_hours`` and ``instance_hours`` are cloud hours billed (minimum
    included); ``lines`` counts every ledger line summed into the row."""

    keys: dict[str, str | None]  # None: the bucket of no project (or no user)
    cost_usd: Decimal
    cost_usd_exact: Decimal
    idle_cost_usd: Decimal
    onprem_cost_usd: Decimal
    onprem_equiv_usd: Decimal
    gpu_hours: float
    instance_hours: float
    lines: int

    def as_json(self) -> dict:
        return {
            **self.keys,
            "cost_usd": str(self.cost_usd),
            "cost_usd_exact": str(self.cost_usd_exact),
            "idle_cost_usd": str(self.idle_cost_usd),
            "onprem_cost_usd": str(self.onprem_cost_usd),
            "onprem_equiv_usd": str(self.onprem_equiv_usd),
            "gpu_hours": round(self.gpu_hours, 4),
            "instance_hours": round(self.instance_hours, 4),
            "lines": self.lines,
        }


VALUE_COLUMNS = ("cost_usd", "cost_usd_exact", "idle_cost_usd", "onprem_cost_usd",
                 "onprem_equiv_usd", "gpu_hours", "instance_hours", "lines")


@dataclass(frozen=True)
class CostReport:
    """The rows of a report (ordered by their keys) and their total."""

    query: CostQuery
    rows: tuple[CostRow, ...]
    total: CostRow

    def as_json(self) -> dict:
        return {
            "from": _iso(self.query.since),
            "to": _iso(self.query.until),
            "group_by": [str(k) for k in self.query.group_by],
            "currency": "USD",
            "rows": [row.as_json() for row in self.rows],
            "total": self.total.as_json(),
        }

    def as_csv(self) -> str:
        """One line per row: the group keys, then :data:`VALUE_COLUMNS` (no total line: the
        columns add up to it). A null key (no project, no user) is an empty field."""
        keys = [str(k) for k in self.query.group_by]
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([*keys, *VALUE_COLUMNS])
        for row in self.rows:
            values = row.as_json()
            writer.writerow([row.keys[k] or "" for k in keys]
                            + [values[c] for c in VALUE_COLUMNS])
        return buffer.getvalue()


def parse_group_by(text: str) -> tuple[GroupKey, ...]:
    """``"project,day"`` -> (PROJECT, DAY). ValueError naming the bad key and the allowed ones."""
    allowed = ", ".join(k.value for k in GroupKey)
    if not isinstance(text, str):
        raise ValueError(f"must be comma-separated keys ({allowed}), got {type(text).__name__}")
    names = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not n for n in names):
        raise ValueError(f"needs one or more keys, comma-separated: {allowed} (got {text!r})")
    unknown = [n for n in names if n not in GroupKey._value2member_map_]
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; choose from {allowed}")
    if len(set(names)) != len(names):
        raise ValueError(f"names a key twice (got {text!r})")
    return tuple(GroupKey(n) for n in names)


def cost_report(store: Store, query: CostQuery) -> CostReport:
    """Sum the ledger for ``query`` (see the module docstring)."""
    keys = [str(k) for k in query.group_by]
    sums = store.cost_sums(keys, since=query.since, until=query.until, projects=query.projects,
                           pool=query.pool, users=query.users)
    total = CostSums((), sum(s.cost_micros for s in sums), sum(s.idle_micros for s in sums),
                     sum(s.onprem_micros for s in sums), sum(s.onprem_equiv_micros for s in sums),
                     sum(s.gpu_seconds for s in sums), sum(s.instance_seconds for s in sums),
                     sum(s.lines for s in sums))
    columns = {
        "cost": allocate_cents([s.cost_micros for s in sums], total.cost_micros),
        "idle": allocate_cents([s.idle_micros for s in sums], total.idle_micros),
        "onprem": allocate_cents([s.onprem_micros for s in sums], total.onprem_micros),
        "equiv": allocate_cents([s.onprem_equiv_micros for s in sums], total.onprem_equiv_micros),
    }
    rows = tuple(
        _row(dict(zip(keys, s.keys, strict=True)), s, *(columns[c][i] for c in columns))
        for i, s in enumerate(sums))
    return CostReport(query, rows, _row({}, total, *(cents(getattr(total, f)) for f in (
        "cost_micros", "idle_micros", "onprem_micros", "onprem_equiv_micros"))))


def cents(amount_micros: int) -> Decimal:
    """Micro-dollars to USD rounded half to even to the cent."""
    return (Decimal(amount_micros) / _MICROS).quantize(CENT, ROUND_HALF_EVEN)


def allocate_cents(amounts_micros: list[int], total_micros: int) -> list[Decimal]:
    """Round each amount to cents so that they add up to :func:`cents` of ``total_micros``:
    floor each, then a cent more to the largest remainders (earlier amounts first on ties)."""
    unit = 10_000  # micro-dollars per cent
    target = int(cents(total_micros) / CENT)
    floors = [a // unit for a in amounts_micros]
    left = target - sum(floors)
    order = sorted(range(len(amounts_micros)), key=lambda i: (-(amounts_micros[i] % unit), i))
    if left > 0:
        for i in order[:left]:
            floors[i] += 1
    elif left < 0:  # only with negative amounts, which the ledger never holds
        for i in reversed(order[left:]):
            floors[i] -= 1
    return [Decimal(f).scaleb(-2) for f in floors]  # whole cents, two decimals: exact


def _row(keys: dict[str, str | None], s: CostSums, cost: Decimal, idle: Decimal, onprem: Decimal,
         equiv: Decimal) -> CostRow:
    return CostRow(
        keys=keys, cost_usd=cost,
        cost_usd_exact=Decimal(s.cost_micros).scaleb(-6),  # exact, six decimals
        idle_cost_usd=idle, onprem_cost_usd=onprem, onprem_equiv_usd=equiv,
        gpu_hours=s.gpu_seconds / 3600, instance_hours=s.instance_seconds / 3600, lines=s.lines)


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z") if moment else None


__all__ = [
    "VALUE_COLUMNS", "CostQuery", "CostReport", "CostRow", "GroupKey", "allocate_cents", "cents",
    "cost_report", "parse_group_by",
]
