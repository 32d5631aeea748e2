"""The return on burst spend in a simulation, computed exactly, and the planner's prediction of it
checked against the truth (``burst simulate --roi``; ``bench/bench_roi.py``).

In production, the wait a burst avoided is only predicted: the planner's model of when the job
would have started on-prem (:mod:`orchestrator.planner.forecast`). A simulation can replay the
counterfactual: the same trace with the on-prem pool alone (the ``never`` controller). A burst
job's exact avoided wait is its start in that replay minus its first start on a burst node in the
policy's run, floored at 0 per job as in ``burst report --roi`` (:mod:`orchestrator.costs.roi`).
The prediction is the one the decision that launched for the job recorded: the latest made at or
before the job's first burst start.

The counterfactual is exact for the trace but not a promise about the world: in it every burst
job queues on-prem, so jobs behind it wait longer too; that knock-on wait is not counted (only
each burst job's own start), as the production figure cannot count it either. A job the
on-prem-only replay never started (it ended first) has no exact start and is left out of the
exact sums (``unfinished_counterfactual``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from orchestrator.sim.metrics import percentile
from orchestrator.sim.world import SimJob, seconds


def onprem_starts(jobs: Iterable[SimJob]) -> dict[int, float | None]:
    """Per trace index, the start of each job in the on-prem-only replay (None: never started)."""
    return {job.index: job.start_s for job in jobs}


def sim_roi(jobs: Iterable[SimJob], predictions: Mapping[str, list], counterfactual: Mapping[int, float | None],
            cost_usd: float, billed_gpu_s: float) -> dict:
    """The ROI figures of one policy run (see the module docstring). ``predictions``: per job id,
    (decision time, predicted start or None) oldest first (``SimStore.predictions``)."""
    burst = predicted = unfinished = 0
    avoided_pred = avoided_exact = avoided_exact_of_predicted = 0.0
    errors: list[float] = []
    by_project: dict[str, dict] = {}
    for job in jobs:
        start = job.burst_start_s
        if start is None:
            continue
        burst += 1
        row = by_project.setdefault(job.domain.project, {
            "burst_jobs": 0, "burst_gpu_hours": 0.0, "hours_avoided_predicted": 0.0,
            "hours_avoided_exact": 0.0})
        row["burst_jobs"] += 1
        row["burst_gpu_hours"] += job.gpus * job.trace.duration_s / 3600
        exact = counterfactual.get(job.index)
        exact_avoided = None if exact is None else max(exact - start, 0.0)
        if exact_avoided is None:
            unfinished += 1
        else:
            avoided_exact += exact_avoided
            row["hours_avoided_exact"] += exact_avoided / 3600
        guess = _prediction(predictions.get(job.domain.id, ()), start)
        if guess is None:
            continue
        predicted += 1
        pred_avoided = max(guess - start, 0.0)
        avoided_pred += pred_avoided
        row["hours_avoided_predicted"] += pred_avoided / 3600
        if exact_avoided is not None:
            avoided_exact_of_predicted += exact_avoided
            errors.append((pred_avoided - exact_avoided) / 3600)
    magnitudes = sorted(abs(e) for e in errors)
    signed = sorted(errors)
    return {
        "burst_jobs": burst,
        "predicted_jobs": predicted,
        "unfinished_counterfactual": unfinished,
        "burst_cost_usd": round(cost_usd, 2),
        "burst_gpu_hours": round(billed_gpu_s / 3600, 1),
        "hours_avoided_exact": round(avoided_exact / 3600, 3),
        "hours_avoided_predicted": round(avoided_pred / 3600, 3),
        "hours_avoided_exact_of_predicted_jobs": round(avoided_exact_of_predicted / 3600, 3),
        "usd_per_hour_avoided_exact": _per_hour(cost_usd, avoided_exact),
        "usd_per_hour_avoided_predicted": _per_hour(cost_usd, avoided_pred),
        # Per job with both figures: predicted minus exact wait avoided, in hours.
        "prediction_error_h": {
            "jobs": len(errors),
            "median_abs": round(percentile(magnitudes, 50), 3),
            "p90_abs": round(percentile(magnitudes, 90), 3),
            "median_signed": round(percentile(signed, 50), 3),
        },
        "by_project": {p: {k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}
                       for p, row in sorted(by_project.items())},
    }


def _prediction(made: Iterable, start: float) -> float | None:
    """The start predicted by the latest decision at or before ``start`` (seconds), or None."""
    guess = None
    for at, predicted in made:
        if seconds(at) > start:
            break
        guess = None if predicted is None else seconds(predicted)
    return guess


def _per_hour(cost_usd: float, avoided_s: float) -> float | None:
    return round(cost_usd / (avoided_s / 3600), 2) if avoided_s > 0 else None


__all__ = ["onprem_starts", "sim_roi"]
