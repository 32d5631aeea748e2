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
from dataclasses import dataclass
from typing import Self

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite

from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase


class StaleLeaderError(Exception):
    """A write carried a fencing token older than the one the store has already seen for its
    scope: the writer was deposed. The transaction was rolled back; nothing was written."""

    def __init__(self, scope: str, token: int, current: int) -> None:
        super().__init__(f"stale leader for {scope!r}: token {token} < current token {current}; "
                         "the write was refused")
        self.scope = scope
        self.token = token
        self.current = current

    def __reduce__(self) -> tuple[type[StaleLeaderError], tuple[str, int, int]]:
        # Keeps the fields when the error crosses a process boundary (Celery results, pickling).
        return (type(self), (self.scope, self.token, self.current))


@dataclass(frozen=True)
class Fence:
    """The scope and token a fenced store view stamps on each of its write transactions."""

    scope: str
    token: int

    def __post_init__(self) -> None:
        if not isinstance(self.scope, str) or not self.scope:
            raise ValueError(f"fence scope must be a non-empty string, got {self.scope!r}")
        # bool is an int subclass; True as a token is always a bug.
        if not isinstance(self.token, int) or isinstance(self.token, bool) or self.token < 0:
            raise ValueError(f"fence token must be a non-negative int, got {self.token!r}")

    def check(self, conn: Connection) -> None:
        """Advance the scope's stored token to ours, or raise StaleLeaderError if it is higher.

        Runs on the write transaction's own connection, so the caller's writes commit only
        together with a successful check."""
        c = T.fences.c
        insert = _dialect_insert(conn)
        stmt = (
            insert.values(scope=self.scope, token=self.token, updated_at=sa.func.now())
            .on_conflict_do_update(
                index_elements=[c.scope],
                # updated_at is the database's clock, for operators only: no decision reads it,
                # so it is not a caller-supplied time like every other time in the store.
                set_={"token": insert.excluded.token, "updated_at": sa.func.now()},
                # Equal tokens pass: one leader makes many writes under one token.
                where=c.token <= insert.excluded.token,
            )
            .returning(c.token)
        )
        if conn.execute(stmt).first() is not None:
            return
        current = conn.execute(sa.select(c.token).where(c.scope == self.scope)).scalar_one()
        raise StaleLeaderError(self.scope, self.token, int(current))


def _dialect_insert(conn: Connection) -> pg.Insert | sqlite.Insert:
    name = conn.dialect.name
    if name == "postgresql":
        return pg.insert(T.fences)
    if name == "sqlite":
        return sqlite.insert(T.fences)
    raise NotImplementedError(f"no fencing for dialect {name}")


class Fencing(StoreBase):
    """The fencing methods of the Store."""

    def fenced(self, scope: str, token: int) -> Self:
        """A view of this store, on the same engine, whose every write is refused with
        StaleLeaderError (and rolled back) once a higher token has written in ``scope``.

        Reads are unchanged. A view of a view replaces the fence. Closing a view does nothing:
        the engine belongs to the store the view was made from.
        """
        # A shallow copy shares the engines (and so their pools); only the fence differs.
        view = copy.copy(self)
        view._fence = Fence(scope, token)
        return view

    @property
    def fence(self) -> Fence | None:
        """This view's fence, or None for a plain store."""
        return self._fence

    def fence_token(self, scope: str) -> int | None:
        """The highest token that has written in ``scope`` (None if none has). A lease can use
        it as the floor of its next token after Redis lost its counter."""
        c = T.fences.c
        with self._read() as conn:
            token = conn.execute(sa.select(c.token).where(c.scope == scope)).scalar()
        return int(token) if token is not None else None

    def close(self) -> None:
        if self._fence is None:
            super().close()


__all__ = ["Fence", "Fencing", "StaleLeaderError"]
