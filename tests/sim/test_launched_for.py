"""A ready burst node goes first to the pending jobs it was launched for (``Node.launched_for``),
not to the oldest pending job that fits: the simulator's burst dispatch
(orchestrator.sim.burstfill), by hand on a World, then a whole policy run."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.placement import GroupRecord, GroupState
from orchestrator.lifecycle import NodeEvent
from orchestrator.sim.burstpool import Spread
from orchestrator.sim.controllers import PolicyController
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.traces import TraceJob
from orchestrator.sim.world import PENDING, World, at
from tests.builders import make_node, make_offering
from tests.sim.helpers import run_with, sim_policy, trace

FOUR = make_offering("a4", gpus=4)


def _world(*jobs: TraceJob, spread: Spread = Spread.ONE_NODE) -> World:
    """One 4-GPU on-prem node, busy with a job "busy" for an hour; ``jobs`` pending, eligible."""
    policy = sim_policy(queue={"source": "slurm"}) if spread is not Spread.ONE_NODE else sim_policy()
    world = World(policy, (TraceJob("busy", 0.0, 3600.0, 4), *jobs), 1, 4, SimStore())
    world.burst.spread = spread
    busy, *rest = world.jobs
    world.arrive(busy, 0.0, eligible=False)
    assert world.dispatch(0.0) == [busy]
    for job in rest:
        world.arrive(job, job.trace.submit_s, eligible=True)
    return world


def _node(world: World, node_id: str, launched_for: tuple[str, ...], *,
          state: NodeState = NodeState.READY):
    node = replace(make_node(node_id, offering=FOUR, policy="simtest", pool="gpu", state=state),
                   launched_for=launched_for)
    world.store.add_node(node, NodeEvent(node_id, at(0), None, node.state, "test", {}))
    return node


def _started(world: World, now: float) -> dict[str, tuple[str, ...]]:
    return {job.trace.job_id: job.burst_nodes for job in world.dispatch(now)}


def test_a_node_goes_to_the_job_it_was_launched_for_not_the_oldest() -> None:
    world = _world(TraceJob("old", 10.0, 600.0, 4), TraceJob("late", 20.0, 600.0, 4))
    world.node_ready(_node(world, "n1", ("late",)), 30.0)
    assert _started(world, 30.0) == {"late": ("n1",)}
    assert world.jobs[1].state == PENDING and world.claimed_starts == 1
    # A node launched for no job (min-nodes, a baseline's) goes to the oldest that fits.
    world.node_ready(_node(world, "n2", ()), 40.0)
    assert _started(world, 40.0) == {"old": ("n2",)}
    assert world.claimed_starts == 1


def test_jobs_packed_on_one_node_all_take_it_before_an_older_one() -> None:
    world = _world(TraceJob("old", 10.0, 600.0, 2), TraceJob("a", 20.0, 600.0, 2),
                   TraceJob("b", 21.0, 600.0, 2))
    world.node_ready(_node(world, "n1", ("b", "a")), 30.0)
    assert _started(world, 30.0) == {"a": ("n1",), "b": ("n1",)}
    assert world.jobs[1].state == PENDING


def test_a_node_whose_job_started_elsewhere_goes_to_the_oldest() -> None:
    world = _world(TraceJob("old", 10.0, 600.0, 4), TraceJob("late", 20.0, 600.0, 4))
    world.node_ready(_node(world, "n0", ()), 25.0)
    world.node_ready(_node(world, "n1", ("old",)), 25.0)  # launched for "old"
    started = _started(world, 25.0)
    assert started["old"] == ("n1",) and started["late"] == ("n0",)
    world = _world(TraceJob("old", 10.0, 600.0, 4), TraceJob("late", 20.0, 600.0, 4))
    world.node_ready(_node(world, "n1", ("late",)), 30.0)
    assert _started(world, 30.0) == {"late": ("n1",)}
    world.node_ready(_node(world, "n2", ("late",)), 40.0)  # (a second launch for it, say)
    assert _started(world, 40.0) == {"old": ("n2",)}  # its job runs already: the oldest


def _group_world(peer: NodeState):
    """An "old" 4-GPU job and a "wide" 8-GPU one; a launch group of two 4-GPU nodes for "wide",
    g1 ready at 30 s and its peer g2 in ``peer``."""
    world = _world(TraceJob("old", 10.0, 600.0, 4), TraceJob("wide", 20.0, 600.0, 8),
                   spread=Spread.ONE_OFFERING)
    _node(world, "g2", ("wide",), state=peer)
    world.store.add_group(GroupRecord("g", "simtest", "sim", "r", None, FOUR.key, 2, ("g1", "g2"),
                                      GroupState.ACTIVE, at(0), at(0)))
    world.node_ready(_node(world, "g1", ("wide",)), 30.0)
    return world


def test_a_launch_group_keeps_its_first_node_for_its_job_until_the_rest_is_up() -> None:
    world = _group_world(NodeState.BOOTING)
    assert _started(world, 30.0) == {}  # "old" fits g1, but g1 is kept for "wide"
    assert world.burst.free_total == 4  # (the reservation is only for the fill)
    booted = world.store.get_node("g2")
    world.store._put(replace(booted, state=NodeState.READY))  # (as the engine's boot records it)
    world.node_ready(world.store.get_node("g2"), 60.0)
    assert {k: sorted(v) for k, v in _started(world, 60.0).items()} == {"wide": ["g1", "g2"]}


def test_a_launch_group_whose_peers_are_gone_frees_its_node() -> None:
    world = _group_world(NodeState.FAILED)
    assert _started(world, 30.0) == {"old": ("g1",)}


def test_in_a_policy_run_every_launched_for_job_that_bursts_takes_its_node() -> None:
    """A whole run of the real planner and executor: on-prem (one 4-GPU node) is busy for two
    hours, four 4-GPU jobs arrive; each burst node is launched for one of them and runs it."""
    jobs = trace(("busy", 0.0, 7200.0, 4), ("a", 60.0, 1800.0, 4), ("b", 90.0, 1800.0, 4),
                 ("c", 400.0, 1800.0, 4), ("d", 700.0, 1800.0, 4))
    policy = sim_policy(offerings=[{"provider": "sim", "region": "r1", "instance_type": "s4",
                                    "gpus": 4, "price_usd_hour": 4}],
                        pool={"name": "gpu", "onprem": {"nodes": 1, "gpus_per_node": 4}})
    engine = run_with(lambda p: PolicyController(p, "t"), policy, jobs, nodes=1, gpus_per_node=4,
                      node_gpus=4, onprem="4")
    world = engine.world
    burst = [j for j in world.jobs if j.where == "burst"]
    assert burst and world.claimed_starts == len(burst)
    launched_for = {job_id for node in engine.store.nodes(include_terminated=True)
                    for job_id in node.launched_for}
    assert {job.trace.job_id for job in burst} == launched_for
