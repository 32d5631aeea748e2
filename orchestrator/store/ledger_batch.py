"""The batched ledger writer: many subjects' lines and marks in one transaction.

:meth:`~orchestrator.store.ledger.Ledger.write_ledger` makes one subject's lines from a bucket on
exactly the lines given, in a transaction of about a dozen statements. The roll-up writes every
node at the tick a new hour bucket opens and at the one its mark moves: at 10,000 live nodes that
was 10,000 transactions and 40-60 s of CPU, twice an hour. :meth:`LedgerBatch.write_ledgers`
does the same for any number of subjects in one transaction of a constant number of statements
(each set of keys bound as one parameter, :mod:`orchestrator.store.keysets`; rows written by one
``executemany`` per statement, the big ones and the diff read straight through the driver,
:mod:`orchestrator.store.rawwrite` and :mod:`orchestrator.store.rawread`):

1. on PostgreSQL, the advisory locks of the subjects' stripes (at most 64,
   :func:`~orchestrator.store.rollups.lock_subjects`), so no other writer of them runs meanwhile;
2. one read of their marks (``FOR UPDATE`` on PostgreSQL) and one of their lines from their marks
   on: the diff read. Each subject is written from the later of its ``since`` and its mark as it
   stands now (a newer roll-up may have finalised buckets; final buckets are never rewritten);
3. the diffs, in Python: per subject the lines to delete, the lines to upsert and whether its
   mark moves, exactly as ``write_ledger`` works them out;
4. one ``DELETE`` of every stale line, one upsert of every changed line on its ``line_key``,
   one increment per roll-up table (hour, day, month) of the summed differences of every subject
   (:func:`~orchestrator.store.rollups.apply_changes`), one upsert of the marks that move (never
   backwards), and the ledger reach of the nodes written
   (:func:`~orchestrator.store.accrual.on_lines_many`).

So every guarantee of ``write_ledger`` holds for the batch as a whole: a crash or an error at any
point rolls back every subject's lines, roll-ups, marks and reach together (nothing half
written); a batch that changes nothing writes nothing; two batches racing on a subject converge
(serialised by its stripe; lines upserted on their key; marks never move back). The lines,
roll-ups, marks and reach it leaves are the ones writing each subject with ``write_ledger`` in
turn leaves (``tests/integration/test_ledger_batch.py``, on random sites).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.domain.costs import CostLine
from orchestrator.store import accrual, rollups
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.keysets import among
from orchestrator.store.ledger import (
    LINE_COLUMNS,
    LINE_SELECT,
    ONPREM_SUBJECT,
    line_from_driver,
    line_upsert,
    line_values,
)
from orchestrator.store.rawread import driver_rows_bound
from orchestrator.store.rawwrite import driver_executemany, driver_time

_c = T.cost_lines.c
_m = T.ledger_marks.c
_MARK_UPSERTS: dict[str, Any] = {}  # dialect -> the never-backwards upsert of marks


@dataclass(frozen=True, slots=True)
class LedgerWrite:
    """What to make of one subject: its lines in buckets from ``since`` on are exactly ``lines``,
    and its mark moves to ``mark`` (None: stays). Checked when made: a line of another subject,
    before ``since``, or with a key given twice is a ValueError, as are naive times."""

    subject: str
    lines: Sequence[CostLine]
    since: datetime
    mark: datetime | None = None
    wanted: dict[str, CostLine] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        require_aware(self.since, "since")
        if self.mark is not None:
            require_aware(self.mark, "mark")
        wanted: dict[str, CostLine] = {}
        for line in self.lines:
            if line.subject != self.subject or line.period_start < self.since:
                raise ValueError(f"line {line.line_key} is not of subject {self.subject!r} from "
                                 f"{self.since.isoformat()}")
            if line.line_key in wanted:
                raise ValueError(f"line key {line.line_key} given twice")
            wanted[line.line_key] = line
        object.__setattr__(self, "wanted", wanted)


@dataclass(frozen=True, slots=True)
class Written:
    """What a batch did to one subject: lines written (new or changed) and deleted."""

    lines_written: int = 0
    lines_deleted: int = 0

    def __bool__(self) -> bool:
        return bool(self.lines_written or self.lines_deleted)


@dataclass(slots=True)
class _Diff:
    """One subject's part of the batch: the old versions of the lines it deletes or rewrites,
    the lines it upserts, and its mark if it moves."""

    removed: list[CostLine]
    changed: list[CostLine]
    stale: list[str]
    mark: datetime | None


class LedgerBatch(StoreBase):
    """The batched ledger writer of the Store (see the module docstring)."""

    def write_ledgers(self, writes: Sequence[LedgerWrite], *, at: datetime) -> list[Written]:
        """Apply every write of ``writes`` (one per subject) in one transaction; what each did,
        in order (nothing for a subject whose lines and mark already said exactly this)."""
        require_aware(at, "at")
        subjects = [w.subject for w in writes]
        if len(set(subjects)) != len(subjects):
            raise ValueError("a batch writes each subject once")
        if not writes:
            return []
        with self._write() as conn:
            rollups.lock_subjects(conn, subjects)
            diffs = _diffs(conn, writes)
            if diffs:
                self._apply(conn, diffs, at)
        return [Written(len(d.changed), len(d.stale)) if (d := diffs.get(w.subject)) else
                Written() for w in writes]

    def _apply(self, conn: Connection, diffs: dict[str, _Diff], at: datetime) -> None:
        stale = sorted(k for d in diffs.values() for k in d.stale)
        if stale:
            conn.execute(sa.delete(T.cost_lines).where(among(self.dialect, _c.line_key, stale)))
        changed = sorted((line for d in diffs.values() for line in d.changed),
                         key=lambda x: x.line_key)
        if changed:
            # Straight through the driver: SQLAlchemy's per-value processing of 20,000 rows
            # cost more than the database's work (orchestrator.store.rawwrite).
            dialect = self.dialect
            rolled = driver_time(dialect, at)
            rows = []
            for line in changed:
                row = line_values(line)
                row["period_start"] = driver_time(dialect, line.period_start)
                row["period_end"] = driver_time(dialect, line.period_end)
                row["rolled_at"] = rolled
                rows.append(row)
            driver_executemany(conn, "cost-lines-upsert", line_upsert(dialect, self._insert),
                               LINE_COLUMNS, rows)
        rollups.apply_changes(conn, self._insert,
                              [x for d in diffs.values() for x in d.removed], changed)
        marks = [{"subject": s, "final_through": d.mark, "updated_at": at}
                 for s, d in sorted(diffs.items()) if d.mark is not None]
        if marks:
            conn.execute(self._mark_upsert(), marks)
        accrual.on_lines_many(conn, [s for s in diffs if not s.startswith(ONPREM_SUBJECT)])

    def _mark_upsert(self) -> Any:
        stmt = _MARK_UPSERTS.get(self.dialect)
        if stmt is None:
            stmt = self._insert(T.ledger_marks)
            stmt = stmt.on_conflict_do_update(index_elements=["subject"], set_={
                # Never backwards, even if a slower roll-up commits after a faster one.
                "final_through": sa.case((stmt.excluded.final_through > _m.final_through,
                                          stmt.excluded.final_through), else_=_m.final_through),
                "updated_at": stmt.excluded.updated_at,
            })
            _MARK_UPSERTS[self.dialect] = stmt
        return stmt


def _diffs(conn: Connection, writes: Sequence[LedgerWrite]) -> dict[str, _Diff]:
    """The diff read and the diffs: per subject that changes, what to write (see step 3)."""
    dialect = conn.dialect.name
    subjects = [w.subject for w in writes]
    query = sa.select(_m.subject, _m.final_through).where(among(dialect, _m.subject, subjects))
    if dialect == "postgresql":
        query = query.with_for_update()
    marks: dict[str, datetime] = dict(conn.execute(query).all())
    have: dict[str, dict[str, CostLine]] = {}
    lines = (sa.select(*LINE_SELECT)
             .select_from(T.cost_lines.outerjoin(T.ledger_marks, _m.subject == _c.subject))
             .where(among(dialect, _c.subject, subjects),
                    sa.or_(_m.final_through.is_(None), _c.period_start >= _m.final_through)))
    # Straight through the driver: 20,000 lines a roll-up of every live node reads.
    for row in driver_rows_bound(conn, lines):
        line = line_from_driver(row)
        have.setdefault(line.subject, {})[line.line_key] = line
    out: dict[str, _Diff] = {}
    for w in writes:
        current = marks.get(w.subject)
        since, wanted = w.since, w.wanted
        if current is not None and current > since:
            since = current
            wanted = {k: x for k, x in wanted.items() if x.period_start >= current}
        old = {k: x for k, x in have.get(w.subject, {}).items() if x.period_start >= since}
        stale = sorted(set(old) - set(wanted))
        changed = [x for k, x in sorted(wanted.items()) if old.get(k) != x]
        move = w.mark is not None and (current is None or w.mark > current)
        if stale or changed or move:
            out[w.subject] = _Diff(
                removed=[old[k] for k in stale] + [old[x.line_key] for x in changed
                                                   if x.line_key in old],
                changed=changed, stale=stale, mark=w.mark if move else None)
    return out


__all__ = ["LedgerBatch", "LedgerWrite", "Written"]
