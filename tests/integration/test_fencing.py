"""Fencing tokens in the store, on real SQLite files and a real PostgreSQL database (no mocks).

Every test runs on both backends through the ``store`` fixture. The races are real threads on
separate connections, and the last test plays the issue's scenario end to end with a real Redis
lease: a leader paused past its lease comes back and its write is refused.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import redis
import sqlalchemy as sa

from orchestrator.automation.leader import LeaderLease
from orchestrator.domain import CapacityBlock, NodeState, PolicyMemory
from orchestrator.lifecycle import transition
from orchestrator.store import StaleLeaderError, Store
from orchestrator.store import tables as T
from orchestrator.store.fencing import Fence
from tests.integration.test_leader import redis_client, scope  # noqa: F401 - fixtures
from tests.integration.test_store import T0, make_decision, make_node, race

S = NodeState


def contents(store: Store) -> dict[str, Any]:
    """Everything a write could have changed, for before/after comparisons."""
    with store.engine.connect() as conn:
        tables = {
            t.name: sorted(tuple(r) for r in conn.execute(sa.select(t)))
            for t in (T.nodes, T.node_events, T.decisions, T.policy_memory, T.capacity_blocks,
                      T.jobs, T.join_attempts, T.fences)
        }
    # Rows hold dicts (JSON) and datetimes: compare their text, which is exact for both.
    return {name: repr(rows) for name, rows in tables.items()}


def test_fenced_writes_work_and_advance_the_fence(store: Store) -> None:
    assert store.fence is None and store.fence_token("p") is None
    leader = store.fenced("p", 1)
    assert leader.fence == Fence("p", 1)
    node, event = make_node(1)
    assert leader.add_node(node, event)
    new, ev = transition(node, S.LAUNCHING, at=T0, reason="launch")
    assert leader.save_transition(node, new, ev)
    leader.add_decision(make_decision(1))
    leader.save_memory("train", PolicyMemory(trigger_since=T0))
    assert store.fence_token("p") == 1
    # The view reads and writes the same database as the store it came from.
    assert store.get_node(node.id) == new
    assert leader.get_decision("d-1") == make_decision(1)
    assert store.load_memory() == {"train": PolicyMemory(trigger_since=T0)}


def test_older_token_is_refused_and_changes_nothing(store: Store) -> None:
    old, new = store.fenced("p", 1), store.fenced("p", 2)
    node, event = make_node(1)
    assert old.add_node(node, event)
    old.save_memory("train", PolicyMemory(trigger_since=T0))
    job = old.submit_job("vision", "a100", 8, 0, None, None, T0)

    new.save_memory("train", PolicyMemory(last_launch_at=T0))  # the new leader writes once
    assert store.fence_token("p") == 2
    before = contents(store)

    launching, ev = transition(node, S.LAUNCHING, at=T0, reason="stale launch")
    node2, event2 = make_node(2)
    refused_writes = [
        lambda: old.add_node(node2, event2),
        lambda: old.save_transition(node, launching, ev),
        lambda: old.update_node(node, gpus_busy=8),
        lambda: old.add_decision(make_decision(7)),
        lambda: old.save_memory("train", PolicyMemory()),
        lambda: old.add_capacity_block(CapacityBlock("k", T0 + timedelta(hours=1), "x"), T0),
        lambda: old.submit_job("vision", "a100", 8, 0, None, None, T0),
        lambda: old.start_job(job, placement="burst", node_id=node.id, at=T0),
        lambda: old.cancel_job(job.id),
        lambda: old.set_join_token(node.id, "hash", T0 + timedelta(hours=1)),
        lambda: old.record_join_attempt(node.id, T0, True, "stale"),
    ]
    for write in refused_writes:
        with pytest.raises(StaleLeaderError) as info:
            write()
        assert (info.value.scope, info.value.token, info.value.current) == ("p", 1, 2)
    assert contents(store) == before  # nothing written, the fence not lowered

    # The same token again is the same leader: allowed.
    assert store.fenced("p", 2).add_node(node2, event2)
    assert store.fence_token("p") == 2


def test_scopes_are_independent(store: Store) -> None:
    store.fenced("p", 9).save_memory("train", PolicyMemory())
    store.fenced("q", 1).save_memory("infer", PolicyMemory())  # q has its own, lower, tokens
    with pytest.raises(StaleLeaderError):
        store.fenced("p", 8).save_memory("train", PolicyMemory())
    assert (store.fence_token("p"), store.fence_token("q")) == (9, 1)


def test_unfenced_writes_are_unaffected(store: Store) -> None:
    store.fenced("p", 5).save_memory("train", PolicyMemory())
    statements: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", record)
    try:
        node, event = make_node(1)
        assert store.add_node(node, event)
        store.save_memory("train", PolicyMemory(trigger_since=T0))
        assert statements and not any("fences" in s for s in statements)
        # ...while a fenced view of the same engine does run the check, first in its transaction:
        seen = len(statements)
        store.fenced("p", 5).save_memory("train", PolicyMemory())
        fenced = [s for s in statements[seen:] if not s.lstrip().upper().startswith("BEGIN")]
        assert "fences" in fenced[0] and "policy_memory" in fenced[-1]
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", record)
    assert store.fence_token("p") == 5


def test_views_share_the_engine(store: Store) -> None:
    view = store.fenced("p", 1).fenced("p", 3)  # a view of a view replaces the fence
    assert view.fence == Fence("p", 3) and view.engine is store.engine
    view.save_memory("train", PolicyMemory())
    view.close()  # the engine is the store's: closing a view must not break the store
    store.save_memory("train", PolicyMemory(trigger_since=T0))
    assert store.fence_token("p") == 3
    for bad in (-1, True, "3", 1.5):
        with pytest.raises(ValueError, match="token"):
            store.fenced("p", bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scope"):
        store.fenced("", 1)


def test_race_of_two_tokens_refuses_every_old_write_after_the_new_one(store: Store) -> None:
    writes = 40
    old, new = store.fenced("p", 5), store.fenced("p", 6)
    outcomes: list[bool] = []  # the token-5 writer's results, in its own order
    old_has_written = threading.Event()
    new_outcomes: list[bool] = []

    def write(view: Store, name: str, i: int) -> bool:
        try:
            view.record_join_attempt(None, T0, True, f"{name}-{i}")
            return True
        except StaleLeaderError:
            return False

    def run(which: int) -> None:
        if which == 0:
            for i in range(writes):
                outcomes.append(write(old, "t5", i))
                if sum(outcomes) == 5:
                    old_has_written.set()  # the new leader starts while the old one still runs
            old_has_written.set()
        else:
            old_has_written.wait(timeout=30)
            new_outcomes.extend(write(new, "t6", i) for i in range(writes))

    race(2, run)
    assert all(new_outcomes) and len(new_outcomes) == writes
    assert sum(outcomes) >= 5
    first_refusal = outcomes.index(False) if False in outcomes else len(outcomes)
    # Once refused, the old leader stays refused.
    assert not any(outcomes[first_refusal:])

    c = T.join_attempts.c
    with store.engine.connect() as conn:
        order = [r for (r,) in conn.execute(sa.select(c.reason).order_by(c.id))]
    # Commit order (ids are assigned inside the fenced transactions, which the fence serialises):
    # no token-5 write landed after the first token-6 write.
    first_new = next(i for i, r in enumerate(order) if r.startswith("t6"))
    assert not any(r.startswith("t5") for r in order[first_new:])
    assert sum(r.startswith("t5") for r in order) == sum(outcomes)
    assert store.fence_token("p") == 6


def test_many_tokens_racing_commit_in_token_order(store: Store) -> None:
    # Four leaders released at once on a scope with no fence row yet: the first insert is raced
    # too. Whatever interleaving happens, committed writes never go back to a lower token.
    tokens = [3, 4, 5, 6]

    def run(i: int) -> int:
        view, accepted = store.fenced("p", tokens[i]), 0
        for n in range(15):
            try:
                view.record_join_attempt(None, T0, True, str(tokens[i]))
                accepted += 1
            except StaleLeaderError:
                pass
            if n % 4 == 0:
                time.sleep(0.001)  # let the others interleave
        return accepted

    accepted = race(len(tokens), run)
    assert accepted[-1] == 15  # the highest token is never refused
    c = T.join_attempts.c
    with store.engine.connect() as conn:
        committed = [int(r) for (r,) in conn.execute(sa.select(c.reason).order_by(c.id))]
    assert committed == sorted(committed)
    assert sum(accepted) == len(committed)
    assert store.fence_token("p") == 6


def test_paused_leader_is_fenced_out_end_to_end(
    store: Store, redis_client: redis.Redis, scope: str  # noqa: F811 - fixtures
) -> None:
    # Leader A takes the lease for 1 s and writes.
    a = LeaderLease(redis_client, scope, 1.0)
    t1 = a.acquire()
    assert t1 is not None
    store.fenced(scope, t1).save_memory("train", PolicyMemory(trigger_since=T0))

    time.sleep(1.1)  # A "pauses" (a GC, a frozen VM) past its lease without knowing

    # B takes over with a larger token and writes.
    b = LeaderLease(redis_client, scope, 5.0)
    t2 = b.acquire()
    assert t2 is not None and t2 > t1
    b_memory = PolicyMemory(last_launch_at=T0 + timedelta(minutes=1))
    store.fenced(scope, t2).save_memory("train", b_memory)

    # A wakes up still believing it leads, and writes with its old token: refused.
    assert a.token == t1
    node, event = make_node(1)
    with pytest.raises(StaleLeaderError) as info:
        store.fenced(scope, t1).save_memory("train", PolicyMemory(last_drain_at=T0))
    assert (info.value.token, info.value.current) == (t1, t2)
    with pytest.raises(StaleLeaderError):
        store.fenced(scope, t1).add_node(node, event)
    assert store.load_memory() == {"train": b_memory}
    assert store.get_node(node.id) is None
    # And A cannot touch B's lease either.
    assert a.renew() is False and a.release() is False and b.held
