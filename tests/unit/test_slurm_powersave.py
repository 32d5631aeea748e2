"""Power-save resumes planned by the planner's rules (orchestrator.planner.powersave), the routing
of node names to policies, and the hostlist expansion with and without scontrol."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.plan import Launch, Rule
from orchestrator.planner.powersave import ResumeRequest, plan_resume, requests_of
from orchestrator.powersave import PowerSaveError, route
from orchestrator.sources.slurm_cli import SlurmCli, expand_hostlist
from tests.builders import T0, make_node, make_offering, make_policy, make_snapshot, offering_spec

NAMES = [f"cloud-{i}" for i in range(1, 9)]


def power_policy(**overrides):
    base = {"name": "ps", "pool": {"name": "cloud"},
            "queue": {"source": "slurm", "partition": "cloud"},
            "fabric": {"slurm": {"join": "power-save", "slots": ["cloud-[1-8]"]}},
            "limits": {"max_nodes": 8, "max_concurrent_launches": 8}}
    base.update(overrides)
    return make_policy(**base)


def node_of(policy, id, state=NodeState.READY, **extra):
    return make_node(id, policy=policy.name, pool=policy.pool.name, state=state, **extra)


def test_one_launch_per_name_bound_through_its_jobs_and_recorded():
    policy = power_policy()
    requests = requests_of(["cloud-1", "cloud-2"], {"cloud-1": 8, "cloud-2": 8}, 8)
    resumed = plan_resume(make_snapshot(pool="cloud"), policy, requests, T0)
    assert set(resumed.launches) == {"cloud-1", "cloud-2"} and resumed.refused == {}
    assert all(launch.jobs == (name,) for name, launch in resumed.launches.items())
    # Slurm names nodes, not whose jobs wait: no project or user (no burst:user tag) is made up.
    assert all(lc.user is None and lc.project is None for lc in resumed.launches.values())
    assert [a for a in resumed.plan.actions if not isinstance(a, Launch)] == []
    decision = resumed.decision
    assert decision.rule is Rule.SCALE_UP
    assert decision.summary.startswith("Slurm ResumeProgram asked for cloud-1, cloud-2: launching 2")
    assert decision.inputs["slurm_power_save"]["launched_for"] == {
        n: lc.node_id for n, lc in resumed.launches.items()}
    assert decision.options  # the offerings weighed, with their cost


def test_idle_bound_nodes_do_not_absorb_a_new_name_but_count_for_max_nodes():
    policy = power_policy(limits={"max_nodes": 2, "max_concurrent_launches": 8})
    idle = node_of(policy, "n-idle", idle_since=T0 - timedelta(hours=1))  # 8 free GPUs
    snapshot = make_snapshot(pool="cloud", nodes=[idle])
    resumed = plan_resume(snapshot, policy, [ResumeRequest("cloud-2", 8),
                                             ResumeRequest("cloud-3", 8)], T0)
    assert list(resumed.launches) == ["cloud-2"]  # a new node, not the idle one; one under max
    assert "max_nodes" in resumed.refused["cloud-3"]


def test_only_offerings_of_the_nodes_size_are_candidates():
    policy = power_policy(offerings=[offering_spec("g4", gpus=4, price=1),
                                     offering_spec("g8", gpus=8, price=10)])
    resumed = plan_resume(make_snapshot(pool="cloud"), policy, [ResumeRequest("cloud-1", 8)], T0)
    assert resumed.launches["cloud-1"].offering.instance_type == "g8"
    none = plan_resume(make_snapshot(pool="cloud"), policy, [ResumeRequest("cloud-1", 2)], T0)
    assert none.launches == {} and none.decision.rule is Rule.NO_OFFERING


def test_an_exhausted_budget_refuses_with_the_budget_named():
    policy = power_policy(budgets=[{"name": "day", "window": "day", "limit_usd": 0.01}])
    resumed = plan_resume(make_snapshot(pool="cloud"), policy, [ResumeRequest("cloud-1", 8)], T0)
    assert resumed.launches == {}
    assert "budgets[day]" in resumed.refused["cloud-1"], resumed.refused


def test_a_paused_pool_refuses():
    policy = power_policy()
    resumed = plan_resume(make_snapshot(pool="cloud", paused_pools=["cloud"]), policy,
                          [ResumeRequest("cloud-1", 8)], T0)
    assert resumed.launches == {} and "paused" in resumed.refused["cloud-1"]


@settings(max_examples=60, deadline=None)
@given(wanted=st.lists(st.sampled_from(NAMES), min_size=1, max_size=6, unique=True),
       live=st.integers(0, 4), max_nodes=st.integers(0, 8), concurrent=st.integers(1, 8))
def test_launches_stay_within_the_names_and_the_limits(wanted, live, max_nodes, concurrent):
    policy = power_policy(limits={"max_nodes": max_nodes, "max_concurrent_launches": concurrent})
    nodes = [node_of(policy, f"n{i}", state=NodeState.BOOTING if i % 2 else NodeState.READY)
             for i in range(live)]
    resumed = plan_resume(make_snapshot(pool="cloud", nodes=nodes), policy,
                          [ResumeRequest(n, 8) for n in wanted], T0)
    launched = set(resumed.launches)
    assert launched | set(resumed.refused) == set(wanted) and not launched & set(resumed.refused)
    assert len(resumed.plan.actions) == len(launched)
    assert len({lc.node_id for lc in resumed.launches.values()}) == len(launched)
    assert len(launched) <= max(max_nodes - live, 0)
    booting = sum(1 for n in nodes if n.state is NodeState.BOOTING)
    assert len(launched) <= max(concurrent - booting, 0)


def test_names_route_to_the_policy_listing_them_and_unknown_names_are_named():
    policy = power_policy()
    other = power_policy(name="ps2", fabric={"slurm": {"join": "power-save",
                                                        "slots": ["gpu-cloud-[1-8]"]}})
    assert route([policy, other], ["cloud-1", "gpu-cloud-2", "cloud-3"]) == {
        "ps": ["cloud-1", "cloud-3"], "ps2": ["gpu-cloud-2"]}
    with pytest.raises(PowerSaveError, match=r"no power-save policy lists cloud-9, x-1 .*ps, ps2"):
        route([policy, other], ["cloud-9", "x-1"])


def test_a_power_save_policy_needs_its_cloud_node_names():
    with pytest.raises(Exception, match="join: power-save needs the State=CLOUD node names"):
        make_policy(queue={"source": "slurm"}, fabric={"slurm": {"join": "power-save"}})


HOSTLISTS = ["cloud-1", "cloud-[1-3]", "cloud-[1,3-4],gpu-cloud-[07-09]", "n[001-003],cloud-[3,5]"]


@pytest.mark.parametrize("expr", HOSTLISTS)
def test_hostnames_fall_back_to_the_parser_without_scontrol(expr, tmp_path):
    cli = SlurmCli(environ={"PATH": str(tmp_path)})  # no scontrol on this PATH
    assert cli.hostnames(expr) == expand_hostlist(expr)
    assert expand_hostlist("cloud-[1,3-4],gpu-cloud-[07-09]") == [
        "cloud-1", "cloud-3", "cloud-4", "gpu-cloud-07", "gpu-cloud-08", "gpu-cloud-09"]


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="Slurm client tools not installed")
@pytest.mark.parametrize("expr", HOSTLISTS)
def test_the_parser_agrees_with_scontrol_show_hostnames(expr, tmp_path):
    # `scontrol show hostnames` needs a slurm.conf but no controller.
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")
    done = subprocess.run(["scontrol", "show", "hostnames", expr], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "SLURM_CONF": str(conf)}, check=True)
    assert done.stdout.split() == expand_hostlist(expr)
    assert SlurmCli(str(conf)).hostnames(expr) == done.stdout.split()
