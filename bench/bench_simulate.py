"""Benchmark: the simulator's replay speed and the policy-quality comparison. Prints figures; not
a test.

    python bench/bench_simulate.py                 # the full ITP trace (69,351 jobs), ~2 minutes
    python bench/bench_simulate.py --days 10       # the first 10 days only, for a quick look

Setting (docs/simulator.md, "Sizing"): the Microsoft ITP trace from ``$BURST_TRACE_DIR`` (default
``../shared/data``), on-prem capacity = the 70th percentile of its concurrent GPU demand (every job
started at submit) in whole 8-GPU nodes, a 30-minute queue-wait SLO, seed 0, tick 1 minute.

On-prem scheduling: easy backfill (``--backfill first-fit`` for the built-in queue's rule).

Runs: the shipped default policy as it is (``default``), the default with its limits sized for a
cluster of that size (``bench/policies/itp-default.yaml``; its trigger keeps the default's
30-minute ``wait_slo``), the same without ``wait_slo`` (``bench/policies/itp-immediate.yaml``: all
unmet demand is burst once the trigger fires), that with a wait-only trigger
(``bench/policies/itp-wait.yaml``), and every baseline (never, greedy, threshold, clairvoyant).
With ``--prototype``, also ``wait-aware``: the prototype the planner's rule was built from
(``bench/wait_aware.py``; not the production planner). Also printed, as a diagnostic: the
clairvoyant's rule on the pool's whole nodes (``clairvoyant_on_nodes``).

Speed: wall time of each replay and the time spent inside ``plan()`` (target: the whole trace in
at most 15 s). Quality, for each policy against the issue's targets: SLO attainment within one
point of greedy's by jobs and by GPU-hours, no job waiting more than 3x the SLO, cloud cost at
most 1.05x the clairvoyant's and at most 0.90x greedy's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from orchestrator.policy import DEFAULT_POLICY_PATH, load_policy
from orchestrator.sim import SimOptions, load_trace, simulate
from orchestrator.sim.clairvoyant import clairvoyant_on_nodes
from orchestrator.sim.replay import as_simulated, run_controlled, size_onprem
from orchestrator.sim.world import Backfill

HERE = Path(__file__).resolve().parent
POLICIES = [("default", DEFAULT_POLICY_PATH), ("itp-default", HERE / "policies" / "itp-default.yaml"),
            ("itp-immediate", HERE / "policies" / "itp-immediate.yaml"),
            ("itp-wait", HERE / "policies" / "itp-wait.yaml")]


def main() -> None:
    from orchestrator.gctune import tune_gc

    tune_gc()  # the collector's thresholds every burst process runs with (orchestrator.gctune)
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", default="itp")
    parser.add_argument("--days", type=float, default=None, help="only jobs submitted in the first N days")
    parser.add_argument("--slo", type=float, default=1800.0, help="wait SLO in seconds")
    parser.add_argument("--backfill", default="easy", choices=[b.value for b in Backfill],
                        help="the on-prem scheduler's backfill rule")
    parser.add_argument("--node-gpus", type=int, default=8, help="GPUs per on-prem node")
    parser.add_argument("--prototype", action="store_true",
                        help="also run the wait-aware prototype (bench/wait_aware.py)")
    parser.add_argument("--policy", action="append", default=None,
                        help="NAME=FILE to run instead of the four default policies (repeatable)")
    args = parser.parse_args()

    began = time.perf_counter()
    trace = load_trace(args.trace)
    load_s = time.perf_counter() - began
    if args.days is not None:
        trace = trace.first_days(args.days)
    chosen = POLICIES if not args.policy else [tuple(p.split("=", 1)) for p in args.policy]
    policies = [(name, load_policy(path)) for name, path in chosen]
    options = SimOptions(slo_s=args.slo, node_gpus=args.node_gpus, onprem="p70", tick_s=60.0,
                         backfill=Backfill(args.backfill))
    began = time.perf_counter()
    result = simulate(trace, policies, baselines=True, options=options)
    total_s = time.perf_counter() - began
    data = result.data
    if args.prototype:
        import sys

        sys.path.insert(0, str(HERE))
        from wait_aware import WaitAwareController

        reference = policies[0][1] if len(policies) == 1 else policies[1][1]
        sizing = size_onprem(trace, reference, options.onprem, options.node_gpus)
        sim = as_simulated(reference, sizing)
        run, _ = run_controlled("wait-aware", WaitAwareController(sim, args.slo), reference, sim,
                                trace, sizing, options, timings=result.timings)
        run.pop("cloud", None)
        clv = next(r for r in data["runs"] if r["name"] == "clairvoyant")["cloud_cost_usd"]
        run["cost_vs_clairvoyant"] = round(run["cloud_cost_usd"] / clv, 4) if clv else None
        data["runs"].insert(len(policies), run)

    print(f"trace {data['trace']['name']}: {data['trace']['jobs']:,} jobs, "
          f"{data['trace']['gpu_hours']:,.0f} GPU-hours (loaded in {load_s:.2f} s); on-prem "
          f"{data['onprem']['gpus']:,} GPUs ({data['onprem']['sizing']}); SLO {args.slo:.0f} s")
    print()
    print("replay speed (wall time; target: the whole trace in <= 15 s)")
    print(f"{'run':<13} {'wall s':>8} {'plan() s':>9} {'plans':>7} {'us/plan':>8} {'other s':>8}")
    for name, timing in result.timings.items():
        plans = timing["plans"]
        per = f"{1e6 * timing['plan_s'] / plans:8.0f}" if plans else f"{'-':>8}"
        print(f"{name:<13} {timing['wall_s']:8.2f} {timing['plan_s']:9.2f} {plans:7,} {per} "
              f"{timing['wall_s'] - timing['plan_s']:8.2f}")
    print(f"all runs: {total_s:.1f} s")
    print()

    runs = {r["name"]: r for r in data["runs"]}
    greedy, clairvoyant = runs["greedy"], runs["clairvoyant"]
    # Diagnostic, not a run: the clairvoyant's rule on the simulated pool's whole nodes.
    began = time.perf_counter()
    onprem = data["onprem"]
    placed = clairvoyant_on_nodes(trace.jobs, onprem["nodes"], onprem["gpus_per_node"], args.slo)
    nodes_gpu_h = sum(j.gpus * j.duration_s for j, p in zip(trace.jobs, placed) if p.cloud) / 3600
    per_gpu_hour = clairvoyant["priced_at"]["usd_per_gpu_hour"]
    print("quality")
    print(f"{'run':<13} {'cost $':>11} {'x clv':>6} {'x greedy':>8} {'cloud GPUh':>11} "
          f"{'SLO jobs':>9} {'SLO GPUh':>9} {'max wait':>9} {'>3x SLO':>8} {'idle $':>9} {'launches':>9}")
    for run in data["runs"]:
        ratio_g = run["cloud_cost_usd"] / greedy["cloud_cost_usd"] if greedy["cloud_cost_usd"] else 0
        launches = "-" if run["launches"] is None else f"{run['launches']:,}"
        print(f"{run['name']:<13} {run['cloud_cost_usd']:11,.0f} {run['cost_vs_clairvoyant'] or 0:6.3f} "
              f"{ratio_g:8.3f} {run['cloud_gpu_hours']:11,.0f} {100 * run['slo_attainment']:8.2f}% "
              f"{100 * run['slo_attainment_gpu_hours']:8.2f}% {run['wait_max_s'] / 60:8.1f}m "
              f"{run['jobs_over_3x_slo']:8,} {run['idle_burst_cost_usd']:9,.0f} {launches:>9}")
    print(f"{'clv-nodes':<13} {nodes_gpu_h * per_gpu_hour:11,.0f} "
          f"{nodes_gpu_h * per_gpu_hour / clairvoyant['cloud_cost_usd']:6.3f} "
          f"{nodes_gpu_h * per_gpu_hour / greedy['cloud_cost_usd']:8.3f} {nodes_gpu_h:11,.0f}   "
          f"(the clairvoyant's rule on whole {onprem['gpus_per_node']}-GPU nodes; diagnostic, "
          f"{time.perf_counter() - began:.1f} s)")
    print()
    print("targets (policy vs greedy and clairvoyant)")
    for name in [n for n, _ in policies] + (["wait-aware"] if "wait-aware" in runs else []):
        run = runs[name]
        checks = {
            "SLO jobs >= greedy - 1pt": run["slo_attainment"] >= greedy["slo_attainment"] - 0.01,
            "SLO GPU-h >= greedy - 1pt": run["slo_attainment_gpu_hours"]
            >= greedy["slo_attainment_gpu_hours"] - 0.01,
            "no wait > 3x SLO": run["jobs_over_3x_slo"] == 0,
            "cost <= 1.05x clairvoyant": run["cloud_cost_usd"] <= 1.05 * clairvoyant["cloud_cost_usd"],
            "cost <= 0.90x greedy": run["cloud_cost_usd"] <= 0.90 * greedy["cloud_cost_usd"],
        }
        print(f"{name:<13} " + "  ".join(f"{k}: {'yes' if ok else 'NO'}" for k, ok in checks.items()))


if __name__ == "__main__":
    main()
