"""The leader lease against a real Redis server on 127.0.0.1:6379 (no fakes).

Each test gets its own scope (so its own ``burst:leader:*`` / ``burst:fence:*`` keys), deleted
afterwards. An unreachable Redis fails the tests with the command that starts it: a skipped
leadership test would hide a regression. The ``redis_client`` and ``scope`` fixtures are also used
by test_fencing.py.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from orchestrator.automation.leader import FENCE_PREFIX, LEADER_PREFIX, LeaderLease, lead

REDIS_URL = os.environ.get("BURST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
REDIS_START_HINT = (
    'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no'
)


@pytest.fixture
def redis_client() -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=5)
    try:
        client.ping()
        reachable = True
    except redis.exceptions.ConnectionError:
        reachable = False
    if not reachable:
        # Failed outside the except block so the report is this one line, not a driver traceback.
        client.close()
        pytest.fail(f"Redis at {REDIS_URL} is not reachable; start it with: {REDIS_START_HINT}",
                    pytrace=False)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def scope(redis_client: redis.Redis) -> Iterator[str]:
    """A scope no other test (or earlier run) uses; its keys are deleted afterwards."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        redis_client.delete(LEADER_PREFIX + name, FENCE_PREFIX + name)


def holder(client: redis.Redis, scope: str) -> str | None:
    value = client.get(LEADER_PREFIX + scope)
    return value.decode() if value is not None else None


def test_one_holder_at_a_time(redis_client: redis.Redis, scope: str) -> None:
    a = LeaderLease(redis_client, scope, 5)
    b = LeaderLease(redis_client, scope, 5)
    assert a.owner != b.owner
    token = a.acquire()
    assert isinstance(token, int) and token >= 1
    assert a.held and a.token == token
    assert b.acquire() is None  # refused while a's lease runs
    assert not b.held and b.token is None
    assert not b.renew()
    assert holder(redis_client, scope) == a.owner
    # Acquiring again while holding is a renewal of the same tenure: same token.
    assert a.acquire() == token
    ttl = redis_client.pttl(LEADER_PREFIX + scope)
    assert 4000 < ttl <= 5000


def test_takeover_after_expiry_gets_a_larger_token(redis_client: redis.Redis, scope: str) -> None:
    old = LeaderLease(redis_client, scope, 0.2)
    t1 = old.acquire()
    assert t1 is not None
    time.sleep(0.3)  # old "pauses" past its lease
    assert not old.held

    taken: list[int | None] = []
    new_owner = f"other-{uuid.uuid4().hex}"

    def take_over() -> None:
        # Another thread with its own client, as another worker would be.
        client = redis.Redis.from_url(REDIS_URL)
        try:
            taken.append(LeaderLease(client, scope, 5, owner=new_owner).acquire())
        finally:
            client.close()

    thread = threading.Thread(target=take_over)
    thread.start()
    thread.join(timeout=10)
    assert taken and taken[0] is not None and taken[0] > t1

    # The old holder wakes up: it can neither extend nor free the new holder's lease.
    assert old.token == t1  # it still believes it leads: that belief is what the fence is for
    assert old.renew() is False
    assert old.token is None
    assert old.release() is False
    assert holder(redis_client, scope) == new_owner
    assert redis_client.pttl(LEADER_PREFIX + scope) > 4000  # not shortened either


def test_release_frees_only_our_own_lease(redis_client: redis.Redis, scope: str) -> None:
    a = LeaderLease(redis_client, scope, 5)
    b = LeaderLease(redis_client, scope, 5)
    assert a.acquire() is not None
    assert b.release() is False  # never held: must not delete a's key
    assert holder(redis_client, scope) == a.owner
    assert a.release() is True
    assert holder(redis_client, scope) is None
    assert a.release() is False  # already gone
    assert b.acquire() is not None


