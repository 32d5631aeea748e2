"""`burst status` answers "why nothing launches", as a user runs it: each policy's latest
decision, the limits and quotas in force, its budgets (spent, committed, limit, grade), and for
each pending job the limit or budget holding it, from the latest decision.

`submit` and `status` run in-process (run_burst_here: the same typer app, output and exit code);
`burst run --once` starts a process, as the loop a user starts does."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.helpers import burst_json_here, run_burst, run_burst_here

POLICY = """\
version: 1
name: tight
pool: {name: gpu, onprem: {nodes: 1, gpus_per_node: 4}}
trigger: {sustained_for: 0s, oldest_wait_above: 0s}
offerings:
  - {provider: local, region: local, zone: local-a, instance_type: local.4gpu, market: spot,
     gpus: 4, price_usd_hour: 1.0}
limits: {max_nodes: 3, max_burst_gpus: 12}
projects:
  - {name: research, max_burst_gpus: 8}
budgets:
  - {name: research-day, project: research, window: day, limit_usd: 0.01}
"""


def test_status_shows_the_decision_limits_budgets_and_what_holds_each_job(tmp_path: Path) -> None:
    policy = tmp_path / "tight.yaml"
    policy.write_text(POLICY)
    env = {"BURST_STATE_DIR": str(tmp_path / "state"), "BURST_LOCAL_BOOT_DELAY_S": "0"}
    submitted = burst_json_here("submit", "--policy", str(policy), "--project", "research",
                                "--gpus", "4", "--duration", "10m", "--count", "2", env=env)
    before = burst_json_here("status", "--policy", str(policy), env=env)
    assert before["policies"][0]["decision"] is None
    assert {j["held_back"]["text"] for j in before["queue"]} == {"no decision yet"}

    run_burst("run", "--policy", str(policy), "--once", env=env, timeout=120, check=True)
    status = burst_json_here("status", "--policy", str(policy), env=env)
    [entry] = status["policies"]
    assert entry["decision"]["rule"] == "limited"
    assert entry["decision"]["held_back_by"] == ["budgets[research-day]"]
    assert entry["limits"]["max_nodes"] == 3 and entry["limits"]["max_burst_gpus"] == 12
    assert entry["quotas"] == {"research": 8}
    [budget] = entry["budgets"]
    assert (budget["budget"], budget["project"], budget["limit_usd"]) == (
        "research-day", "research", "0.010000")
    assert {"spent_usd", "committed_usd", "grade"} <= budget.keys()
    # One job runs on-prem; the other waits, held by the research budget.
    [waiting] = status["queue"]
    assert waiting["id"] in {j["id"] for j in submitted}
    assert waiting["held_back"]["held_back_by"] == ["budgets[research-day]"]
    assert waiting["held_back"]["decision"] == entry["decision"]["id"]

    text = run_burst_here("status", "--policy", str(policy), env={**env, "COLUMNS": "200"},
                     check=True).stdout
    assert "limited: 4 unmet GPU(s) but held back by budgets[research-day]" in text
    assert "max_nodes 3" in text and "projects[research].max_burst_gpus 8" in text
    assert "research-day" in text and "0.01" in text
