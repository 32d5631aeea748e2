"""The embedded loop's own notification sender: a daemon thread with retries and backoff.

The loop hands it the ids :func:`orchestrator.notify.watch.check` claimed and goes on at once: a
target that is down, slow or answering 500 costs the tick nothing. Each attempt has the target's
timeout; a failed one is retried after ``backoff_s`` doubling up to ``max_backoff_s``, at most
``max_attempts`` times, and the last failure marks the row failed. On start it picks up rows a
previous run claimed but never sent (claimed rows are never claimed again, so they would otherwise
be lost); sent rows are never sent again.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime

import httpx

from orchestrator.notify.deliver import DeliveryFailed, NoTarget, attempt
from orchestrator.policy.models import Policy
from orchestrator.store import Store
from orchestrator.store.notices import NoticeState

log = logging.getLogger(__name__)


class NotificationSender:
    """Send claimed notifications from a thread of this process (see the module docstring)."""

    def __init__(self, store: Store, policies: Iterable[Policy], now: Callable[[], datetime], *,
                 max_attempts: int = 5, backoff_s: float = 1.0, max_backoff_s: float = 60.0):
        self.store = store
        self.policies = list(policies)
        self.now = now
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._due: list[tuple[float, int, int]] = []  # (monotonic due, id, attempts made)
        self._wake = threading.Condition()
        self._stop = False
        self._busy = False
        self._thread: threading.Thread | None = None

    def start(self) -> NotificationSender:
        if self._thread is None:
            names = {t.name for p in self.policies for t in p.notifications.targets}
            if names:
                unsent = [n.id for n in self.store.notices(state=NoticeState.PENDING, limit=1000)
                          if n.target in names]
                self.submit(unsent)
            self._thread = threading.Thread(target=self._run, name="burst-notify", daemon=True)
            self._thread.start()
        return self

    def submit(self, notice_ids: Iterable[int]) -> None:
        with self._wake:
            for notice_id in notice_ids:
                heapq.heappush(self._due, (time.monotonic(), notice_id, 0))
            self._wake.notify()

    def idle(self) -> bool:
        """Nothing waiting to be sent or retried."""
        with self._wake:
            return not self._due and not self._busy

    def stop(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        with httpx.Client() as client:
            while True:
                with self._wake:
                    while not self._stop and (not self._due or self._due[0][0] > time.monotonic()):
                        wait = self._due[0][0] - time.monotonic() if self._due else None
                        self._wake.wait(wait)
                    if self._stop:
                        return
                    _, notice_id, made = heapq.heappop(self._due)
                    self._busy = True
                try:
                    self._send(client, notice_id, made)
                finally:
                    with self._wake:
                        self._busy = False

    def _send(self, client: httpx.Client, notice_id: int, made: int) -> None:
        final = made + 1 >= self.max_attempts
        try:
            attempt(self.store, self.policies, notice_id, self.now(), final=final, client=client)
        except NoTarget as exc:
            log.warning("%s", exc)
        except DeliveryFailed:
            if not final:
                delay = min(self.backoff_s * 2 ** made, self.max_backoff_s)
                with self._wake:
                    heapq.heappush(self._due, (time.monotonic() + delay, notice_id, made + 1))
        except Exception:  # noqa: BLE001 - the sender thread must outlive one bad row
            log.exception("notification %d: unexpected error while sending", notice_id)


__all__ = ["NotificationSender"]
