"""The node agent's durable results and kept registration (orchestrator/fabric/results.py)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from orchestrator.fabric.results import (
    ResultBox,
    RunningRun,
    RunResult,
    clear_running,
    forget_session,
    load_session,
    note_running,
    running_run,
    save_session,
)


def result(job_id: str, ended_at: str, attempt: int | None = 1) -> RunResult:
    return RunResult(job_id=job_id, outcome="done", exit_code=0, ended_at=ended_at, attempt=attempt)


def test_results_survive_a_new_box_until_acknowledged(tmp_path: Path) -> None:
    box = ResultBox(tmp_path)
    later = result("j/2", "2026-01-01T00:00:02+00:00")
    earlier = result("j-1", "2026-01-01T00:00:01+00:00")
    box.put(later)
    box.put(earlier)
    box.put(result("j/2", "2026-01-01T00:00:02+00:00", attempt=2))  # another run of the same job
    reopened = ResultBox(tmp_path)  # the agent restarted
    assert reopened.pending()[:2] == [earlier, later] and len(reopened.pending()) == 3
    reopened.ack(later)
    assert later not in ResultBox(tmp_path).pending()
    assert not list((tmp_path / "results").glob(".*.tmp"))  # nothing half-written left behind
    assert later.body("n1") == {"node_id": "n1", "outcome": "done", "exit_code": 0,
                                "ended_at": later.ended_at, "attempt": 1}
    assert "attempt" not in result("x", "t", attempt=None).body("n1")


def test_an_unreadable_result_is_set_aside_not_resent(tmp_path: Path) -> None:
    box = ResultBox(tmp_path)
    box.put(result("ok", "2026-01-01T00:00:00+00:00"))
    (tmp_path / "results" / "torn.json").write_text('{"job_id": "x", "outc')
    (tmp_path / "results" / "odd.json").write_text(json.dumps({"job_id": "y", "outcome": "won"}))
    assert [r.job_id for r in box.pending()] == ["ok"]
    assert sorted(p.name for p in (tmp_path / "results").glob("*.bad")) == ["odd.bad", "torn.bad"]


def test_the_kept_registration_is_the_nodes_own_and_private(tmp_path: Path) -> None:
    answer = {"credential": "cred-1", "heartbeat_s": 1.0, "fabric": None}
    save_session(tmp_path, "n1", answer)
    assert stat.S_IMODE((tmp_path / "session.json").stat().st_mode) == 0o600
    assert load_session(tmp_path, "n1") == answer
    assert load_session(tmp_path, "n2") is None  # another node's state dir: not ours
    (tmp_path / "session.json").write_text("{not json")
    assert load_session(tmp_path, "n1") is None
    forget_session(tmp_path)
    forget_session(tmp_path)  # idempotent
    assert load_session(tmp_path, "n1") is None


def test_the_run_under_way_is_noted_and_cleared(tmp_path: Path) -> None:
    assert running_run(tmp_path) is None
    note_running(tmp_path, RunningRun("j-1", 3))
    assert running_run(tmp_path) == RunningRun("j-1", 3)
    (tmp_path / "running.json").write_text('{"job_id": "j-1", "attempt": "3"}')
    assert running_run(tmp_path) is None  # malformed: ignored, not trusted
    clear_running(tmp_path)
    clear_running(tmp_path)
    assert running_run(tmp_path) is None
