"""The version of the ledger reach's kept groups: one counter row, moved by every write of them.

Budgets read the reach's groups (:mod:`orchestrator.store.reach_groups`) on every request; at a
running site's 1,500 groups reading and parsing them was most of a request. A store keeps the
groups it parsed (``Accrual.budget_inputs``) with the version it read them at, and reads only
this one row on a request to know whether they are still current.

``ledger_reach_version`` (migration 0022) holds one row (``id`` 1). Every write of
``ledger_reach_groups`` adds one to its ``version`` in the same transaction (:func:`bump`, called
by :func:`reach_groups._apply <orchestrator.store.reach_groups>` after its upsert and delete, the
transaction's last statements, and by the groups' rebuild): a commit moves the groups and the
version together, a rollback neither. On PostgreSQL the update locks the row until the writer
commits; writers of the groups take it last, after their group rows, so it adds no lock cycle.

A missing row (deleted around the store) is written again by the next bump, at a random version.
A reader reads the version *before* the groups (:func:`read`): groups read after a version are
at least as new as it, so a cache labelled with that version may hold newer groups than the
label (the next read sees a newer version and reads them again), never older ones. A write of
the groups around the store (raw SQL in a script or a test) must bump the version too, or the
stores that cached the groups serve them until the next write.
"""

from __future__ import annotations

import secrets

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.store import tables as T

ledger_reach_version = sa.Table(
    "ledger_reach_version", T.Base.metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("version", sa.BigInteger, nullable=False),
)

# An upsert, so a row deleted around the store (a test's TRUNCATE of every table) comes back.
# It comes back at a random version, not at 1: a store may keep groups read at the old row's
# version, which a restart from 1 would reach again with other groups.
_BUMP = ("INSERT INTO ledger_reach_version (id, version) VALUES (1, {p}) ON CONFLICT (id) "
         "DO UPDATE SET version = ledger_reach_version.version + 1")
_BUMPS = {"postgresql": _BUMP.format(p="%s"), "sqlite": _BUMP.format(p="?")}
_READ = "SELECT version FROM ledger_reach_version WHERE id = 1"


def bump(conn: Connection) -> None:
    """Move the version in ``conn``'s transaction (a write of the groups), on the transaction's
    own DBAPI cursor (a state change pays for one more statement, not for its result
    processing)."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute(_BUMPS[conn.dialect.name], (secrets.randbits(62),))
    finally:
        cursor.close()


def read(conn: Connection) -> int | None:
    """The version as ``conn``'s transaction sees it; None when the row is missing (a schema
    made without the migration): then nothing may be cached."""
    cursor = conn.connection.cursor()  # the DBAPI cursor: no result processing for one integer
    try:
        cursor.execute(_READ)
        row = cursor.fetchone()
    finally:
        cursor.close()
    return None if row is None else int(row[0])


__all__ = ["bump", "ledger_reach_version", "read"]
