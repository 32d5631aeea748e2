"""The return on burst spend in the simulator (``burst simulate --roi``, :mod:`orchestrator.sim.roi`):
the exact waiting avoided comes from the on-prem-only replay, the predicted one from the decisions
that burst the jobs, and on a queue whose on-prem future is known the two agree.
"""

from __future__ import annotations

from orchestrator.sim.replay import simulate
from tests.sim.helpers import options, sim_policy, trace

H = 3600.0


def test_a_burst_job_avoids_the_wait_behind_a_long_on_prem_job_exactly_as_predicted():
    # On-prem (8 GPUs) is taken for 10 h by "long"; "short" (1 h, all 8 GPUs) arrives a minute
    # later: on-prem only it starts at 10 h, burst it starts once a node is up (100 s boot).
    jobs = trace(("long", 0.0, 10 * H, 8), ("short", 60.0, H, 8))
    result = simulate(jobs, [("p", sim_policy())], options=options(roi=True))
    roi = result.data["runs"][0]["roi"]
    assert roi["burst_jobs"] == 1 and roi["predicted_jobs"] == 1
    assert roi["unfinished_counterfactual"] == 0
    exact = roi["hours_avoided_exact"]
    assert 9.8 <= exact < 10.0  # 10 h less the minute it arrived after and the node's boot
    assert roi["hours_avoided_predicted"] == exact  # the release at 10 h was known
    assert roi["prediction_error_h"] == {"jobs": 1, "median_abs": 0.0, "p90_abs": 0.0,
                                         "median_signed": 0.0}
    assert roi["burst_cost_usd"] == result.data["runs"][0]["cloud_cost_usd"]
    assert roi["usd_per_hour_avoided_exact"] == round(roi["burst_cost_usd"] / exact, 2)
    assert list(roi["by_project"]) == [next(iter(result.data["runs"][0]["projects"]))]


def test_without_the_option_no_counterfactual_is_replayed():
    jobs = trace(("long", 0.0, 10 * H, 8), ("short", 60.0, H, 8))
    result = simulate(jobs, [("p", sim_policy())], options=options())
    assert "roi" not in result.data["runs"][0] and "roi-counterfactual" not in result.timings
