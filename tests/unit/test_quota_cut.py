"""The quota cut of absorption (:mod:`orchestrator.planner.quota_cut`): once every bin left is a
project's own and every project queued is over its quota, the rest is placed per project on the
columns. The jobs must land where asking every node one by one puts them, held GPUs the same, and
the tallies must equal counting the unmet jobs one by one.
"""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain import NodeState
from orchestrator.planner import quota_cut
from orchestrator.planner.admission import Admission, NodeAdmitter, held_gpus
from orchestrator.planner.census import take_census
from orchestrator.planner.demand import absorb
from orchestrator.planner.offerings import expected_hours
from tests.builders import NaiveAdmitter, T0, make_job, make_node, make_policy, make_snapshot

M = timedelta(minutes=1)



def _jobs(specs):
    return tuple(make_job(f"j{i:03d}", project=p, priority=prio, gpus=g,
                          submitted_at=T0 - age * M, duration_s=d)
                 for i, (p, prio, age, g, d) in enumerate(specs))


JOB_SPECS = st.lists(st.tuples(st.sampled_from(["a", "b", "b", "c"]), st.integers(0, 1),
                               st.integers(0, 30), st.sampled_from([0, 1, 1, 2, 3, 4, 8, 9]),
                               st.sampled_from([None, 600.0, 0.0, 1e3 / 3])),
                     max_size=60)
NODE_SPECS = st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(0, 8),
                                st.sampled_from([NodeState.READY, NodeState.READY,
                                                 NodeState.READY, NodeState.BOOTING])),
                      max_size=14)


def _outcomes(specs, node_specs, quotas, onprem):
    projects = [{"name": name, "priority": prio, "max_burst_gpus": quota}
                for (name, prio), quota in zip([("a", 1), ("b", 0), ("c", 0)], quotas)
                if quota is not None]
    projects += [{"name": "c", "priority": 0}] if quotas[2] is None else []
    policy = make_policy(projects=projects)
    nodes = [make_node(f"n{i}", project=p, gpus_busy=busy, state=state)
             for i, (p, busy, state) in enumerate(node_specs)]
    queue = make_snapshot(_jobs(specs), nodes=nodes, onprem_free=onprem).queues["gpu"]
    found = []
    for kind in (NodeAdmitter, NaiveAdmitter):
        admitter = kind(Admission(policy, None, T0, held_gpus(nodes)), nodes)
        demand = absorb(queue, nodes, policy, take_census(nodes, policy, None), admitter)
        found.append((demand, admitter.admission.held))
    return found


def _same(fast, naive) -> None:
    (got, held), (want, want_held) = fast, naive
    assert [j.id for j in got.burst_absorbed] == [j.id for j in want.burst_absorbed]
    assert [j.id for j in got.unmet] == [j.id for j in want.unmet]
    assert [j.id for j in got.onprem_absorbed] == [j.id for j in want.onprem_absorbed]
    assert got.busy_nodes == want.busy_nodes
    assert held == want_held
    assert got.absorbed_burst_gpus() == sum(j.gpus for j in want.burst_absorbed)
    if got.unmet_by_project is None:  # an empty queue: nothing tallied
        assert not want.unmet and not want.ordered
        return
    # The tallies, against counting the unmet jobs one by one.
    per_project: dict[str, int] = {}
    for job in want.unmet:
        per_project[job.project] = per_project.get(job.project, 0) + job.gpus
    assert list(got.unmet_by_project.items()) == list(per_project.items())
    assert got.unmet_gpus == sum(per_project.values())
    assert got.unmet_widths == Counter(j.gpus for j in want.unmet)
    assert got.unmet_hours == expected_hours([j.duration_s for j in want.unmet])
    waiting = [*want.burst_absorbed, *want.unmet]
    assert got.oldest_beyond == min((j.submitted_at for j in waiting), default=None)


@settings(max_examples=200, deadline=None)
@given(JOB_SPECS, NODE_SPECS, st.tuples(st.integers(0, 10), st.integers(0, 10),
                                        st.integers(0, 10) | st.none()),
       st.lists(st.integers(0, 3), max_size=2))
def test_the_cut_absorbs_as_asking_every_node(specs, node_specs, quotas, onprem) -> None:
    fast, naive = _outcomes(specs, node_specs, quotas, onprem)
    _same(fast, naive)


def test_the_cut_fires_and_places_each_project_on_its_own_nodes(monkeypatch) -> None:
    # Both projects hold their quota in nodes of their own; a booting node takes the first jobs
    # whoever they are; then only own nodes are left: the cut places the rest per project.
    calls = []
    real = quota_cut.place_own

    def spy(*args):
        calls.append(len(args[2]))
        return real(*args)

    monkeypatch.setattr("orchestrator.planner.quota_absorb.place_own", spy)
    specs = [("ab"[i % 2] if i % 7 else "b", i % 2, i % 9, [1, 2, 1, 4, 8][i % 5], 600.0)
             for i in range(50)]
    nodes = [("a", 0, NodeState.READY), ("a", 6, NodeState.READY), ("b", 0, NodeState.READY),
             ("b", 8, NodeState.READY), ("c", 0, NodeState.READY), (None, 0, NodeState.BOOTING)]
    fast, naive = _outcomes(specs, nodes, (16, 16, 0), [1])
    assert calls and calls[0] < len(specs)  # the cut came before the end of the queue
    assert fast[0].burst_absorbed and fast[0].unmet
    _same(fast, naive)
