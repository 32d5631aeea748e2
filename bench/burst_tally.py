"""Diagnostic: which jobs one policy's replay burst, by class of width and runtime, and what its
displacement records say. Prints figures; not a test.

    python bench/burst_tally.py --policy bench/policies/itp-default.yaml --node-gpus 4
    python bench/burst_tally.py --policy my.yaml --node-gpus 4 --days 10 --seed 1

Setting as ``bench/bench_seeds.py`` (on-prem at the p70 of concurrent demand, 30-minute SLO, easy
backfill, tick 1 minute). Classes: *narrow* jobs use fewer than 8 GPUs, *wide* ones 8 or more;
*short* jobs run under an hour, *medium* ones under a day, *long* ones a day or more. For each
class: its jobs and GPU-hours, the GPU-hours burst, the jobs that missed the SLO and the longest
wait. The displacement tally counts the records of every decision (``inputs.displaced``; at
most 20 per decision are recorded) by the ``reason`` each gives, and by the class of the jobs
displaced and of the jobs they were displaced for.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

from orchestrator.policy import load_policy
from orchestrator.sim import SimOptions
from orchestrator.sim.controllers import PolicyController
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.replay import as_simulated, replay, size_onprem
from orchestrator.sim.simjob import DONE, at
from trace_args import add_trace_args, trace_of


def job_class(gpus: int, duration_s: float) -> str:
    width = "wide" if gpus >= 8 else "narrow"
    length = "short" if duration_s < 3600 else "medium" if duration_s < 86400 else "long"
    return f"{width}-{length}"


def main() -> None:
    parser = argparse.ArgumentParser()
    add_trace_args(parser)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--node-gpus", type=int, default=4)
    args = parser.parse_args()
    trace = trace_of(args)
    policy = load_policy(args.policy)
    options = SimOptions(seed=args.seed, slo_s=1800.0, node_gpus=args.node_gpus, onprem="p70",
                         tick_s=60.0)
    sizing = size_onprem(trace, policy, options.onprem, options.node_gpus)
    sim = as_simulated(policy, sizing)

    records: list[dict] = []
    keep = SimStore.add_decision

    def add_decision(store, decision) -> None:
        records.extend((decision.inputs.get("wait_aware") or {}).get("displaced") or ())
        keep(store, decision)

    SimStore.add_decision = add_decision  # type: ignore[method-assign]
    began = time.perf_counter()
    try:
        engine = replay(PolicyController(sim, policy.name), policy, sim, trace, sizing, options)
    finally:
        SimStore.add_decision = keep  # type: ignore[method-assign]
    wall = time.perf_counter() - began
    print(f"trace {trace.name}: {len(trace.jobs):,} jobs; on-prem {sizing.gpus:,} GPUs in "
          f"{sizing.nodes} x {sizing.gpus_per_node}; policy {policy.name}; seed {args.seed}; "
          f"{wall:.0f} s")
    cost = sum(b.cost_micro_usd for b in engine.provider.bills(until=at(engine.now))) / 1e6
    tally: dict[str, dict] = defaultdict(lambda: Counter())
    cls_of: dict[str, str] = {}
    for job in engine.world.jobs:
        cls = job_class(job.gpus, job.trace.duration_s)
        cls_of[job.domain.id] = cls
        gpu_h = job.gpus * job.trace.duration_s / 3600.0
        row = tally[cls]
        row["jobs"] += 1
        row["gpu_h"] += gpu_h
        if job.state == DONE and job.where == "burst":
            row["burst_jobs"] += 1
            row["burst_gpu_h"] += gpu_h
        if job.wait_s > options.slo_s:
            row["late"] += 1
            row["late_gpu_h"] += gpu_h
        row["max_wait"] = max(row["max_wait"], job.wait_s)
    print(f"{'class':<14} {'jobs':>7} {'GPU-h':>10} {'burst jobs':>10} {'burst GPU-h':>12} "
          f"{'late':>5} {'max wait':>9}")
    total = Counter()
    for cls in sorted(tally):
        row = tally[cls]
        print(f"{cls:<14} {row['jobs']:7,} {row['gpu_h']:10,.0f} {row['burst_jobs']:10,} "
              f"{row['burst_gpu_h']:12,.0f} {row['late']:5,} {row['max_wait'] / 60:8.1f}m")
        total.update({k: v for k, v in row.items() if k != "max_wait"})
    print(f"{'all':<14} {total['jobs']:7,} {total['gpu_h']:10,.0f} {total['burst_jobs']:10,} "
          f"{total['burst_gpu_h']:12,.0f} {total['late']:5,}")
    print(f"cost ${cost:,.2f}; SLO {100 * (1 - total['late'] / total['jobs']):.2f} % of jobs, "
          f"{100 * (1 - total['late_gpu_h'] / total['gpu_h']):.2f} % of GPU-h")
    if records:
        print(f"\ndisplacement records: {len(records):,}")
        reasons = Counter(r.get("reason", "displacement") for r in records)
        for reason, count in reasons.most_common():
            print(f"  reason {reason}: {count:,}")
        pairs = Counter((cls_of.get(r["job"], "?"), cls_of.get(r["displaced_for"], "?"))
                        for r in records)
        for (moved, kept), count in pairs.most_common(12):
            print(f"  {moved:<14} displaced for {kept:<14} {count:6,}")


if __name__ == "__main__":
    main()
