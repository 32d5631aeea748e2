"""Traces: the canonical CSV (with errors naming file, line and column), the bundled sample, and
the loaders of the real traces in the shared data (skipped, saying why, when it is absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.sim.traces import (
    ALIBABA_DIR,
    ITP_DIR,
    PHILLY_DIR,
    TraceError,
    TraceJob,
    load_alibaba,
    load_itp,
    load_philly,
    load_trace,
    parse_canonical,
    to_canonical,
    trace_dir,
)

DATA = trace_dir()
needs_data = pytest.mark.skipif(
    not (DATA / ITP_DIR).is_dir(),
    reason=f"the shared trace data is not at {DATA} (set BURST_TRACE_DIR to the directory holding "
           f"{ITP_DIR}/, {PHILLY_DIR}/ and {ALIBABA_DIR}/)")


def test_canonical_round_trip_sorts_by_submit_time():
    jobs = [TraceJob("b", 20.5, 60, 2, "p", 3), TraceJob("a", 10, 3600, 8)]
    text = to_canonical(jobs)
    assert text.splitlines()[0] == "job_id,submit_s,duration_s,gpus,project,priority"
    assert parse_canonical(text, "t.csv") == (jobs[1], jobs[0])


@pytest.mark.parametrize(("text", "error"), [
    ("id,submit\n", "t.csv:1: expected the header job_id,submit_s"),
    ("job_id,submit_s,duration_s,gpus,project,priority\na,1,2\n", "t.csv:2: expected 6 columns"),
    ("job_id,submit_s,duration_s,gpus,project,priority\na,x,2,1,,\n", "t.csv:2: submit_s: not a number"),
    ("job_id,submit_s,duration_s,gpus,project,priority\na,1,-2,1,,\n", "t.csv:2: duration_s: must be"),
    ("job_id,submit_s,duration_s,gpus,project,priority\na,1,2,0,,\n", "t.csv:2: gpus: must be at least 1"),
    ("job_id,submit_s,duration_s,gpus,project,priority\na,1,2,1.5,,\n", "t.csv:2: gpus: not a whole"),
    ("job_id,submit_s,duration_s,gpus,project,priority\na,1,2,1,,\na,3,2,1,,\n",
     "t.csv:3: job_id: 'a' repeats line 2"),
])
def test_bad_canonical_rows_name_file_line_and_column(text, error):
    with pytest.raises(TraceError) as caught:
        parse_canonical(text, "t.csv")
    assert str(caught.value).startswith(error)


def test_unknown_names_and_missing_directories_say_what_to_do(tmp_path, monkeypatch):
    with pytest.raises(TraceError, match="no such file, and not one of itp, philly"):
        load_trace(str(tmp_path / "nope.csv"))
    monkeypatch.setenv("BURST_TRACE_DIR", str(tmp_path))
    with pytest.raises(TraceError, match=r"set BURST_TRACE_DIR .* \(or use --trace itp-sample"):
        load_trace("philly")


def test_the_bundled_sample_is_a_real_itp_cluster_with_its_licence_beside_it():
    sample = load_trace("itp-sample")
    assert len(sample.jobs) == 260
    assert {j.project for j in sample.jobs} == {"cluster10"}
    assert all(j.job_id.startswith("cluster10/") and j.duration_s >= 600 for j in sample.jobs)
    assert round(sample.gpu_hours) == 4023  # SOURCE.md of the ITP traces: cluster10, 4,023 GPU-h
    here = Path(__file__).resolve().parents[2] / "orchestrator" / "sim" / "data"
    assert "MIT License" in (here / "LICENSE-ITP.txt").read_text()
    assert "Copyright (c) Microsoft Corporation" in (here / "LICENSE-ITP.txt").read_text()


@needs_data
def test_itp_loader_reads_all_ten_clusters():
    trace = load_itp(DATA / ITP_DIR)
    assert len(trace.jobs) == 69_351
    assert round(trace.gpu_hours, 1) == 1_632_719.7  # the figure SOURCE.md re-computed
    assert len({j.project for j in trace.jobs}) == 10
    assert len({j.job_id for j in trace.jobs}) == 69_351
    widths = {}
    for j in trace.jobs:
        widths[j.gpus] = widths.get(j.gpus, 0) + 1
    assert widths == {1: 57_682, 2: 1_483, 4: 2_371, 8: 7_009, 16: 381, 32: 354, 64: 71}
    assert [j.submit_s for j in trace.jobs] == sorted(j.submit_s for j in trace.jobs)
    assert min(j.duration_s for j in trace.jobs) >= 600


@needs_data
def test_the_bundled_sample_is_exactly_cluster10_of_the_real_trace():
    real = tuple(j for j in load_itp(DATA / ITP_DIR).jobs if j.project == "cluster10")
    assert load_trace("itp-sample").jobs == real


@needs_data
def test_philly_loader_accumulates_intervals_and_keeps_users_as_projects():
    trace = load_philly(DATA / PHILLY_DIR)
    assert len(trace.jobs) == 15_000
    assert trace.jobs[-1].submit_s == 4_977_039  # SOURCE.md: the excerpt spans 4,977,039 s
    assert len({j.project for j in trace.jobs}) == 136
    assert sum(1 for j in trace.jobs if j.gpus == 1) == 11_963
    assert max(j.gpus for j in trace.jobs) == 48


@needs_data
def test_alibaba_loader_keeps_scheduled_gpu_pods():
    trace = load_alibaba(DATA / ALIBABA_DIR)
    # 8,152 pods: 1,088 ask for no GPU; of the rest, those never scheduled or with no run time
    # are left out.
    assert 5_000 < len(trace.jobs) < 8_152 - 1_088 + 1
    assert {j.project for j in trace.jobs} <= {"LS", "BE", "Burstable", "Guaranteed"}
    assert {j.gpus for j in trace.jobs} <= {1, 2, 4, 8}
    assert all(j.duration_s > 0 for j in trace.jobs)


@needs_data
def test_named_traces_load_through_the_trace_directory(monkeypatch):
    monkeypatch.setenv("BURST_TRACE_DIR", str(DATA))
    assert load_trace("philly").name == "philly"
    assert len(load_trace("alibaba").jobs) == len(load_alibaba(DATA / ALIBABA_DIR).jobs)


def test_first_days_keeps_the_jobs_submitted_within_them() -> None:
    from orchestrator.sim.traces import Trace, TraceJob

    jobs = tuple(TraceJob(f"j{i}", 100.0 + i * 43200.0, 60.0, 1) for i in range(5))  # every 12 h
    trace = Trace("t", jobs, "test")
    head = trace.first_days(1)
    assert head.name == "t[1d]" and [j.job_id for j in head.jobs] == ["j0", "j1"]
    assert trace.first_days(0.5).jobs == jobs[:1]
    assert Trace("e", (), "test").first_days(2).jobs == ()
