"""`burst demo` as a user runs it: a whole burst cycle, a JSON summary, nothing left behind."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import node_processes, run_burst

pytestmark = pytest.mark.slow


def test_demo_json_runs_a_whole_burst_cycle_and_leaves_nothing(tmp_path):
    # The demo's state (and so every node's user-data path) lives under TMPDIR: only processes
    # naming this test's own directory are the demo's, whatever else runs on the machine.
    result = run_burst("demo", "--json", env={"TMPDIR": str(tmp_path)}, timeout=300)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    for key in ("nodes_launched", "nodes_terminated", "jobs_onprem", "jobs_burst", "wait_p95_s", "cost_usd"):
        assert key in summary
    assert summary["nodes_launched"] >= 2
    assert summary["nodes_terminated"] == summary["nodes_launched"]
    assert summary["nodes_failed"] == 0, "a clean cycle passes through no failed state"
    assert summary["jobs_onprem"] > 0 and summary["jobs_burst"] > 0
    assert summary["jobs_onprem"] + summary["jobs_burst"] == summary["jobs_total"] == summary["jobs_done"]
    assert summary["cost_usd"] > 0
    assert 0 < summary["wait_p95_s"] < 120
    assert summary["leftover_processes"] == 0 and not summary["timed_out"]
    assert node_processes(str(tmp_path)) == [], "the demo left node processes running"


def test_demo_human_output_shows_progress_and_summary():
    result = run_burst("demo", timeout=300)
    assert result.returncode == 0, result.stderr
    assert "burst demo summary" in result.stdout
    assert "jobs run on-prem / burst" in result.stdout
    assert "scale-up" in result.stderr  # the live view shows the launch decision
