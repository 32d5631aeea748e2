"""Leadership: a lease in Redis, with a fencing token, so only one planner acts per policy per tick.

``LeaderLease(redis, scope, lease_s)`` competes for the key ``burst:leader:<scope>``. Whoever sets
it (``SET key owner NX PX lease``) leads until the lease runs out, unless it renews in time.
Every successful acquisition also takes the next value of the counter ``burst:fence:<scope>``:
that is the holder's fencing token, and tokens strictly increase from one holder to the next.

Why a lease is not enough (Kleppmann, "How to do distributed locking", 2016): a holder can stop
for longer than its lease without knowing it (a GC pause, swapping, a frozen VM, a network
partition that delays its packets). Meanwhile the lease expires and another process takes over.
When the first one resumes, nothing on its side tells it that it no longer leads, and a check of
the lease just before writing does not help, because the pause can fall between the check and the
write. Only the party that receives the writes can tell the two apart, so the token travels with
every write and the store checks it: ``store.fenced(scope, token)`` refuses (and rolls back) any
write carrying a token lower than one it has already accepted for that scope
(``orchestrator.store.fencing``). The lease keeps two leaders from both *trying* most of the time;
the fence makes sure a deposed one cannot *succeed*.

Acquiring and taking the token are one Lua script, so they happen together: were they two
commands, a holder paused between its SET and its INCR could come back after its lease expired
and draw a token larger than its successor's, fencing out the rightful leader instead.

The counter must outlive the leases. If Redis loses it (a restart without persistence) the next
tokens start again at 1 and the store refuses them all; passing the store's highest token as
``floor`` (``store.fence_token(scope)``) restarts the counter above it.

Keys hold the owner string; the scripts compare it server-side so a holder only ever extends or
deletes its own lease, never a successor's. redis-py is imported only for type checking: this
module works with any client offering ``register_script`` and ``get``.
"""

from __future__ import annotations

import math
import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from redis import Redis

LEADER_PREFIX = "burst:leader:"
FENCE_PREFIX = "burst:fence:"

# KEYS[1] the lease, KEYS[2] the fence counter; ARGV[1] owner, ARGV[2] lease in ms, ARGV[3] floor.
_ACQUIRE = """
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return false
end
local token = redis.call('INCR', KEYS[2])
local floor = tonumber(ARGV[3])
if token <= floor then
  token = floor + 1
  redis.call('SET', KEYS[2], string.format('%.0f', token))
end
return token
"""

# Extend only if the key still holds our owner value: after an expiry someone else may own it.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Delete only if ours: a late release must never free a successor's lease.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


def default_owner() -> str:
    """An owner id unique to this lease object: host, process and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"


class LeaderLease:
    """One contender for the leadership of ``scope``.

    ``owner`` must be unique per contender (the default is): two leases sharing an owner string
    would each take the other's lease for their own. Not thread-safe; use one per thread.
    """

    def __init__(
        self, redis_client: Redis[Any], scope: str, lease_s: float, owner: str | None = None
    ) -> None:
        if not isinstance(scope, str) or not scope:
            raise ValueError(f"scope must be a non-empty string, got {scope!r}")
        if not lease_s > 0 or math.isinf(lease_s):  # also refuses NaN
            raise ValueError(f"lease_s must be a positive number of seconds, got {lease_s!r}")
        self.scope = scope
        self.key = LEADER_PREFIX + scope
        self.fence_key = FENCE_PREFIX + scope
        self.lease_ms = max(1, math.ceil(lease_s * 1000))
        self.owner = owner or default_owner()
        self._redis = redis_client
        self._acquire = redis_client.register_script(_ACQUIRE)
        self._renew = redis_client.register_script(_RENEW)
        self._release = redis_client.register_script(_RELEASE)
        self._token: int | None = None

    @property
    def token(self) -> int | None:
        """The fencing token of the current tenure as this contender believes it, or None.

        A belief, not a fact: the lease may have expired since. Pass it to ``store.fenced``."""
        return self._token

    @property
    def held(self) -> bool:
        """Whether Redis holds our owner value under the lease key right now (one round trip).

        True can be stale the moment it returns, which is why writes carry the token."""
        if self._token is None:
            return False
        value = self._redis.get(self.key)
        if isinstance(value, bytes):
            value = value.decode()
        return value == self.owner

    def acquire(self, floor: int = 0) -> int | None:
        """Take the lease: the new fencing token, or None if another contender holds it.

        Called again while we still hold it, it renews and returns the same token (one tenure,
        one token). ``floor``: a token the new one must exceed (see the module docstring).
        """
        if self._token is not None and self.renew():
            return self._token
        token = self._acquire(
            keys=[self.key, self.fence_key], args=[self.owner, self.lease_ms, int(floor)]
        )
        self._token = int(token) if token is not None else None
        return self._token

    def renew(self) -> bool:
        """Extend the lease by ``lease_s`` from now if it is still ours. False if it expired or
        another contender took it; the tenure is then over, and a new one needs ``acquire()``."""
        if self._token is None:
            return False
        renewed = bool(self._renew(keys=[self.key], args=[self.owner, self.lease_ms]))
        if not renewed:
            self._token = None
        return renewed

    def release(self) -> bool:
        """Give the lease up if it is still ours. True if our key was deleted; a lease that
        expired or passed to another contender is left alone."""
        self._token = None
        return bool(self._release(keys=[self.key], args=[self.owner]))


@contextmanager
def lead(
    redis_client: Redis[Any], scope: str, lease_s: float, *, floor: int = 0
) -> Iterator[int | None]:
    """Lead ``scope`` for the duration of the block: yields the fencing token, or None if another
    contender holds the lease (the block should then do nothing). Releases on exit."""
    lease = LeaderLease(redis_client, scope, lease_s)
    token = lease.acquire(floor)
    try:
        yield token
    finally:
        if token is not None:
            lease.release()


__all__ = ["FENCE_PREFIX", "LEADER_PREFIX", "LeaderLease", "default_owner", "lead"]
