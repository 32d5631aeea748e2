"""The node wait model's kept view of the on-prem nodes (orchestrator.planner.node_shape): on
any sequence of pools, each answer derived from the last equals the one computed from scratch."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.snapshot import OnPremRelease, OnPremState, PoolQueue
from orchestrator.planner import node_shape

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NODES = 5


def _queue(per: tuple[int, ...], releases: tuple[OnPremRelease, ...], total: int) -> PoolQueue:
    return PoolQueue("p", OnPremState(total, sum(per), per), (), onprem_releases=releases)


# Each step: releases kept (by position in the last pool), releases new (node, end, GPUs), free
# GPUs per node; the same end may come twice on one node.
_step = st.tuples(
    st.lists(st.booleans(), max_size=12),
    st.lists(st.tuples(st.integers(0, NODES - 1), st.sampled_from([0, 30, 60, 90, 600]),
                       st.integers(1, 4)), max_size=4),
    st.lists(st.integers(0, 4), min_size=NODES, max_size=NODES),
    st.sampled_from([20, 21]),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_step, min_size=1, max_size=12), st.booleans())
def test_each_answer_equals_the_one_from_scratch(steps, fresh_start):
    if fresh_start:
        node_shape._last[0] = None
    releases: tuple[OnPremRelease, ...] = ()
    answers = []
    for keep, new, per, total in steps:
        kept = tuple(r for r, k in zip(releases, keep + [True] * len(releases)) if k)
        made = tuple(OnPremRelease(gpus, T0 + timedelta(seconds=end), node)
                     for node, end, gpus in new)
        releases = kept + made
        queue = _queue(tuple(per), releases, total)
        expected = node_shape.from_scratch(queue)
        assert node_shape.shape(queue) == expected
        assert node_shape.shape(queue) == expected  # (asked again: the kept answer)
        answers.append((queue, node_shape.shape(queue)))
    # No answer was changed in place by the later ones (their lists are shared, not edited).
    for queue, answer in answers:
        assert answer == node_shape.from_scratch(queue)


def test_a_release_reported_twice_is_counted_twice():
    release = OnPremRelease(2, T0 + timedelta(seconds=60), 1)
    node_shape._last[0] = None
    node_shape.shape(_queue((4, 0), (), 8))
    queue = _queue((4, 0), (release, release), 8)
    assert node_shape.shape(queue) == node_shape.from_scratch(queue)
    assert node_shape.shape(queue)[1][1] == [(node_shape.to_us(release.ends_at), 2)] * 2


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=40), st.lists(st.integers(0, 45), max_size=40))
def test_the_diff_of_two_pools_releases_is_an_edit_between_them(before, after):
    # Any two tuples of releases (objects 0-30 shared, repeats, any order): what left and what
    # came make one of the other, as multisets by identity; steady orders give short edits.
    from collections import Counter

    objects = [OnPremRelease(1, T0, 0) for _ in range(46)]
    old = tuple(objects[i] for i in before)
    new = tuple(objects[i] for i in after)
    gone, came = node_shape.diff(old, new)
    left = Counter(map(id, old))
    left.subtract(map(id, gone))
    left.update(map(id, came))
    assert min(left.values(), default=0) >= 0 and +left == Counter(map(id, new))
    assert all(r in old for r in gone) and all(r in new for r in came)


def test_the_diff_of_a_steady_order_is_what_left_and_what_came():
    objects = [OnPremRelease(1, T0, 0) for _ in range(200)]
    old = tuple(objects[:150])
    new = tuple(o for k, o in enumerate(objects[:150]) if k not in (3, 40, 41, 42, 99)) + tuple(
        objects[150:160])
    gone, came = node_shape.diff(old, new)
    assert gone == [objects[k] for k in (3, 40, 41, 42, 99)] and came == objects[150:160]
