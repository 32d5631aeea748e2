"""Join tokens, node credentials and the audit log of agent registrations, in the store.

Only hashes are stored; the caller (fabric) hashes. A join token is single-use: consuming it is a
conditional UPDATE that only one caller can win, even when two registrations race. Hash
comparisons are constant-time so a caller cannot learn a stored hash byte by byte.
"""

from __future__ import annotations

import hmac
from datetime import datetime
from typing import Any, Literal

import sqlalchemy as sa

from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

JoinResult = Literal["ok", "unknown-node", "wrong-token", "expired", "replayed"]

# Compared against when a node has no hash, so an unknown credential costs the same time as a
# wrong one.
_NO_HASH = "\x00" * 64


def _same(stored: str | None, given: str) -> bool:
    matched = hmac.compare_digest((stored or _NO_HASH).encode(), given.encode())
    return matched and stored is not None


class JoinSecrets(StoreBase):
    """Join-token, credential and join-audit methods of the Store."""

    def set_join_token(self, node_id: str, token_hash: str, expires_at: datetime) -> bool:
        """Give the node a fresh single-use join token (replacing any earlier one).
        False if the node is unknown."""
        c = T.nodes.c
        stmt = sa.update(T.nodes).where(c.id == node_id).values(
            join_token_hash=token_hash,
            join_token_expires_at=require_aware(expires_at, "expires_at"),
            join_token_used_at=None,
        )
        with self._write() as conn:
            return conn.execute(stmt).rowcount == 1

    def consume_join_token(self, node_id: str, token_hash: str, now: datetime) -> JoinResult:
        """Spend the node's join token: "ok" for exactly one caller, else why not.

        A wrong token is reported as such even if the real one was used or expired, so a guess
        reveals nothing about the token's state.
        """
        require_aware(now, "now")
        c = T.nodes.c
        with self._write() as conn:
            row = conn.execute(
                sa.select(c.join_token_hash, c.join_token_expires_at, c.join_token_used_at)
                .where(c.id == node_id)
            ).first()
            if row is None:
                return "unknown-node"
            if not _same(row.join_token_hash, token_hash):
                return "wrong-token"
            if row.join_token_used_at is not None:
                return "replayed"
            if row.join_token_expires_at is None or row.join_token_expires_at <= now:
                return "expired"
            # The read above does not lock on PostgreSQL: the condition on used_at is what makes
            # the token single-use when two registrations pass the checks at once.
            spent = conn.execute(
                sa.update(T.nodes)
                .where(c.id == node_id, c.join_token_hash == token_hash,
                       c.join_token_used_at.is_(None))
                .values(join_token_used_at=now)
            ).rowcount == 1
        return "ok" if spent else "replayed"

    def set_credential(self, node_id: str, credential_hash: str) -> bool:
        """Store the hash of the agent's long-lived credential. False if the node is unknown."""
        c = T.nodes.c
        with self._write() as conn:
            return conn.execute(
                sa.update(T.nodes).where(c.id == node_id).values(credential_hash=credential_hash)
            ).rowcount == 1

    def check_credential(self, node_id: str, credential_hash: str) -> bool:
        c = T.nodes.c
        with self._read() as conn:
            stored = conn.execute(sa.select(c.credential_hash).where(c.id == node_id)).scalar()
        return _same(stored, credential_hash)

    def record_join_attempt(
        self, node_id: str | None, at: datetime, ok: bool, reason: str, remote: str | None = None
    ) -> None:
        with self._write() as conn:
            conn.execute(sa.insert(T.join_attempts).values(
                node_id=node_id, at=require_aware(at, "at"), ok=ok, reason=reason, remote=remote,
            ))

    def join_attempts(self, node_id: str | None = None) -> list[dict[str, Any]]:
        """Registration attempts, oldest first, as dicts (id, node_id, at, ok, reason, remote)."""
        c = T.join_attempts.c
        query = sa.select(T.join_attempts).order_by(c.id)
        if node_id is not None:
            query = query.where(c.node_id == node_id)
        with self._read() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]
