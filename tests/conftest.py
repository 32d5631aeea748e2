"""Shared fixtures: real databases for the store tests.

SQLite tests get a fresh file per test. PostgreSQL tests share one freshly created database per
session (dropped at the end), emptied before each test. An unreachable PostgreSQL server fails the
tests that need it, with the command that starts it: a skipped database test would hide a
regression.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestrator.store import Store
from orchestrator.store.tables import Base

PG_ADMIN_URL = os.environ.get(
    "BURST_TEST_PG_ADMIN_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
PG_START_HINT = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """URL of a PostgreSQL database created for this test session."""
    admin_url = sa.make_url(PG_ADMIN_URL)
    admin = sa.create_engine(
        admin_url, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3}
    )
    try:
        conn: sa.Connection | None = admin.connect()
    except sa.exc.OperationalError:
        conn = None
    if conn is None:
        # Failed outside the except block so the report is this one line, not a driver traceback.
        admin.dispose()
        pytest.fail(
            f"PostgreSQL server at {admin_url.host}:{admin_url.port} is not reachable; "
            f"start it with: {PG_START_HINT}",
            pytrace=False,
        )
    name = f"burst_test_{os.getpid()}_{secrets.token_hex(4)}"
    conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        # FORCE ends connections a failed test may have leaked (PostgreSQL 13+).
        conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database URL per backend: a new SQLite file, or the session's PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'burst.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """A migrated, empty Store on each backend."""
    s = Store(store_url)
    s.upgrade()
    if s.dialect == "postgresql":
        names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        with s.engine.begin() as conn:
            conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY")
    try:
        yield s
    finally:
        s.close()


# -- running under pytest-xdist (optional) ---------------------------------------------------------
# The README's test command runs serially. For a run on pytest-xdist workers (--dist loadgroup):
# tests that share one machine-wide resource and cannot run on two workers at once: the Slurm
# mini-cluster (its daemons, ports and munge socket), and the Redis databases some modules flush
# (test_public_tasks.py and test_cancel_task.py share databases 11/12 through the same fixtures;
# test_control_cli.py owns database 13). With --dist loadgroup each group runs on one worker;
# without xdist the mark is inert.
_SINGLE_WORKER_FIXTURES = {"slurm_cluster": "slurm", "slurm": "slurm"}
_SINGLE_WORKER_MODULES = {"test_public_tasks.py": "redis-db-11-12",
                          "test_cancel_task.py": "redis-db-11-12",
                          "test_control_cli.py": "redis-db-13"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        group = next((g for fixture, g in _SINGLE_WORKER_FIXTURES.items() if fixture in names),
                     _SINGLE_WORKER_MODULES.get(item.path.name))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
