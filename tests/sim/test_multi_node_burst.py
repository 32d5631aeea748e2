"""Multi-node jobs on burst nodes in a policy run: where the policy's fabric spans nodes (Slurm,
torch elastic) a job wider than one node runs on whole free nodes of one offering, as the planner
launches them (one launch group); with the built-in queue it runs on one node or not at all.
The pool rule (orchestrator.sim.burstpool) by hand and by property, then whole runs of the real
planner and executor (tests.sim.helpers)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.lifecycle import NodeEvent
from orchestrator.sim.burstpool import BurstPool, Spread
from orchestrator.sim.controllers import PolicyController
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.traces import TraceJob
from orchestrator.sim.world import World, at
from tests.builders import make_node, make_offering
from tests.sim.helpers import job, nodes_by_launch, run_with, sim_policy, trace


def pool_of(spread: Spread, nodes: list[tuple[str, int]]) -> BurstPool:
    pool = BurstPool(spread)
    for index, (offering, gpus) in enumerate(nodes):
        pool.add_node(index, gpus, offering)
    return pool


def test_a_wide_job_takes_whole_nodes_of_one_offering_only() -> None:
    pool = pool_of(Spread.ONE_OFFERING, [("a", 4), ("a", 4), ("b", 4)])
    assert not pool.fits_job(12) and pool.find_job(12) is None  # 3 whole nodes, but two offerings
    assert pool.fits_job(8)
    assert sorted(i for i, _ in pool.find_job(8)) == [0, 1]
    mixed = pool_of(Spread.ANY, [("a", 4), ("a", 4), ("b", 4)])
    assert mixed.fits_job(12)  # the baselines' autoscaler rule: any whole nodes


def test_one_node_spread_never_places_a_job_over_nodes() -> None:
    pool = pool_of(Spread.ONE_NODE, [("a", 4), ("a", 4)])
    assert not pool.fits_job(8) and pool.find_job(8) is None
    assert pool.find_job(4) == ((0, 4),)


def test_a_job_one_node_holds_goes_on_one_node_before_whole_nodes() -> None:
    pool = pool_of(Spread.ONE_OFFERING, [("small", 4), ("small", 4), ("big", 8)])
    assert pool.find_job(8) == ((2, 8),)  # the 8-GPU node, not two 4-GPU ones
    pool.take(pool.find_job(8))
    assert sorted(i for i, _ in pool.find_job(8)) == [0, 1]  # now the two 4-GPU ones
    pool.take(pool.find_job(8))
    assert pool.free_total == 0 and not pool.fits_job(1)


def test_a_partly_busy_node_is_not_a_whole_node_and_release_gives_it_back() -> None:
    pool = pool_of(Spread.ONE_OFFERING, [("a", 4), ("a", 4)])
    one = pool.find_job(1)
    pool.take(one)
    assert not pool.fits_job(8)
    pool.release(one)
    assert pool.fits_job(8)
    pool.remove_node(1)  # (drained)
    assert not pool.fits_job(8) and pool.fits_job(4)


@settings(max_examples=200, deadline=None)
@given(nodes=st.lists(st.sampled_from([("a", 2), ("b", 4), ("c", 4), ("d", 8)]),  # (offering, GPUs)
                      min_size=1, max_size=10),
       busy=st.lists(st.integers(1, 8), max_size=6),
       width=st.integers(1, 40))
def test_placements_stay_within_one_offering_and_cover_the_job(nodes, busy, width) -> None:
    pool = pool_of(Spread.ONE_OFFERING, nodes)
    for gpus in busy:  # some one-node work first
        alloc = pool.find_job(gpus) if gpus <= pool.max_size else None
        if alloc is not None and len(alloc) == 1:
            pool.take(alloc)
    free_before = dict(pool.free)
    alloc = pool.find_job(width)
    assert pool.fits_job(width) == (alloc is not None)
    if alloc is None:
        return
    assert sum(used for _, used in alloc) >= width
    offerings = {nodes[index][0] for index, _ in alloc}
    assert len(offerings) == 1
    if len(alloc) > 1:
        sizes = {nodes[index][1] for index, _ in alloc}
        assert len(sizes) == 1 and all(free_before[i] == nodes[i][1] for i, _ in alloc)
        assert len(alloc) == -(-width // sizes.pop())  # ceil(width / node GPUs) whole nodes
    else:
        [(index, used)] = alloc
        assert used == width and free_before[index] >= width


# -- whole runs ----------------------------------------------------------------------------------

FOUR = [{"provider": "sim", "region": "r1", "instance_type": "s4", "gpus": 4, "price_usd_hour": 4}]
JOBS = trace(("busy", 0.0, 4 * 3600.0, 4), ("wide", 60.0, 3600.0, 8))


def _run(**policy):
    # On-prem: two 4-GPU nodes, one busy for 4 hours: the wide job needs both.
    settings_ = {"offerings": FOUR, "pool": {"name": "gpu", "onprem": {"nodes": 2,
                                                                        "gpus_per_node": 4}}}
    settings_.update(policy)
    return run_with(lambda p: PolicyController(p, "t"), sim_policy(**settings_), JOBS,
                    nodes=2, gpus_per_node=4, node_gpus=4, onprem="8")


def test_a_slurm_fabric_runs_a_wide_job_on_its_launch_group() -> None:
    engine = _run(queue={"source": "slurm"})
    wide = job(engine, "wide")
    assert wide.where == "burst" and wide.end_s is not None
    launched = nodes_by_launch(engine)
    assert len(launched) == 2 and engine.counters.launches == 2  # ceil(8 / 4), one group
    assert wide.wait_s < 1800
    assert len({n.offering_key for n in launched}) == 1


def test_the_builtin_queue_holds_the_wide_job_on_prem() -> None:
    engine = _run()
    wide = job(engine, "wide")
    assert wide.where == "onprem" and engine.counters.launches == 0
    assert wide.wait_s >= 4 * 3600 - 60  # until the busy job ends
    assert engine.store.held_back["placement.one_node_per_job"] > 0


def _ready(world: World, node_id: str, offering) -> None:
    node = make_node(node_id, offering=offering, policy="simtest", pool="gpu")
    world.store.add_node(node, NodeEvent(node_id, at(0), None, node.state, "test", {}))
    world.node_ready(node, 0.0)


def test_the_world_never_splits_a_wide_job_across_offerings() -> None:
    """Three whole free 4-GPU burst nodes, two offerings: a 12-GPU job waits; an 8-GPU one runs
    on the two nodes of one offering."""
    policy = sim_policy(queue={"source": "slurm"})
    jobs = (TraceJob("busy", 0.0, 3600.0, 4), TraceJob("w12", 0.0, 600.0, 12),
            TraceJob("w8", 1.0, 600.0, 8))
    world = World(policy, jobs, 1, 4, SimStore())
    busy, wide12, wide8 = world.jobs
    world.burst.spread = Spread.ONE_OFFERING
    _ready(world, "a1", make_offering("a4", gpus=4))
    _ready(world, "b1", make_offering("b4", gpus=4))
    _ready(world, "a2", make_offering("a4", gpus=4))
    world.arrive(busy, 0.0, eligible=False)
    assert world.dispatch(0.0) == [busy]  # on-prem (one 4-GPU node) is full now
    world.arrive(wide12, 0.0, eligible=True)
    assert world.dispatch(0.0) == []  # 12 GPUs would need both offerings
    world.arrive(wide8, 1.0, eligible=True)
    [started] = world.dispatch(1.0)
    assert started.trace.job_id == "w8" and started.where == "burst"
    assert sorted(started.burst_nodes) == ["a1", "a2"]
    runs = world.running_on_burst()
    assert sorted((r.node_id, r.gpus) for r in runs) == [("a1", 4), ("a2", 4)]
    world.finish(started, started.attempt, 601.0)
    assert world.running_on_burst() == () and all(run[4] == 601.0 for run in world.burst_runs)
