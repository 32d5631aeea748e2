"""The node wait model's node space kept across plans (orchestrator.planner.node_steps, and what
orchestrator.planner.node_shape keeps for it): on any sequence of pools and instants, the space
made from the kept entry, which reads a node's steps only when asked, answers as the space built
in full from the releases, and what is kept equals what is computed from scratch."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.pending import to_us
from orchestrator.domain.snapshot import OnPremRelease, OnPremState, PoolQueue
from orchestrator.planner import node_shape, node_steps
from orchestrator.planner.backfill import NodeSpace

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NODES = 6


def _queue(per: tuple[int, ...], releases: tuple[OnPremRelease, ...], total: int) -> PoolQueue:
    return PoolQueue("p", OnPremState(total, sum(per), per), (), onprem_releases=tuple(releases))


def _kept_fields(kept: node_shape.Kept) -> tuple:
    # (the order by first end: ties in any order, so compared as the sorted keys and the set)
    return (kept.exact, kept.widest, kept.smallest, kept.widest_nodes, kept.first,
            kept.first_arr.tolist(), [kept.first[n] for n in kept.order], sorted(kept.order),
            kept.full, kept.opens_full, kept.opens_node, kept.free_nodes, kept.free_total)


def _state(s: NodeSpace) -> tuple:
    """Everything a space answers from, every node's steps read."""
    for node in range(len(s.sizes)):
        s.steps(node)
    s._nodes_by_next_step()
    nexts = s._next
    assert [nexts[n] for n in s._by_next] == sorted(nexts)  # (ties in any order)
    return (s.sizes, s.node_size, s._smallest, s._widest, s.times, s.frees, s.free_total,
            s.free_nodes, nexts, s._windows())


# Each step: releases kept (by position in the last pool), releases new (node, end in s from T0,
# GPUs), free GPUs per node, the pool's GPUs, and the plan's instant (s from T0). Ends fall on
# whole and odd seconds, some at or before the instant (ended, or ending now).
_step = st.tuples(
    st.lists(st.booleans(), max_size=14),
    st.lists(st.tuples(st.integers(0, NODES - 1),
                       st.sampled_from([0, 30, 59.999999, 60, 60.000001, 90, 600, 1e6 + 0.3]),
                       st.integers(1, 4)), max_size=5),
    st.lists(st.integers(0, 4), min_size=NODES, max_size=NODES),
    st.sampled_from([24, 25, 30]),
    st.sampled_from([0, 30, 45.5, 60, 61, 120]),
)
_jobs = st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 8, 12]),
                           st.sampled_from([5.0, 30.0, 60.0, 59.999999, math.inf]),
                           st.booleans()), max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_step, _jobs), min_size=1, max_size=10), st.booleans())
def test_the_kept_space_answers_as_the_one_built_in_full(steps, fresh_start):
    if fresh_start:
        node_shape._last[0] = None
    releases: tuple[OnPremRelease, ...] = ()
    for (keep, new, per, total, at), jobs in steps:
        kept = tuple(r for r, k in zip(releases, keep + [True] * len(releases)) if k)
        made = tuple(OnPremRelease(gpus, T0 + timedelta(seconds=end), node)
                     for node, end, gpus in new)
        releases = kept + made
        queue = _queue(tuple(per), releases, total)
        now_us = to_us(T0 + timedelta(seconds=at))
        # What is kept equals what is computed from scratch.
        assert _kept_fields(node_shape.kept(queue)[2]) == _kept_fields(
            node_shape.kept_from_scratch(queue)[2])
        lazy = node_steps.space(queue, now_us)
        full = node_steps.from_scratch(queue, now_us)
        assert _state(lazy.copy()) == _state(full.copy())
        # Each answer, after holds and on copies, equals the full space's (the lazy one reads
        # a node's steps only when asked).
        for gpus, limit, take_copy in jobs:
            if take_copy:
                lazy, full = lazy.copy(), full.copy()
            assert lazy.fits_now(gpus, limit) == full.fits_now(gpus, limit)
            found = full.earliest(gpus, limit)
            assert lazy.earliest(gpus, limit) == found
            if found is not None:
                lazy.hold(found[1], found[0], limit)
                full.hold(found[1], found[0], limit)
        assert _state(lazy) == _state(full)


def test_an_end_too_far_from_the_epoch_for_a_float_builds_the_space_in_full():
    node_shape._last[0] = None
    far = datetime(9999, 1, 1, tzinfo=UTC)  # 2.5e17 µs: past 2**53
    queue = _queue((0, 4), (OnPremRelease(4, far, 0),), 8)
    assert not node_shape.kept(queue)[2].exact
    space = node_steps.space(queue, to_us(T0))
    assert space.times[0] is not None  # (built in full)
    assert _state(space) == _state(node_steps.from_scratch(queue, to_us(T0)))


def test_two_ends_a_float_cannot_tell_apart_open_in_node_order():
    # Near 2**53 µs from now, a second from now is coarser than a microsecond: the ends of
    # node 1 (earlier) and node 0 (a µs later) are one instant, where the sweep takes node 0
    # first, as the space built in full does.
    from orchestrator.domain.pending import from_us

    node_shape._last[0] = None
    base = 2 ** 53 - 10
    later, earlier = from_us(base + 1), from_us(base)
    assert (base + 1) / 1e6 == base / 1e6
    queue = _queue((0, 0, 4), (OnPremRelease(4, later, 0), OnPremRelease(4, earlier, 1)), 12)
    lazy, full = node_steps.space(queue, 0), node_steps.from_scratch(queue, 0)
    assert lazy._windows() == full._windows()
    assert [node for _, node, _ in lazy._windows()] == [2, 0, 1]
    assert lazy.earliest(8, 10.0) == full.earliest(8, 10.0)
