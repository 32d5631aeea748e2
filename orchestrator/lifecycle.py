"""The node state machine: every allowed edge, the one gate that changes state, per-state timeouts.

``TRANSITIONS`` is the single source of truth: each edge carries a comment with the observed fact
that causes it. :func:`transition` is the only way a node changes state; an edge that is not in
the table raises :class:`IllegalTransition`. Timeouts are data (:func:`state_timeouts`), read by
the reconciler, never scattered ifs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from orchestrator.domain.evolve import evolve
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.plan import ActionReason
from orchestrator.policy.models import Policy

S = NodeState
# How many times a writer re-reads a node and tries its compare-and-set again when the node
# changed under it (``Store.save_transition`` / ``update_node`` compare versions, and heartbeats
# and usage updates bump the version without changing the state).
CAS_RETRIES = 8

TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    S.REQUESTED: frozenset({
        S.LAUNCHING,  # the provider accepted the launch and returned an instance id
        S.FAILED,  # the launch call failed (capacity, quota, auth, invalid) or timed out
        S.TERMINATED,  # nothing was ever created (cancelled before the call; provider has none)
    }),
    S.LAUNCHING: frozenset({
        S.BOOTING,  # the provider reports the instance running
        S.JOINING,  # the agent registered before we saw the instance running (eventual consistency)
        S.FAILED,  # launch timed out, or the instance vanished before running
        S.TERMINATING,  # we decided to give it up before it booted
    }),
    S.BOOTING: frozenset({
        S.JOINING,  # the node agent registered with its join token
        S.FAILED,  # boot timeout, or the instance vanished
        S.TERMINATING,  # given up before it joined
    }),
    S.JOINING: frozenset({
        S.READY,  # the fabric reports the node usable
        S.FAILED,  # join timeout, heartbeat lost, or the instance vanished
        S.TERMINATING,  # given up before it became ready
    }),
    S.READY: frozenset({
        S.DRAINING,  # scale-down, a spot notice, or an operator asked for the node to leave
        S.FAILED,  # heartbeat lost or the instance vanished (e.g. spot interruption)
        S.TERMINATING,  # terminated without a drain (respect_running_jobs: false and idle)
    }),
    S.DRAINING: frozenset({
        S.TERMINATING,  # the fabric released the node, or the drain grace expired
        S.FAILED,  # heartbeat lost or the instance vanished mid-drain
    }),
    S.TERMINATING: frozenset({
        S.TERMINATED,  # the provider confirmed the instance is gone
        S.FAILED,  # terminate kept failing past the terminate timeout; retried from failed
    }),
    S.FAILED: frozenset({
        S.TERMINATING,  # the failed node's instance is being terminated
        S.TERMINATED,  # the provider confirms there is no instance (never created, or gone)
    }),
    S.TERMINATED: frozenset(),  # terminal
}

INITIAL_STATES = frozenset({S.REQUESTED})


class IllegalTransition(Exception):
    """A state change that the lifecycle table does not allow."""


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """One recorded state change (appended to the store, never updated)."""

    node_id: str
    at: datetime
    from_state: NodeState | None
    to_state: NodeState
    reason: str
    details: dict[str, Any]


def can_transition(current: NodeState, target: NodeState) -> bool:
    return target in TRANSITIONS[current]


def transition(
    node: Node, target: NodeState, *, at: datetime, reason: str, **details: Any
) -> tuple[Node, NodeEvent]:
    """The only gate for changing a node's state: returns the new node and the event to append.

    The returned node's version is one higher; the store writes it compare-and-set against the old
    version, so two writers racing on the same node cannot both win.
    """
    if not can_transition(node.state, target):
        raise IllegalTransition(
            f"node {node.id}: {node.state} -> {target} is not allowed (reason: {reason})"
        )
    changed = evolve(node, state=target, state_since=at, version=node.version + 1)
    return changed, NodeEvent(node.id, at, node.state, target, reason, dict(details))


def reachable_from(state: NodeState) -> frozenset[NodeState]:
    """Every state reachable from ``state`` (used to check that every node can end terminated)."""
    seen: set[NodeState] = set()
    frontier = [state]
    while frontier:
        current = frontier.pop()
        for nxt in TRANSITIONS[current]:
            if nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return frozenset(seen)


@dataclass(frozen=True, slots=True)
class StateTimeout:
    """A node in ``state`` longer than ``limit`` goes to ``to`` for ``reason``."""

    state: NodeState
    limit: timedelta
    to: NodeState
    reason: ActionReason


def state_timeouts(policy: Policy) -> tuple[StateTimeout, ...]:
    """Per-state timeouts of a policy, as data. DRAINING is handled by the drain deadline."""
    t = policy.timeouts
    return (
        StateTimeout(S.REQUESTED, t.launch, S.FAILED, ActionReason.LAUNCH_TIMEOUT),
        StateTimeout(S.LAUNCHING, t.launch + t.boot, S.FAILED, ActionReason.BOOT_TIMEOUT),
        StateTimeout(S.BOOTING, t.boot, S.FAILED, ActionReason.BOOT_TIMEOUT),
        StateTimeout(S.JOINING, t.join, S.FAILED, ActionReason.JOIN_TIMEOUT),
        StateTimeout(S.TERMINATING, t.terminate, S.FAILED, ActionReason.TERMINATE_RETRY),
    )


def overdue(node: Node, timeouts: Iterable[StateTimeout], now: datetime) -> bool:
    """Whether ``node`` has been in its state longer than its timeout (draining: past its drain
    deadline): what the reconciler acts on, and what alerts and notifications call stuck."""
    if node.state is S.DRAINING:
        return node.drain_deadline is not None and now > node.drain_deadline
    limit = next((t.limit for t in timeouts if t.state is node.state), None)
    return limit is not None and now - node.state_since > limit

