"""Benchmark: plan() time on large snapshots. Prints figures; not a test.

    python bench/bench_plan.py [--repeat 7] [--wait-slo 30m] [--profile] [--million] [--tuples] [--cpu]

Scenarios grow to 100k pending jobs, 10k burst nodes and 500 offerings (the simulator's target
size). Each snapshot is planned ``--repeat`` times with the order memo cleared first (``cold ms``:
a queue seen for the first time, as a production tick sees a freshly observed queue; this is the
figure to compare with the 50 ms target) and as many times as it is (``warm ms``: a tick over an
unchanged queue, the order of its pending tuple memoized, as the simulator hands the same tuple
while its queue does not change). Jobs have realistic widths (1/2/4/8 GPUs, mostly small), 20
projects, a spread of submit times; nodes are spread over the lifecycle states; offerings are
distinct instance types. The pending jobs reach the planner as the
:class:`~orchestrator.domain.pending.PendingColumns` a queue source builds from its query rows
(built before the timing, as the source builds it before ``plan()``); ``--tuples`` hands them as
a tuple of Jobs instead (the columns are then built inside the cold figure). ``floor ms``: one
``numpy.argsort`` of the submit times, measured in the same run. ``--cpu``: every figure is CPU
time of this process (``time.process_time``), not wall time: on a machine shared with other
work, what the plan itself costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time
from datetime import UTC, datetime, timedelta

import numpy
import yaml

from orchestrator.domain import Job, Node, NodeState, OnPremState, PoolQueue, Snapshot
from orchestrator.domain.pending import PendingColumns, columns_of
from orchestrator.planner import demand, plan
from orchestrator.policy import Market, load_policy_text

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def make_policy(offerings: int, wait_slo: str | None = None) -> object:
    specs = [{"provider": "sim", "region": "r", "zone": "z", "instance_type": f"t{i}",
              "market": "spot" if i % 2 else "on-demand", "gpus": [1, 2, 4, 8][i % 4],
              "price_usd_hour": round(1.0 + i * 0.37 % 30, 2)} for i in range(offerings)]
    doc = {"version": 1, "name": "bench", "pool": {"name": "gpu", "onprem": {"nodes": 500, "gpus_per_node": 8}},
           "trigger": {"sustained_for": "0s", **({"wait_slo": wait_slo} if wait_slo else {})},
           "offerings": specs,
           "limits": {"max_nodes": 10000, "max_concurrent_launches": 200},
           "projects": [{"name": f"p{i}", "priority": i % 3, "max_burst_gpus": 4000} for i in range(20)]}
    return load_policy_text(yaml.safe_dump(doc), "bench")


def make_snapshot(jobs: int, nodes: int, rng: random.Random) -> Snapshot:
    widths = [1] * 50 + [2] * 25 + [4] * 15 + [8] * 10
    pending = tuple(Job(f"j{i}", f"p{rng.randrange(20)}", "gpu", rng.choice(widths),
                        NOW - timedelta(seconds=rng.randrange(1, 86400)), priority=rng.randrange(3),
                        duration_s=rng.choice([600, 3600, 14400])) for i in range(jobs))
    states = [NodeState.READY] * 7 + [NodeState.BOOTING, NodeState.DRAINING, NodeState.LAUNCHING]
    fleet = tuple(Node(f"n{i}", "bench", "gpu", "sim", f"sim/r/z/t{i % 8}/spot", f"t{i % 8}", Market.SPOT, 8, 9.5,
                       rng.choice(states), NOW - timedelta(minutes=rng.randrange(1, 600)),
                       NOW - timedelta(hours=1), f"r{i}", instance_id=f"i{i}", project=f"p{i % 20}",
                       gpus_busy=rng.choice([0, 8, 8, 8]), running_jobs=1,
                       idle_since=None, last_heartbeat=NOW) for i in range(nodes))
    free = tuple(rng.choice([0, 0, 0, 1, 2]) for _ in range(500))
    queue = PoolQueue("gpu", OnPremState(4000, sum(free), free), pending)
    return Snapshot(NOW, {"gpu": queue}, fleet, ())


def as_columns(snapshot: Snapshot) -> Snapshot:
    """The snapshot as a queue source hands it: pending jobs as columns built from rows."""
    queues = {}
    for name, queue in snapshot.queues.items():
        rows = [(j.id, j.project, j.gpus, j.priority, j.submitted_at, j.duration_s,
                 j.checkpoint_s, j.user, j.dataset_gb) for j in queue.pending]
        queues[name] = dataclasses.replace(queue, pending=PendingColumns.from_rows(name, rows))
    return dataclasses.replace(snapshot, queues=queues)


CLOCK = time.perf_counter  # --cpu: time.process_time


def floor_ms(snapshot: Snapshot, repeat: int) -> float:
    """The floor: one ``numpy.argsort`` of the pending jobs' submit times (median ms)."""
    submitted = columns_of(snapshot.queues["gpu"].pending).submitted_us
    times = []
    for _ in range(repeat):
        began = CLOCK()
        numpy.argsort(submitted)
        times.append((CLOCK() - began) * 1000)
    return statistics.median(times)


