"""Controller leases and API presence in the store, on real SQLite and PostgreSQL (no mocks).

The lease is what makes one controller plan a pool at a time; its token fences the holder's writes.
Presence windows bound what a controller could have heard from agents.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import timedelta

import pytest

from orchestrator.domain import PolicyMemory
from orchestrator.store import StaleLeaderError, Store
from tests.integration.test_store import T0, race

TTL = timedelta(seconds=30)
HOST = socket.gethostname()


def test_acquire_renew_refuse_and_expire(store: Store) -> None:
    first = store.acquire_lease("policy:fast", "a", T0, TTL)
    assert first.granted and first.new_tenure and first.lease.token == 1
    assert first.lease.acquired_at == T0 and first.lease.expires_at == T0 + TTL
    # Renewal: the same tenure (token, start), a later expiry.
    again = store.acquire_lease("policy:fast", "a", T0 + timedelta(seconds=10), TTL)
    assert again.granted and not again.new_tenure
    assert (again.lease.token, again.lease.acquired_at) == (1, T0)
    assert again.lease.expires_at == T0 + timedelta(seconds=40)
    # Another holder is refused while the lease lives, and told who holds it.
    other = store.acquire_lease("policy:fast", "b", T0 + timedelta(seconds=39), TTL)
    assert not other.granted and other.lease.holder == "a"
    # Scopes are independent.
    assert store.acquire_lease("reconcile", "b", T0, TTL).granted
    # Expired: b takes over with a higher token and a new tenure.
    later = T0 + timedelta(seconds=41)
    took = store.acquire_lease("policy:fast", "b", later, TTL)
    assert took.granted and took.new_tenure and took.lease.token == 2
    assert took.lease.acquired_at == later and took.took_over is None


def test_a_deposed_holder_is_fenced_out_before_the_new_one_writes(store: Store) -> None:
    old = store.acquire_lease("policy:fast", "a", T0, TTL).lease
    writer = store.fenced_by(old.fence)
    writer.save_memory("fast", PolicyMemory(last_launch_at=T0))
    store.acquire_lease("policy:fast", "b", T0 + TTL + timedelta(seconds=1), TTL)
    with pytest.raises(StaleLeaderError):
        writer.save_memory("fast", PolicyMemory())
    assert store.load_memory()["fast"] == PolicyMemory(last_launch_at=T0)


def test_expired_lease_taken_again_by_its_holder_is_a_new_tenure(store: Store) -> None:
    store.acquire_lease("reconcile", "a", T0, TTL)
    back = store.acquire_lease("reconcile", "a", T0 + timedelta(minutes=5), TTL)
    assert back.granted and back.new_tenure and back.lease.token == 2
    assert back.lease.acquired_at == T0 + timedelta(minutes=5)


def test_a_renewal_after_a_long_silence_restarts_the_watch_not_the_tenure(store: Store) -> None:
    """A deployment whose workers were all down for longer than max_gap, but shorter than its
    lease, keeps its tenure (same token: its fenced writes stay valid) while what it observed
    counts again from its return (the Celery chaos run failed a node on a launch timeout that ran
    while no worker could launch or reconcile)."""
    gap = timedelta(seconds=10)
    store.acquire_lease("reconcile", "celery", T0, TTL, max_gap=gap)
    steady = store.acquire_lease("reconcile", "celery", T0 + timedelta(seconds=10), TTL, max_gap=gap)
    assert steady.resumed_after is None and steady.lease.acquired_at == T0
    back_at = T0 + timedelta(seconds=37)  # 27 s of silence; the lease (30 s) still lives
    back = store.acquire_lease("reconcile", "celery", back_at, TTL, max_gap=gap)
    assert back.granted and not back.new_tenure and back.lease.token == 1
    assert back.resumed_after == timedelta(seconds=27) and back.lease.acquired_at == back_at
    # Without max_gap (callers that never pause), the tenure's start stands.
    store.acquire_lease("policy:p", "x", T0, TTL)
    plain = store.acquire_lease("policy:p", "x", T0 + timedelta(seconds=27), TTL)
    assert plain.resumed_after is None and plain.lease.acquired_at == T0


def test_the_watch_gap_is_never_tighter_than_twice_the_reconcile_period() -> None:
    from orchestrator.leadership import MIN_GAP, watch_gap

    # Never tighter than twice the Celery reconcile period (three ticks).
    for tick_s in (0.5, 1.0, 2.0, 10.0, 30.0):
        assert watch_gap(tick_s) >= timedelta(seconds=2 * 3 * tick_s)
        assert watch_gap(tick_s) >= MIN_GAP


def test_release_frees_the_lease_and_only_our_tenure(store: Store) -> None:
    a = store.acquire_lease("reconcile", "a", T0, TTL).lease
    assert store.release_lease(a, T0 + timedelta(seconds=1))
    assert not store.release_lease(a, T0 + timedelta(seconds=1))  # already released
    b = store.acquire_lease("reconcile", "b", T0 + timedelta(seconds=2), TTL)
    assert b.granted and b.lease.token == 2  # at once, no TTL wait, and the token still grows
    assert not store.release_lease(a, T0 + timedelta(seconds=3))  # a stale release frees nothing
    assert store.lease("reconcile").holder == "b"


def test_a_dead_process_on_this_host_is_taken_over_at_once(store: Store) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead_pid = int(gone.stdout)
    store.acquire_lease("policy:fast", "run-1", T0, TTL, host=HOST, pid=dead_pid)
    claim = store.acquire_lease("policy:fast", "run-2", T0 + timedelta(seconds=1), TTL,
                                host=HOST, pid=12345678)
    assert claim.granted and claim.took_over == "run-1" and claim.lease.token == 2


def test_a_live_process_or_another_host_keeps_its_lease(store: Store) -> None:
    import os

    store.acquire_lease("policy:fast", "run-1", T0, TTL, host=HOST, pid=os.getpid())
    assert not store.acquire_lease("policy:fast", "run-2", T0, TTL, host=HOST, pid=1).granted
    store.acquire_lease("reconcile", "far", T0, TTL, host="elsewhere", pid=99999999)
    assert not store.acquire_lease("reconcile", "run-2", T0, TTL, host=HOST, pid=1).granted
    # A holder that is not process-bound (a Celery deployment) is only ever taken over on expiry.
    store.acquire_lease("policy:x", "celery", T0, TTL)
    assert not store.acquire_lease("policy:x", "run-2", T0, TTL, host=HOST, pid=1).granted


def test_concurrent_contenders_one_wins(store: Store) -> None:
    claims = race(6, lambda i: store.acquire_lease("policy:fast", f"h{i}", T0, TTL))
    assert sum(c.granted for c in claims) == 1
    winner = next(c for c in claims if c.granted)
    assert all(c.lease.holder == winner.lease.holder for c in claims)


def test_bad_lease_arguments_are_refused(store: Store) -> None:
    with pytest.raises(ValueError, match="scope and a holder"):
        store.acquire_lease("", "a", T0, TTL)
    with pytest.raises(ValueError, match="ttl"):
        store.acquire_lease("s", "a", T0, timedelta(0))
    with pytest.raises(ValueError, match="tz-aware"):
        store.acquire_lease("s", "a", T0.replace(tzinfo=None), TTL)


# -- presence ----------------------------------------------------------------------------------

P = timedelta(seconds=2)


def test_presence_window_is_the_current_run_of_api_processes(store: Store) -> None:
    assert store.presence_window_start(T0) is None  # never recorded: nothing to go by
    s = lambda n: T0 + timedelta(seconds=n)  # noqa: E731
    store.record_presence("api-1", s(0), s(0))
    store.record_presence("api-1", s(0), s(100))
    assert store.presence_window_start(s(101), P) == s(0)
    # api-1 killed at ~100; the API is down: nothing can be heard, the window starts now.
    assert store.presence_window_start(s(200), P) == s(200)
    # api-2 starts long after: a new window.
    store.record_presence("api-2", s(300), s(300))
    assert store.presence_window_start(s(301), P) == s(300)
    # api-3 starts while api-2 is up (a replica, a rolling restart), api-2 stops: one window.
    store.record_presence("api-2", s(300), s(310))
    store.record_presence("api-3", s(309), s(309))
    store.end_presence("api-2", s(311))
    store.record_presence("api-3", s(309), s(320))
    assert store.presence_window_start(s(321), P) == s(300)
