"""The idle-GPU rule of the planner: a ready node whose jobs barely use their GPUs (measured) is
flagged in the decision's inputs, and drained as idle only when the policy opts in."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from orchestrator.domain import ActionReason, Drain, NodeState
from orchestrator.planner import plan
from tests.builders import POLICY, T0, make_node, make_policy, make_snapshot

M = timedelta(minutes=1)


def busy_low(node_id: str, low_for: timedelta | None):
    node = make_node(node_id, state=NodeState.READY, gpus_busy=8, running_jobs=1)
    return dataclasses.replace(
        node, gpu_utilisation_percent=1.0,
        low_utilisation_since=None if low_for is None else T0 - low_for)


def test_a_node_low_for_idle_for_is_flagged_but_kept_by_default() -> None:
    nodes = [busy_low("n1", 31 * M), busy_low("n2", 29 * M), busy_low("n3", None)]
    result = plan(make_snapshot(nodes=nodes), [make_policy()], T0)
    [decision] = result.decisions
    assert decision.inputs["low_utilisation"] == {
        "nodes": ["n1"], "below_percent": 5.0, "for_s": 1800.0, "counted_as_idle": False,
        "drained": []}
    assert not [a for a in result.actions if isinstance(a, Drain)]


def test_opted_in_a_low_utilisation_node_is_drained_and_the_decision_names_it() -> None:
    policy = make_policy(scale_down={"count_low_utilisation_as_idle": True},
                         utilisation={"idle_below_percent": 10, "idle_for": "20m"})
    nodes = [busy_low("n1", 31 * M), busy_low("n2", 19 * M), busy_low("n3", None)]
    result = plan(make_snapshot(nodes=nodes), [policy], T0)
    drains = [a for a in result.actions if isinstance(a, Drain)]
    assert [(d.node_id, d.reason) for d in drains] == [("n1", ActionReason.LOW_UTILISATION)]
    inputs = result.decisions[0].inputs["low_utilisation"]
    assert inputs["drained"] == ["n1"] and inputs["counted_as_idle"] is True
    assert result.memory[POLICY].last_drain_at == T0


def test_min_nodes_keeps_a_low_utilisation_node() -> None:
    policy = make_policy(scale_down={"count_low_utilisation_as_idle": True},
                         limits={"min_nodes": 1, "max_nodes": 10})
    result = plan(make_snapshot(nodes=[busy_low("n1", 60 * M)]), [policy], T0)
    assert not [a for a in result.actions if isinstance(a, Drain)]
