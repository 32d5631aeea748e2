"""API tokens in the store (SQLite and PostgreSQL): only hashes stored, scopes validated, expiry,
revocation and last use; and the tick-timing upsert the metrics read."""

from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from orchestrator.store import Store
from orchestrator.store.tokens import Role, hash_api_token, validate_scope
from tests.builders import T0

M = timedelta(minutes=1)


def test_a_token_is_stored_only_as_its_hash(store: Store) -> None:
    secret, token = store.create_api_token("viewer", ["research", "vision", "research"],
                                           created_at=T0, description="grafana")
    assert secret.startswith("bat_") and len(secret) > 40
    assert token.role is Role.VIEWER and token.projects == ("research", "vision")
    with store.engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(sa.text("SELECT * FROM api_tokens"))]
    assert len(rows) == 1
    assert secret not in repr(rows) and rows[0]["token_hash"] == hash_api_token(secret)
    assert store.check_api_token(secret, T0) == (token, "ok")
    assert store.check_api_token(secret + "x", T0) == (None, "unknown")


def test_expiry_revocation_and_last_use(store: Store) -> None:
    secret, token = store.create_api_token("submitter", ["research"], created_at=T0,
                                           expires_at=T0 + 60 * M)
    seen, status = store.check_api_token(secret, T0 + M)
    assert status == "ok" and seen is not None
    assert store.get_api_token(token.id).last_used_at == T0 + M  # type: ignore[union-attr]
    store.check_api_token(secret, T0 + M + timedelta(seconds=30))  # within the minute: no write
    assert store.get_api_token(token.id).last_used_at == T0 + M  # type: ignore[union-attr]
    store.check_api_token(secret, T0 + 3 * M)
    assert store.get_api_token(token.id).last_used_at == T0 + 3 * M  # type: ignore[union-attr]

    assert store.check_api_token(secret, T0 + 60 * M)[1] == "expired"
    revoked = store.revoke_api_token(token.id, T0 + 5 * M)
    assert revoked is not None and revoked.revoked_at == T0 + 5 * M
    again = store.revoke_api_token(token.id, T0 + 9 * M)
    assert again is not None and again.revoked_at == T0 + 5 * M  # the first revocation stays
    assert store.check_api_token(secret, T0 + 6 * M)[1] == "revoked"
    assert store.revoke_api_token("tok-missing", T0) is None
    assert store.api_tokens() == []
    assert [t.id for t in store.api_tokens(include_revoked=True)] == [token.id]


@pytest.mark.parametrize(("role", "projects", "field"), [
    ("owner", ["research"], "role"),
    ("viewer", [], "project"),
    ("admin", ["research"], "project"),
    ("viewer", ["has space"], "project"),
    ("viewer", ["a,b"], "project"),
])
def test_bad_scopes_are_refused_naming_the_field(role: str, projects: list[str], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}: "):
        validate_scope(role, projects)


def test_bad_token_fields_write_nothing(store: Store) -> None:
    with pytest.raises(ValueError, match="^expires: "):
        store.create_api_token("admin", [], created_at=T0, expires_at=T0)
    with pytest.raises(ValueError, match="^description: "):
        store.create_api_token("admin", [], created_at=T0, description="x" * 501)
    assert store.api_tokens(include_revoked=True) == []


def test_record_tick_upserts_per_policy(store: Store) -> None:
    store.record_tick("train", T0, 0.25)
    store.record_tick("train", T0 + M, 0.75)
    store.record_tick("infer", T0 + M, 2.0)
    stats = {s.policy: s for s in store.tick_stats()}
    assert (stats["train"].ticks, stats["train"].total_duration_s) == (2, 1.0)
    assert (stats["train"].last_at, stats["train"].last_duration_s) == (T0 + M, 0.75)
    assert stats["infer"].ticks == 1
