"""Multi-node placement in the planner: launch groups of one offering, all or nothing, the
interconnect a wide job requires, and the decisions that say why a wide job is held."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain import NodeState, Rule
from orchestrator.planner import plan
from orchestrator.planner.placement import MULTI_NODE, NO_INTERCONNECT, WIDER_THAN_LIMIT
from orchestrator.policy.enums import Interconnect
from tests.builders import T0, make_job, make_node, make_offering, make_policy, make_snapshot, offering_spec

M = timedelta(minutes=1)
TORCH = {"kind": "torch-elastic", "torch": {"rdzv_endpoint": "127.0.0.1:29400", "run_id": "r",
                                             "entrypoint": ["train.py"]}}
EFA8 = make_offering("efa8", price=30)
EFA8 = type(EFA8)(**{**{f: getattr(EFA8, f) for f in EFA8.__dataclass_fields__},
                    "interconnect": Interconnect.EFA, "interconnect_gbps": 3200})
PLAIN8 = make_offering("g8", price=10)


def job(i: int, gpus: int):
    return make_job(f"j{i}", gpus=gpus, submitted_at=T0 - 10 * M + timedelta(seconds=i))


def policy(**kw):
    base = {"fabric": TORCH, "offerings": [offering_spec("g8", price=10)]}
    base.update(kw)
    return make_policy(**base)


def run(pol, jobs, nodes=(), offerings=(PLAIN8, EFA8)):
    return plan(make_snapshot(jobs, nodes=nodes, offerings=offerings), [pol], T0)


def test_a_wide_job_gets_one_launch_group_of_one_offering():
    result = run(policy(), [job(0, 20)])
    launches = result.launches
    assert len(launches) == 3  # ceil(20 / 8)
    assert {lc.offering.key for lc in launches} == {PLAIN8.key}
    assert {lc.group for lc in launches} != {None} and len({lc.group for lc in launches}) == 1
    assert all(lc.group_size == 3 and lc.jobs == ("j0",) for lc in launches)
    assert list(result.launch_groups) == [launches[0].group]
    decision = result.decisions[0]
    assert decision.rule is Rule.SCALE_UP and "launch group(s)" in decision.summary


def test_one_node_jobs_stay_out_of_groups():
    result = run(policy(), [job(0, 4), job(1, 8)])
    assert [lc.group for lc in result.launches] == [None, None]


def test_booting_group_covers_its_job_next_tick():
    pol = policy()
    first = run(pol, [job(0, 16)])
    nodes = [make_node(lc.node_id, state=NodeState.BOOTING, offering=lc.offering, instance_id="i")
             for lc in first.launches]
    again = run(pol, [job(0, 16)], nodes=nodes)
    assert again.launches == [] and again.decisions[0].rule is Rule.COVERED


def test_a_group_wider_than_max_nodes_is_held_never_partly_launched():
    result = run(policy(limits={"max_nodes": 2}), [job(0, 24)])
    assert result.launches == []
    decision = result.decisions[0]
    assert WIDER_THAN_LIMIT in decision.held_back_by
    assert "never partly launched" in decision.summary and "limits.max_nodes (2)" in decision.summary


def test_an_offerings_own_max_nodes_passes_the_group_to_the_next():
    pol = policy(offerings=[offering_spec("g8", price=10, max_nodes=1),
                            offering_spec("efa8", price=30)])
    result = run(pol, [job(0, 16)])
    assert [lc.offering.instance_type for lc in result.launches] == ["efa8", "efa8"]


def test_room_for_part_of_a_group_launches_none_of_it():
    # 3 nodes alive, max 4: the 16-GPU job's 2 nodes do not both fit, so neither is launched,
    # while a one-node job behind it still gets the last node
    nodes = [make_node(f"n{i}", gpus_busy=8, running_jobs=1) for i in range(3)]
    result = run(policy(limits={"max_nodes": 4}), [job(0, 16), job(1, 8)], nodes=nodes)
    assert [(lc.group, lc.jobs) for lc in result.launches] == [(None, ("j1",))]
    assert "limits.max_nodes" in result.decisions[0].held_back_by


def test_multi_node_requires_keeps_offerings_without_it_out_of_groups():
    pol = policy(multi_node_requires="efa",
                 offerings=[offering_spec("g8", price=10), offering_spec("efa8", price=30)])
    result = run(pol, [job(0, 16), job(1, 8)])
    by_job = {lc.jobs: lc.offering.instance_type for lc in result.launches}
    assert by_job == {("j0",): "efa8", ("j1",): "g8"}  # the one-node job takes the cheap one
    assert NO_INTERCONNECT in result.decisions[0].held_back_by


def test_no_offering_with_the_interconnect_holds_the_wide_job_and_says_so():
    result = run(policy(multi_node_requires="rdma"), [job(0, 16)])
    assert result.launches == []
    assert "offerings without interconnect rdma" in result.decisions[0].summary


def test_offering_asking_for_an_interconnect_its_type_lacks_is_rejected():
    pol = policy(offerings=[offering_spec("g8", price=10, interconnect="efa"),
                            offering_spec("efa8", price=30, interconnect="efa")])
    result = run(pol, [job(0, 8)])
    assert [lc.offering.instance_type for lc in result.launches] == ["efa8"]
    rejected = {o.offering_key: o.rejected for o in result.decisions[0].options if o.rejected}
    assert "interconnect efa asked for" in rejected[PLAIN8.key]


def test_the_builtin_fabric_still_holds_jobs_wider_than_a_node():
    result = run(make_policy(), [job(0, 16)])
    assert result.launches == [] and MULTI_NODE in result.decisions[0].held_back_by


@settings(max_examples=60, deadline=None)
@given(widths=st.lists(st.integers(1, 40), min_size=1, max_size=8), max_nodes=st.integers(1, 8),
       alive=st.integers(0, 4))
def test_groups_are_whole_one_offering_and_within_max_nodes(widths, max_nodes, alive):
    pol = policy(limits={"max_nodes": max_nodes, "max_concurrent_launches": 8},
                 offerings=[offering_spec("g8", price=10, max_nodes=3),
                            offering_spec("efa8", price=30)])
    nodes = [make_node(f"n{i}", gpus_busy=8, running_jobs=1) for i in range(alive)]
    result = run(pol, [job(i, w) for i, w in enumerate(widths)], nodes=nodes)
    assert len(result.launches) + alive <= max(max_nodes, alive)
    for group, members in result.launch_groups.items():
        assert len({m.offering.key for m in members}) == 1  # one offering: one provider/region/zone
        assert len(members) == members[0].group_size  # never partly launched
        (job_id,) = {m.jobs for m in members}
        width = widths[int(job_id[0][1:])]
        assert len(members) == -(-width // members[0].offering.gpus)
