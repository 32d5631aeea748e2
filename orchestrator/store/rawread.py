"""Reads straight through the database driver, for the few reads a tick makes of many rows.

SQLAlchemy's typed result processing (a ``UtcDateTime`` per time, an enum per state, a mapping
per row) costs more per row than reading the row: at 10,000 nodes and 11,000 running jobs it was
about a second of a tick's CPU. :func:`driver_rows` runs a Core statement on the transaction's
own DBAPI cursor and hands back the driver's plain tuples; :func:`utc` turns the driver's times
into the aware UTC datetimes the rest of burst uses (what ``tables.UtcDateTime`` does per value).
Only statements whose bound values are plain strings and numbers go this way: they are rendered
as literals by the dialect's own quoting (``literal_binds``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def epoch_us_column(column: sa.ColumnElement[Any], dialect: str) -> sa.ColumnElement[Any]:
    """``column``, a time, as the driver should return it for a read of many rows: on
    PostgreSQL whole microseconds since the epoch, worked out by the server (exact: ``EXTRACT``
    gives a numeric), which psycopg hands over for about half of what an aware datetime costs
    it and which compares as cheaply (:mod:`orchestrator.kept`); elsewhere the column as it is.
    :func:`utc` reads either."""
    if dialect != "postgresql":
        return column
    return sa.cast(sa.func.round(sa.extract("epoch", column) * 1_000_000), sa.BigInteger)


def driver_rows(conn: sa.Connection, query: sa.Select[Any] | str) -> list[tuple[Any, ...]]:
    """Every row of ``query`` as the driver returns it (SQLite: times as naive UTC text;
    PostgreSQL: aware datetimes), inside ``conn``'s transaction. ``query`` as text: SQL both
    dialects read alike, written once by the caller (no compile per call on a hot read)."""
    sql = query if isinstance(query, str) else str(
        query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
    cursor = conn.connection.cursor()  # the DBAPI cursor, in this transaction
    try:
        cursor.execute(sql)
        return cursor.fetchall()
    finally:
        cursor.close()


def driver_rows_bound(conn: sa.Connection, query: sa.Select[Any]) -> list[Any]:
    """:func:`driver_rows` for a statement whose bound values are not plain strings and numbers
    (a PostgreSQL array, which the dialect does not render as a literal): compiled with its
    parameters, which go to the driver as they are (no bind processing), by ``exec_driver_sql``."""
    compiled = query.compile(dialect=conn.dialect)
    params = compiled.construct_params()
    names = compiled.positiontup
    args = params if names is None else tuple(params[n] for n in names)
    return list(conn.exec_driver_sql(compiled.string, args))  # type: ignore[arg-type]


def utc(value: datetime | str | int | None) -> datetime | None:
    """A driver's time as an aware UTC datetime: SQLite's naive UTC text (``YYYY-MM-DD
    HH:MM:SS.ffffff``, what ``UtcDateTime`` stores), PostgreSQL's aware datetime, or whole
    microseconds since the epoch (what :func:`epoch_us_column` asks PostgreSQL for)."""
    if value is None:
        return None
    if isinstance(value, int):
        return _EPOCH + timedelta(microseconds=value)  # exact: integer arithmetic
    if isinstance(value, str):
        # Parsing the offset with the text is about eight times cheaper than replace(tzinfo).
        return datetime.fromisoformat(value + "+00:00")
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value if value.tzinfo is UTC else value.astimezone(UTC)


__all__ = ["driver_rows", "driver_rows_bound", "epoch_us_column", "utc"]
