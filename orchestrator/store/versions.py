"""Version counters: one-row tables whose counter moves with every write of what each one guards,
so a store that keeps what it read (parsed, summed) can tell with one read whether it is current.

A counter's table holds one row (``id`` 1, ``version``). Every write of the guarded rows adds one
to it in the same transaction (:meth:`VersionCounter.bump`): a commit moves the rows and the
version together, a rollback neither. On PostgreSQL the update locks the row until the writer
commits, so writers take it as late as they can (the transaction's last statements, in one order:
:mod:`orchestrator.store.rollup_version` before :mod:`orchestrator.store.reach_version`), which
holds it for a commit's time and adds no lock cycle.

**Keeping is safe when the version is read first.** A reader reads the version, then the rows:
rows read after a version are at least as new as it, so what a store keeps under a version may be
newer than its label (the next read sees a newer version and reads them again), never older. When
a later read finds the label still current, no write of the rows committed since the label was
read, so what is kept is exactly what the rows hold. :func:`read_versions` reads several counters
in one statement (one round trip, one snapshot).

A missing row (deleted around the store) is written again by the next bump, at a random version
rather than 1: a store may keep rows read at the old row's version, which a restart from 1 would
reach again with other rows. A write of the guarded rows around the store (raw SQL in a script or
a test) must bump the counter too, or the stores that kept them serve them until the next write.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.store import tables as T


class VersionCounter:
    """The one-row counter table ``name`` (see the module)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.table = sa.Table(
            name, T.Base.metadata,
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("version", sa.BigInteger, nullable=False),
        )
        bump = (f"INSERT INTO {name} (id, version) VALUES (1, {{p}}) ON CONFLICT (id) "
                f"DO UPDATE SET version = {name}.version + 1")
        self._bumps = {"postgresql": bump.format(p="%s"), "sqlite": bump.format(p="?")}
        self.select = f"(SELECT version FROM {name} WHERE id = 1)"

    def bump(self, conn: Connection) -> None:
        """Move the version in ``conn``'s transaction (a write of the guarded rows), on the
        transaction's own DBAPI cursor (a state change pays for one more statement, not for its
        result processing)."""
        cursor = conn.connection.cursor()
        try:
            cursor.execute(self._bumps[conn.dialect.name], (secrets.randbits(62),))
        finally:
            cursor.close()

    def read(self, conn: Connection) -> int | None:
        """The version as ``conn`` sees it; None when the row is missing (a schema made without
        its migration): then nothing may be kept."""
        return read_versions(conn, (self,))[0]


def read_versions(conn: Connection, counters: Sequence[VersionCounter]
                  ) -> tuple[int | None, ...]:
    """The versions of ``counters`` in one statement, on the DBAPI cursor (no result processing
    for a few integers); None for a missing row."""
    cursor = conn.connection.cursor()
    try:
        cursor.execute("SELECT " + ", ".join(c.select for c in counters))
        row = cursor.fetchone()
    finally:
        cursor.close()
    return tuple(None if v is None else int(v) for v in row)


__all__ = ["VersionCounter", "read_versions"]
