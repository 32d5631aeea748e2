"""`burst demo` as a user runs it: a whole burst cycle, a JSON summary, nothing left behind."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from orchestrator.cli.demo_cmd import _print_summary
from orchestrator.demo import DemoSummary
from tests.e2e.helpers import burst_cmd, node_processes, run_burst

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


def test_demo_human_output_shows_progress_summary_and_a_hint_that_works(tmp_path: Path):
    state = tmp_path / "kept state"  # a space: the printed hint must be quoted to work
    # Both streams into one pipe, as `burst demo 2>&1 | tee demo.log` would write them.
    result = subprocess.run(burst_cmd("demo", "--keep-state", str(state)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, timeout=300,
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stdout
    assert "burst demo summary" in [x.strip() for x in lines]  # a title on a line of its own
    assert "jobs run on-prem / burst" in result.stdout
    # Each event is one whole line: the launch names its offering and the GPUs it is for.
    launch = re.compile(r"^\[\s*\d+\.\ds\] scale-up: launching \d+ node\(s\) \(\S+\) for \d+ "
                        r"unmet GPU\(s\)")
    assert any(launch.match(x) for x in lines), result.stdout
    assert node_processes(str(tmp_path)) == [], "the demo left node processes running"

    # The hint, run as printed (by a shell, `burst` on the PATH), explains the launch.
    [hint] = [x for x in lines if x.startswith("why it launched: ")]
    command = hint.removeprefix("why it launched: ")
    assert command.startswith(f"BURST_STATE_DIR={shlex.quote(str(state))} burst explain d-")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "burst").write_text(f"#!/bin/sh\nexec {shlex.join(burst_cmd())} \"$@\"\n")
    (bin_dir / "burst").chmod(0o755)
    shown = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert shown.returncode == 0, shown.stderr
    decision_id = command.rsplit(" ", 1)[1]
    assert decision_id in shown.stdout and "rule: scale-up" in shown.stdout


def test_demo_hint_is_printed_only_when_the_state_is_kept(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path):
    summary = DemoSummary(policy="default", nodes_launched=2, launch_decisions=["d-1a2b3c4d5e6f"])
    _print_summary(summary)
    printed = capsys.readouterr().out
    assert "burst explain" not in printed and "--keep-state DIR" in printed
    _print_summary(summary, tmp_path)
    assert f"BURST_STATE_DIR={tmp_path} burst explain d-1a2b3c4d5e6f" in capsys.readouterr().out


def test_demo_keep_state_refuses_a_directory_in_use(tmp_path: Path):
    (tmp_path / "something").write_text("x")
    result = run_burst("demo", "--keep-state", str(tmp_path))
    assert result.returncode == 2
    assert f"error: --keep-state: {tmp_path} is not empty" in result.stderr
