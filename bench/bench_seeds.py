"""Benchmark: how much the policy-quality figures move with the simulator's seed. Prints figures;
not a test.

    python bench/bench_seeds.py                   # seeds 0-4, the full ITP trace, ~4 minutes
    python bench/bench_seeds.py --seeds 0,1,2 --policy mine=my.yaml
    python bench/bench_seeds.py --days 5 --seeds 0,1,2   # the first 5 days only

The seed draws burst nodes' boot times (``providers/sim.py``), keyed by the launch request, whose
id carries the policy's name: renaming a policy alone changes its draws. On the ITP trace one
policy's cloud cost moves by a few per cent between seeds, as much as many policy changes do, so
compare policies over several seeds. Columns: the cost's mean and range, its mean ratio to the clairvoyant, the mean (min - max) ratio
to greedy paired by seed, the worst seed's attainment by jobs and by GPU-hours, the most jobs
waiting past 3x the SLO, the longest wait of any seed, and the mean replay wall time of a seed's
run (the machine's load shows in it). Setting as ``bench/bench_simulate.py``: on-prem at the p70
of concurrent demand in 8-GPU nodes, 30-minute SLO, easy backfill, tick 1 minute. Each seed
replays every policy and the greedy baseline; ratios to greedy are paired by seed; the
clairvoyant does not depend on the seed.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from orchestrator.policy import load_policy
from orchestrator.sim import SimOptions, Trace, load_trace, simulate
from orchestrator.sim.controllers import GreedyController
from orchestrator.sim.replay import as_simulated, run_clairvoyant, run_controlled, size_onprem

HERE = Path(__file__).resolve().parent
POLICIES = [("itp-default", HERE / "policies" / "itp-default.yaml"),
            ("itp-immediate", HERE / "policies" / "itp-immediate.yaml")]


def _seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}") from None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", default="itp")
    parser.add_argument("--seeds", default=[0, 1, 2, 3, 4], type=_seeds,
                        help="comma-separated seeds (default 0,1,2,3,4)")
    parser.add_argument("--policy", action="append", default=None,
                        help="NAME=FILE to run instead of itp-default and itp-immediate "
                        "(repeatable)")
    parser.add_argument("--days", type=float, default=None,
                        help="only jobs submitted in the first N days")
    parser.add_argument("--node-gpus", type=int, default=8, help="GPUs per on-prem node")
    parser.add_argument("--greedy-only", action="store_true",
                        help="of the baselines, replay only greedy (and the clairvoyant): never "
                        "and threshold are not in the table, and cost a third of a seed's time")
    args = parser.parse_args()
    seeds = args.seeds
    trace = load_trace(args.trace)
    if args.days is not None:
        trace = trace.first_days(args.days)
    chosen = POLICIES if not args.policy else [tuple(p.split("=", 1)) for p in args.policy]
    policies = [(name, load_policy(path)) for name, path in chosen]
    rows: dict[str, list[dict]] = {}
    clairvoyant_cost = None
    began = time.perf_counter()
    for seed in seeds:
        options = SimOptions(seed=seed, slo_s=1800.0, node_gpus=args.node_gpus, onprem="p70",
                             tick_s=60.0)
        if args.greedy_only:
            result = _with_greedy(trace, policies, options)
        else:
            result = simulate(trace, policies, baselines=True, options=options)
        runs = {r["name"]: r for r in result.data["runs"]}
        clairvoyant_cost = runs["clairvoyant"]["cloud_cost_usd"]
        greedy = runs["greedy"]["cloud_cost_usd"]
        for name in [n for n, _ in policies] + ["greedy"]:
            run = runs[name]
            rows.setdefault(name, []).append({
                "cost": run["cloud_cost_usd"], "x_greedy": run["cloud_cost_usd"] / greedy,
                "slo": run["slo_attainment"], "slo_gpuh": run["slo_attainment_gpu_hours"],
                "over": run["jobs_over_3x_slo"], "max_wait": run["wait_max_s"],
                "wall": result.timings.get(name, {}).get("wall_s", 0.0)})
        print(f"seed {seed} done ({time.perf_counter() - began:.0f} s)", flush=True)
    print()
    print(f"trace {trace.name}, seeds {seeds}; clairvoyant ${clairvoyant_cost:,.0f} (seed-free)")
    print(f"{'run':<14} {'cost mean $':>12} {'min-max $':>19} {'x clv':>6} {'x greedy':>16} "
          f"{'SLO jobs min':>13} {'SLO GPUh min':>13} {'>3x max':>8} {'max wait':>9} "
          f"{'replay s':>9}")
    for name, values in rows.items():
        costs = [v["cost"] for v in values]
        ratios = [v["x_greedy"] for v in values]
        mean = statistics.fmean(costs)
        print(f"{name:<14} {mean:12,.0f} {min(costs):9,.0f}-{max(costs):,.0f} "
              f"{mean / clairvoyant_cost:6.3f} {statistics.fmean(ratios):6.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f}) {100 * min(v['slo'] for v in values):12.2f}% "
              f"{100 * min(v['slo_gpuh'] for v in values):12.2f}% "
              f"{max(v['over'] for v in values):8,} "
              f"{max(v['max_wait'] for v in values) / 60:8.1f}m "
              f"{statistics.fmean(v['wall'] for v in values):9.1f}")


def _with_greedy(trace: Trace, policies: list, options: SimOptions):
    """``simulate`` with greedy and the clairvoyant as its only baselines (``--greedy-only``)."""
    result = simulate(trace, policies, baselines=False, options=options)
    reference = policies[0][1]
    sizing = size_onprem(trace, reference, options.onprem, options.node_gpus)
    sim_reference = as_simulated(reference, sizing)
    run, _ = run_controlled("greedy", GreedyController(sim_reference), reference, sim_reference,
                            trace, sizing, options, None, result.timings)
    run.pop("cloud")
    result.data["runs"].append(run)
    run, _ = run_clairvoyant(reference, sim_reference, trace, sizing, options)
    result.data["runs"].append(run)
    return result


if __name__ == "__main__":
    main()
