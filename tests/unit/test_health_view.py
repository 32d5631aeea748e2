"""CapacityLearner.view: the lazy snapshot the simulator hands the planner every tick holds the
same health as the eager one, and refuses a read after the learner moved on."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.capacity import CapacityLearner

KEYS = ("aws/us-east-1/a/g5/spot", "gcp/us-east5/a/g2/spot", "aws/us-east-1/a/g5/on-demand",
        "unseen")

events = st.lists(st.tuples(st.sampled_from(KEYS), st.booleans(), st.booleans(),
                            st.floats(0.0, 30.0)), max_size=30)


def _fed(history) -> CapacityLearner:
    learner = CapacityLearner({KEYS[0]: 0.01, KEYS[1]: 0.002})
    t = 0.0
    for key, is_launch, flag, hours in history:
        t += 0.5
        if is_launch:
            learner.launch(key, t, refused=flag)
        else:
            learner.ran(key, hours, t, interrupted=flag)
    return learner


@settings(max_examples=60, deadline=None)
@given(events, st.floats(0.0, 100.0))
def test_the_view_holds_what_the_snapshot_holds(history, later_h):
    learner = _fed(history)
    now_h = len(history) * 0.5 + later_h
    eager = learner.snapshot(KEYS, now_h)
    view = learner.view(KEYS, now_h)
    assert dict(view) == eager
    assert len(view) == len(eager) and set(view) == set(eager)
    for key in KEYS:
        assert view.get(key) == eager.get(key)


def test_a_read_after_a_newer_event_is_refused():
    learner = _fed([(KEYS[0], True, False, 0.0)])
    view = learner.view(KEYS, 2.0)
    first = view[KEYS[0]]  # read before: kept
    learner.ran(KEYS[0], 1.0, 2.0, interrupted=True)
    assert view[KEYS[0]] == first
    with pytest.raises(RuntimeError):
        view[KEYS[1]]
    with pytest.raises(KeyError):
        learner.view(KEYS, 2.0)["unseen"]
