"""Benchmark: what naming whose work is unmet costs a tick. Prints figures; not a test.

    python bench/bench_owners.py [--repeat 7] [--jobs 100000] [--users-per-project 10]

The decision record lists unmet GPUs per (project, user) (``inputs.unmet_by_owner``, see
``orchestrator.planner._owners``), counting the first ``MAX_OWNER_SCAN`` unmet jobs in
scheduling order. This times that tally on a planner scenario of ``bench_plan.py`` (by default
its largest: 100k pending jobs, 10k nodes, 500 offerings), each job given a user of its project
(``--users-per-project`` of each of its 20 projects), next to two floors measured in the same
run: one whole cold ``plan()`` of that snapshot (the tally is part of it), and an uncapped tally
over every pending job (what the cap saves).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time

import yaml
from bench_plan import NOW, make_snapshot

from orchestrator.planner import MAX_OWNER_SCAN, _owners, demand, plan
from orchestrator.policy import load_policy_text


def make_policy(offerings: int):
    """bench_plan's policy, its max_nodes within the policy bound (10,000)."""
    specs = [{"provider": "sim", "region": "r", "zone": "z", "instance_type": f"t{i}",
              "market": "spot" if i % 2 else "on-demand", "gpus": [1, 2, 4, 8][i % 4],
              "price_usd_hour": round(1.0 + i * 0.37 % 30, 2)} for i in range(offerings)]
    doc = {"version": 1, "name": "bench",
           "pool": {"name": "gpu", "onprem": {"nodes": 500, "gpus_per_node": 8}},
           "trigger": {"sustained_for": "0s"}, "offerings": specs,
           "limits": {"max_nodes": 10_000, "max_concurrent_launches": 200},
           "projects": [{"name": f"p{i}", "priority": i % 3, "max_burst_gpus": 4000}
                        for i in range(20)]}
    return load_policy_text(yaml.safe_dump(doc), "bench")


def median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--users-per-project", type=int, default=10)
    args = parser.parse_args()
    rng = random.Random(42)
    snapshot = make_snapshot(args.jobs, args.jobs // 10, rng)
    queue = snapshot.queues["gpu"]
    jobs = tuple(dataclasses.replace(
        j, user=f"{j.project}-u{rng.randrange(args.users_per_project)}") for j in queue.pending)
    snapshot = dataclasses.replace(snapshot, queues={"gpu": dataclasses.replace(queue,
                                                                                pending=jobs)})
    policy = make_policy(500 if args.jobs >= 100_000 else 50)

    def cold() -> None:
        demand._ORDER_MEMO.clear()
        plan(snapshot, [policy], NOW)

    inputs = plan(snapshot, [policy], NOW).decisions[0].inputs
    print(f"{args.jobs} pending jobs, {args.users_per_project} users in each of 20 projects; "
          f"unmet jobs counted "
          f"{inputs['unmet_owner_jobs_counted']} (cap {MAX_OWNER_SCAN}), owners listed "
          f"{len(inputs['unmet_by_owner'])} + {inputs['unmet_owners_omitted']} omitted",
          flush=True)
    plan_ms = median_ms(cold, args.repeat)
    print(f"{'cold plan() ms (floor)':>34} {plan_ms:8.1f}", flush=True)
    capped_ms = median_ms(lambda: _owners(jobs), args.repeat)
    print(f"{'owner tally, capped ms':>34} {capped_ms:8.1f}  ({capped_ms / plan_ms:.1%} of the "
          "plan)", flush=True)
    full_ms = median_ms(lambda: _full(jobs), args.repeat)
    print(f"{'owner tally, every job ms':>34} {full_ms:8.1f}  ({full_ms / plan_ms:.1%} of "
          "the plan)")


def _full(jobs):
    """The tally without the cap (the same code over every job)."""
    from orchestrator import planner

    saved = planner.MAX_OWNER_SCAN
    planner.MAX_OWNER_SCAN = len(jobs)
    try:
        return planner._owners(jobs)
    finally:
        planner.MAX_OWNER_SCAN = saved


if __name__ == "__main__":
    main()
