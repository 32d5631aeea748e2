"""Benchmark: spot chosen by expected cost against spot-first and all-on-demand greedy. Prints
figures; not a test.

    python bench/bench_spot.py                   # the full ITP trace (69,351 jobs)
    python bench/bench_spot.py --days 10         # the first 10 days, for a quick look

Setting: as bench/bench_simulate.py (ITP, on-prem = the 70th percentile in whole 4-GPU nodes,
EASY backfill, SLO 30 min, tick 1 min), with the simulator's spot markets from the shared data
(``SimOptions.spot_data``: Spot Advisor buckets, SkyPilot availability traces; seeded;
orchestrator/sim/spotdata.py). Offerings: the bundled catalogue's 4-GPU 24 GB-class nodes (AWS
g5.12xlarge, GCP g2-standard-48) in five US regions at real prices. Every run's queue is
``source: slurm`` (fabric slurm), as in the one-price ITP policies: a job wider than one burst node
runs on whole nodes of one offering (multi-node burst), so wide jobs can burst too. Runs:

* ``itp-spot``: ``spot.by_expected_cost`` over every offering, spot and on-demand, jobs
  checkpointing every 30 min (bench/policies/itp-spot.yaml), hazards learned from node events;
* ``itp-spot-first``: the cheapest spot offering, its on-demand twin when it is refused (what
  managed spot jobs do elsewhere; bench/policies/itp-spot-first.yaml);
* ``itp-ondemand``: the wait-aware default on on-demand offerings only, and the baselines priced
  with them (``greedy`` is the all-on-demand greedy of the target).

Printed per run: cloud cost (interrupted and re-run work included: every billed second is), the
ratio to on-demand greedy, attainment by jobs and GPU-hours, max wait, interruptions, capacity
errors, the largest compute lost by one interruption against the checkpoint interval.
Target (issue 16, part 4): itp-spot <= 0.45x greedy and below itp-spot-first, attainment >= 99.9 %
/ >= 99 %, max wait <= 3x SLO, no job losing more than one checkpoint interval per interruption.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from orchestrator.policy import load_policy
from orchestrator.sim import SimOptions, load_trace
from orchestrator.sim.controllers import GreedyController, PolicyController
from orchestrator.sim.replay import as_simulated, run_controlled, size_onprem

HERE = Path(__file__).resolve().parent
RUNS = ("itp-ondemand", "itp-spot", "itp-spot-first")


def main() -> None:
    from orchestrator.gctune import tune_gc

    tune_gc()  # the collector's thresholds every burst process runs with (orchestrator.gctune)
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", default="itp")
    parser.add_argument("--days", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slo", type=float, default=1800.0)
    parser.add_argument("--runs", default=None,
                        help="comma-separated subset of the runs (greedy is always run: the ratio)")
    parser.add_argument("--spot-policy", default=None, help="another policy file for itp-spot")
    args = parser.parse_args()
    trace = load_trace(args.trace)
    if args.days is not None:
        trace = trace.first_days(args.days)
    options = SimOptions(seed=args.seed, slo_s=args.slo, spot_data=True)
    names = RUNS if args.runs is None else tuple(n for n in RUNS if n in args.runs.split(","))
    files = {name: HERE / "policies" / f"{name}.yaml" for name in RUNS}
    if args.spot_policy:
        files["itp-spot"] = Path(args.spot_policy)
    reference = load_policy(files["itp-ondemand"])
    policies = {name: load_policy(files[name]) for name in names}
    sizing = size_onprem(trace, reference, options.onprem, options.node_gpus)
    print(f"trace {trace.name}: {len(trace.jobs)} jobs; on-prem {sizing.gpus} GPUs; seed {args.seed}")
    results = {}
    runs = [(name, PolicyController(as_simulated(p, sizing), name), p) for name, p in policies.items()]
    runs.append(("greedy", GreedyController(as_simulated(reference, sizing)), reference))
    for name, controller, policy in runs:
        began = time.perf_counter()
        sim_policy = as_simulated(policy, sizing)
        run, _ = run_controlled(name, controller, policy, sim_policy, trace, sizing, options)
        results[name] = (run, time.perf_counter() - began, sim_policy)
    greedy = results["greedy"][0]["cloud_cost_usd"]
    print(f"{'run':16} {'cost $':>12} {'x greedy':>9} {'jobs %':>7} {'GPU-h %':>8} {'max wait':>9} "
          f"{'interr.':>8} {'cap.err':>8} {'max loss':>9} {'wall s':>7}")
    for name, (run, wall, _) in results.items():
        print(f"{name:16} {run['cloud_cost_usd']:12,.0f} {run['cloud_cost_usd'] / greedy:9.3f} "
              f"{run['slo_attainment'] * 100:7.2f} {run['slo_attainment_gpu_hours'] * 100:8.2f} "
              f"{run['wait_max_s'] / 60:8.0f}m {run['interruptions']:8} {run['capacity_errors']:8} "
              f"{run.get('max_loss_per_interruption_s', 0) / 60:8.1f}m {wall:7.1f}")
    print("max loss: the most compute one interruption cost a job (checkpoint interval: 30m)")


if __name__ == "__main__":
    main()
