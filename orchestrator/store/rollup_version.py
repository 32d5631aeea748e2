"""The version of the cost roll-ups, and the window sums a store keeps while it holds.

Every request of ``/v1/budgets`` summed each budget window's burst cost per (pool, project) from
the roll-ups (:func:`orchestrator.store.rollups.rollup_sums`): one grouped read per window, the
largest part of the route's own work on PostgreSQL after the reach's groups were kept
(:mod:`orchestrator.store.reach_version`). Those sums only change when a roll-up is written, a
few times a minute at most, while budgets are read by every dashboard and every planner.

``cost_rollup_version`` (migration 0023) holds one row (``id`` 1). A transaction that changes
the roll-ups (:func:`rollups.apply_changes <orchestrator.store.rollups.apply_changes>`, which
writes nothing when the lines' sums do not change, and the roll-ups' rebuild) marks itself
(:func:`moved`); the store's write transaction adds one to the version as one of its last
statements (:func:`flush`, before the reach groups' own bump: one order for every writer), so
the row is locked for a commit's time only, and parallel writers of different subjects wait for
each other only there. Outside a store write transaction the bump is made at once.

:class:`KeptSums` keeps each window's sums under the version read before them (why that is
safe: :mod:`orchestrator.store.versions`), keyed by the window as the roll-ups read it (both ends
rounded up to the hour), so a month budget's window is one entry for the whole month.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection

from orchestrator.store.versions import VersionCounter

ROLLUPS = VersionCounter("cost_rollup_version")
cost_rollup_version = ROLLUPS.table

_MOVED = "burst.rollups.moved"  # Connection.info key: this transaction changed the roll-ups
KEPT_WINDOWS = 64  # windows kept under one version at most (rolling windows add one an hour)

Window = tuple[datetime | None, datetime | None]
WindowSums = dict[tuple[str | None, ...], int]


def begin(conn: Connection) -> None:
    """Defer the bump of ``conn``'s transaction to :func:`flush` (``Store._write``)."""
    conn.info[_MOVED] = False


def moved(conn: Connection) -> None:
    """``conn``'s transaction changed the roll-ups: bump now, or at :func:`flush` when deferred."""
    if _MOVED in conn.info:
        conn.info[_MOVED] = True
    else:
        ROLLUPS.bump(conn)


def flush(conn: Connection) -> None:
    """Bump the version if ``conn``'s transaction changed the roll-ups; one of its last
    statements."""
    if conn.info.pop(_MOVED, False):
        ROLLUPS.bump(conn)


def discard(conn: Connection) -> None:
    """Forget the mark (the transaction rolled back, or flushed already)."""
    conn.info.pop(_MOVED, None)


class KeptSums:
    """Window sums kept under one roll-up version (see the module). Shared by the threads of
    one store: a version change swaps one reference, an entry is one dict store, and a miss is
    read by one thread at a time."""

    def __init__(self) -> None:
        # One attribute, swapped whole: a thread never sees one version's label on another's sums.
        self._kept: tuple[int | None, dict[Window, WindowSums]] = (None, {})
        self._reading = threading.Lock()

    def get(self, version: int | None, window: Window,
            read: Callable[[], WindowSums]) -> WindowSums:
        """``window``'s sums as kept under ``version`` (read before calling), else ``read()``
        and kept. A None version (no counter row) keeps nothing."""
        if version is None:
            return read()
        label, table = self._kept
        if label == version and (sums := table.get(window)) is not None:
            return sums
        # One reader at a time reads again: after a roll-up write every request in flight misses
        # at once, and eight threads each summing the roll-ups set the route's tail. The others
        # wait for it and find the sums kept under the version they read.
        with self._reading:
            label, table = self._kept
            if label == version and (sums := table.get(window)) is not None:
                return sums
            sums = read()
            if label != version or len(table) >= KEPT_WINDOWS:
                table = {}
                self._kept = (version, table)
            table[window] = sums
            return sums


__all__ = ["KEPT_WINDOWS", "ROLLUPS", "KeptSums", "begin", "cost_rollup_version", "discard",
           "flush", "moved"]
