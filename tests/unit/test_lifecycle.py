"""The node lifecycle table, checked exhaustively (in the style of Ray's instance-manager tests).

Every allowed edge is written out below as a literal; the test walks the table state by state,
crossing each one off, so an edge added to or removed from ``TRANSITIONS`` without updating this
file fails, and so does a state nobody checked.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain import ActionReason, NodeState
from orchestrator.lifecycle import (
    INITIAL_STATES,
    TRANSITIONS,
    IllegalTransition,
    can_transition,
    reachable_from,
    state_timeouts,
    transition,
)
from tests.builders import T0, make_node, make_policy

S = NodeState

EXPECTED: dict[NodeState, set[NodeState]] = {
    S.REQUESTED: {S.LAUNCHING, S.FAILED, S.TERMINATED},
    S.LAUNCHING: {S.BOOTING, S.JOINING, S.FAILED, S.TERMINATING},
    S.BOOTING: {S.JOINING, S.FAILED, S.TERMINATING},
    S.JOINING: {S.READY, S.FAILED, S.TERMINATING},
    S.READY: {S.DRAINING, S.FAILED, S.TERMINATING},
    S.DRAINING: {S.TERMINATING, S.FAILED},
    S.TERMINATING: {S.TERMINATED, S.FAILED},
    S.FAILED: {S.TERMINATING, S.TERMINATED},
    S.TERMINATED: set(),
}

TRANSIENT = (S.REQUESTED, S.LAUNCHING, S.BOOTING, S.JOINING, S.TERMINATING)


def test_every_edge_explicitly() -> None:
    unchecked = set(NodeState)
    for state, targets in EXPECTED.items():
        assert set(TRANSITIONS[state]) == targets, state
        for target in targets:
            assert can_transition(state, target)
        unchecked.remove(state)
    assert not unchecked, f"no state left unchecked: {unchecked}"
    assert set(TRANSITIONS) == set(NodeState)


ILLEGAL = [(a, b) for a, b in itertools.product(NodeState, NodeState) if b not in EXPECTED[a]]
LEGAL = [(a, b) for a in NodeState for b in sorted(EXPECTED[a])]


@pytest.mark.parametrize(("source", "target"), ILLEGAL, ids=[f"{a}->{b}" for a, b in ILLEGAL])
def test_illegal_edges_raise(source: NodeState, target: NodeState) -> None:
    node = make_node("n1", state=source, version=3)
    with pytest.raises(IllegalTransition, match=f"{source} -> {target}"):
        transition(node, target, at=T0, reason="test")
    assert not can_transition(source, target)


def test_no_self_loops() -> None:
    """A state change always changes the state (a repeat is not an event)."""
    for state in NodeState:
        assert state not in TRANSITIONS[state]
        with pytest.raises(IllegalTransition):
            transition(make_node("n1", state=state), state, at=T0, reason="again")


@pytest.mark.parametrize(("source", "target"), LEGAL, ids=[f"{a}->{b}" for a, b in LEGAL])
def test_transition_bumps_version_and_sets_state_since(source: NodeState, target: NodeState) -> None:
    node = make_node("n1", state=source, version=3, state_since=T0 - timedelta(hours=2))
    at = T0 + timedelta(seconds=7)
    new, event = transition(node, target, at=at, reason="because", extra=1)
    assert (new.state, new.version, new.state_since) == (target, 4, at)
    assert (node.state, node.version) == (source, 3)  # the input is not changed
    # nothing else moves
    assert new.created_at == node.created_at and new.request_id == node.request_id
    assert (event.node_id, event.at, event.from_state, event.to_state) == ("n1", at, source, target)
    assert event.reason == "because" and event.details == {"extra": 1}


def test_initial_state_is_requested() -> None:
    assert INITIAL_STATES == {S.REQUESTED}


@pytest.mark.parametrize("state", [s for s in NodeState if s is not S.TERMINATED])
def test_every_state_can_reach_terminated(state: NodeState) -> None:
    assert S.TERMINATED in reachable_from(state)


def test_terminated_has_no_exits() -> None:
    assert TRANSITIONS[S.TERMINATED] == frozenset()
    assert reachable_from(S.TERMINATED) == frozenset()
    assert S.TERMINATED.is_terminal and not any(s.is_terminal for s in NodeState if s is not S.TERMINATED)


def test_every_state_reachable_from_requested() -> None:
    assert reachable_from(S.REQUESTED) | {S.REQUESTED} == set(NodeState)


def test_failed_reachable_from_every_live_state() -> None:
    for state in NodeState:
        if state not in (S.FAILED, S.TERMINATED):
            assert S.FAILED in TRANSITIONS[state], state


def test_state_timeouts_cover_each_transient_state() -> None:
    policy = make_policy(timeouts={"launch": "3m", "boot": "7m", "join": "4m", "terminate": "9m"})
    timeouts = {t.state: t for t in state_timeouts(policy)}
    assert set(timeouts) == set(TRANSIENT)
    m = timedelta(minutes=1)
    assert {s: t.limit for s, t in timeouts.items()} == {
        S.REQUESTED: 3 * m, S.LAUNCHING: 10 * m, S.BOOTING: 7 * m, S.JOINING: 4 * m,
        S.TERMINATING: 9 * m,
    }
    assert {s: t.reason for s, t in timeouts.items()} == {
        S.REQUESTED: ActionReason.LAUNCH_TIMEOUT, S.LAUNCHING: ActionReason.BOOT_TIMEOUT,
        S.BOOTING: ActionReason.BOOT_TIMEOUT, S.JOINING: ActionReason.JOIN_TIMEOUT,
        S.TERMINATING: ActionReason.TERMINATE_RETRY,
    }
    for t in timeouts.values():
        assert can_transition(t.state, t.to)  # a timeout never asks for an illegal edge


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=20))
def test_random_walk_stays_legal_and_can_always_terminate(choices: list[int]) -> None:
    node = make_node("n1", state=S.REQUESTED, version=0)
    at = T0
    for step, choice in enumerate(choices):
        options = sorted(TRANSITIONS[node.state])
        if not options:
            break
        at += timedelta(seconds=1)
        node, _ = transition(node, options[choice % len(options)], at=at, reason="walk")
        assert node.version == step + 1 and node.state_since == at
        assert node.state is S.TERMINATED or S.TERMINATED in reachable_from(node.state)
