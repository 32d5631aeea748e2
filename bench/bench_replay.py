"""Benchmark: one policy's replay of a trace, its wall and CPU time, its plan() calls and the
ticks it skipped (orchestrator/sim/idletick.py: idle and held ticks; slept: before the last
plan's holds_until, orchestrator/planner/horizon.py), and peak memory. Prints figures; not a
test.

    python bench/bench_replay.py --policy bench/policies/itp-default.yaml --node-gpus 4   # full ITP
    python bench/bench_replay.py --trace philly          # the shipped default, as burst simulate
    python bench/bench_replay.py --trace alibaba --days 30

Issue 17's targets: the full ITP trace under ``bench/policies/itp-default.yaml`` (on 4-GPU
on-prem nodes, as ``bench/bench_seeds.py --node-gpus 4``) in at most 10 s, the Philly and Alibaba
traces under the shipped default (``burst simulate --trace NAME``: its own node size) in at
most 30 s each, and at most 200 MiB of memory for the full ITP replay. Setting as ``burst
simulate``: on-prem at the p70 of concurrent demand, 30-minute SLO, easy backfill, tick 1
minute, seed 0.

Printed next to the replay, measured in the same process: the floor, the same trace replayed
on-prem only (the ``never`` baseline: the engine, the on-prem scheduler and the trace with no
planner), so the ratio holds on a busy machine; and the peak RSS of the process
(``resource.getrusage``: the trace, both replays and the interpreter). ``--profile`` prints the
policy replay's cProfile, by internal and by cumulative time, and writes it to the file
``BURST_PROFILE_OUT`` names, if set (``pstats`` reads it back, e.g. to compare two policies).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import resource
import time

from orchestrator.policy import DEFAULT_POLICY_PATH, load_policy
from orchestrator.sim import SimOptions, load_trace
from orchestrator.sim.controllers import NeverController, PolicyController
from orchestrator.sim.replay import as_simulated, run_controlled, size_onprem


def _timed(run) -> tuple[dict, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    from orchestrator.gctune import tune_gc

    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", default="itp")
    parser.add_argument("--policy", default=str(DEFAULT_POLICY_PATH),
                        help="policy file (default: the shipped default)")
    parser.add_argument("--node-gpus", type=int, default=None,
                        help="GPUs per on-prem node (default: the policy's)")
    parser.add_argument("--days", type=float, default=None,
                        help="only jobs submitted in the first N days")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--default-gc", action="store_true",
                        help="keep CPython's collector thresholds (default: burst's, as every "
                        "burst process sets them: orchestrator.gctune)")
    args = parser.parse_args()
    if not args.default_gc:
        tune_gc()

    began = time.perf_counter()
    trace = load_trace(args.trace)
    if args.days is not None:
        trace = trace.first_days(args.days)
    load_s = time.perf_counter() - began
    policy = load_policy(args.policy)
    options = SimOptions(seed=args.seed, node_gpus=args.node_gpus)
    sizing = size_onprem(trace, policy, options.onprem, options.node_gpus)
    sim = as_simulated(policy, sizing)

    floor, floor_wall, floor_cpu = _timed(lambda: run_controlled(
        "never", NeverController(), policy, sim, trace, sizing, options)[0])
    profiler = cProfile.Profile() if args.profile else None
    timings: dict = {}

    def policy_run() -> dict:
        if profiler is not None:
            profiler.enable()
        try:
            return run_controlled(policy.name, PolicyController(sim, policy.name), policy, sim,
                                  trace, sizing, options, timings=timings)[0]
        finally:
            if profiler is not None:
                profiler.disable()

    run, wall, cpu = _timed(policy_run)
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"trace {trace.name}: {len(trace.jobs):,} jobs (loaded in {load_s:.2f} s); on-prem "
          f"{sizing.gpus:,} GPUs in {sizing.nodes} x {sizing.gpus_per_node}; policy "
          f"{policy.name}; load average {load}")
    print(f"{'run':<14} {'wall s':>8} {'CPU s':>8} {'x floor':>8} {'plan() s':>9} {'plans':>8} "
          f"{'idle ticks':>10} {'held ticks':>10} {'slept':>8}")
    print(f"{'never (floor)':<14} {floor_wall:8.2f} {floor_cpu:8.2f} {1:8.2f} {'-':>9} {'-':>8} "
          f"{'-':>10} {'-':>10} {'-':>8}")
    plan_s = timings[policy.name]["plan_s"]
    print(f"{policy.name:<14} {wall:8.2f} {cpu:8.2f} {cpu / max(floor_cpu, 1e-9):8.2f} "
          f"{plan_s:9.2f} {run['plans']:8,} {run['idle_ticks']:10,} {run['held_ticks']:10,} "
          f"{run['slept_ticks']:8,}")
    print(f"peak RSS {rss_mib:.0f} MiB; cost ${run['cloud_cost_usd']:,.2f}; SLO "
          f"{100 * run['slo_attainment']:.2f} % of jobs, {100 * run['slo_attainment_gpu_hours']:.2f} "
          f"% of GPU-h; never: SLO {100 * floor['slo_attainment']:.2f} %")
    if profiler is not None:
        stats = pstats.Stats(profiler)
        if os.environ.get("BURST_PROFILE_OUT"):
            stats.dump_stats(os.environ["BURST_PROFILE_OUT"])
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
