"""API presence in the store: when an API that receives agents' heartbeats was up.

Each API process (``burst run``'s in-process API, ``burst api``) records a window: its own id, when
it started and, every ``PRESENCE_PERIOD``, that it is still up (``record_presence``). A node's
heartbeats can only have been heard inside such windows, so the liveness rules count a node's
silence from the start of the *current* window (``presence_window_start``): windows of several
API processes that overlap (replicas, a rolling restart) form one window; a gap longer than one
period starts a new one. Rows older than a day are pruned as new ones are recorded.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import sqlalchemy as sa

from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

#: How often an API process records that it is up. A window with no record for two periods is over.
PRESENCE_PERIOD = timedelta(seconds=2)
KEEP = timedelta(days=1)


class Presence(StoreBase):
    """The presence methods of the Store."""

    def record_presence(self, api_id: str, started_at: datetime, now: datetime) -> None:
        """Record that API process ``api_id`` (up since ``started_at``) is up at ``now``."""
        require_aware(started_at, "started_at")
        require_aware(now, "now")
        with self._write() as conn:
            stmt = self._insert(T.presence).values(id=api_id, started_at=started_at, seen_at=now)
            conn.execute(stmt.on_conflict_do_update(
                index_elements=["id"], set_={"seen_at": stmt.excluded.seen_at}))
            conn.execute(sa.delete(T.presence).where(T.presence.c.seen_at < now - KEEP))

    def end_presence(self, api_id: str, now: datetime) -> None:
        """A clean stop: the window ends now (a killed API's ends at its last record)."""
        require_aware(now, "now")
        with self._write() as conn:
            conn.execute(sa.update(T.presence).where(T.presence.c.id == api_id)
                         .values(seen_at=now))

    def presence_window_start(self, now: datetime,
                              period: timedelta = PRESENCE_PERIOD) -> datetime | None:
        """When the current presence window began: ``now`` if no API is up now, None if no API
        ever recorded presence (nothing to go by; the caller keeps its other bounds)."""
        require_aware(now, "now")
        c = T.presence.c
        with self._read() as conn:
            rows = [(r.started_at, r.seen_at) for r in conn.execute(
                sa.select(c.started_at, c.seen_at).where(c.seen_at >= now - KEEP))]
            if not rows:
                ever = conn.execute(sa.select(sa.func.count()).select_from(T.presence)).scalar()
                return None if not ever else now
        live = [started for started, seen in rows if seen >= now - 2 * period]
        if not live:
            return now
        start = min(live)
        # Walk back through windows that were up until within one period of the start.
        changed = True
        while changed:
            changed = False
            for started, seen in rows:
                if started < start and seen + period >= start:
                    start = started
                    changed = True
        return min(start, now)


__all__ = ["PRESENCE_PERIOD", "Presence"]
