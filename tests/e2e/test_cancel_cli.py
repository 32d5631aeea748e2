"""`burst cancel` as a user runs it: pending jobs cancelled, a repeat harmless, unknown ids and
finished jobs refused on stderr with exit 2 while the others are still cancelled. Run in-process
(run_burst_here: the same typer app, exit code, stdout and stderr; no `burst` process is needed for
a command that reads and writes the state directory and exits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import FAST_POLICY, burst_json_here, run_burst_here


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {"BURST_STATE_DIR": str(tmp_path / "state")}


def test_cancel_pending_jobs_then_again_then_unknown(env: dict[str, str]) -> None:
    submitted = burst_json_here("submit", "--policy", str(FAST_POLICY), "--project", "research",
                                "--gpus", "2", "--duration", "10m", "--count", "3", env=env)
    first, second, third = (j["id"] for j in submitted)
    done = run_burst_here("cancel", first, second, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"cancelled {first}", f"cancelled {second}"]
    status = burst_json_here("status", "--policy", str(FAST_POLICY), env=env)
    assert [j["id"] for j in status["queue"]] == [third]

    again = run_burst_here("cancel", first, "j-[bold]x", env=env)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert again.stdout.strip() == f"{first} was cancelled already"
    assert "no job 'j-[bold]x'" in again.stderr  # echoed verbatim, never as markup

    as_json = run_burst_here("cancel", third, "--json", env=env)
    assert as_json.returncode == 0
    assert burst_json_here("cancel", third, env=env) == [
        {"id": third, "state": "cancelled", "result": "already-cancelled", "node": None}]