def test_renew_extends_the_lease(redis_client: redis.Redis, scope: str) -> None:
    a = LeaderLease(redis_client, scope, 0.5)
    assert a.acquire() is not None
    for _ in range(3):  # 0.6 s in all, past the 0.5 s lease; 0.3 s of slack per renewal
        time.sleep(0.2)
        assert a.renew()
    assert a.held
    assert LeaderLease(redis_client, scope, 1).acquire() is None


def test_renew_after_a_lapse_ends_the_tenure(redis_client: redis.Redis, scope: str) -> None:
    a = LeaderLease(redis_client, scope, 0.1)
    t1 = a.acquire()
    time.sleep(0.2)
    # Nobody took over, but the lease lapsed: the tenure is over and the next one is new.
    assert a.renew() is False
    t2 = a.acquire()
    assert t1 is not None and t2 is not None and t2 > t1


def test_tokens_strictly_increase_over_handovers(redis_client: redis.Redis, scope: str) -> None:
    leases = [LeaderLease(redis_client, scope, 5) for _ in range(3)]
    tokens: list[int] = []
    for i in range(50):
        lease = leases[i % 3]
        token = lease.acquire()
        assert token is not None, f"handover {i} refused"
        tokens.append(token)
        assert all(other.acquire() is None for other in leases if other is not lease)
        assert lease.release()
    assert all(b > a for a, b in itertools.pairwise(tokens)), tokens
    assert int(redis_client.get(FENCE_PREFIX + scope) or 0) == tokens[-1]


def test_floor_restarts_a_lost_counter_above_the_store(
    redis_client: redis.Redis, scope: str
) -> None:
    a = LeaderLease(redis_client, scope, 5)
    assert a.acquire() == 1
    assert a.release()
    redis_client.delete(FENCE_PREFIX + scope)  # Redis restarted without persistence
    assert a.acquire(floor=41) == 42
    assert a.release()
    assert a.acquire(floor=3) == 43  # a floor below the counter changes nothing


def test_two_threads_racing_never_both_hold(redis_client: redis.Redis, scope: str) -> None:
    rounds = 200
    barrier = threading.Barrier(2)
    guard = threading.Lock()
    holding = 0
    most = 0
    wins: list[int] = []
    errors: list[BaseException] = []

    def contender() -> None:
        nonlocal holding, most
        client = redis.Redis.from_url(REDIS_URL)
        lease = LeaderLease(client, scope, 5)
        try:
            for _ in range(rounds):
                barrier.wait(timeout=10)
                token = lease.acquire()
                if token is None:
                    continue
                with guard:
                    holding += 1
                    most = max(most, holding)
                    wins.append(token)
                time.sleep(0)  # give the other thread a chance to (wrongly) get in
                assert lease.held
                with guard:
                    holding -= 1
                assert lease.release()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread below
            errors.append(exc)
            barrier.abort()
        finally:
            client.close()

    threads = [threading.Thread(target=contender) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    assert most == 1
    # Each round starts with the lease free (the winner releases before the next barrier), so
    # every round has a winner; the loser may still win the same round after the winner released.
    # Each tenure takes a new, larger token.
    assert rounds <= len(wins) <= 2 * rounds
    assert wins == sorted(set(wins))


def test_lead_context_manager(redis_client: redis.Redis, scope: str) -> None:
    with lead(redis_client, scope, 5) as token:
        assert token is not None
        with lead(redis_client, scope, 5) as second:
            assert second is None  # someone else leads: the block must do nothing
        assert holder(redis_client, scope) is not None  # the refused block released nothing
    assert holder(redis_client, scope) is None
    with lead(redis_client, scope, 5) as next_token:
        assert next_token is not None and next_token > token


def test_lease_arguments_are_checked(redis_client: redis.Redis) -> None:
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lease_s"):
            LeaderLease(redis_client, "x", bad)
    with pytest.raises(ValueError, match="scope"):
        LeaderLease(redis_client, "", 1)
