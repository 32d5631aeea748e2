"""Writes straight through the database driver, for the few writes of many rows at once.

SQLAlchemy builds each row's parameters of an ``executemany`` in Python: a bind processor per
value (``UtcDateTime`` and SQLite's datetime text for every time), the parameter mapping per
row. At the roll-up's 20,000 lines and 10,000 ledger-reach rows that cost more CPU than the
database's own work. :func:`driver_executemany` compiles a Core statement once per dialect and
hands the driver the rows as they are (``exec_driver_sql``: no bind processing, but the
engine's events and error wrapping); the caller gives driver-ready values (:func:`driver_time`
for times, as ``tables.UtcDateTime`` stores them), the counterpart of :mod:`rawread`'s reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

_COMPILED: dict[tuple[str, str], tuple[str, tuple[str, ...] | None]] = {}


def driver_executemany(conn: sa.Connection, key: str, stmt: Any, columns: Sequence[str],
                       rows: Sequence[Mapping[str, Any]]) -> None:
    """Run ``stmt`` once per row of ``rows`` through the driver's ``executemany``, in ``conn``'s
    transaction. ``key`` names the statement (compiled once per dialect and key); ``columns``:
    the columns an ``INSERT`` sets (its other parameters are its own bind parameters)."""
    if not rows:
        return
    dialect = conn.dialect
    compiled = _COMPILED.get((dialect.name, key))
    if compiled is None:
        c = stmt.compile(dialect=dialect, column_keys=list(columns))
        names = tuple(c.positiontup) if c.positiontup is not None else None
        compiled = _COMPILED[(dialect.name, key)] = (c.string, names)
    sql, names = compiled
    params: Sequence[Any] = rows if names is None else [tuple(r[n] for n in names) for r in rows]
    # As the driver's own SQL: no bind processing, but the engine's events and error wrapping.
    conn.exec_driver_sql(sql, params)  # type: ignore[arg-type]


def driver_time(dialect: str, moment: datetime) -> datetime | str:
    """``moment`` as the driver takes it for a ``UtcDateTime`` column: SQLite's naive UTC text of
    fixed width (what SQLAlchemy's SQLite ``DATETIME`` writes), PostgreSQL's aware datetime."""
    if dialect == "sqlite":
        return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    return moment


__all__ = ["driver_executemany", "driver_time"]
