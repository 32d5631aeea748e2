"""Join tokens, node credentials and the audit log of agent registrations, in the store.

Only hashes are stored; the caller (fabric) hashes. Hash comparisons are constant-time so a
caller cannot learn a stored hash byte by byte.

A registration (:meth:`JoinSecrets.register_node`) is one transaction: check the token, spend it,
store the new credential's hash, move the node to joining with its event, and append the audit
row. A controller killed inside it leaves nothing written, the token unspent. A registration that
was written but whose answer the agent never got can be completed again, with the same token for
the same node within the token's lifetime (a fresh credential replaces the unused one); it is
final once the agent has used a credential (:meth:`JoinSecrets.check_credential` closes it).

The audit log is bounded: each write prunes rows beyond ``join_attempts_cap`` (the newest kept)
and rows older than ``join_attempts_retention`` among the oldest, so anonymous callers cannot
grow it without limit.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.lifecycle import NodeEvent, transition
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

JoinResult = Literal["ok", "unknown-node", "wrong-token", "expired", "replayed"]
# "again": a registration already written whose answer the agent never got, completed again;
# "not-launched": the node's launch is not recorded yet (the agent retries, nothing spent);
# "node is <state>": the node is past joining, nothing spent.
RegisterResult = Literal["ok", "again", "unknown-node", "wrong-token", "expired", "replayed",
                         "not-launched"] | str

# States a registration moves to joining, and states in which a written registration whose answer
# was lost may be completed again (the built-in fabric makes a node ready at registration).
_TO_JOIN = frozenset({NodeState.LAUNCHING, NodeState.BOOTING})
_REGISTERED = frozenset({NodeState.JOINING, NodeState.READY})
# Oldest audit rows looked at per write for the age prune: a bounded cost per registration.
_PRUNE_BATCH = 16

# Compared against when a node has no hash, so an unknown credential costs the same time as a
# wrong one.
_NO_HASH = "\x00" * 64


def _same(stored: str | None, given: str) -> bool:
    matched = hmac.compare_digest((stored or _NO_HASH).encode(), given.encode())
    return matched and stored is not None


@dataclass(frozen=True, slots=True)
class Registration:
    """What :meth:`JoinSecrets.register_node` did: its result and the node afterwards."""

    result: RegisterResult
    node: Node | None

    @property
    def ok(self) -> bool:
        return self.result in ("ok", "again")


class JoinSecrets(StoreBase):
    """Join-token, credential and join-audit methods of the Store."""

    join_attempts_cap: int = 10_000
    join_attempts_retention: timedelta = timedelta(days=7)

    if TYPE_CHECKING:  # provided by the Store (repo.py), which composes this mixin
        def _node_in(self, conn: sa.Connection, node_id: str) -> Node | None: ...
        def _save_transition_in(self, conn: sa.Connection, old: Node, new: Node,
                                event: NodeEvent) -> bool: ...

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

    def register_node(
        self, node_id: str, token_hash: str, credential_hash: str, now: datetime, *,
        remote: str | None = None, details: dict[str, Any] | None = None,
    ) -> Registration:
        """Register the node's agent, all or nothing (see the module docstring).

        "ok"/"again": the token is spent, ``credential_hash`` is the node's credential and the
        node is joining (or already joining or ready: "again"). Anything else: nothing changed
        but the audit row. ``details`` go into the joining event.
        """
        require_aware(now, "now")
        c = T.nodes.c
        with self._write() as conn:
            # FOR UPDATE on PostgreSQL (SQLite already holds the write lock): nobody changes the
            # node between this read and the writes below.
            row = conn.execute(
                sa.select(c.join_token_hash, c.join_token_expires_at, c.join_token_used_at)
                .where(c.id == node_id).with_for_update()
            ).first()
            result: RegisterResult
            node = None
            if row is None:
                _same(None, token_hash)  # the same work as a wrong token: timing tells nothing
                result = "unknown-node"
            elif not _same(row.join_token_hash, token_hash):
                result = "wrong-token"
            elif row.join_token_expires_at is None or row.join_token_expires_at <= now:
                result = "replayed" if row.join_token_used_at is not None else "expired"
            else:
                node = self._node_in(conn, node_id)
                result = self._register_in(conn, node, row.join_token_used_at, credential_hash,
                                           now, details or {}) if node is not None else "unknown-node"
                if result in ("ok", "again"):
                    node = self._node_in(conn, node_id)
            ok = result in ("ok", "again")
            self._record_join_attempt_in(conn, node_id, now, ok, result, remote)
        return Registration(result, node if ok else None)

    def _register_in(self, conn: sa.Connection, node: Node, used_at: datetime | None,
                     credential_hash: str, now: datetime, details: dict[str, Any]) -> RegisterResult:
        if node.state is NodeState.REQUESTED:
            return "not-launched"
        if node.state in _TO_JOIN:
            new, event = transition(replace(node, last_heartbeat=now), NodeState.JOINING, at=now,
                                    reason="agent registered", **details)
            if not self._save_transition_in(conn, node, new, event):
                raise RuntimeError(f"node {node.id} changed under its row lock")
        elif node.state not in _REGISTERED:
            return f"node is {node.state}"
        c = T.nodes.c
        conn.execute(sa.update(T.nodes).where(c.id == node.id).values(
            join_token_used_at=used_at or now, credential_hash=credential_hash))
        # A token spent by a registration that never moved the node (a controller before this
        # was atomic) is completed like one whose answer was lost.
        return "again" if used_at is not None else "ok"

    def set_credential(self, node_id: str, credential_hash: str) -> bool:
        """Store the hash of the agent's long-lived credential. False if the node is unknown."""
        c = T.nodes.c
        with self._write() as conn:
            return conn.execute(
                sa.update(T.nodes).where(c.id == node_id).values(credential_hash=credential_hash)
            ).rowcount == 1

    def check_credential(self, node_id: str, credential_hash: str) -> bool:
        """Is ``credential_hash`` the node's credential? The first use of a credential makes the
        node's registration final: its join token can no longer complete it again."""
        c = T.nodes.c
        with self._read() as conn:
            row = conn.execute(sa.select(c.credential_hash, c.join_token_expires_at,
                                         c.join_token_used_at).where(c.id == node_id)).first()
        matched = _same(row.credential_hash if row is not None else None, credential_hash)
        if matched and row is not None and row.join_token_used_at is not None and (
                row.join_token_expires_at is None
                or row.join_token_expires_at > row.join_token_used_at):
            with self._write() as conn:
                # Closing = ending the token's lifetime at its use (once: the condition).
                conn.execute(sa.update(T.nodes).where(
                    c.id == node_id, c.credential_hash == credential_hash,
                    c.join_token_used_at.is_not(None),
                ).values(join_token_expires_at=c.join_token_used_at))
        return matched

    def record_join_attempt(
        self, node_id: str | None, at: datetime, ok: bool, reason: str, remote: str | None = None
    ) -> None:
        with self._write() as conn:
            self._record_join_attempt_in(conn, node_id, at, ok, reason, remote)

    def _record_join_attempt_in(self, conn: sa.Connection, node_id: str | None, at: datetime,
                                ok: bool, reason: str, remote: str | None) -> None:
        c = T.join_attempts.c
        new_id = conn.execute(sa.insert(T.join_attempts).values(
            node_id=node_id, at=require_aware(at, "at"), ok=ok, reason=reason, remote=remote,
        )).inserted_primary_key[0]
        # Bounded: the newest ``join_attempts_cap`` rows at most (ids only grow)...
        conn.execute(sa.delete(T.join_attempts).where(c.id <= new_id - self.join_attempts_cap))
        # ...and rows past the retention go, a few of the oldest per write.
        oldest = sa.select(c.id).order_by(c.id).limit(_PRUNE_BATCH)
        conn.execute(sa.delete(T.join_attempts).where(
            c.id.in_(oldest), c.at < at - self.join_attempts_retention))

    def prune_join_attempts(self, now: datetime) -> int:
        """Delete every audit row older than the retention; how many went."""
        require_aware(now, "now")
        c = T.join_attempts.c
        with self._write() as conn:
            return conn.execute(sa.delete(T.join_attempts).where(
                c.at < now - self.join_attempts_retention)).rowcount

    def join_attempts(self, node_id: str | None = None) -> list[dict[str, Any]]:
        """Registration attempts, oldest first, as dicts (id, node_id, at, ok, reason, remote)."""
        c = T.join_attempts.c
        query = sa.select(T.join_attempts).order_by(c.id)
        if node_id is not None:
            query = query.where(c.node_id == node_id)
        with self._read() as conn:
            return [dict(r._mapping) for r in conn.execute(query)]
