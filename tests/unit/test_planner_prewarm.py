"""The planner's pre-warm floor, case by case: launches, limits, scale-down and pause.

A pre-warm asks for at least N free burst GPUs (ready or starting) for a pool until a time. Each case
starts from the "instant" base policy of ``tests.builders`` (8-GPU $10/h on-demand offering, no
on-prem, no hysteresis, no cooldowns) and a pre-warm of the pool ``gpu``; it asserts the actions
(as sorted short tuples, so a missing or extra action fails) and the decision record.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest

from orchestrator.domain import Drain, Hold, Launch, NodeState, Plan, PolicyMemory, Rule, Terminate
from orchestrator.domain.snapshot import PrewarmRequest
from orchestrator.planner import plan
from orchestrator.policy import Market
from tests.builders import (
    POLICY,
    POOL,
    T0,
    make_job,
    make_node,
    make_offering,
    make_policy,
    make_snapshot,
    offering_spec,
)

S = NodeState
M = timedelta(minutes=1)
UNTIL = T0 + timedelta(hours=2)
UNTIL_TEXT = "2025-03-01T14:00:00Z"
G8_KEY = make_offering("g8").key
G4_KEY = make_offering("g4", gpus=4, price=6).key
DEAR_KEY = make_offering("g8x", price=20).key
OD = str(Market.ON_DEMAND)


def launch(n: int = 1, instance_type: str = "g8", project: str | None = None,
           reason: str = "prewarm") -> list[tuple]:
    return [("launch", instance_type, OD, project, reason)] * n


def summarize(p: Plan) -> list[tuple]:
    out: list[tuple] = []
    for a in p.actions:
        if isinstance(a, Launch):
            out.append(("launch", a.offering.instance_type, str(a.offering.market), a.project,
                        str(a.reason)))
        elif isinstance(a, Drain):
            out.append(("drain", a.node_id, str(a.reason)))
        elif isinstance(a, Terminate):
            out.append(("terminate", a.node_id, str(a.reason)))
        elif isinstance(a, Hold):
            out.append(("hold",))
    return sorted(out, key=repr)


def idle(node_id: str, idle_for: timedelta = 60 * M, **kw: Any):
    return make_node(node_id, state=S.READY, idle_since=T0 - idle_for, **kw)


def busy(node_id: str, **kw: Any):
    return make_node(node_id, state=S.READY, gpus_busy=8, running_jobs=1, **kw)


def job(i: int, gpus: int = 8, **kw: Any):
    return make_job(f"j{i}", gpus=gpus, submitted_at=T0 - 10 * M + timedelta(seconds=i), **kw)


@dataclass
class Case:
    id: str
    gpus: int | None = 16  # the pre-warm of pool gpu (None: no pre-warm)
    until: datetime = UNTIL
    policy: dict = field(default_factory=dict)
    snapshot: dict = field(default_factory=dict)
    rule: Rule = Rule.PREWARM
    actions: list[tuple] = field(default_factory=list)
    held_back: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()  # substrings of the decision's summary
    chosen: str | None = None


CAPPED = offering_spec("g8", gpus=8, price=10, max_nodes=1)
CHEAP_SMALL = [offering_spec("g8", gpus=8, price=10), offering_spec("g4", gpus=4, price=6)]

CASES = [
    # -- launching the gap -------------------------------------------------------------------------
    Case("launches-the-gap", actions=launch(2), chosen=G8_KEY,
         summary=(f"pre-warming 16 GPUs until {UNTIL_TEXT}", "launching 2 node(s)", "16 short")),
    Case("gap-rounds-up-to-whole-nodes", gpus=12, actions=launch(2), chosen=G8_KEY),
    Case("counts-in-flight-gpus",
         gpus=24, snapshot={"nodes": [make_node("n1", state=S.BOOTING),
                                      make_node("n2", state=S.REQUESTED)]},
         actions=launch(1), chosen=G8_KEY, summary=("16 GPU(s) ready or starting",)),
    Case("counts-free-ready-gpus",
         snapshot={"nodes": [idle("n1"), make_node("n2", state=S.JOINING)]},
         summary=("floor is met",)),
    Case("busy-gpus-do-not-count",  # 8 of 16 free: one more node, not a met floor
         snapshot={"nodes": [busy("n1"), make_node("n2", state=S.JOINING)]},
         actions=launch(1), chosen=G8_KEY, summary=("8 GPU(s) ready or starting",)),
    Case("partly-busy-node-counts-its-free-gpus",
         gpus=8, snapshot={"nodes": [make_node("n1", state=S.READY, gpus_busy=4, running_jobs=1)]},
         actions=launch(1), chosen=G8_KEY, summary=("4 GPU(s) ready or starting",)),
    Case("pending-work-fitted-on-a-booting-node-takes-its-gpus",
         gpus=8, snapshot={"nodes": [make_node("n1", state=S.BOOTING)], "jobs": [job(1)]},
         actions=launch(1), chosen=G8_KEY),
    Case("no-launch-that-could-not-be-ready-before-the-end",
         until=T0 + 5 * M, actions=[],
         summary=("16 GPU(s) short", "would not be ready before the floor ends")),
    Case("draining-and-failed-nodes-do-not-count",
         gpus=8, snapshot={"nodes": [make_node("n1", state=S.DRAINING, drain_deadline=T0 + M),
                                     make_node("n2", state=S.FAILED)]},
         actions=launch(1), chosen=G8_KEY),
    Case("nodes-of-another-policy-in-the-pool-count",
         gpus=8, snapshot={"nodes": [idle("n1", policy="other")]},
         summary=("floor is met",)),
    Case("busy-nodes-of-another-policy-do-not-count",
         gpus=8, snapshot={"nodes": [busy("n1", policy="other")]},
         actions=launch(1), chosen=G8_KEY),
    Case("nodes-of-another-pool-do-not-count",
         gpus=8, snapshot={"nodes": [busy("n1", policy="other", pool="cpu")]},
         actions=launch(1), chosen=G8_KEY),
    Case("cheapest-offering-for-a-small-gap",
         gpus=4, policy={"offerings": CHEAP_SMALL}, actions=launch(1, "g4"), chosen=G4_KEY),
    Case("cheapest-offering-for-a-whole-node-gap",
         gpus=8, policy={"offerings": CHEAP_SMALL}, actions=launch(1, "g8"), chosen=G8_KEY),
    Case("floor-ignores-scale-up-cooldown",
         policy={"cooldowns": {"scale_up": "10m"}},
         snapshot={"memory": {POLICY: PolicyMemory(last_launch_at=T0 - M)}},
         actions=launch(2), chosen=G8_KEY),
    # -- limits ------------------------------------------------------------------------------------
    Case("max-nodes-binds", gpus=24, policy={"limits": {"max_nodes": 1}},
         actions=launch(1), chosen=G8_KEY, held_back=("limits.max_nodes",),
         summary=("held back by limits.max_nodes",)),
    Case("max-nodes-reached-launches-nothing", policy={"limits": {"max_nodes": 1}},
         snapshot={"nodes": [busy("n1")]}, held_back=("limits.max_nodes",),
         summary=(f"pre-warming 16 GPUs until {UNTIL_TEXT}", "16 GPU(s) short")),
    Case("max-hourly-spend-binds", gpus=24, policy={"limits": {"max_hourly_spend_usd": 25}},
         actions=launch(2), chosen=G8_KEY, held_back=("limits.max_hourly_spend_usd",)),
    Case("max-burst-gpus-binds", policy={"limits": {"max_burst_gpus": 8}},
         actions=launch(1), chosen=G8_KEY, held_back=("limits.max_burst_gpus",)),
    Case("max-concurrent-launches-binds",
         gpus=32, policy={"limits": {"max_concurrent_launches": 2}},
         snapshot={"nodes": [make_node("n1", state=S.BOOTING)]},
         actions=launch(1), chosen=G8_KEY, held_back=("limits.max_concurrent_launches",)),
    Case("offering-max-nodes-falls-back-to-the-next-offering",
         policy={"offerings": [CAPPED, offering_spec("g8x", gpus=8, price=20)]},
         actions=launch(1) + launch(1, "g8x"), chosen=G8_KEY,
         held_back=(f"offerings[{G8_KEY}].max_nodes",)),
    Case("demand-already-covered-but-floor-limited",
         policy={"limits": {"max_nodes": 1}},
         snapshot={"jobs": [job(0, 4)], "nodes": [idle("n1", 0 * M)]},
         held_back=("limits.max_nodes",), summary=("12 GPU(s) short", "fit on burst nodes")),
    # -- a floor, not a cap: demand launches as before ----------------------------------------------
    # Nodes launched for demand will be busy: the floor (free GPUs) launches beside them.
    Case("demand-and-floor-launch-together",
         snapshot={"jobs": [job(0, 8)]}, rule=Rule.SCALE_UP,
         actions=launch(1, project="research", reason="demand") + launch(2), chosen=G8_KEY,
         summary=("launching 1 node(s)", "pre-warming 16 GPUs")),
    Case("demand-beyond-the-floor-still-keeps-the-floor-free",
         gpus=8, snapshot={"jobs": [job(0, 8), job(1, 8)]}, rule=Rule.SCALE_UP,
         actions=launch(2, project="research", reason="demand") + launch(1), chosen=G8_KEY,
         summary=("pre-warming 8 GPUs",)),
    Case("idle-floor-node-absorbs-demand-and-the-floor-is-refilled",
         gpus=8, snapshot={"jobs": [job(0, 8)], "nodes": [idle("n1", 0 * M)]},
         actions=launch(1), chosen=G8_KEY,
         summary=("pre-warming 8 GPUs", "fit on burst nodes")),
    Case("floor-launches-even-when-the-trigger-does-not-fire",
         gpus=8, policy={"trigger": {"pending_gpus_above": 100, "oldest_wait_above": "1h"}},
         snapshot={"jobs": [job(0, 4)]}, actions=launch(1), chosen=G8_KEY,
         summary=("pre-warming 8 GPUs", "demand: trigger-not-met")),
    # -- scale-down ----------------------------------------------------------------------------------
    Case("no-drain-below-the-floor-before-until",
         snapshot={"nodes": [idle("n1"), idle("n2")]}, summary=("floor is met",)),
    Case("idle-nodes-above-the-floor-drain-oldest-first",
         gpus=8, snapshot={"nodes": [idle("n1", 20 * M), idle("n2", 60 * M)]},
         actions=[("drain", "n2", "idle")]),
    Case("floor-keeps-the-idle-node-and-adds-what-the-busy-one-cannot-give",
         gpus=16, snapshot={"nodes": [idle("n1"), busy("n2")]}, actions=launch(1), chosen=G8_KEY),
    Case("normal-drain-after-until",
         until=T0, snapshot={"nodes": [idle("n1"), idle("n2")]}, rule=Rule.NO_DEMAND,
         actions=[("drain", "n1", "idle"), ("drain", "n2", "idle")]),
    Case("no-prewarm-drains-as-usual",
         gpus=None, snapshot={"nodes": [idle("n1")]}, rule=Rule.NO_DEMAND,
         actions=[("drain", "n1", "idle")]),
    Case("over-max-nodes-wins-over-the-floor",
         gpus=24, policy={"limits": {"max_nodes": 1}},
         snapshot={"nodes": [busy("n1"), make_node("n2", gpus_busy=4, running_jobs=1)]},
         actions=[("drain", "n2", "over-limit")], held_back=("limits.max_nodes",)),
    # -- pause ----------------------------------------------------------------------------------------
    Case("paused-pool-no-prewarm-launch",
         snapshot={"paused_pools": [POOL]}, rule=Rule.PAUSED,
         summary=("paused", "pre-warming 16 GPUs", "held while the pool is paused")),
    Case("paused-pool-still-finishes-drains",
         gpus=8, snapshot={"paused_pools": [POOL], "nodes": [
             busy("n1"), make_node("n2", state=S.DRAINING, released=True, drain_deadline=T0 + M)]},
         rule=Rule.PAUSED, actions=[("terminate", "n2", "drained")],
         summary=("8 GPU(s) short, held while the pool is paused",)),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_prewarm(case: Case) -> None:
    policy = make_policy(**case.policy)
    snapshot = make_snapshot(**case.snapshot)
    if case.gpus is not None:
        snapshot = dataclasses.replace(snapshot, prewarm={POOL: PrewarmRequest(case.gpus, case.until)})
    result = plan(snapshot, [policy], T0)
    [decision] = result.decisions
    assert summarize(result) == sorted(case.actions, key=repr), decision.summary
    assert decision.rule is case.rule, decision.summary
    assert decision.held_back_by == case.held_back, decision.summary
    for text in case.summary:
        assert text in decision.summary, decision.summary
    assert decision.chosen == case.chosen
    if case.gpus is not None and case.until > T0:
        assert decision.inputs["prewarm"]["gpus"] == case.gpus
    # Pre-warm launches belong to no project and get ids distinct from demand launches.
    ids = [a.node_id for a in result.launches] + [a.request_id for a in result.launches]
    assert len(ids) == len(set(ids))
    for a in result.launches:
        if a.reason == "prewarm":
            assert a.project is None


def test_prewarm_launches_once_then_holds_still() -> None:
    """Planned again with its own launches in flight, the floor launches nothing more (no flap);
    once ready and idle, they stay until ``until`` and are drained after it."""
    policy = make_policy()
    snapshot = dataclasses.replace(make_snapshot(), prewarm={POOL: PrewarmRequest(16, UNTIL)})
    first = plan(snapshot, [policy], T0)
    assert len(first.launches) == 2
    starting = [make_node(a.node_id, state=S.REQUESTED, project=None) for a in first.launches]
    second = plan(dataclasses.replace(snapshot, nodes=tuple(starting), memory=first.memory),
                  [policy], T0 + M)
    assert second.launches == [] and second.drains == []
    assert second.decisions[0].rule is Rule.PREWARM
    ready = tuple(idle(n.id, 60 * M, project=None) for n in starting)
    before = plan(dataclasses.replace(snapshot, nodes=ready), [policy], UNTIL - M)
    assert before.drains == []
    after_snapshot = dataclasses.replace(snapshot, nodes=ready, taken_at=UNTIL)
    after = plan(after_snapshot, [policy], UNTIL)
    assert sorted(d.node_id for d in after.drains) == sorted(n.id for n in ready)
    assert after.decisions[0].rule is Rule.NO_DEMAND
