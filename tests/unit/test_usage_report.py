"""The usage report's maths (:func:`orchestrator.costs.usage_report.fold_usage`): a job's measured
share and utilisation are spread over its groups in proportion to its allocation there; a group
with nothing measured is unknown (None), never 0; totals add up; bad group-by keys name the
allowed ones.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.costs.usage_report import fold_usage, parse_usage_group_by
from orchestrator.domain.utilisation import UsageSource
from orchestrator.store.usage import JobUtilisation
from orchestrator.store.usage_reads import JobAllocation, JobStart
from tests.builders import T0


def _use(job_id: str, allocated: float, measured: float, used: float) -> JobUtilisation:
    return JobUtilisation(job_id, "p", "n1", UsageSource.AGENT, T0, T0 + timedelta(hours=1),
                          allocated, measured, measured, used, None, None, None, None, None)


def test_a_job_measured_half_the_time_spreads_its_use_over_its_days() -> None:
    # 10 GPU-h on day 1, 30 on day 2; half its GPU time measured, at 40 %.
    allocations = [JobAllocation(("d1",), "j", False, 10 * 3600, 0),
                   JobAllocation(("d2",), "j", False, 30 * 3600, 0),
                   JobAllocation(("d2",), None, False, 0.0, 5_000_000)]  # idle: cost only
    measured = {"j": _use("j", 40 * 3600, 20 * 3600, 8 * 3600)}
    report = fold_usage(("day",), allocations, [], measured)
    d1, d2 = (r.as_json() for r in report.rows)
    assert (d1["measured_gpu_hours"], d1["used_gpu_hours"], d1["utilisation_percent"]) == (5.0, 2.0, 40.0)
    assert (d2["measured_gpu_hours"], d2["used_gpu_hours"], d2["measured_share"]) == (15.0, 6.0, 0.5)
    assert d2["burst_cost_usd"] == "5.00"
    assert report.total.as_json()["used_gpu_hours"] == 8.0


def test_unmeasured_work_is_unknown_and_waits_are_nearest_rank() -> None:
    allocations = [JobAllocation(("ada",), "j1", True, 3600.0, 0)]
    starts = [JobStart(f"j{i}", ("ada",), float(w)) for i, w in enumerate([10, 20, 30, 40])]
    row = fold_usage(("user",), allocations, starts, {}).rows[0].as_json()
    assert (row["utilisation_percent"], row["used_gpu_hours"], row["measured_share"]) == (None, None, 0.0)
    assert (row["jobs"], row["wait_p50_s"], row["wait_p95_s"]) == (4, 20.0, 40.0)
    assert row["onprem_gpu_hours"] == 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.sampled_from(["j1", "j2", "j3"]),
                          st.booleans(), st.floats(0, 1e5)), max_size=12),
       st.floats(0, 1), st.floats(0, 1))
def test_rows_add_up_to_the_total_and_use_never_exceeds_allocation(lines, share, util) -> None:
    allocations = [JobAllocation((k,), j, o, g, 0) for k, j, o, g in lines]
    per_job: dict[str, float] = {}
    for _, j, _, g in lines:
        per_job[j] = per_job.get(j, 0.0) + g
    measured = {j: _use(j, total, total * share, total * share * util)
                for j, total in per_job.items() if total * share > 0}
    report = fold_usage(("user",), allocations, [], measured)
    for name in ("onprem_gpu_s", "burst_gpu_s", "measured_gpu_s", "used_gpu_s"):
        assert sum(getattr(r, name) for r in report.rows) == pytest.approx(
            getattr(report.total, name))
    for r in report.rows:
        assert r.used_gpu_s <= r.measured_gpu_s + 1e-6 <= r.gpu_s + 2e-6
        if r.measured_gpu_s <= 0:
            assert r.utilisation_percent is None


def test_an_invalid_group_by_names_the_allowed_keys() -> None:
    assert parse_usage_group_by("project,user") == ("project", "user")
    for text in ("colour", "project,project", "", "user,"):
        with pytest.raises(ValueError, match="user, project, provider, pool, day|twice"):
            parse_usage_group_by(text)
