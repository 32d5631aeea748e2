"""Budgets are hard caps in the simulator, with the production planner and dispatcher rule
(issue 13, finding 2): nodes already up take no work their scope's budget cannot pay for, whatever
the grades; a project's work on another project's node is its spend; and no burst node bills
idle for work the dispatcher cannot start (finding 5).

The stated bound (docs/budgets.md): spend <= limit + per node in scope its price x (2 ticks +
the billing increment). Jobs here run exactly their declared duration.
"""

from __future__ import annotations

import pytest

from orchestrator.sim.controllers import PolicyController
from tests.sim.helpers import nodes_by_launch, run_with, sim_policy, trace

TICK_S = 60.0
# 8-GPU jobs of 1 h every 10 min: 100 of them outrun a $40 cap more than twentyfold unchecked.
STREAM = [(f"j{i}", 600.0 * i, 3600.0, 8) for i in range(100)]


def run(policy, jobs):
    return run_with(lambda p: PolicyController(p, "policy"), policy, trace(*jobs))


def bound(engine, limit: float) -> float:
    """The cap plus the stated slack: each node's price for two ticks (no billing increment in
    the sim provider's default catalogue beyond per-second)."""
    slack = sum(n.price_usd_hour * 2 * TICK_S / 3600 for n in nodes_by_launch(engine))
    return limit + slack


@pytest.mark.parametrize("grades", [[], [{"at_percent": 100, "action": "no-new-launches"}], None],
                         ids=["no-grades", "only-no-new-launches", "default-grades"])
def test_a_40_dollar_budget_caps_a_stream_of_work(grades) -> None:
    """Before: $1,205 on a $40 budget (a stream of 200 such jobs) with grades [] or only
    no-new-launches (nodes already up kept taking work forever); +5 % with the default grades."""
    budget = {"name": "cap", "limit_usd": 40}
    if grades is not None:
        budget["grades"] = grades
    engine = run(sim_policy(budgets=[budget]), STREAM)
    assert engine._accrued <= bound(engine, 40), engine._accrued
    assert engine._accrued > 20  # it did burst, up to near the cap
    assert engine.world.finished == len(STREAM)  # the rest ran on-prem


def test_a_project_budget_caps_its_work_on_another_projects_nodes() -> None:
    """Project vision, with a tiny budget, may not run on research's nodes past it: its share of
    those nodes is its spend (finding 2's production-path case, in the simulator)."""
    budgets = [{"name": "vision", "project": "vision", "limit_usd": 2, "grades": []}]
    research = [(f"r{i}", 0.0, 6 * 3600.0, 4, "research") for i in range(4)]
    vision = [(f"v{i}", 60.0 * (i + 1), 3600.0, 4, "vision") for i in range(40)]
    engine = run(sim_policy(budgets=budgets), research + vision)
    world = engine.world
    store = engine.store
    vision_on_foreign = 0.0
    for project, node_id, gpus, start, end in world.burst_runs:
        node = store.get_node(node_id)
        if project == "vision" and node.project != "vision":
            vision_on_foreign += node.price_usd_hour * gpus / node.gpus * ((end or start) - start) / 3600
    own = sum(n.price_usd_hour * ((n.state_since - n.created_at).total_seconds()) / 3600
              for n in nodes_by_launch(engine) if n.project == "vision")
    assert vision_on_foreign + own <= 2 + 1e-6 + sum(
        n.price_usd_hour * 2 * TICK_S / 3600 for n in nodes_by_launch(engine)
        if n.project == "vision")


def test_a_job_wider_than_one_node_launches_nothing_and_leaves_no_idle_node() -> None:
    """Finding 5: an 8-GPU job with 4-GPU nodes made the planner launch 2 nodes that sat idle
    forever ("covered") while the dispatcher could not start it."""
    policy = sim_policy(offerings=[{"provider": "sim", "region": "r1", "instance_type": "s4",
                                    "gpus": 4, "price_usd_hour": 4}],
                        pool={"name": "gpu", "onprem": {"nodes": 1, "gpus_per_node": 4}})
    jobs = [("busy", 0.0, 4 * 3600.0, 4), ("wide", 60.0, 3600.0, 8)]
    engine = run(policy, jobs)
    assert engine.counters.launches == 0
    held = engine.store.held_back
    assert held["placement.one_node_per_job"] > 0
