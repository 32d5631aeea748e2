"""The planner's speed work must not change a single decision.

* The candidate memo (:func:`orchestrator.planner.offerings.resolved`) is pure: the same inputs
  give the same plan with the memo cold or warm, and another catalogue, another set of capacity
  blocks or a block that ran out is resolved afresh.
* The tick that decides nothing (nothing unmet, nothing to drain, no floor) records what the full
  path records: every candidate priced at 0 nodes, ranked by hourly price.
* The one-pass census of the nodes gives what each rule used to count on its own.
* The scheduling order is (project priority, job priority) descending, then (submitted_at, id).
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain import CapacityBlock, NodeState
from orchestrator.domain.plan import Rule
from orchestrator.planner import offerings as offerings_module
from orchestrator.planner import plan
from orchestrator.planner.census import take_census
from orchestrator.planner.demand import scheduling_order
from orchestrator.planner.offerings import resolve_candidates, resolved
from orchestrator.planner.offerings import price_options
from tests.builders import (
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
CHEAP, DEAR = offering_spec("g4", gpus=4, price=4), offering_spec("g8", gpus=8, price=30)


def _policy(**kw):
    return make_policy(offerings=[CHEAP, DEAR], **kw)


def _cold() -> None:
    offerings_module._MEMO.clear()


# -- the candidate memo ----------------------------------------------------------------------------

def test_memo_gives_the_same_plan_cold_and_warm() -> None:
    policy = _policy()
    snapshot = make_snapshot([make_job(f"j{i}", gpus=g) for i, g in enumerate([1, 3, 8, 16])],
                             nodes=[make_node("b1", state=S.BOOTING)])
    _cold()
    cold = plan(snapshot, [policy], T0)
    warm = plan(snapshot, [policy], T0)
    _cold()
    again = plan(snapshot, [policy], T0)
    assert cold == warm == again
    assert cold.launches  # the comparison covers launches and priced options
    assert len(cold.decisions[0].options) == 2


def test_memo_returns_the_same_result_for_the_same_inputs() -> None:
    policy = _policy()
    catalogue = (make_offering("g4", gpus=4, price=4.0),)
    first = resolved(policy, catalogue, (), T0)
    assert resolved(policy, catalogue, (), T0) is first
    usable, rejected = resolve_candidates(policy, catalogue, (), T0)
    assert list(first.candidates) == usable and list(first.rejected) == rejected


def test_another_catalogue_is_resolved_afresh() -> None:
    # The catalogue's price fills in an offering the policy leaves unpriced.
    policy = make_policy(offerings=[{"provider": "aws", "region": "us-east-1",
                                     "instance_type": "g4", "market": "on-demand"}])
    before = resolved(policy, (make_offering("g4", gpus=4, price=4.0),), (), T0)
    after = resolved(policy, (make_offering("g4", gpus=4, price=5.0),), (), T0)
    assert before.candidates[0].offering.price_usd_hour == 4.0
    assert after.candidates[0].offering.price_usd_hour == 5.0
    assert resolved(policy, (), (), T0).candidates == ()  # not in the catalogue: rejected
    assert "not in the provider catalogue" in (resolved(policy, (), (), T0).rejected[0].rejected or "")


def test_capacity_blocks_are_part_of_the_key_and_expire() -> None:
    policy = _policy()
    key = resolved(policy, (), (), T0).candidates[0].key
    block = CapacityBlock(key, T0 + 10 * M, "InsufficientInstanceCapacity")
    blocked = resolved(policy, (), (block,), T0)
    assert key not in [c.key for c in blocked.candidates]
    assert "InsufficientInstanceCapacity" in (blocked.rejected[0].rejected or "")
    # Another reason is another value: recomputed, not served from the entry above.
    other = resolved(policy, (), (CapacityBlock(key, T0 + 10 * M, "quota"),), T0)
    assert "quota" in (other.rejected[0].rejected or "")
    # Once the block has run out the offering is usable again, the block still listed.
    later = resolved(policy, (), (block,), T0 + 11 * M)
    assert key in [c.key for c in later.candidates] and later.rejected == ()


def test_another_policy_object_is_never_served_a_cached_entry() -> None:
    first = make_policy(offerings=[CHEAP])
    second = make_policy(offerings=[DEAR])
    assert [c.key for c in resolved(first, (), (), T0).candidates] != \
        [c.key for c in resolved(second, (), (), T0).candidates]


def test_memo_stays_bounded() -> None:
    policy = _policy()
    for i in range(offerings_module._MEMO_SIZE + 10):
        resolved(policy, (make_offering(f"x{i}"),), (), T0)
    assert len(offerings_module._MEMO) <= offerings_module._MEMO_SIZE


# -- the tick that decides nothing -----------------------------------------------------------------

def test_quiet_tick_records_every_candidate_at_zero_nodes_ranked_by_price() -> None:
    policy = make_policy(offerings=[DEAR, CHEAP])  # the dear one first in the policy
    snapshot = make_snapshot([make_job("j1", gpus=2)], onprem_free=[8],
                             nodes=[make_node("r1", gpus_busy=8, running_jobs=1)])
    result = plan(snapshot, [policy], T0)
    decision = result.decisions[0]
    assert decision.rule is Rule.NO_DEMAND and result.actions == ()
    usable, _ = resolve_candidates(policy, (), (), T0)
    assert list(decision.options) == price_options((), usable)
    assert [o.nodes for o in decision.options] == [0, 0]
    assert decision.inputs["nodes_by_state"] == {"ready": 1}
    assert decision.inputs["spend_usd_hour"] == 10.0


def test_quiet_tick_is_unchanged_by_a_warm_memo_across_ticks() -> None:
    policy = _policy()
    ticks = [T0 + i * M for i in range(3)]
    _cold()
    warm = [plan(make_snapshot(taken_at=t), [policy], t) for t in ticks]
    cold = []
    for t in ticks:
        _cold()
        cold.append(plan(make_snapshot(taken_at=t), [policy], t))
    assert warm == cold


# -- the census ------------------------------------------------------------------------------------

_states = st.sampled_from(list(NodeState))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_states, st.integers(0, 8), st.integers(0, 2), st.integers(0, 30),
                          st.booleans()), max_size=12))
def test_census_counts_what_each_rule_used_to_count(specs) -> None:
    policy = make_policy()
    nodes = [make_node(f"n{i}", state=state, gpus_busy=busy, running_jobs=running,
                       idle_since=T0 - idle * M if running == 0 else None,
                       policy="train" if mine else "other")
             for i, (state, busy, running, idle, mine) in enumerate(specs)]
    census = take_census(nodes, policy, T0, only_policy="train")
    live = [n for n in nodes if n.policy == "train" and not n.state.is_terminal]
    assert census.nodes == live
    assert census.ready == [n for n in live if n.state is S.READY]
    assert census.draining == [n for n in live if n.state is S.DRAINING]
    staying = [n for n in live if n.state.in_flight or n.state is S.READY]
    assert (census.staying, census.staying_gpus) == (len(staying), sum(n.gpus for n in staying))
    assert census.idle == [n for n in census.ready if n.running_jobs == 0 and n.idle_since is not None
                           and T0 - n.idle_since >= policy.scale_down.idle_for]
    assert census.spend_usd_hour == sum(n.price_usd_hour for n in live)
    by_state: dict[str, int] = {}
    for n in live:
        by_state[str(n.state)] = by_state.get(str(n.state), 0) + 1
    assert census.by_state == by_state
    burst = [n for n in live if (n.state is S.READY and n.gpus_free > 0) or n.state.in_flight]
    assert census.burst_owners == [n.id for n in burst]
    assert census.burst_free == [n.gpus if n.state.in_flight else n.gpus_free for n in burst]
    assert census.burst_node_size == max((n.gpus for n in burst), default=0)


# -- the scheduling order --------------------------------------------------------------------------

@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 2), st.integers(0, 5),
                          st.integers(0, 3)), max_size=40),
       st.integers(0, 3))
def test_scheduling_order_is_priorities_then_age_then_id(specs, default_priority) -> None:
    policy = make_policy(projects=[{"name": "a", "priority": 2}, {"name": "b", "priority": 0}],
                         default_project_priority=default_priority)
    # Few distinct submit times: many ties, broken by id; ids not in submit order.
    jobs = [make_job(f"j{(i * 7) % 41}", project=p, priority=prio, submitted_at=T0 - age * M, gpus=g + 1)
            for i, (p, prio, age, g) in enumerate(specs)]
    priorities = {"a": 2, "b": 0}
    expected = sorted(jobs, key=lambda j: (-priorities.get(j.project, default_priority), -j.priority,
                                           j.submitted_at, j.id))
    assert scheduling_order(tuple(jobs), policy) == expected


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 2),
                          st.sampled_from([0, 0, 1, 700_000]), st.integers(0, 3)), max_size=40))
def test_scheduling_order_on_submit_times_centuries_apart(specs) -> None:
    # Submit times ~2,000 years apart: the packed sort key (class, submit time, position) would
    # not fit in 63 bits, so the order is a lexsort; ties still go by id, then position.
    policy = make_policy(projects=[{"name": "a", "priority": 2}, {"name": "b", "priority": 0}])
    jobs = [make_job(f"j{(i * 7) % 13}", project=p, priority=prio,
                     submitted_at=T0 - timedelta(days=age), gpus=g + 1)
            for i, (p, prio, age, g) in enumerate(specs)]
    priorities = {"a": 2, "b": 0}
    expected = [j for _, j in sorted(enumerate(jobs), key=lambda e: (
        -priorities.get(e[1].project, 0), -e[1].priority, e[1].submitted_at, e[1].id, e[0]))]
    assert scheduling_order(tuple(jobs), policy) == expected