def main() -> None:
    from orchestrator.gctune import tune_gc

    tune_gc()  # the collector's thresholds every burst process runs with (orchestrator.gctune)
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--profile", action="store_true",
                        help="also print where one cold plan of the largest snapshot spends "
                        "its time")
    parser.add_argument("--wait-slo", default=None,
                        help="set trigger.wait_slo (e.g. 30m), as the shipped default does")
    parser.add_argument("--tuples", action="store_true",
                        help="hand the planner pending jobs as a tuple of Jobs (the simulator's "
                        "form) instead of the columns a queue source builds from its rows")
    parser.add_argument("--million", action="store_true",
                        help="also plan 1,000,000 pending jobs (10k nodes, 500 offerings)")
    parser.add_argument("--cpu", action="store_true",
                        help="time CPU of this process (time.process_time) instead of wall time")
    args = parser.parse_args()
    global CLOCK
    if args.cpu:
        CLOCK = time.process_time
    rng = random.Random(42)
    print(f"{'pending jobs':>12} {'nodes':>6} {'offerings':>9} {'cold ms':>8} {'cold min':>8} "
          f"{'warm ms':>8} {'floor ms':>8}  actions")
    sizes = [(1_000, 100, 10), (10_000, 1_000, 50), (100_000, 10_000, 500)]
    if args.million:
        sizes.append((1_000_000, 10_000, 500))
    for jobs, nodes, offerings in sizes:
        policy = make_policy(offerings, args.wait_slo)
        snapshot = make_snapshot(jobs, nodes, rng)
        if not args.tuples:
            snapshot = as_columns(snapshot)
        times, cold = [], []
        for _ in range(args.repeat):
            began = CLOCK()
            result = plan(snapshot, [policy], NOW)
            times.append((CLOCK() - began) * 1000)
        for _ in range(args.repeat):
            demand._ORDER_MEMO.clear()
            began = CLOCK()
            plan(snapshot, [policy], NOW)
            cold.append((CLOCK() - began) * 1000)
        print(f"{jobs:>12} {nodes:>6} {offerings:>9} {statistics.median(cold):>8.1f} "
              f"{min(cold):>8.1f} {statistics.median(times):>8.1f} "
              f"{floor_ms(snapshot, args.repeat):>8.2f}  {len(result.actions)} "
              f"({result.decisions[0].rule})")
    if args.profile:  # the last (largest) scenario, cold; profiling inflates every figure
        import cProfile
        import pstats

        demand._ORDER_MEMO.clear()
        profiler = cProfile.Profile()
        profiler.runcall(plan, snapshot, [policy], NOW)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(18)


if __name__ == "__main__":
    main()
