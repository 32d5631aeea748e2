"""The queue's scheduling order is memoized, and absorption tallies the unmet jobs from columns:
neither may change a decision.

* :func:`orchestrator.planner.demand.ordered` is a pure memo keyed on the identity of the pending
  tuple and the project priorities: warm or cold, the plan is the same; an equal tuple of other
  identity, another set of priorities or a list is ordered afresh.
* :func:`orchestrator.planner.demand.absorb` tallies the unmet jobs (per project in order of their
  first unmet job, per width, expected hours, oldest submit time) from the queue's columns, also
  when absorption stops early and the rest of the queue is unmet: the tallies equal counting the
  unmet jobs one by one.
* Absorption under quotas alone chooses among nodes by whose they are and remembers a refusal
  while no start loosens it: the jobs land where asking every node one by one puts them.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain import NodeState
from orchestrator.planner import demand as demand_module
from orchestrator.planner import plan
from orchestrator.planner.admission import Admission, NodeAdmitter, held_gpus
from orchestrator.planner.census import take_census
from orchestrator.planner.demand import absorb, ordered, scheduling_order
from orchestrator.planner.offerings import expected_hours
from tests.builders import NaiveAdmitter, T0, make_job, make_node, make_policy, make_snapshot, offering_spec

M = timedelta(minutes=1)
PROJECTS = [{"name": "a", "priority": 2}, {"name": "b", "priority": 0}]


def _cold() -> None:
    demand_module._ORDER_MEMO.clear()


def _jobs(specs: list[tuple[str, int, int, int, int | None]]) -> tuple:
    # Few distinct submit times (ties broken by id), ids not in submit order.
    return tuple(make_job(f"j{(i * 7) % 41}", project=p, priority=prio, gpus=g,
                          submitted_at=T0 - age * M, duration_s=d)
                 for i, (p, prio, age, g, d) in enumerate(specs))


SPECS = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 2), st.integers(0, 5),
                           st.integers(1, 12), st.sampled_from([None, 600.0, 3600.0, 0.0, 1e3 / 3])),
                 max_size=40)


def test_the_memo_gives_the_same_plan_cold_and_warm() -> None:
    policy = make_policy(projects=PROJECTS, offerings=[offering_spec("g8", gpus=8, price=10)])
    jobs = _jobs([(p, i % 3, i % 4, 1 + i % 9, 600.0 if i % 2 else None)
                  for i, p in enumerate(["a", "b", "c"] * 10)])
    snapshot = make_snapshot(jobs, nodes=[make_node("b1", state=NodeState.BOOTING)],
                             onprem_free=[3, 2])
    _cold()
    cold = plan(snapshot, [policy], T0)
    warm = plan(snapshot, [policy], T0)
    _cold()
    assert cold == warm == plan(snapshot, [policy], T0)
    assert repr(cold) == repr(warm)  # the record's dicts in the same order too
    assert cold.decisions[0].inputs["unmet_gpus"] > 0


def test_the_memo_is_keyed_on_identity_and_priorities() -> None:
    jobs = _jobs([("a", 0, 1, 1, None), ("b", 1, 2, 2, None), ("c", 0, 0, 4, None)])
    policy = make_policy(projects=PROJECTS)
    first = ordered(jobs, policy)
    assert ordered(jobs, policy) is first
    assert ordered(tuple(jobs), policy) is first  # tuple() of a tuple is the same object
    assert ordered(jobs[:1] + jobs[1:], policy) is not first  # equal, but another tuple
    other = make_policy(projects=[{"name": "b", "priority": 5}])
    assert ordered(jobs, other) is not first
    assert scheduling_order(jobs, other)[0].project == "b"
    assert ordered(list(jobs), policy) is not ordered(list(jobs), policy)  # lists: never memoized


@settings(max_examples=120, deadline=None)
@given(SPECS, st.lists(st.integers(0, 8), max_size=4), st.lists(st.integers(0, 8), max_size=4),
       st.integers(0, 3), st.booleans())
def test_absorb_tallies_equal_counting_the_unmet_jobs(specs, onprem, busy, default, warm) -> None:
    policy = make_policy(projects=PROJECTS, default_project_priority=default)
    jobs = _jobs(specs)
    nodes = [make_node(f"n{i}", gpus_busy=b) for i, b in enumerate(busy)]
    snapshot = make_snapshot(jobs, nodes=nodes, onprem_free=onprem)
    if not warm:
        _cold()
    demand = absorb(snapshot.queues["gpu"], nodes, policy, take_census(nodes, policy, None))
    assert demand.ordered == tuple(scheduling_order(list(jobs), policy))
    unmet = demand.unmet
    if not jobs:
        return
    per_project: dict[str, int] = {}
    for job in unmet:
        per_project[job.project] = per_project.get(job.project, 0) + job.gpus
    assert list(demand.unmet_by_project.items()) == list(per_project.items())
    assert demand.unmet_widths == Counter(j.gpus for j in unmet)
    assert demand.unmet_hours == expected_hours([j.duration_s for j in unmet])
    assert demand.unmet_gpus == sum(j.gpus for j in unmet)
    assert demand.pending_gpus == sum(j.gpus for j in jobs)
    assert demand.onprem_absorbed_gpus == sum(j.gpus for j in demand.onprem_absorbed)
    assert demand.burst_absorbed_gpus == sum(j.gpus for j in demand.burst_absorbed)
    beyond = demand.burst_absorbed + unmet
    assert demand.beyond_onprem == beyond
    assert demand.oldest_beyond == min((j.submitted_at for j in beyond), default=None)
    # absorption is first-fit in scheduling order: a job fits nowhere only after the ones before
    placed = demand.onprem_absorbed + demand.burst_absorbed
    assert sorted(placed + unmet, key=demand.ordered.index) == list(demand.ordered)


def test_one_queue_under_changing_capacity_plans_as_if_cold() -> None:
    # The simulator hands the same pending tuple while its queue does not change, and capacity
    # moves under it: absorption stops at another position each time (tallies kept per position).
    policy = make_policy(projects=PROJECTS, offerings=[offering_spec("g4", gpus=4, price=4)])
    jobs = _jobs([(p, i % 3, i % 5, 1 + i % 4, 3600.0 if i % 3 else None)
                  for i, p in enumerate(["a", "b", "c", "c"] * 12)])
    free_sets = [[8, 8], [1], [8, 8, 8, 8, 8], [], [8, 8], [3, 3, 3]]
    warm = [plan(make_snapshot(jobs, onprem_free=free), [policy], T0) for free in free_sets]
    for free, seen in zip(free_sets, warm, strict=True):
        _cold()
        assert repr(plan(make_snapshot(jobs, onprem_free=free), [policy], T0)) == repr(seen)


@settings(max_examples=150, deadline=None)
@given(SPECS, st.lists(st.integers(0, 8), max_size=4), st.data())
def test_narrowing_the_unmet_jobs_equals_counting_the_rest(specs, onprem, data) -> None:
    # The wait-aware split keeps some unmet jobs queued: the tallies of the rest (by subtraction)
    # equal counting them, project order included, or are dropped (counted later) when a
    # project would be left with no GPUs.
    policy = make_policy(projects=PROJECTS)
    demand = absorb(make_snapshot(_jobs(specs), onprem_free=onprem).queues["gpu"], [], policy)
    unmet = demand.unmet
    keep = data.draw(st.lists(st.booleans(), min_size=len(unmet), max_size=len(unmet)))
    due = tuple(j for j, k in zip(unmet, keep) if k)
    removed = tuple(j for j, k in zip(unmet, keep) if not k)
    narrowed = demand.narrowed(due, removed)
    assert narrowed.unmet == due
    assert narrowed.unmet_gpus == sum(j.gpus for j in due)
    if narrowed.unmet_by_project is None:  # dropped: none to begin with, or a project lost all
        assert (demand.unmet_by_project is None
                or {j.project for j in due} != set(demand.unmet_by_project))
        return
    per_project: dict[str, int] = {}
    for job in due:
        per_project[job.project] = per_project.get(job.project, 0) + job.gpus
    assert list(narrowed.unmet_by_project.items()) == list(per_project.items())
    assert narrowed.unmet_widths == Counter(j.gpus for j in due)
    assert narrowed.unmet_hours == expected_hours([j.duration_s for j in due])



NODE_SPECS = st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(0, 8),
                                st.sampled_from([NodeState.READY, NodeState.READY,
                                                 NodeState.BOOTING])), max_size=12)


@settings(max_examples=60, deadline=None)
@given(SPECS, NODE_SPECS, st.integers(0, 24), st.integers(0, 24))
def test_quota_shortcuts_absorb_as_asking_every_node(specs, node_specs, quota_a, quota_b) -> None:
    # Quota-only admission chooses among nodes by whose they are, and a refusal is remembered
    # while nothing loosens it: the same jobs must land on the same nodes, held the same.
    policy = make_policy(projects=[{"name": "a", "priority": 2, "max_burst_gpus": quota_a},
                                   {"name": "b", "priority": 0, "max_burst_gpus": quota_b}])
    nodes = [make_node(f"n{i}", project=p, gpus_busy=busy, state=state)
             for i, (p, busy, state) in enumerate(node_specs)]
    queue = make_snapshot(_jobs(specs), nodes=nodes, onprem_free=[2]).queues["gpu"]
    outcomes = []
    for kind in (NodeAdmitter, NaiveAdmitter):
        admitter = kind(Admission(policy, None, T0, held_gpus(nodes)), nodes)
        found = absorb(queue, nodes, policy, take_census(nodes, policy, None), admitter)
        outcomes.append(([j.id for j in found.burst_absorbed], [j.id for j in found.unmet],
                         found.busy_nodes, admitter.admission.held))
    assert outcomes[0] == outcomes[1]
