"""Fencing tokens: the store refuses writes from a deposed leader.

A leader lease (``orchestrator.automation.leader``) hands its holder a token that grows with every
new holder. A lease alone cannot stop a holder that was paused (GC, swap, a frozen VM, a network
partition) past its expiry from writing after a successor took over: it only finds out when it
next looks at the clock. So the party that receives the writes must check, and that is the store.

``Store.fenced(scope, token)`` returns a view of the store that shares its engine and whose every
write transaction first runs, inside the same transaction, an atomic check-and-advance of the
``fences`` row of ``scope``: the row is created at ``token`` if missing, raised to ``token`` if it
is lower, left alone if equal, and a higher stored token makes the transaction roll back with
``StaleLeaderError``. Plain stores (not fenced) run no extra statement.

Why it is atomic:

* SQLite: write transactions start with ``BEGIN IMMEDIATE`` (see ``engine``), so the whole
  transaction, fence check included, holds the database's single write lock.
* PostgreSQL: the check is one ``INSERT ... ON CONFLICT (scope) DO UPDATE ... WHERE
  fences.token <= excluded.token RETURNING token``. ON CONFLICT DO UPDATE locks the conflicting
  row and evaluates its WHERE against the newest committed version (waiting for a concurrent
  writer to finish first), and the row lock is held until commit. So fenced transactions of one
  scope are serialised through that row: a token-5 transaction either commits before the token-6
  transaction checked, or checks after it committed and is refused.
"""

from __future__ import annotations

import copy
from typing import Self

import sqlalchemy as sa

from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase
from orchestrator.store.fence import Fence, StaleLeaderError


class Fencing(StoreBase):
    """The fencing methods of the Store."""

    def fenced(self, scope: str, token: int) -> Self:
        """A view of this store, on the same engine, whose every write is refused with
        StaleLeaderError (and rolled back) once a higher token has written in ``scope``.

        Reads are unchanged. A view of a view replaces the fence. Closing a view does nothing:
        the engine belongs to the store the view was made from.
        """
        # A shallow copy shares the engines (and so their pools); only the fence differs.
        return self.fenced_by(Fence(scope, token))

    def fenced_by(self, *fences: Fence) -> Self:
        """A view whose every write checks each of ``fences`` (all in its one transaction): the
        writer of several scopes (a controller leading a pool's policies and its reconciliation)
        is refused as soon as any of them passed to a newer holder. No fences: a plain view."""
        scopes = [f.scope for f in fences]
        if len(set(scopes)) != len(scopes):
            raise ValueError(f"a view can carry one fence per scope, got {scopes}")
        view = copy.copy(self)
        # Sorted by scope: concurrent multi-scope writers lock the fence rows in one order.
        view._fences = tuple(sorted(fences, key=lambda f: f.scope))
        return view

    @property
    def fence(self) -> Fence | None:
        """This view's fence (the first, for a view of several), or None for a plain store."""
        return self._fences[0] if self._fences else None

    @property
    def fences(self) -> tuple[Fence, ...]:
        """Every fence this view checks; empty for a plain store."""
        return self._fences

    def fence_token(self, scope: str) -> int | None:
        """The highest token that has written in ``scope`` (None if none has). A lease can use
        it as the floor of its next token after Redis lost its counter."""
        c = T.fences.c
        with self._read() as conn:
            token = conn.execute(sa.select(c.token).where(c.scope == scope)).scalar()
        return int(token) if token is not None else None

    def close(self) -> None:
        if not self._fences:
            super().close()


__all__ = ["Fence", "Fencing", "StaleLeaderError"]
