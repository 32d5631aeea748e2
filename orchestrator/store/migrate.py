"""Schema migrations of the store: Alembic driven from code, without an alembic.ini.

``upgrade(url)`` is what ``burst`` runs at start-up and what tests run on an empty database. A
caller holding a connection (the Store, a test) passes it so the migration shares its engine and,
on SQLite, its locking settings.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection
from sqlalchemy.engine import URL

from orchestrator.store.engine import make_engine, normalize_url, write_engine

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic (with Mako and Pygments, about 11 MiB of a process) is imported by the functions that
# migrate: importing the store, as the simulator and the planner's callers do, does not load it.

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str | URL, connection: Connection | None = None) -> Config:
    """An Alembic Config for the store's migrations at ``url``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    rendered = normalize_url(url).render_as_string(hide_password=False)
    # Config values pass through configparser interpolation, where '%' is special.
    config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def upgrade(
    url: str | URL, revision: str = "head", *, connection: Connection | None = None
) -> None:
    """Migrate the database at ``url`` to ``revision`` (default: the newest)."""
    from alembic import command

    _run(url, connection, lambda cfg: command.upgrade(cfg, revision))


def downgrade(
    url: str | URL, revision: str = "base", *, connection: Connection | None = None
) -> None:
    """Migrate the database at ``url`` down to ``revision`` (default: an empty schema)."""
    from alembic import command

    _run(url, connection, lambda cfg: command.downgrade(cfg, revision))


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def current_revision(connection: Connection) -> str | None:
    """The revision the database behind ``connection`` is at (None when never migrated)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def _run(url: str | URL, connection: Connection | None, fn: Callable[[Config], None]) -> None:
    if connection is not None:
        fn(alembic_config(url, connection))
        return
    engine = write_engine(make_engine(url))
    try:
        # One transaction for the whole run: a failed migration leaves the schema untouched
        # (PostgreSQL and, with SQLAlchemy emitting BEGIN, SQLite both have transactional DDL).
        with engine.begin() as conn:
            fn(alembic_config(url, conn))
    finally:
        engine.dispose()
