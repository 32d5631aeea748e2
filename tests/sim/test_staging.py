"""Data staging in the simulator: a trace's optional ``dataset_gb`` column, and the what-if of a
policy whose pool declares ``storage``: burst jobs stage first (their runs on burst nodes are
longer by the staging time), egress is counted, and a job whose staging would outlast its
predicted on-prem wait stays on-prem (``held_back_by: storage.staging``)."""

from __future__ import annotations

import pytest

from orchestrator.sim import simulate
from orchestrator.sim.traces import TraceError, TraceJob, parse_canonical, to_canonical
from tests.sim.helpers import options, sim_policy, trace

HEADER = "job_id,submit_s,duration_s,gpus,project,priority,dataset_gb"
STORAGE = {"datasets": [{"uri": "nfs://fs/d", "size_gb": 100}], "checkpoint_size_gb": 10,
           "egress_usd_per_gb": 0.1, "bandwidth_gbps": 10}


def test_the_dataset_column_is_optional_and_round_trips():
    jobs = [TraceJob("a", 0, 60, 1, "p", 0, 2.5), TraceJob("b", 5, 60, 1, "", 0, None)]
    text = to_canonical(jobs)
    assert text.splitlines()[0] == HEADER and text.splitlines()[2].endswith(",")
    assert parse_canonical(text, "t.csv") == tuple(jobs)
    plain = to_canonical([TraceJob("c", 0, 60, 1)])
    assert "dataset_gb" not in plain and parse_canonical(plain, "t.csv")[0].dataset_gb is None


@pytest.mark.parametrize(("row", "error"), [
    ("a,1,2,1,,,lots", "t.csv:2: dataset_gb: not a number"),
    ("a,1,2,1,,,-1", "t.csv:2: dataset_gb: must be GB from 0"),
    ("a,1,2,1,,", "t.csv:2: expected 7 columns"),
])
def test_a_bad_dataset_size_names_file_line_and_column(row, error):
    with pytest.raises(TraceError, match=error):
        parse_canonical(f"{HEADER}\n{row}\n", "t.csv")


def test_the_what_if_shows_staging_time_egress_and_the_jobs_kept_on_prem():
    # On-prem (8 GPUs) is taken for 1 h by "long". "huge" (project "big": 10 TB, 8000 s of
    # staging at 10 Gbit/s) would start on-prem in about an hour: with storage it stays. "small"
    # (the pool's 100 GB: 80 s) queues behind it for 1.5 h: worth bursting. It runs 2 h, so its
    # burst node is busy when on-prem frees for "huge".
    jobs = trace(("long", 0, 3600, 8), ("huge", 10, 1800, 8, "big"), ("small", 20, 7200, 8))
    plain = sim_policy()
    staged = sim_policy(pool={"storage": STORAGE}, projects=[{"name": "big", "storage": {
        **STORAGE, "datasets": [{"uri": "s3://big/corpus", "size_gb": 10_000}]}}])
    data = simulate(jobs, [("plain", plain), ("staged", staged)],
                    options=options(tick_s=60.0)).data
    runs = {run["name"]: run for run in data["runs"]}
    plain_run, staged_run = runs["plain"], runs["staged"]
    assert plain_run["staged_gb"] == 0 and plain_run["egress_usd"] == 0
    assert plain_run["cloud_gpu_hours"] == 20.0  # both went to the cloud (8 x 0.5 h + 8 x 2 h)
    # Only "small" went to the cloud with storage: 100 GB in, 10 GB back, at $0.10.
    assert staged_run["staged_gb"] == 100.0 and staged_run["egress_usd"] == 11.0
    assert staged_run["staging_hours"] == pytest.approx(80 / 3600, abs=1e-3)
    assert staged_run["held_back_by"].get("storage.staging", 0) >= 1
    assert staged_run["cloud_gpu_hours"] == 16.0  # huge ran on-prem instead
    assert staged_run["jobs_finished"] == plain_run["jobs_finished"] == 3
    # The burst node ran "small" 80 s longer: its billed time shows the staging (the node leaves
    # at a tick, so by whole ticks).
    alone = simulate(trace(("long", 0, 3600, 8), ("small", 20, 7200, 8)), [("plain", plain)],
                     options=options(tick_s=60.0)).data["runs"][0]
    assert staged_run["cloud_billed_gpu_hours"] > alone["cloud_billed_gpu_hours"]
