"""PostgreSQL connections pinged before use only after sitting idle
(``orchestrator.store.engine.ping_when_idle``), against the real server: a connection idle past the
limit whose server process was ended is replaced at checkout and the read succeeds; one used moments
ago is trusted, so the read on it fails once as a statement in flight at a restart would, and the
next read connects afresh; a connection reused at once is never pinged, one left idle always is."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from orchestrator.store import Store
from orchestrator.store import engine as engine_mod
from tests.conftest import PG_ADMIN_URL

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[Store]:
    s = Store(pg_url)
    s.upgrade()
    try:
        yield s
    finally:
        s.close()


def _end_server_processes(store: Store) -> int:
    """End every server process of the store's database (as a server restart would)."""
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return len(conn.execute(sa.text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :name AND pid <> pg_backend_pid()"),
                {"name": store.engine.url.database}).all())
    finally:
        admin.dispose()


def _count_pings(store: Store, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    dialect = store.engine.dialect
    real = dialect.do_ping
    pings = [0]

    def counted(dbapi_connection: object) -> bool:
        pings[0] += 1
        return real(dbapi_connection)

    monkeypatch.setattr(dialect, "do_ping", counted)
    return pings


def test_a_connection_idle_past_the_limit_is_pinged_and_replaced(
        pg_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_mod, "PG_PING_IDLE_S", 0.05)
    pings = _count_pings(pg_store, monkeypatch)
    assert pg_store.get_api_token("none") is None  # a pooled connection, now idle
    assert _end_server_processes(pg_store) >= 1
    time.sleep(0.2)
    # The ping finds the connection gone; the pool connects afresh and the read succeeds.
    assert pg_store.get_api_token("none") is None
    assert pings[0] == 1
    assert pg_store.check_api_token("not-a-token", datetime.now(UTC))[1] == "unknown"  # (autocommit view)


def test_a_connection_used_moments_ago_is_trusted_and_fails_once(
        pg_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_mod, "PG_PING_IDLE_S", 60.0)
    pings = _count_pings(pg_store, monkeypatch)
    assert pg_store.get_api_token("none") is None
    assert _end_server_processes(pg_store) >= 1
    with pytest.raises(sa.exc.DBAPIError) as failed:
        pg_store.get_api_token("none")
    assert failed.value.connection_invalidated  # SQLAlchemy invalidated the pool on it
    assert pg_store.get_api_token("none") is None  # the next checkout connected afresh
    assert pings[0] == 0


def test_reuse_at_once_is_not_pinged_and_idle_reuse_is(
        pg_store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    pings = _count_pings(pg_store, monkeypatch)
    monkeypatch.setattr(engine_mod, "PG_PING_IDLE_S", 60.0)
    for _ in range(20):
        pg_store.get_api_token("none")
        pg_store.check_api_token("not-a-token", datetime.now(UTC))
    assert pings[0] == 0
    monkeypatch.setattr(engine_mod, "PG_PING_IDLE_S", 0.0)
    for _ in range(5):
        time.sleep(0.01)
        pg_store.get_api_token("none")
    assert pings[0] == 5
