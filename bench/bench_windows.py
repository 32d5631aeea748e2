"""Benchmark: policies compared on several windows of one trace and several seeds, on the full
trace's on-prem sizing. Prints figures; not a test.

    python bench/bench_windows.py --policy base=bench/policies/itp-no-spare.yaml \\
        --policy spare=bench/policies/itp-default.yaml
    python bench/bench_windows.py --days 10 --starts 0,10,20,30,40,50 --seeds 0,1 --policy ...

One policy's cost moves by a few per cent with the simulator's seed (the boot draws), as much as
many policy changes do, and a full-trace seed takes minutes. Short windows (the jobs submitted in
``[start, start + days)`` days from the trace's first submit, replayed from an empty cluster of
the full trace's size: on-prem at the p70 of the whole trace's concurrent demand, in
``--node-gpus`` nodes, easy backfill, 30-minute SLO, tick 1 minute) give many paired samples
for the same time. A window starts empty and drains at its end, so its costs are not a slice of
the full trace's; compare policies with each other, paired by window and seed: the summary gives
each policy's total, its ratio to the first policy's, on how many (window, seed) pairs it is
cheaper, its late jobs (wait past the SLO) and its longest wait.
"""

from __future__ import annotations

import argparse
import time

from orchestrator.policy import load_policy
from orchestrator.sim import SimOptions, load_trace
from orchestrator.sim.controllers import PolicyController
from orchestrator.sim.replay import as_simulated, replay, size_onprem
from orchestrator.sim.simjob import at
from orchestrator.sim.traces import Trace

SLO_S = 1800.0


def _floats(text: str) -> list[float]:
    return [float(s) for s in text.split(",") if s.strip()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", default="itp")
    parser.add_argument("--policy", action="append", required=True,
                        help="NAME=FILE (repeatable; the first is the reference)")
    parser.add_argument("--days", type=float, default=10.0, help="window length in days")
    parser.add_argument("--starts", default="0,10,20,30,40,50", type=_floats,
                        help="window starts, days from the first submit")
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds")
    parser.add_argument("--node-gpus", type=int, default=4)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    full = load_trace(args.trace)
    first = full.jobs[0].submit_s
    windows = []
    for start in args.starts:
        a, b = first + start * 86400, first + (start + args.days) * 86400
        windows.append((start, Trace(f"{full.name}[{start:g}d+{args.days:g}d]",
                                     tuple(j for j in full.jobs if a <= j.submit_s < b),
                                     full.source)))
    results: dict[tuple[str, float, int], tuple[float, int, float]] = {}
    names = []
    began = time.perf_counter()
    for spec in args.policy:
        name, path = spec.split("=", 1)
        names.append(name)
        policy = load_policy(path)
        sizing = size_onprem(full, policy, "p70", args.node_gpus)
        sim = as_simulated(policy, sizing)
        for start, trace in windows:
            for seed in seeds:
                options = SimOptions(seed=seed, slo_s=SLO_S, node_gpus=args.node_gpus,
                                     onprem="p70", tick_s=60.0)
                engine = replay(PolicyController(sim, policy.name), policy, sim, trace, sizing,
                                options)
                cost = sum(b.cost_micro_usd
                           for b in engine.provider.bills(until=at(engine.now))) / 1e6
                waits = [j.wait_s for j in engine.world.jobs]
                late = sum(1 for w in waits if w > SLO_S)
                results[(name, start, seed)] = (cost, late, max(waits, default=0.0))
                print(f"{name} window {start:g}d seed {seed}: ${cost:,.0f}, {late} late, max "
                      f"wait {max(waits, default=0.0) / 60:.1f} min "
                      f"({time.perf_counter() - began:.0f} s)", flush=True)
    reference = names[0]
    pairs = [(start, seed) for start, _ in windows for seed in seeds]
    base = sum(results[(reference, s, k)][0] for s, k in pairs)
    print(f"\ntrace {full.name}, windows of {args.days:g} d from {args.starts} d, seeds {seeds}")
    for name in names:
        total = sum(results[(name, s, k)][0] for s, k in pairs)
        cheaper = sum(1 for s, k in pairs
                      if results[(name, s, k)][0] < results[(reference, s, k)][0])
        late = sum(results[(name, s, k)][1] for s, k in pairs)
        longest = max(results[(name, s, k)][2] for s, k in pairs)
        print(f"{name:<16} total ${total:12,.0f}  x{total / base:.4f}  cheaper in "
              f"{cheaper}/{len(pairs)}  late jobs {late}  max wait {longest / 60:.1f} min")


if __name__ == "__main__":
    main()
