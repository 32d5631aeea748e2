"""The simulated on-prem scheduler: priority then FIFO with backfill, whole GPUs of one node for
multi-GPU jobs, whole nodes for multi-node jobs; and the GPU pool it places jobs on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.planner.demand import scheduling_order
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.pool import GpuPool
from orchestrator.sim.traces import TraceJob
from orchestrator.sim.world import Backfill, World
from tests.sim.helpers import sim_policy


def world_of(jobs: list[tuple], nodes: int = 1, per_node: int = 8, policy=None,
             backfill: Backfill = Backfill.EASY) -> World:
    trace = tuple(TraceJob(*j) for j in jobs)
    return World(policy or sim_policy(), trace, nodes, per_node, SimStore(), backfill=backfill)


def arrive_all(world: World, now: float) -> None:
    for job in world.jobs:
        world.arrive(job, now, eligible=True)


def started_ids(started) -> list[str]:
    return [j.trace.job_id for j in started]


def test_higher_project_priority_starts_first_then_job_priority():
    policy = sim_policy(projects=[{"name": "hi", "priority": 10}])
    world = world_of([("a", 0, 100, 8, "lo"), ("b", 1, 100, 8, "lo", 5), ("c", 2, 100, 8, "hi"),
                      ("d", 3, 100, 8, "lo")], policy=policy)
    world.arrive(world.jobs[0], 0, True)
    assert started_ids(world.dispatch(0)) == ["a"]
    for job in world.jobs[1:]:
        world.arrive(job, 3, True)
    assert world.dispatch(3) == []
    order = []
    for now in (100, 200, 300):
        running = next(j for j in world.jobs if j.state == 1)
        world.finish(running, running.attempt, now)
        order += started_ids(world.dispatch(now))
    assert order == ["c", "b", "d"]  # project priority, then the job's own priority, then FIFO


def test_equal_priority_is_fifo():
    world = world_of([("a", 0, 100, 8), ("b", 1, 100, 8), ("c", 2, 100, 8)])
    arrive_all(world, 2)
    assert started_ids(world.dispatch(2)) == ["a"]
    world.finish(world.jobs[0], 0, 100)
    assert started_ids(world.dispatch(100)) == ["b"]


def test_backfill_starts_a_later_job_that_fits_when_the_head_does_not():
    world = world_of([("a", 0, 100, 4), ("big", 1, 100, 8), ("small", 2, 100, 2)])
    arrive_all(world, 2)
    assert started_ids(world.dispatch(2)) == ["a", "small"]  # big waits; small backfills
    assert world.jobs[1].state == 0


def test_multi_gpu_jobs_need_gpus_of_one_node():
    world = world_of([("a", 0, 100, 3), ("b", 0, 100, 3), ("c", 0, 100, 3)], nodes=2, per_node=4)
    arrive_all(world, 0)
    assert started_ids(world.dispatch(0)) == ["a", "b"]  # 2 GPUs free in all, but 1 per node


def test_multi_node_jobs_need_whole_free_nodes():
    world = world_of([("a", 0, 100, 1), ("wide", 1, 100, 8)], nodes=2, per_node=4)
    arrive_all(world, 1)
    assert started_ids(world.dispatch(1)) == ["a"]  # 7 GPUs free, but only one whole node
    world.finish(world.jobs[0], 0, 100)
    assert started_ids(world.dispatch(100)) == ["wide"]
    assert sorted(world.jobs[1].alloc) == [(0, 4), (1, 4)]
    assert world.onprem.free_total == 0


def test_pool_best_fit_keeps_whole_nodes_free_and_release_restores_them():
    pool = GpuPool.uniform(3, 8)
    first = pool.place(6)
    assert first == ((0, 6),)
    assert pool.place(2) == ((0, 2),)  # best fit: the node with 2 left, not a whole one
    assert pool.whole_gpus == 16
    wide = pool.place(16)
    assert wide == ((1, 8), (2, 8)) and pool.free_total == 0
    assert pool.place(1) is None
    pool.release(wide)
    assert pool.free_per_node() == (0, 8, 8) and pool.whole_gpus == 16


def naive_backfill(world: World, policy) -> list[str]:
    """The scan the built-in queue does: scheduling order, start every job that fits."""
    pool = GpuPool.uniform(len(world.onprem), world.onprem.max_size)
    by_id = {j.trace.job_id: j for j in world.jobs}
    started = []
    for job in scheduling_order([j.domain for j in world.jobs], policy):
        if pool.place(by_id[job.id].gpus) is not None:
            started.append(job.id)
    return started


@settings(max_examples=60, deadline=None)
@given(
    widths=st.lists(st.sampled_from([1, 1, 2, 3, 4, 6, 8, 12, 16]), min_size=1, max_size=30),
    priorities=st.lists(st.integers(0, 2), min_size=30, max_size=30),
    projects=st.lists(st.sampled_from(["hi", "lo", "mid"]), min_size=30, max_size=30),
    nodes=st.integers(1, 4),
    per_node=st.sampled_from([4, 8]),
)
def test_dispatch_starts_exactly_what_a_backfill_scan_in_scheduling_order_starts(
        widths, priorities, projects, nodes, per_node):
    policy = sim_policy(projects=[{"name": "hi", "priority": 5}, {"name": "mid", "priority": 1}])
    jobs = [(f"j{i:02d}", i % 7, 100, w, projects[i], priorities[i]) for i, w in enumerate(widths)]
    world = world_of(jobs, nodes=nodes, per_node=per_node, policy=policy)
    arrive_all(world, 10)
    assert started_ids(world.dispatch(10)) == naive_backfill(world, policy)


def test_easy_backfill_keeps_a_wide_job_from_being_overtaken_forever():
    # Two 4-GPU nodes. "wide" (8 GPUs) needs both; a stream of long 1-GPU jobs keeps one node
    # busy under first-fit, so wide never starts. Under easy it reserves the nodes that free
    # first, and long jobs behind it may not use them.
    jobs = [("a", 0, 100, 4), ("wide", 1, 100, 8)] + [(f"s{k}", 2 + k, 1000, 1) for k in range(3)]
    for rule, wide_starts in ((Backfill.FIRST_FIT, False), (Backfill.EASY, True)):
        world = world_of(jobs, nodes=2, per_node=4, backfill=rule)
        arrive_all(world, 5)
        first = started_ids(world.dispatch(5))
        world.finish(world.jobs[0], 0, 105)
        later = started_ids(world.dispatch(105))
        if wide_starts:
            assert first == ["a"]  # the small jobs would outlive a's end (105): held back
            assert later == ["wide"]
        else:
            assert first == ["a", "s0", "s1", "s2"]
            assert later == []


def test_easy_backfill_lets_a_job_that_ends_in_time_use_the_reserved_nodes():
    jobs = [("a", 0, 100, 4), ("wide", 1, 100, 8), ("short", 2, 50, 2), ("long", 3, 500, 2)]
    world = world_of(jobs, nodes=2, per_node=4, backfill=Backfill.EASY)
    arrive_all(world, 3)
    assert started_ids(world.dispatch(3)) == ["a", "short"]  # short ends (53) before a (103)
    assert world.jobs[3].state == 0  # long would delay wide: it waits


def test_a_job_wider_than_the_pool_reserves_nothing():
    jobs = [("a", 0, 100, 4), ("huge", 1, 100, 64), ("long", 2, 500, 2)]
    world = world_of(jobs, nodes=2, per_node=4, backfill=Backfill.EASY)
    arrive_all(world, 2)
    assert started_ids(world.dispatch(2)) == ["a", "long"]  # huge never fits on-prem


def test_pool_find_skips_avoided_nodes_and_changes_nothing():
    pool = GpuPool.uniform(3, 8)
    assert pool.find(2, frozenset({0})) == ((1, 2),)
    assert pool.find(16, frozenset({1})) == ((0, 8), (2, 8))
    assert pool.find(24, frozenset({1})) is None
    assert pool.free_total == 24


def test_slurm_backfill_scans_past_an_older_job_of_the_same_width():
    # easy looks only at the first pending job of each width: "long" (2 GPUs) would delay wide,
    # so "short" (2 GPUs, ends before a) waits behind it. Slurm's pass tests every job in order.
    jobs = [("a", 0, 100, 4), ("b", 0, 100, 2), ("wide", 1, 100, 8), ("long", 2, 500, 2),
            ("short", 3, 50, 2)]
    for rule, expected in ((Backfill.EASY, ["a", "b"]), (Backfill.SLURM, ["a", "b", "short"])):
        world = world_of(jobs, nodes=2, per_node=4, backfill=rule)
        arrive_all(world, 3)
        assert started_ids(world.dispatch(3)) == expected, rule


def test_slurm_backfill_passes_come_at_most_every_bf_interval():
    # The main scheduler runs at every event, the backfill pass at most every bf_interval_s.
    jobs = [("a", 0, 100, 4), ("b", 0, 10, 3), ("wide", 1, 100, 8), ("small", 2, 20, 1),
            ("c", 3, 10, 1)]
    world = World(sim_policy(), tuple(TraceJob(*j) for j in jobs), 2, 4, SimStore(),
                  backfill=Backfill.SLURM, bf_interval_s=30.0)
    for job in world.jobs[:4]:
        world.arrive(job, 2, True)
    # a and b by the main scheduler; wide blocks it; the pass backfills small (ends by 102).
    assert started_ids(world.dispatch(2)) == ["a", "b", "small"]
    world.finish(world.jobs[1], 0, 12)
    world.arrive(world.jobs[4], 12, True)
    assert started_ids(world.dispatch(12)) == []  # wide heads the queue; no pass before 32
    assert started_ids(world.dispatch(32)) == ["c"]
