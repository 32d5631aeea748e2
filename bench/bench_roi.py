"""Benchmark: the return on burst spend on the ITP replay, and the planner's prediction of the wait
each burst job avoided checked against the exact on-prem-only replay. Prints figures; not a test.

    python bench/bench_roi.py                  # the full ITP trace, itp-default: ~1-2 minutes
    python bench/bench_roi.py --days 10        # the first 10 days only

Setting: as ``bench/bench_simulate.py`` (ITP from ``$BURST_TRACE_DIR``, on-prem = p70 of concurrent
demand in 8-GPU nodes, SLO 30 min, seed 0, tick 1 min, easy backfill), the policy
``bench/policies/itp-default.yaml``. The counterfactual is the ``never`` replay (on-prem only) of the
same trace; a burst job's exact wait avoided is its start there minus its first burst start, its
predicted one the planner's on-prem start recorded by the decision that burst it, both floored at
0 per job (``orchestrator.sim.roi``). The floor printed beside the figures: the replay without
``--roi`` (no counterfactual), so the cost of the prediction and of the extra replay shows.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from orchestrator.policy import load_policy
from orchestrator.sim import SimOptions, load_trace, simulate
from orchestrator.sim.world import Backfill

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trace", default="itp")
    parser.add_argument("--days", type=float, default=None, help="only jobs submitted in the first N days")
    parser.add_argument("--policy", default=str(HERE / "policies" / "itp-default.yaml"))
    args = parser.parse_args()

    trace = load_trace(args.trace)
    if args.days is not None:
        trace = trace.first_days(args.days)
    policy = load_policy(Path(args.policy))
    runs = [(policy.name, policy)]
    base = dict(slo_s=1800.0, node_gpus=8, onprem="p70", tick_s=60.0, backfill=Backfill.EASY)
    began = time.perf_counter()
    plain = simulate(trace, runs, options=SimOptions(**base))
    plain_s = time.perf_counter() - began
    began = time.perf_counter()
    result = simulate(trace, runs, options=SimOptions(**base, roi=True))
    roi_s = time.perf_counter() - began
    data = result.data
    run = data["runs"][0]
    roi = run["roi"]
    error = roi["prediction_error_h"]
    print(f"trace {data['trace']['name']}: {data['trace']['jobs']:,} jobs; on-prem "
          f"{data['onprem']['gpus']:,} GPUs ({data['onprem']['sizing']}); policy {policy.name}")
    print(f"replay without --roi (floor): {plain_s:.1f} s, plan() {plain.timings[policy.name]['plan_s']:.1f} s;"
          f" with --roi: {roi_s:.1f} s (counterfactual {result.timings['roi-counterfactual']['wall_s']:.1f} s,"
          f" plan() {result.timings[policy.name]['plan_s']:.1f} s)")
    same = plain.data["runs"][0]["cloud_cost_usd"] == run["cloud_cost_usd"]
    print(f"same run either way: {same} (cloud cost ${run['cloud_cost_usd']:,.0f})")
    print()
    print(f"burst jobs {roi['burst_jobs']:,}; with a prediction {roi['predicted_jobs']:,}; "
          f"not started in the counterfactual {roi['unfinished_counterfactual']:,}")
    print(f"burst spend ${roi['burst_cost_usd']:,.0f}; burst GPU-hours (billed) {roi['burst_gpu_hours']:,.0f}")
    print(f"waiting avoided, exact (all burst jobs):        {roi['hours_avoided_exact']:>12,.1f} h  "
          f"${roi['usd_per_hour_avoided_exact'] or 0:,.2f}/h")
    print(f"waiting avoided, exact (jobs with a prediction): {roi['hours_avoided_exact_of_predicted_jobs']:>11,.1f} h")
    print(f"waiting avoided, predicted:                     {roi['hours_avoided_predicted']:>12,.1f} h  "
          f"${roi['usd_per_hour_avoided_predicted'] or 0:,.2f}/h")
    print(f"per-job error (predicted - exact avoided, h) over {error['jobs']:,} jobs: "
          f"median |e| {error['median_abs']:.2f}, p90 |e| {error['p90_abs']:.2f}, "
          f"median e {error['median_signed']:+.2f}")


if __name__ == "__main__":
    main()
