"""The CLI talks to the loop that runs: `burst run` records its policies in the state directory,
and `submit`, `status`, `plan` without -p use them; a job for a pool no running policy watches is
refused; `burst run`'s lines reach a file as they happen; a missing optional extra is one line
naming the `pip install` to run. The loop is a `burst run` process; the commands typed beside it
(submit, status, plan) run in-process (run_burst_here: the same typer app reading the same state
directory and running.json), the missing-extra check starts `burst` (it is about imports)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.e2e.helpers import (FAST_POLICY, burst_cmd, burst_json_here, free_port, kill_all, run_burst,
                               run_burst_here, wait_for)


def _env(tmp_path: Path) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BURST_")}
    return {**clean, "BURST_STATE_DIR": str(tmp_path / "state"), "BURST_API_PORT": str(free_port()),
            "BURST_LOCAL_BOOT_DELAY_S": "0"}


def test_commands_default_to_the_running_loops_policies(tmp_path: Path):
    env = _env(tmp_path)
    log = tmp_path / "run.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(burst_cmd("run", "-p", str(FAST_POLICY), "--tick", "1"), env=env,
                                stdout=sink, stderr=subprocess.STDOUT)
    try:
        record = Path(env["BURST_STATE_DIR"]) / "running.json"
        wait_for(record.exists, timeout=120, what="running.json")
        assert json.loads(record.read_text())["policy_files"] == [str(FAST_POLICY.resolve())]
        # Lines reach the file while the loop runs (not when it exits).
        wait_for(lambda: "running policies" in log.read_text(), timeout=60, what="the start line")

        # No -p: the loop's policy (pool gpu of policy fast), not the shipped default.
        [job] = burst_json_here("submit", "--project", "research", "--gpus", "1", "--duration",
                                "2s", env=env)
        assert job["pool"] == "gpu"
        status = burst_json_here("status", env=env)
        assert status["loop"]["running"] is True
        assert [p["policy"] for p in status["policies"]] == ["fast"]
        plan = burst_json_here("plan", env=env)
        assert [d["policy"] for d in plan["decisions"]] == ["fast"]

        refused = run_burst_here("submit", "--project", "research", "--gpus", "1", "--duration",
                                 "1m", "--pool", "cpu", env=env)
        assert refused.returncode == 2
        assert "no running policy watches pool 'cpu'" in refused.stderr
        assert "the pools watched are gpu" in refused.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        kill_all(env["BURST_STATE_DIR"])
    assert not (Path(env["BURST_STATE_DIR"]) / "running.json").exists()  # a clean stop clears it
    assert "Traceback" not in log.read_text()


def test_a_missing_extra_is_one_line_naming_the_install(tmp_path: Path):
    # Celery made unimportable for this process, as on a machine that ran `pip install -e .`.
    blocker = tmp_path / "site"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(
        "import sys\n"
        "class _NoCelery:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('celery', 'kombu'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, _NoCelery())\n")
    env = _env(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocker), os.environ.get("PYTHONPATH")]))
    result = run_burst("worker", env=env)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if not line.startswith("warning: ")]
    assert lines == ["error: this needs the optional 'celery' dependencies (celery is not "
                     "installed): pip install 'burst[celery]'"]
