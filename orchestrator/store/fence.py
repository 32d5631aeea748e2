"""The fence a store view stamps on its writes, and the error a deposed writer gets.

Kept apart from :mod:`orchestrator.store.fencing` (the Store methods) so that the connection
handling in :mod:`orchestrator.store.base` can run the check without importing the repository
mixin that itself builds on ``base``: ``base`` and ``fencing`` both import this module, neither
imports the other's dependants.
"""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.dialects import sqlite

from orchestrator.store import tables as T


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



__all__ = ["Fence", "StaleLeaderError"]
