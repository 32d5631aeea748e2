"""The console never drops a word: data holding `[`, `]`, `[bold]` or `[/]` comes out verbatim.

Rich reads `[...]` as a style tag and silently drops it; a budget named in a decision
(`budgets[vision-day]`) is exactly what a user came to read. Every command that echoes data is
driven here through the `burst` typer app, piped (as in a script or a log file), against a store
seeded with names and messages full of brackets. The commands run in-process (run_burst_here:
the same app and consoles, built afresh per call as in a new process); `burst run --once` still
starts a process (it installs signal handlers and serves the agents' API while it ticks).
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from orchestrator.costs.ledger import roll_up
from orchestrator.domain import NodeState
from orchestrator.domain.plan import Decision, OfferingOption, Rule
from orchestrator.store import Store, default_sqlite_url
from tests.builders import make_rig
from tests.e2e.helpers import FAST_POLICY, free_port, kill_all, run_burst, run_burst_here

TEAM = "[bold]team[/] [x]"  # a project name as a user might type it (the store takes any text)
DECISION_ID = "d-[red]1[/red]"
SUMMARY = "launches held back by budgets[vision-day] and [bold]limits[/bold] [/]"
HELD = ("budgets[vision-day]", "limits[max_nodes]")
OFFERING = "aws/us-east-1/-/[g8]/spot"  # the optimizer view shows it as offering + market
REJECTED = "over budgets[vision-day] ([red]$10.00[/red])"
ACTION = "hold [x]: budgets[vision-day]"


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory):
    """A state directory with a node and ledger for project TEAM and a bracket-laden decision."""
    base = tmp_path_factory.mktemp("console")
    state = base / "state"
    store = Store(default_sqlite_url(state))
    store.upgrade()
    rig = make_rig(store)
    rig.executor.run([rig.launch_action(1, project=TEAM)])
    rig.move("n1", NodeState.BOOTING, NodeState.JOINING, NodeState.READY)
    rig.clock.advance(hours=2)
    roll_up(store, [rig.policy], rig.now)
    store.add_decision(Decision(
        id=DECISION_ID, policy=rig.policy.name, at=rig.now, rule=Rule.LIMITED, summary=SUMMARY,
        inputs={"budgets[vision-day]": "spent [b]$90[/b] of $100"},
        options=(OfferingOption(OFFERING, 8, 10.0, 1, 10.0, REJECTED),),
        held_back_by=HELD, actions=(ACTION,)))
    start = (rig.now - timedelta(days=1)).isoformat()
    end = (rig.now + timedelta(days=1)).isoformat()
    store.close()
    env = {"BURST_STATE_DIR": str(state), "BURST_API_PORT": str(free_port()),
           "BURST_LOCAL_BOOT_DELAY_S": "0", "COLUMNS": "250"}
    # The commands run the fast test policy (pool gpu, like the seeded node's).
    yield {"env": env, "policy": str(FAST_POLICY), "window": ["--from", start, "--to", end]}
    kill_all(str(state))


def burst(seeded, *args: str, code: int = 0, process: bool = False):
    result = (run_burst if process else run_burst_here)(*args, env=seeded["env"])
    assert result.returncode == code, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result


def test_decisions_and_explain_print_every_bracket(seeded) -> None:
    listed = burst(seeded, "decisions", "--limit", "5").stdout
    assert DECISION_ID in listed and SUMMARY in listed

    shown = burst(seeded, "explain", DECISION_ID).stdout
    for text in (DECISION_ID, f"why: {SUMMARY}", "budgets[vision-day]", "spent [b]$90[/b] of $100",
                 OFFERING.rpartition("/")[0], REJECTED, f"held back by: {', '.join(HELD)}", f"  - {ACTION}"):
        assert text in shown, (text, shown)

    missing = burst(seeded, "explain", "d-[red]x", code=2)
    assert "error: no decision 'd-[red]x'" in missing.stderr


def test_status_submit_and_pool_echo_names_verbatim(seeded) -> None:
    policy = ["-p", seeded["policy"]]
    submitted = burst(seeded, "submit", "--project", TEAM, "--gpus", "1", "--duration", "1m", *policy)
    assert f"GPU(s) for {TEAM} (" in submitted.stdout and ") in pool gpu" in submitted.stdout
    status = burst(seeded, "status", *policy).stdout
    assert status.count(TEAM) >= 2, status  # the queued job and the burst node's project

    bad_pool = burst(seeded, "submit", "--project", "p", "--gpus", "1", "--duration", "1m",
                     "--pool", "[bold]gpu[/]", *policy, code=2)
    assert "--pool: no running policy watches pool '[bold]gpu[/]'" in bad_pool.stderr

    paused = burst(seeded, "pool", "pause", "gpu", "--reason", "[bold]maintenance[/] [x]", *policy)
    assert "pool gpu paused ([bold]maintenance[/] [x])" in paused.stdout
    burst(seeded, "pool", "resume", "gpu", *policy)


def test_report_rows_keep_bracketed_projects(seeded) -> None:
    report = burst(seeded, "report", *seeded["window"]).stdout
    assert TEAM in report, report


def test_run_log_names_policies_and_decisions_verbatim(seeded) -> None:
    run = burst(seeded, "run", "--once", "-p", str(FAST_POLICY), process=True)
    assert "burst: running policies [fast], tick" in run.stderr, run.stderr


def test_usage_errors_echo_the_argument_verbatim(seeded) -> None:
    # Help and usage errors are plain click text (rich_markup_mode=None): no tag is eaten there.
    unknown = burst(seeded, "[bold]status[/]", code=2)
    assert "No such command '[bold]status[/]'" in unknown.stderr
