"""The planner, scenario by scenario: each case asserts the actions *and* the decision record.

Every case starts from the "instant" base policy of ``tests.builders`` (8-GPU on-demand offering at
$10/h, no on-prem, no hysteresis, no cooldowns) and switches on only the mechanism it is about.
Actions are compared as a sorted list of short tuples, so a missing or an extra action fails:

* ``("launch", instance_type, market, project, reason)``
* ``("drain", node_id, reason)`` / ``("terminate", node_id, reason)`` / ``("hold",)``
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from orchestrator.domain import (
    CapacityBlock,
    Drain,
    Hold,
    Launch,
    NodeState,
    Plan,
    PolicyMemory,
    Rule,
    Terminate,
)
from orchestrator.planner import plan
from orchestrator.planner.scaleup import MULTI_NODE
from orchestrator.policy import Market
from tests.builders import (
    POLICY,
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
G8 = make_offering("g8")  # the base policy's offering, as the planner resolves it
G8_KEY = G8.key
ON_DEMAND = str(Market.ON_DEMAND)


def job(i: int, gpus: int = 8, **kw: Any):
    """Job ``j<i>``, submitted i seconds after the first so scheduling order is j0, j1, ..."""
    return make_job(f"j{i}", gpus=gpus, submitted_at=T0 - 10 * M + timedelta(seconds=i), **kw)


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


def launch(n: int = 1, instance_type: str = "g8", project: str | None = "research",
           reason: str = "demand", market: str = ON_DEMAND) -> list[tuple]:
    return [("launch", instance_type, market, project, reason)] * n


HOLD = [("hold",)]


def _says(result: Plan, text: str) -> None:
    assert text in result.decisions[0].summary, result.decisions[0].summary


@dataclass
class Case:
    id: str
    policy: dict = field(default_factory=dict)
    snapshot: dict = field(default_factory=dict)
    rule: Rule = Rule.NO_DEMAND
    actions: list[tuple] = field(default_factory=list)
    held_back: tuple[str, ...] = ()
    chosen: str | None = None
    check: Callable[[Plan], None] | None = None


def _memory(**kw: Any) -> dict:
    return {"memory": {POLICY: PolicyMemory(**kw)}}


def _options_check(cheap_key: str, dear_key: str) -> Callable[[Plan], None]:
    def check(p: Plan) -> None:
        options = {o.offering_key: o for o in p.decisions[0].options}
        assert options[cheap_key].rejected is None and options[dear_key].rejected is None
        assert options[dear_key].expected_cost_usd > options[cheap_key].expected_cost_usd
    return check


def _rejected_check(key: str, reason_part: str) -> Callable[[Plan], None]:
    def check(p: Plan) -> None:
        rejected = [o for o in p.decisions[0].options if o.offering_key == key]
        assert len(rejected) == 1, p.decisions[0].options
        assert rejected[0].rejected is not None and reason_part in rejected[0].rejected
    return check


def _memory_check(**expected: Any) -> Callable[[Plan], None]:
    def check(p: Plan) -> None:
        for name, value in expected.items():
            assert getattr(p.memory[POLICY], name) == value, (name, p.memory[POLICY])
    return check


def _drain_deadline_check(node_id: str) -> Callable[[Plan], None]:
    def check(p: Plan) -> None:
        [drain] = [a for a in p.actions if isinstance(a, Drain) and a.node_id == node_id]
        assert drain.deadline == T0 + timedelta(minutes=15)  # now + scale_down.drain_grace
    return check


def idle_node(node_id: str, idle_for: timedelta, **kw: Any):
    return make_node(node_id, state=S.READY, idle_since=T0 - idle_for, **kw)


SPOT_SPEC = offering_spec("g8", gpus=8, price=3, market="spot", fallback_on_demand=True)
SPOT_KEY = make_offering("g8", market=Market.SPOT, price=3).key
DEAR = offering_spec("g8x", gpus=8, price=20)
DEAR_KEY = make_offering("g8x", price=20).key
CAPPED = offering_spec("g8", gpus=8, price=10, max_nodes=1)

CASES = [
    # -- demand and the trigger ----------------------------------------------------------------
    Case("no-pending", rule=Rule.NO_DEMAND),
    Case("all-fits-onprem",
         policy={"pool": {"onprem": {"nodes": 2}}},
         snapshot={"jobs": [job(0, 8), job(1, 4), job(2, 4)], "onprem_free": (8, 8)},
         rule=Rule.NO_DEMAND),
    Case("onprem-too-fragmented-for-a-wide-job",
         policy={"pool": {"onprem": {"nodes": 2}}},
         snapshot={"jobs": [job(0, 8)], "onprem_free": (4, 4)},
         rule=Rule.SCALE_UP, actions=launch(), chosen=G8_KEY),
    Case("trigger-below-threshold",
         policy={"trigger": {"pending_gpus_above": 8, "oldest_wait_above": "30m"}},
         snapshot={"jobs": [job(0, 4)]},
         rule=Rule.TRIGGER_NOT_MET, actions=HOLD,
         check=_memory_check(trigger_since=None)),
    Case("trigger-by-wait-alone",
         policy={"trigger": {"pending_gpus_above": 8, "oldest_wait_above": "5m"}},
         snapshot={"jobs": [job(0, 4)]},  # waited ~10m
         rule=Rule.SCALE_UP, actions=launch(), chosen=G8_KEY),
    Case("trigger-all-needs-both",
         policy={"trigger": {"pending_gpus_above": 0, "oldest_wait_above": "30m", "combine": "all"}},
         snapshot={"jobs": [job(0, 4)]},
         rule=Rule.TRIGGER_NOT_MET, actions=HOLD),
    Case("sustaining-first-tick",
         policy={"trigger": {"sustained_for": "5m"}},
         snapshot={"jobs": [job(0)]},
         rule=Rule.SUSTAINING, actions=HOLD, check=_memory_check(trigger_since=T0)),
    Case("sustaining-keeps-trigger-since",
         policy={"trigger": {"sustained_for": "5m"}},
         snapshot={"jobs": [job(0)], **_memory(trigger_since=T0 - 2 * M)},
         rule=Rule.SUSTAINING, actions=HOLD, check=_memory_check(trigger_since=T0 - 2 * M)),
    Case("sustained-launches",
         policy={"trigger": {"sustained_for": "5m"}},
         snapshot={"jobs": [job(0)], **_memory(trigger_since=T0 - 5 * M)},
         rule=Rule.SCALE_UP, actions=launch(), chosen=G8_KEY,
         check=_memory_check(trigger_since=T0 - 5 * M, last_launch_at=T0)),
    Case("trigger-stops-holding-resets-memory",
         snapshot={"jobs": [], **_memory(trigger_since=T0 - 2 * M)},
         rule=Rule.NO_DEMAND, check=_memory_check(trigger_since=None)),
    # -- capacity already answering the demand --------------------------------------------------
    *[Case(f"in-flight-{state}-covers",
           snapshot={"jobs": [job(0, 8)], "nodes": [make_node("n1", state=state, idle_since=None)]},
           rule=Rule.COVERED)
      for state in (S.REQUESTED, S.LAUNCHING, S.BOOTING, S.JOINING)],
    Case("in-flight-covers-part-launches-rest",
         snapshot={"jobs": [job(0, 8), job(1, 8)], "nodes": [make_node("n1", state=S.BOOTING)]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY),
    Case("ready-free-gpus-absorb",
         snapshot={"jobs": [job(0, 4)],
                   "nodes": [make_node("n1", gpus_busy=4, running_jobs=1)]},
         rule=Rule.COVERED),
    Case("half-busy-nodes-do-not-absorb-a-6-gpu-job",
         snapshot={"jobs": [job(0, 6)],
                   "nodes": [make_node("n1", gpus_busy=4, running_jobs=1),
                             make_node("n2", gpus_busy=4, running_jobs=1)]},
         rule=Rule.SCALE_UP, actions=launch(), chosen=G8_KEY),
    Case("draining-node-absorbs-nothing",
         snapshot={"jobs": [job(0, 8)],
                   "nodes": [make_node("n1", state=S.DRAINING, drain_deadline=T0 + 10 * M)]},
         rule=Rule.SCALE_UP, actions=launch(), chosen=G8_KEY),
    Case("cooldown",
         policy={"cooldowns": {"scale_up": "5m"}},
         snapshot={"jobs": [job(0)], **_memory(last_launch_at=T0 - M)},
         rule=Rule.COOLDOWN, actions=HOLD, check=_memory_check(last_launch_at=T0 - M)),
    Case("cooldown-over",
         policy={"cooldowns": {"scale_up": "5m"}},
         snapshot={"jobs": [job(0)], **_memory(last_launch_at=T0 - 5 * M)},
         rule=Rule.SCALE_UP, actions=launch(), chosen=G8_KEY),
    # -- limits ----------------------------------------------------------------------------------
    Case("max-nodes-binds",
         policy={"limits": {"max_nodes": 2}},
         snapshot={"jobs": [job(i) for i in range(3)]},
         rule=Rule.SCALE_UP, actions=launch(2), chosen=G8_KEY, held_back=("limits.max_nodes",)),
    Case("max-nodes-reached",
         policy={"limits": {"max_nodes": 1}},
         snapshot={"jobs": [job(0)], "nodes": [make_node("n1", gpus_busy=8, running_jobs=1)]},
         rule=Rule.LIMITED, actions=HOLD, held_back=("limits.max_nodes",)),
    Case("terminating-node-still-counts-for-max-nodes",
         policy={"limits": {"max_nodes": 1}},
         snapshot={"jobs": [job(0)], "nodes": [make_node("n1", state=S.TERMINATING)]},
         rule=Rule.LIMITED, actions=HOLD, held_back=("limits.max_nodes",)),
    Case("max-concurrent-launches-binds",
         policy={"limits": {"max_concurrent_launches": 2}},
         snapshot={"jobs": [job(i) for i in range(4)], "nodes": [make_node("n1", state=S.BOOTING)]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY,
         held_back=("limits.max_concurrent_launches",)),
    Case("max-hourly-spend-binds",
         policy={"limits": {"max_hourly_spend_usd": 25}},
         snapshot={"jobs": [job(i) for i in range(3)]},
         rule=Rule.SCALE_UP, actions=launch(2), chosen=G8_KEY,
         held_back=("limits.max_hourly_spend_usd",)),
    Case("max-hourly-spend-counts-existing-nodes",
         policy={"limits": {"max_hourly_spend_usd": 15}},
         snapshot={"jobs": [job(0)], "nodes": [make_node("n1", gpus_busy=8, running_jobs=1)]},
         rule=Rule.LIMITED, actions=HOLD, held_back=("limits.max_hourly_spend_usd",)),
    Case("max-burst-gpus-binds",
         policy={"limits": {"max_burst_gpus": 16}},
         snapshot={"jobs": [job(i) for i in range(3)]},
         rule=Rule.SCALE_UP, actions=launch(2), chosen=G8_KEY,
         held_back=("limits.max_burst_gpus",)),
    Case("offering-max-nodes-binds",
         policy={"offerings": [CAPPED]},
         snapshot={"jobs": [job(i) for i in range(3)]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY,
         held_back=(f"offerings[{G8_KEY}].max_nodes",)),
    Case("offering-max-nodes-falls-back-to-next-offering",
         policy={"offerings": [CAPPED, DEAR]},
         snapshot={"jobs": [job(i) for i in range(3)]},
         rule=Rule.SCALE_UP, actions=launch(1) + launch(2, "g8x"), chosen=G8_KEY,
         held_back=(f"offerings[{G8_KEY}].max_nodes",)),
    Case("offering-max-nodes-fallback-for-every-project",
         # research (first) hits g8's cap, then its quota on g8x; prod must still get g8x nodes.
         policy={"offerings": [CAPPED, DEAR],
                 "projects": [{"name": "research", "priority": 5, "max_burst_gpus": 16},
                              {"name": "prod", "priority": 1}]},
         snapshot={"jobs": [job(0), job(1), job(2), job(3, project="prod")]},
         rule=Rule.SCALE_UP, actions=launch(1) + launch(1, "g8x") + launch(1, "g8x", "prod"),
         chosen=G8_KEY,
         held_back=(f"offerings[{G8_KEY}].max_nodes", "projects[research].max_burst_gpus")),
    Case("project-quota-binds",
         policy={"projects": [{"name": "research", "max_burst_gpus": 8}]},
         snapshot={"jobs": [job(i) for i in range(3)]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY,
         held_back=("projects[research].max_burst_gpus",)),
    Case("project-quota-counts-its-live-nodes",
         policy={"projects": [{"name": "research", "max_burst_gpus": 8}]},
         snapshot={"jobs": [job(0)],
                   "nodes": [make_node("n1", project="research", gpus_busy=8, running_jobs=1)]},
         rule=Rule.LIMITED, actions=HOLD, held_back=("projects[research].max_burst_gpus",)),
    Case("project-quota-holds-back-only-its-project",
         policy={"projects": [{"name": "research", "priority": 9, "max_burst_gpus": 0}]},
         snapshot={"jobs": [job(0), job(1, project="prod")]},
         rule=Rule.SCALE_UP, actions=launch(1, project="prod"), chosen=G8_KEY,
         held_back=("projects[research].max_burst_gpus",)),
    Case("higher-priority-project-first",
         policy={"limits": {"max_nodes": 1},
                 "projects": [{"name": "prod", "priority": 10}, {"name": "research", "priority": 0}]},
         # research waited longer, prod outranks it
         snapshot={"jobs": [job(0, project="research"), job(1, project="prod")]},
         rule=Rule.SCALE_UP, actions=launch(1, project="prod"), chosen=G8_KEY,
         held_back=("limits.max_nodes",)),
    Case("equal-priority-oldest-first",
         policy={"limits": {"max_nodes": 1}},
         snapshot={"jobs": [job(1, project="prod"), job(0, project="research")]},
         rule=Rule.SCALE_UP, actions=launch(1, project="research"), chosen=G8_KEY,
         held_back=("limits.max_nodes",)),
    # -- choosing the offering -------------------------------------------------------------------
    Case("cheapest-offering-chosen",
         policy={"offerings": [DEAR, offering_spec("g8", gpus=8, price=10)]},
         snapshot={"jobs": [job(0)]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY,
         check=_options_check(G8_KEY, DEAR_KEY)),
    Case("cheapest-for-the-demand-not-per-node",
         # 4 GPUs of demand: a $6 4-GPU node beats a $10 8-GPU node
         policy={"offerings": [offering_spec("g8", gpus=8, price=10), offering_spec("g4", gpus=4, price=6)]},
         snapshot={"jobs": [job(0, 4)]},
         rule=Rule.SCALE_UP, actions=launch(1, "g4"), chosen=make_offering("g4", gpus=4, price=6).key,
         check=_options_check(make_offering("g4", gpus=4, price=6).key, G8_KEY)),
    Case("capacity-blocked-spot-falls-back-to-on-demand",
         policy={"offerings": [SPOT_SPEC]},
         snapshot={"jobs": [job(0)], "offerings": [make_offering("g8", price=10)],
                   "capacity_blocks": [CapacityBlock(SPOT_KEY, T0 + 3 * M, "ICE")]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY,
         check=_rejected_check(SPOT_KEY, "capacity error")),
    Case("expired-capacity-block-ignored",
         policy={"offerings": [SPOT_SPEC]},
         snapshot={"jobs": [job(0)], "offerings": [make_offering("g8", price=10)],
                   "capacity_blocks": [CapacityBlock(SPOT_KEY, T0, "ICE")]},
         rule=Rule.SCALE_UP, actions=launch(1, market="spot"), chosen=SPOT_KEY),
    Case("unknown-offering-rejected",
         policy={"offerings": [{"provider": "aws", "region": "us-east-1", "instance_type": "mystery"},
                               offering_spec("g8", gpus=8, price=10)]},
         snapshot={"jobs": [job(0)]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY,
         check=_rejected_check(make_offering("mystery").key, "not in the provider catalogue")),
    Case("no-usable-offering",
         policy={"offerings": [{"provider": "aws", "region": "us-east-1", "instance_type": "mystery"}]},
         snapshot={"jobs": [job(0)]},
         rule=Rule.NO_OFFERING, actions=HOLD,
         check=_rejected_check(make_offering("mystery").key, "not in the provider catalogue")),
    Case("catalogue-fills-gpus-and-price",
         policy={"offerings": [{"provider": "aws", "region": "us-east-1", "instance_type": "g8"}]},
         snapshot={"jobs": [job(0, 8)], "offerings": [make_offering("g8", price=12)]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY),
    # -- packing -----------------------------------------------------------------------------------
    # A job runs on one burst node (the dispatcher has no multi-node placement yet): one wider than
    # every offering's node is not launched for, and the decision says so (finding 5 of issue 13).
    Case("job-wider-than-one-node-is-not-launched-for",
         snapshot={"jobs": [job(0, 20)]},
         rule=Rule.LIMITED, actions=HOLD, held_back=(MULTI_NODE,),
         check=lambda p: _says(p, "1 job(s) wider than one burst node (8 GPUs) are not launched")),
    Case("wide-job-does-not-block-a-small-one",
         snapshot={"jobs": [job(0, 16), job(1, 4)]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY, held_back=(MULTI_NODE,)),
    Case("wide-job-is-not-covered-by-whole-free-nodes",
         # two idle 8-GPU nodes cannot run a 16-GPU job: they do not cover it, nor are they kept
         snapshot={"jobs": [job(0, 16)], "nodes": [make_node("n1", idle_since=T0 - 60 * M),
                                                   make_node("n2", idle_since=T0 - 60 * M)]},
         rule=Rule.LIMITED, held_back=(MULTI_NODE,),
         actions=[("drain", "n1", "idle"), ("drain", "n2", "idle"), ("hold",)]),
    Case("mixed-widths-sized-as-they-will-be-absorbed",
         # scheduling order 3, 3, 5, 5: packed in that order they need 3 nodes, not FFD's 2
         snapshot={"jobs": [job(0, 3), job(1, 3), job(2, 5), job(3, 5)]},
         rule=Rule.SCALE_UP, actions=launch(3), chosen=G8_KEY),
    Case("small-jobs-share-nodes",
         snapshot={"jobs": [job(i, 2) for i in range(8)]},
         rule=Rule.SCALE_UP, actions=launch(2), chosen=G8_KEY),
    # -- scale-down ------------------------------------------------------------------------------
    Case("idle-node-drained-after-idle-for",
         snapshot={"nodes": [idle_node("n1", 11 * M)]},
         rule=Rule.NO_DEMAND, actions=[("drain", "n1", "idle")],
         check=_drain_deadline_check("n1")),
    Case("idle-node-not-drained-before-idle-for",
         snapshot={"nodes": [idle_node("n1", 9 * M)]},
         rule=Rule.NO_DEMAND),
    Case("busy-node-not-drained",
         snapshot={"nodes": [make_node("n1", gpus_busy=8, running_jobs=1, idle_since=None)]},
         rule=Rule.NO_DEMAND),
    Case("idle-node-kept-when-pending-work-fits",
         policy={"trigger": {"pending_gpus_above": 100, "oldest_wait_above": "1h"}},
         snapshot={"jobs": [job(0, 4)], "nodes": [idle_node("n1", 60 * M)]},
         rule=Rule.COVERED),
    Case("idle-node-not-drained-in-scale-down-cooldown",
         policy={"cooldowns": {"scale_down": "5m"}},
         snapshot={"nodes": [idle_node("n1", 60 * M)], **_memory(last_launch_at=T0 - M)},
         rule=Rule.NO_DEMAND),
    Case("min-nodes-kept",
         policy={"limits": {"min_nodes": 1}},
         snapshot={"nodes": [idle_node("n1", 60 * M)]},
         rule=Rule.NO_DEMAND),
    Case("min-nodes-drains-only-the-surplus-oldest-idle-first",
         policy={"limits": {"min_nodes": 1}},
         snapshot={"nodes": [idle_node("n1", 20 * M), idle_node("n2", 60 * M)]},
         rule=Rule.NO_DEMAND, actions=[("drain", "n2", "idle")]),
    Case("min-nodes-launched",
         policy={"limits": {"min_nodes": 2}},
         rule=Rule.MIN_NODES, actions=launch(2, project=None, reason="min-nodes"), chosen=G8_KEY),
    Case("min-nodes-counts-in-flight",
         policy={"limits": {"min_nodes": 2}},
         snapshot={"nodes": [make_node("n1", state=S.BOOTING)]},
         rule=Rule.MIN_NODES, actions=launch(1, project=None, reason="min-nodes"), chosen=G8_KEY),
    Case("over-limit-drains-least-busy",
         policy={"limits": {"max_nodes": 1}},
         snapshot={"nodes": [make_node("n1", gpus_busy=8, running_jobs=2),
                             make_node("n2", gpus_busy=4, running_jobs=1)]},
         rule=Rule.NO_DEMAND, actions=[("drain", "n2", "over-limit")]),
    Case("over-limit-not-drained-twice",
         # two nodes already leave: the two ready ones fit max_nodes=2 and stay
         policy={"limits": {"max_nodes": 2}},
         snapshot={"nodes": [make_node("n1", gpus_busy=8, running_jobs=1),
                             make_node("n2", gpus_busy=8, running_jobs=1),
                             make_node("n3", state=S.DRAINING, drain_deadline=T0 + 5 * M),
                             make_node("n4", state=S.TERMINATING)]},
         rule=Rule.NO_DEMAND),
    Case("idle-drain-counts-toward-over-limit",
         policy={"limits": {"max_nodes": 2}},
         snapshot={"nodes": [idle_node("n1", 60 * M),
                             make_node("n2", gpus_busy=8, running_jobs=1),
                             make_node("n3", gpus_busy=8, running_jobs=1)]},
         rule=Rule.NO_DEMAND, actions=[("drain", "n1", "idle")]),
    Case("draining-released-terminated",
         snapshot={"nodes": [make_node("n1", state=S.DRAINING, released=True,
                                       drain_deadline=T0 + 10 * M)]},
         rule=Rule.NO_DEMAND, actions=[("terminate", "n1", "drained")]),
    Case("draining-past-deadline-terminated",
         snapshot={"nodes": [make_node("n1", state=S.DRAINING, drain_deadline=T0 - timedelta(seconds=1),
                                       running_jobs=1, gpus_busy=8)]},
         rule=Rule.NO_DEMAND, actions=[("terminate", "n1", "drain-deadline")]),
    Case("draining-within-deadline-waits",
         snapshot={"nodes": [make_node("n1", state=S.DRAINING, drain_deadline=T0 + M,
                                       running_jobs=1, gpus_busy=8)]},
         rule=Rule.NO_DEMAND),
    # -- pausing ---------------------------------------------------------------------------------
    Case("paused-pool-launches-nothing",
         snapshot={"jobs": [job(0)], "paused_pools": ["gpu"], **_memory(trigger_since=T0 - M)},
         rule=Rule.PAUSED, actions=HOLD, check=_memory_check(trigger_since=None)),
    Case("paused-pool-still-finishes-drains",
         snapshot={"paused_pools": ["gpu"],
                   "nodes": [make_node("n1", state=S.DRAINING, released=True)]},
         rule=Rule.PAUSED, actions=[("terminate", "n1", "drained")]),
    Case("unobserved-queue-launches-nothing",
         snapshot={"jobs": [job(0)], "queue": False},
         rule=Rule.NO_DEMAND),
    Case("other-policies-nodes-ignored",
         snapshot={"jobs": [job(0)], "nodes": [make_node("n1", state=S.BOOTING, policy="other")]},
         rule=Rule.SCALE_UP, actions=launch(1), chosen=G8_KEY),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_scenario(case: Case) -> None:
    policy = make_policy(**case.policy)
    snapshot = make_snapshot(**case.snapshot)
    result = plan(snapshot, [policy], T0)

    assert summarize(result) == sorted(case.actions, key=repr)
    [decision] = result.decisions
    assert decision.policy == POLICY and decision.at == T0
    assert decision.rule is case.rule, decision.summary
    assert decision.held_back_by == case.held_back, decision.summary
    assert decision.chosen == case.chosen
    assert len(decision.actions) == len(result.actions)  # every action is explained
    for action in result.actions:
        if isinstance(action, Launch | Drain | Terminate):
            assert action.decision_id == decision.id
    if case.check is not None:
        case.check(result)


def test_case_ids_are_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))


# -- determinism and ids -------------------------------------------------------------------------

def _busy_snapshot(now=T0):
    jobs = [job(i, g) for i, g in enumerate([1, 2, 3, 8, 12, 4, 4])]
    nodes = [make_node("b1", state=S.BOOTING), idle_node("idle", 60 * M),
             make_node("d1", state=S.DRAINING, released=True)]
    return make_snapshot(jobs, nodes=nodes, taken_at=now)


def test_plan_is_deterministic() -> None:
    policy = make_policy(offerings=[offering_spec("g8", gpus=8, price=10), DEAR])
    first = plan(_busy_snapshot(), [policy], T0)
    second = plan(_busy_snapshot(), [policy], T0)
    assert first == second
    assert first.launches  # the comparison covers launches, not just an empty plan


def test_ids_unique_within_a_plan_and_across_ticks() -> None:
    policy = make_policy()
    jobs = [job(i) for i in range(6)]
    one = plan(make_snapshot(jobs), [policy], T0)
    two = plan(make_snapshot(jobs, taken_at=T0 + M), [policy], T0 + M)
    launches = one.launches + two.launches
    assert len(one.launches) == len(two.launches) == 6
    assert len({lc.node_id for lc in launches}) == 12
    assert len({lc.request_id for lc in launches}) == 12
    assert one.decisions[0].id != two.decisions[0].id


def test_two_policies_get_distinct_ids() -> None:
    a = make_policy()
    b = make_policy(name="other")
    snapshot = make_snapshot([job(0)])
    result = plan(snapshot, [a, b], T0)
    assert [d.policy for d in result.decisions] == ["train", "other"]
    ids = [lc.node_id for lc in result.launches]
    assert len(ids) == 2 and len(set(ids)) == 2
    assert set(result.memory) == {"train", "other"}


def test_decision_inputs_name_the_demand() -> None:
    policy = make_policy(pool={"onprem": {"nodes": 1}})
    snapshot = make_snapshot([job(0, 8), job(1, 4)], onprem_free=(8,),
                             nodes=[make_node("n1", state=S.BOOTING)])
    result = plan(snapshot, [policy], T0)
    inputs = result.decisions[0].inputs
    assert inputs["pending_gpus"] == 12
    assert inputs["absorbed_onprem_gpus"] == 8
    assert inputs["absorbed_burst_gpus"] == 4
    assert inputs["unmet_gpus"] == 0
    assert inputs["nodes_by_state"] == {"booting": 1}
    assert result.decisions[0].rule is Rule.COVERED


def test_idle_drain_records_last_drain_at() -> None:
    result = plan(make_snapshot(nodes=[idle_node("n1", 60 * M)]), [make_policy()], T0)
    assert result.memory[POLICY].last_drain_at == T0


def test_launch_carries_the_offering_and_pool() -> None:
    result = plan(make_snapshot([job(0)]), [make_policy()], T0)
    [lc] = result.launches
    assert lc.offering == dataclasses.replace(G8, gpu_model="A100")
    assert (lc.policy, lc.pool, lc.project) == (POLICY, "gpu", "research")
    assert lc.node_id.startswith(f"{POLICY}-") and lc.request_id.startswith("r-")


@pytest.mark.parametrize("widths", [[3, 3, 5, 5], [1, 7, 2, 6, 4, 4], [5, 3, 5, 3], [6, 2, 2, 6],
                                    [8, 8, 1], [7, 3], [2] * 9])
def test_a_spike_is_answered_once(widths: list[int]) -> None:
    """The nodes launched for a spike absorb it while they boot: the next tick launches nothing."""
    policy = make_policy()
    jobs = [job(i, w) for i, w in enumerate(widths)]
    first = plan(make_snapshot(jobs), [policy], T0)
    assert first.decisions[0].rule is Rule.SCALE_UP
    booting = [make_node(lc.node_id, state=S.BOOTING, offering=lc.offering, state_since=T0,
                         created_at=T0) for lc in first.launches]
    later = T0 + M
    second = plan(make_snapshot(jobs, nodes=booting, taken_at=later, memory=first.memory),
                  [policy], later)
    assert second.launches == []
    assert second.decisions[0].rule is Rule.COVERED, second.decisions[0].summary
    assert second.decisions[0].inputs["absorbed_burst_gpus"] == sum(widths)
