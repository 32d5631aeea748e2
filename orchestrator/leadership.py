"""Controller leadership: which scopes this controller leads now, and since when it could see.

Every driver of the control loop holds a :class:`Controller` (a holder of store leases,
:mod:`orchestrator.store.leases`). Each pass it claims the scopes it means to act on,
``reconcile`` and ``policy:<name>``; a scope another live controller leads is skipped (reported,
not an error), and the writes for the scopes it does lead go through a store view fenced with
their lease tokens, so a controller taken over mid-pass cannot write past its successor.

Two kinds of holder:

* process-bound (the embedded ``burst run``, an in-process evaluation): host and pid are stored
  with the lease, so a contender on the same host takes over at once once that process is gone;
  ``burst run`` releases its leases on a clean stop.
* a deployment (Celery workers and beat on one broker): one holder id shared by all its workers,
  so a tenure continues from task to task and worker to worker while any renews; it ends only by
  expiry. Among its workers the Redis leases (``orchestrator.automation.leader``) still decide.

:meth:`Controller.observing_since` is the start of what this controller could have heard from
agents: the later of its tenure of ``reconcile`` (restarted when no pass renewed it for longer
than :func:`watch_gap`: a deployment whose workers were all down saw nothing meanwhile, though
its lease outlived the outage) and the current API presence window
(:mod:`orchestrator.store.presence`). The reconciler judges liveness and state timeouts from it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from orchestrator.store import Store
from orchestrator.store.leases import Lease

log = logging.getLogger(__name__)

RECONCILE = "reconcile"
MIN_TTL = timedelta(seconds=30)
MIN_GAP = timedelta(seconds=10)


def policy_scope(name: str) -> str:
    return f"policy:{name}"


def watch_gap(tick_s: float) -> timedelta:
    """The longest silence between two claims that still counts as watching throughout.

    Twice the Celery reconcile period (three ticks) and then some, so ordinary lag never
    restarts a watch (a watch restarted every pass would never let a timeout fire); a longer
    silence means no pass could run (every worker down, the broker restarting, the process
    paused), and time in it must not count against nodes."""
    return max(MIN_GAP, timedelta(seconds=6 * tick_s))


def lease_ttl(tick_s: float) -> timedelta:
    """A controller lease outlives several ticks (and the reconcile period of the Celery beat,
    three ticks), so a tenure only ends when its holder stops renewing, not between passes."""
    return max(MIN_TTL, timedelta(seconds=10 * tick_s))


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a lease: an id, and for a process-bound holder its host and pid."""

    id: str
    host: str | None = None
    pid: int | None = None

    @classmethod
    def this_process(cls, kind: str) -> Holder:
        host, pid = socket.gethostname(), os.getpid()
        return cls(f"{kind}:{host}:{pid}:{uuid.uuid4().hex[:8]}", host, pid)

    @classmethod
    def deployment(cls, kind: str, address: str) -> Holder:
        """One id for every process of a deployment (e.g. Celery workers on one broker)."""
        digest = hashlib.sha256(address.encode()).hexdigest()[:12]
        return cls(f"{kind}:{digest}")


@dataclass(slots=True)
class Claims:
    """What one claim found: the leases we hold and the scopes others lead (scope -> holder)."""

    held: dict[str, Lease] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    new_tenures: list[str] = field(default_factory=list)

    def leads(self, scope: str) -> bool:
        return scope in self.held


class Controller:
    """One controller's leases in the store; not thread-safe (one per driving thread)."""

    def __init__(self, store: Store, holder: Holder, ttl: timedelta,
                 max_gap: timedelta | None = None) -> None:
        self.store = store
        self.holder = holder
        self.ttl = ttl
        self.max_gap = max_gap  # see watch_gap; None: a tenure's watch never restarts
        self.held: dict[str, Lease] = {}

    def claim(self, scopes: list[str], now: datetime) -> Claims:
        """Take or renew each scope; drop the ones another live controller leads."""
        claims = Claims()
        for scope in scopes:
            got = self.store.acquire_lease(scope, self.holder.id, now, self.ttl,
                                           host=self.holder.host, pid=self.holder.pid,
                                           max_gap=self.max_gap)
            if not got.granted:
                if self.held.pop(scope, None) is not None:
                    log.warning("lost the lease of %s to %s", scope, got.lease.holder)
                claims.skipped[scope] = got.lease.holder
                continue
            if got.resumed_after is not None:
                log.warning("%s: no pass for %.0fs (longer than %.0fs): what this controller "
                            "observes counts again from now", scope,
                            got.resumed_after.total_seconds(), self.max_gap.total_seconds())
            if got.new_tenure:
                claims.new_tenures.append(scope)
                if got.took_over:
                    log.warning("%s: took over from %s, whose process is gone", scope,
                                got.took_over)
                else:
                    log.info("%s: leading (token %d)", scope, got.lease.token)
            self.held[scope] = got.lease
            claims.held[scope] = got.lease
        return claims

    def view(self, scopes: list[str], store: Store | None = None) -> Store:
        """``store`` (default ours) fenced with the leases we hold of ``scopes`` (and its own
        fences, if it is a fenced view already)."""
        base = store or self.store
        fences = [self.held[s].fence for s in scopes if s in self.held]
        return base.fenced_by(*base.fences, *fences)

    def observing_since(self, now: datetime) -> datetime | None:
        """Since when this controller could have heard agents: the later of its ``reconcile``
        tenure and the current API presence window (None if neither is known)."""
        starts = []
        lease = self.held.get(RECONCILE)
        if lease is not None:
            starts.append(lease.acquired_at)
        window = self.store.presence_window_start(now)
        if window is not None:
            starts.append(window)
        return max(starts) if starts else None

    def release_all(self, now: datetime) -> None:
        """Give up every lease held (a clean stop): a successor need not wait for expiry."""
        for scope, lease in list(self.held.items()):
            try:
                self.store.release_lease(lease, now)
            except Exception:  # noqa: BLE001 - expiry frees it anyway
                log.warning("could not release the lease of %s", scope, exc_info=True)
        self.held.clear()


__all__ = ["RECONCILE", "Claims", "Controller", "Holder", "lease_ttl", "policy_scope", "watch_gap"]
