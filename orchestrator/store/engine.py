"""Engines for the store: URL normalisation and the SQLite settings that make it safe to share.

SQLite is the embedded default, so it must behave under concurrent writers (the loop, the API,
a CLI command in another process): WAL lets readers proceed during a write, ``busy_timeout``
makes a writer wait for the lock instead of failing, and write transactions open with
``BEGIN IMMEDIATE`` so the lock is taken up front. A deferred transaction that reads and then
writes can fail outright with "database is locked" when another writer got there first, since
SQLite cannot upgrade its read lock without risking deadlock; taking the write lock at BEGIN
turns that into an orderly queue.

PostgreSQL connections are pinged before use only when they sat idle in the pool for more than
:data:`PG_PING_IDLE_S` (:func:`ping_when_idle`), not at every checkout as SQLAlchemy's
``pool_pre_ping`` does: under load a pooled connection is checked out again within milliseconds,
and a ping at every checkout was one round trip in five of a ``/v1/budgets`` answer
(docs/performance.md). A connection that sat idle (the controller's, between ticks) is pinged as
before, so a server restarted meanwhile costs no statement. One used within the last second is
trusted: if the server restarted in that second, the statement fails as one in flight at the
restart would, SQLAlchemy invalidates the whole pool on that disconnect, and the next checkout
connects afresh ("optimistic" handling in SQLAlchemy's terms; tests/integration/test_pg_ping.py).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import StaticPool

from orchestrator.store.codec import json_dumps

SQLITE_BUSY_TIMEOUT_MS = 30_000
WRITE_OPTION = "burst_write"  # execution option marking a connection that will write
DEFAULT_DB_NAME = "burst.db"
# PostgreSQL connections kept open per process (SQLAlchemy's default keeps 5): the API serves
# requests from a thread pool, and beyond the kept ones each request opened and closed its own
# connection, which set the tail of every route under 8 concurrent clients (docs/performance.md,
# "/v1/budgets ... (issue 17, part 3, 2026-12-05)"). A pool only grows as far as a process uses it
# at once, so a worker that runs one task at a time still holds one connection.
PG_POOL_SIZE = 12
PG_MAX_OVERFLOW = 20
# A PostgreSQL connection idle in the pool longer than this is pinged before use (module docstring).
PG_PING_IDLE_S = 1.0
_IDLE_SINCE = "burst_idle_since"  # connection record info: when it went back to the pool


def default_sqlite_url(state_dir: Path) -> str:
    """The URL of the embedded store inside ``state_dir``."""
    path = (Path(state_dir).expanduser() / DEFAULT_DB_NAME).resolve()
    return f"sqlite:///{path}"


def normalize_url(url: str | URL) -> URL:
    """``url`` with the driver the store uses: psycopg 3 for PostgreSQL, pysqlite for SQLite."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend in ("postgresql", "postgres"):
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        return parsed
    if backend == "sqlite":
        return parsed
    raise ValueError(f"unsupported store URL {parsed.render_as_string(hide_password=True)!r}: "
                     "use sqlite:///path or postgresql://...")


def sqlite_file(url: URL) -> Path | None:
    """The file a SQLite URL names, or None for an in-memory database."""
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def make_engine(url: str | URL, *, read_only: bool = False) -> Engine:
    """An engine for ``url``; SQLite files get their parent directories created.

    ``read_only``: the database itself refuses every write on this engine's connections (SQLite
    ``query_only``, PostgreSQL ``default_transaction_read_only``), so a command that promises to
    write nothing (``burst plan``'s live dry-run) cannot, whatever code path it reaches.
    """
    parsed = normalize_url(url)
    if parsed.get_backend_name() == "sqlite":
        return _sqlite_engine(parsed, read_only=read_only)
    kwargs: dict[str, Any] = {"pool_size": PG_POOL_SIZE, "max_overflow": PG_MAX_OVERFLOW}
    if read_only:
        kwargs["connect_args"] = {"options": "-c default_transaction_read_only=on"}
    engine = sa.create_engine(parsed, json_serializer=json_dumps, **kwargs)
    ping_when_idle(engine)
    return engine


def ping_when_idle(engine: Engine, idle_s: float | None = None) -> None:
    """Ping ``engine``'s pooled connections at checkout only when they sat idle for more than
    ``idle_s`` (default :data:`PG_PING_IDLE_S`, read at each checkout); a connection that does not
    answer invalidates the pool (as ``pool_pre_ping`` does), and the pool connects afresh."""
    dialect = engine.dialect

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        if record is not None:
            record.info[_IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        since = record.info.pop(_IDLE_SINCE, None)
        limit = PG_PING_IDLE_S if idle_s is None else idle_s
        if since is None or time.monotonic() - since <= limit:
            return  # new (just connected), or back in the pool moments ago
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            # The pool retries the checkout on a fresh connection, and drops the others made
            # before now (the server they were made to is gone).
            raise sa.exc.InvalidatePoolError(f"ping after {time.monotonic() - since:.0f} s idle: "
                                             f"{type(exc).__name__}") from exc


def write_engine(engine: Engine) -> Engine:
    """A view of ``engine`` whose transactions are writes (BEGIN IMMEDIATE on SQLite)."""
    return engine.execution_options(**{WRITE_OPTION: True})


def _sqlite_engine(url: URL, *, read_only: bool = False) -> Engine:
    path = sqlite_file(url)
    kwargs: dict[str, Any] = {
        "connect_args": {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        "json_serializer": json_dumps,
    }
    if path is None:
        # Each new connection to :memory: would be a new, empty database: share one.
        kwargs["poolclass"] = StaticPool
    elif not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, **kwargs)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the sqlite3 module (which would emit a deferred BEGIN only before
        # DML) so that the "begin" hook below decides how every transaction starts.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            if read_only:
                cursor.execute("PRAGMA query_only=ON")
            elif path is not None:
                cursor.execute("PRAGMA journal_mode=WAL")
                # NORMAL is durable across application crashes in WAL mode; only an OS crash can
                # lose the last commits, and the reconciler recovers from that.
                cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA foreign_keys=ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        writes = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if writes else "BEGIN")

    return engine
