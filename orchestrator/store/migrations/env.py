"""Alembic environment of the state store: runs migrations on SQLite or PostgreSQL.

It is driven by ``orchestrator.store.migrate`` with a Config built in code (no alembic.ini). When
the caller passes a live connection in ``config.attributes["connection"]`` the migrations run on
it, inside the caller's transaction; otherwise an engine is made from ``sqlalchemy.url``.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from orchestrator.store.engine import make_engine, normalize_url, write_engine
from orchestrator.store.tables import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )


def run_offline() -> None:
    url = normalize_url(config.get_main_option("sqlalchemy.url") or "")
    context.configure(
        url=url,
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=url.get_backend_name() == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        # A write connection: on SQLite the whole migration then holds the lock from BEGIN.
        with write_engine(engine).connect() as own:
            _configure(own)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
