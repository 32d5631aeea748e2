"""Controller leases in the store: one controller plans a pool at a time, however it is driven.

A lease is a row of ``leases`` per scope (``reconcile``, ``policy:<name>``): its holder, until when,
the start of the holder's tenure and a token that grows with every new tenure. Every driver of the
control loop (the embedded ``burst run``, the Celery tick and reconcile tasks, a public evaluate
task) takes the same lease before it plans or reconciles a scope, so they exclude each other
whatever process or machine they run in: the store is the one thing they all share (Redis is not,
an embedded loop has none).

* ``acquire_lease``: take a free or expired lease (a new tenure: token + 1, ``acquired_at`` now),
  renew our own (same token, same tenure; after a silence over ``max_gap`` the tenure's watch
  restarts, ``acquired_at`` now), or report the live holder (not granted). A holder that
  names its host and pid is *process-bound*: a contender on the same host whose pid is gone takes
  over at once, so a restarted ``burst run`` need not wait out the TTL of the one killed before it.
* ``release_lease``: give it up on a clean stop (only our own tenure; a successor's is untouched).

The token is also a fencing token: a new tenure advances the fence ``lease:<scope>`` in the same
transaction, and the holder's writes go through ``store.fenced_by(lease.fence)``; so a holder that
was paused past its expiry and taken over is refused by the store on its next write, even before
the new holder wrote anything. (Redis leases among Celery workers of one deployment keep their own
fences, ``orchestrator.automation.leader``; a view may carry both.)

Atomic on both backends: SQLite write transactions hold the database lock from BEGIN; on
PostgreSQL the row is created if missing (ON CONFLICT DO NOTHING) and then locked FOR UPDATE, so
two contenders are serialised on it. Times are passed in, never read from a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psutil
import sqlalchemy as sa

from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.fence import Fence

FENCE_PREFIX = "lease:"


def lease_fence_scope(scope: str) -> str:
    """The fence scope of a lease's tokens (apart from the Redis leases' own fences)."""
    return FENCE_PREFIX + scope


@dataclass(frozen=True, slots=True)
class Lease:
    """One lease as the store has it."""

    scope: str
    holder: str  # "" once released
    token: int
    acquired_at: datetime  # start of the current tenure
    renewed_at: datetime
    expires_at: datetime
    host: str | None = None
    pid: int | None = None

    @property
    def fence(self) -> Fence:
        """The fence this tenure's writes carry."""
        return Fence(lease_fence_scope(self.scope), self.token)

    def live(self, now: datetime) -> bool:
        return bool(self.holder) and self.expires_at > now


@dataclass(frozen=True, slots=True)
class LeaseClaim:
    """The answer to ``acquire_lease``: ``granted`` with our lease, or the live holder's."""

    granted: bool
    lease: Lease
    new_tenure: bool = False
    took_over: str | None = None  # a dead process-bound holder we replaced before its expiry
    resumed_after: timedelta | None = None  # a renewal after a silence over max_gap: watch restarts


def _lease(row: sa.Row[Any]) -> Lease:
    m = row._mapping
    return Lease(scope=m["scope"], holder=m["holder"], token=int(m["token"]),
                 acquired_at=m["acquired_at"], renewed_at=m["renewed_at"],
                 expires_at=m["expires_at"], host=m["host"], pid=m["pid"])


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this host (a zombie counts as gone: it runs nothing)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:
        return False  # e.g. access denied: it exists


class Leases(StoreBase):
    """The lease methods of the Store."""

    def acquire_lease(self, scope: str, holder: str, now: datetime, ttl: timedelta, *,
                      host: str | None = None, pid: int | None = None,
                      max_gap: timedelta | None = None) -> LeaseClaim:
        """Take, renew or be refused the lease of ``scope`` for ``ttl`` from ``now``.

        ``host``/``pid``: given, the lease is bound to that process (see the module docstring).
        An expired lease taken again by the same holder starts a new tenure: it was away longer
        than its lease, so what it observed before says nothing about now.

        ``max_gap``: a renewal more than this after the previous one keeps the tenure (same token)
        but restarts its watch (``acquired_at`` = now): the holder was away that long (every
        worker of a deployment down, its broker restarting), so it saw nothing meanwhile, even
        though its lease had not expired yet.
        """
        require_aware(now, "now")
        if not scope or not holder:
            raise ValueError(f"a lease needs a scope and a holder, got {scope!r}, {holder!r}")
        if ttl <= timedelta(0):
            raise ValueError(f"lease ttl must be positive, got {ttl}")
        c = T.leases.c
        with self._write() as conn:
            conn.execute(self._insert(T.leases).values(
                scope=scope, holder="", token=0, acquired_at=now, renewed_at=now,
                expires_at=now).on_conflict_do_nothing())
            current = _lease(conn.execute(
                sa.select(T.leases).where(c.scope == scope).with_for_update()).one())
            took_over = None
            if current.live(now) and current.holder != holder:
                dead = (current.pid is not None and host is not None and current.host == host
                        and current.pid != pid and process_gone(current.pid))
                if not dead:
                    return LeaseClaim(False, current)
                took_over = current.holder
            values = {"renewed_at": now, "expires_at": now + ttl, "host": host, "pid": pid}
            renewal = current.holder == holder and current.live(now)
            resumed_after = None
            if renewal and max_gap is not None and now - current.renewed_at > max_gap:
                resumed_after = now - current.renewed_at
                values["acquired_at"] = now
            if not renewal:
                floor = conn.execute(sa.select(T.fences.c.token).where(
                    T.fences.c.scope == lease_fence_scope(scope))).scalar() or 0
                values |= {"holder": holder, "token": max(current.token, int(floor)) + 1,
                           "acquired_at": now}
            conn.execute(sa.update(T.leases).where(c.scope == scope).values(**values))
            lease = _lease(conn.execute(sa.select(T.leases).where(c.scope == scope)).one())
            if not renewal:
                # Fence the predecessor out now, not at our first write: its next write fails.
                lease.fence.check(conn)
        return LeaseClaim(True, lease, new_tenure=not renewal, took_over=took_over,
                          resumed_after=resumed_after)

    def release_lease(self, lease: Lease, now: datetime) -> bool:
        """Give up ``lease`` if its tenure is still the current one; False otherwise. The row
        stays (no holder, expired), so the next tenure's token is still higher."""
        require_aware(now, "now")
        c = T.leases.c
        with self._write() as conn:
            done = conn.execute(sa.update(T.leases).where(
                c.scope == lease.scope, c.holder == lease.holder, c.token == lease.token,
            ).values(holder="", expires_at=now, renewed_at=now, pid=None)).rowcount
        return done == 1

    def lease(self, scope: str) -> Lease | None:
        """The lease row of ``scope`` (live or not), or None if none was ever taken."""
        with self._read() as conn:
            row = conn.execute(sa.select(T.leases).where(T.leases.c.scope == scope)).first()
        return _lease(row) if row is not None else None

    def leases(self) -> list[Lease]:
        """Every lease row, by scope (for status displays)."""
        with self._read() as conn:
            rows = conn.execute(sa.select(T.leases).order_by(T.leases.c.scope)).all()
        return [_lease(r) for r in rows]


__all__ = ["FENCE_PREFIX", "Lease", "LeaseClaim", "Leases", "lease_fence_scope", "process_gone"]
