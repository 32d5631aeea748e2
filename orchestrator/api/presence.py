"""Presence of this API process in the store: the window in which agents could be heard.

The API receives the agents' heartbeats; while it is down, or before it started, nothing can be
heard from any node. :class:`PresenceRecorder` records this process's window (its start, then every
``PRESENCE_PERIOD`` that it is still up, from a daemon thread; its end on a clean stop), so the
liveness rules never count the API's own absence as a node's silence
(:mod:`orchestrator.store.presence`, :mod:`orchestrator.leadership`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from orchestrator.store import Store
from orchestrator.store.presence import PRESENCE_PERIOD

log = logging.getLogger(__name__)


class PresenceRecorder:
    """Records one API process's presence window; ``start()`` once, ``stop()`` on a clean stop."""

    def __init__(self, store: Store, clock, period_s: float = PRESENCE_PERIOD.total_seconds()):
        self.store = store
        self.clock = clock
        self.period_s = period_s
        self.id = f"api:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="burst-presence", daemon=True)
        self.started_at = None

    def start(self) -> None:
        """Record the window's start now (before agents can be heard), then keep it up."""
        self.started_at = self.clock.now()
        self.store.record_presence(self.id, self.started_at, self.started_at)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.store.record_presence(self.id, self.started_at, self.clock.now())
            except Exception:  # noqa: BLE001 - a store hiccup: the next period records again
                log.warning("could not record the API's presence", exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        if self.started_at is not None:
            try:
                self.store.end_presence(self.id, self.clock.now())
            except Exception:  # noqa: BLE001 - the window then ends at its last record
                log.warning("could not record the end of the API's presence", exc_info=True)


__all__ = ["PresenceRecorder"]
