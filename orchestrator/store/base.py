"""The store's connection handling, shared by its repository parts.

Every public Store method is one transaction: reads through ``_read()`` (or ``_peek()``, without
BEGIN and COMMIT on PostgreSQL, for reads that need no common snapshot), writes through
``_write()`` (which on SQLite takes the write lock at BEGIN, and ends with the roll-ups' version
and the ledger reach's group counts its writes changed, :mod:`orchestrator.store.rollup_version`,
:mod:`orchestrator.store.reach_groups`). Compare-and-set writes report a lost
race by the affected row count, never by an exception, so callers can treat conflicts as data.
A fenced view (``fencing``, checks in ``fence``) makes ``_write()`` check its leader token first, in the same
transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Self

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import Engine

from orchestrator.kept import Kept
from orchestrator.store import migrate, reach_groups, rollup_version
from orchestrator.store.engine import make_engine, normalize_url, write_engine
from orchestrator.store.fence import Fence


class StoreBase:
    """Owns the engine; subclasses add the repository methods."""

    # Set only on the views made by ``Store.fenced`` / ``fenced_by``; a plain store runs no fence
    # statement. A view may carry several (one per scope it leads): every one is checked.
    _fences: tuple[Fence, ...] = ()

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        self._url = normalize_url(url)
        self.read_only = read_only  # every write is refused by the database itself
        self._engine: Engine = make_engine(self._url, read_only=read_only)
        self._writer: Engine = write_engine(self._engine)
        # Values made from rows a read finds again and again (orchestrator.kept), by what they
        # are: shared with this store's views, which are shallow copies.
        self._kept: dict[str, Kept[Any]] = {}
        # Window sums of the cost roll-ups, kept while their version holds (budgets' reads).
        self._window_sums = rollup_version.KeptSums()
        self._reach_reading = threading.Lock()  # the reach's kept groups: one reader of a miss
        # PostgreSQL reads that need no common snapshot run without BEGIN and COMMIT (_peek).
        self._autocommit: Engine | None = (
            self._engine.execution_options(isolation_level="AUTOCOMMIT")
            if self._engine.dialect.name == "postgresql" else None)

    @property
    def url(self) -> str:
        """The store URL, password hidden (safe to log)."""
        return self._url.render_as_string(hide_password=True)

    @property
    def dialect(self) -> str:
        return self._engine.dialect.name

    @property
    def engine(self) -> Engine:
        """The engine, for migrations and tests; application code goes through the methods."""
        return self._engine

    def upgrade(self, revision: str = "head") -> None:
        """Migrate the schema to ``revision`` (default: the newest) with this store's engine."""
        with self._writer.begin() as conn:
            migrate.upgrade(self._url, revision, connection=conn)

    def downgrade(self, revision: str = "base") -> None:
        """Migrate the schema down to ``revision`` (default: nothing left but Alembic's table)."""
        with self._writer.begin() as conn:
            migrate.downgrade(self._url, revision, connection=conn)

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with _argument_errors(), self._engine.begin() as conn:
            yield conn

    @contextmanager
    def _peek(self) -> Iterator[Connection]:
        """A read whose statements need no common snapshot: on PostgreSQL in autocommit, which
        saves the BEGIN and COMMIT round trips (at READ COMMITTED, PostgreSQL's default and the
        store's, a read transaction gives its statements no common snapshot anyway: each sees
        what was committed when it began); on SQLite a read transaction, as ``_read``."""
        if self._autocommit is None:
            with self._read() as conn:
                yield conn
            return
        with _argument_errors(), self._autocommit.connect() as conn:
            yield conn

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with _argument_errors(), self._writer.begin() as conn:
            for fence in self._fences:
                # First statements of the transaction, so a deposed leader's write is refused
                # (and rolled back by the raise) before anything of it is written.
                fence.check(conn)
            reach_groups.begin(conn)
            rollup_version.begin(conn)
            try:
                yield conn
                # The versions and counts its writes moved: the transaction's last statements,
                # in one order for every writer (orchestrator.store.versions): the roll-ups'
                # version, then the ledger reach's group counts and their version.
                rollup_version.flush(conn)
                reach_groups.flush(conn)
            finally:
                rollup_version.discard(conn)
                reach_groups.discard(conn)

    def _insert(self, table: sa.Table) -> Any:
        """A dialect insert, which offers ``on_conflict_do_nothing`` / ``_do_update``.

        Its rowcount tells whether a row went in: SQLAlchemy only keeps an INSERT's rowcount when
        asked (psycopg otherwise reports -1).
        """
        if self.dialect == "postgresql":
            stmt = pg.insert(table)
        elif self.dialect == "sqlite":
            stmt = sqlite.insert(table)
        else:
            raise NotImplementedError(f"no upsert for dialect {self.dialect}")
        return stmt.execution_options(preserve_rowcount=True)


@contextmanager
def _argument_errors() -> Iterator[None]:
    """Surface a bad argument caught while binding parameters (a naive datetime, a wrong type)
    as the ValueError/TypeError it is, rather than as a database error."""
    try:
        yield
    except sa.exc.StatementError as exc:
        if not isinstance(exc, sa.exc.DBAPIError) and isinstance(exc.orig, ValueError | TypeError):
            raise exc.orig from exc
        raise


def require_aware(value: datetime, name: str) -> datetime:
    """``value`` if it is tz-aware; the store never guesses a timezone."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name} must be a tz-aware UTC datetime, got naive {value.isoformat()}")
    return value
