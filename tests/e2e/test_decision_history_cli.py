"""Bounded decision history through the CLI: ``burst run --once`` applies the retention
(``BURST_DECISION_RETENTION``) and counts a repeated decision on its row, and ``burst decisions``
/ ``burst explain`` show the count and when it was last made. The ticks and the settings error start
`burst` (a loop process; a setting read from the environment at start-up); `decisions` and
`explain` read the state directory in-process (run_burst_here)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from orchestrator.domain.plan import Decision, Rule
from orchestrator.store import Store, default_sqlite_url
from tests.e2e.helpers import FAST_POLICY, burst_json_here, free_port, kill_all, run_burst, run_burst_here


def _decision(i: int, at: datetime, policy: str = "fast") -> Decision:
    return Decision(id=f"d-old-{i}", policy=policy, at=at, rule=Rule.NO_DEMAND,
                    summary=f"nothing pending {i}")


def test_bad_retention_setting_is_refused_by_name(tmp_path: Path) -> None:
    result = run_burst("decisions", env={"BURST_STATE_DIR": str(tmp_path),
                                         "BURST_DECISION_RETENTION": "a month"})
    assert result.returncode == 2 and "BURST_DECISION_RETENTION" in result.stderr.upper()
    assert "Traceback" not in result.stderr


def test_embedded_loop_prunes_and_repeats_show_in_decisions(tmp_path: Path) -> None:
    state = tmp_path / "state"
    env = {"BURST_STATE_DIR": str(state), "BURST_API_PORT": str(free_port()),
           "BURST_LOCAL_BOOT_DELAY_S": "0", "BURST_DECISION_RETENTION": "1h"}
    try:
        run_burst("run", "--policy", str(FAST_POLICY), "--once", env=env, timeout=120, check=True)
        with Store(default_sqlite_url(state)) as store:
            store.add_decision(_decision(1, datetime.now(UTC) - timedelta(hours=2)))
            store.add_decision(_decision(2, datetime.now(UTC) - timedelta(minutes=30),
                                         policy="other"))
        # Two more ticks of an empty queue: each decides what the first did.
        for _ in range(2):
            run_burst("run", "--policy", str(FAST_POLICY), "--once", env=env, timeout=120,
                      check=True)
        found = burst_json_here("decisions", env=env)
        assert [(d["policy"], d["repeats"]) for d in found] == [("fast", 3), ("other", 1)]
        [fast, other] = found
        assert fast["last_seen_at"] > fast["at"] and other["last_seen_at"] == other["at"]
        text = run_burst_here("decisions", env=env, check=True).stdout
        assert "x3, last" in text
        explained = run_burst_here("explain", fast["id"], env=env, check=True).stdout
        assert "made 3 ticks in a row" in explained
    finally:
        kill_all(str(state))
