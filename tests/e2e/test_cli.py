"""The CLI as a user runs it: plan, snapshot schema, submit/status, run --once, decisions/explain,
db upgrade (SQLite and PostgreSQL), and settings from the environment and a settings file.
The stateless commands (plan, submit, status, decisions, explain) run the CLI in-process
(run_burst_here: the same typer app, exit code, stdout and stderr); `burst run --once`, `burst db
upgrade` and the settings tests (the environment, a settings file) start `burst`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest

from tests.e2e.helpers import (FAST_POLICY, burst_json, burst_json_here, free_port, kill_all, run_burst,
                               run_burst_here)

ROOT = Path(__file__).resolve().parents[2]
SPIKE = ROOT / "policies" / "snapshots" / "spike.json"


@pytest.fixture
def env(tmp_path: Path):
    state = tmp_path / "state"
    yield {"BURST_STATE_DIR": str(state), "BURST_API_PORT": str(free_port()),
           "BURST_LOCAL_BOOT_DELAY_S": "0"}
    kill_all(str(state))


def test_plan_json_launches_for_the_example_spike():
    plan = burst_json_here("plan", "--snapshot", str(SPIKE))
    launches = [a for a in plan["actions"] if a["type"] == "launch"]
    assert launches, plan
    [decision] = plan["decisions"]
    assert decision["rule"] == "scale-up"
    assert decision["chosen"] == launches[0]["offering"]["provider"] + "/local/local-a/local.4gpu/spot"
    assert {o["offering_key"] for o in decision["options"]} >= {"local/local/local-a/local.8gpu/on-demand"}
    # The default's wait_slo (30m, expected_boot 10m): train-llm-1 (8 GPUs, 40 min old) is due
    # now; the two 2-GPU sweeps (15 min old) are late too but burst only from 03:04.
    assert decision["inputs"]["pending_gpus_beyond_onprem"] == 12
    assert decision["inputs"]["unmet_gpus"] == 8
    wait = decision["inputs"]["wait_aware"]
    assert (wait["due_jobs"], wait["waiting_jobs"]) == (1, 2)
    assert wait["earliest_burst_deadline"] == "2026-11-30T03:04:00+00:00"
    # Planning is pure: the same snapshot gives the same plan, ids included.
    assert burst_json_here("plan", "--snapshot", str(SPIKE)) == plan


def test_plan_human_output_explains_the_choice():
    result = run_burst_here("plan", "--snapshot", str(SPIKE), check=True)
    assert "scale-up" in result.stdout and "offerings considered" in result.stdout
    assert "chosen" in result.stdout


def test_snapshot_schema_is_json_schema_of_the_format():
    schema = json.loads(run_burst_here("plan", "--snapshot-schema", check=True).stdout)
    assert schema["$id"] == "burst-snapshot-v1"
    assert {"Job", "Node", "PoolQueue", "Offering"} <= set(schema["$defs"])


def test_bad_snapshot_names_file_and_path(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"taken_at": "2026-11-30T03:00:00Z", "queues": {"gpu": {"pool": "gpu"}},
                               "bogus": 1}))
    result = run_burst_here("plan", "--snapshot", str(bad))
    assert result.returncode == 2
    assert f"{bad}: queues.gpu.onprem" in result.stderr
    assert f"{bad}: bogus" in result.stderr
    assert "Traceback" not in result.stderr
    spike = json.loads(SPIKE.read_text())
    spike["queues"]["gpu"]["pending"][1]["gpus"] = 0
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps(spike))
    result = run_burst_here("plan", "--snapshot", str(zero))
    assert result.returncode == 2
    assert f"{zero}: queues.gpu.pending.1.gpus: must be at least 1, got 0" in result.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{\n  \"taken_at\": \n")
    result = run_burst_here("plan", "--snapshot", str(broken))
    assert result.returncode == 2 and f"{broken}:3:1: invalid JSON" in result.stderr


def test_plan_with_a_bad_policy_lists_problems(tmp_path):
    policy = tmp_path / "p.yaml"
    policy.write_text("version: 1\nname: x\npool: {name: gpu, onprem: {nodes: 1, gpus_per_node: 4}}\n"
                      "offerings: [{provider: nowhere}]\nlimits: {max_nodes: -1}\n")
    result = run_burst_here("plan", "--policy", str(policy), "--snapshot", str(SPIKE))
    assert result.returncode == 2
    # (An empty offerings list is checked with accelerators, after the fields: not listed here.)
    assert f"{policy}:4:" in result.stderr and "offerings[0].provider" in result.stderr
    assert f"{policy}:5:" in result.stderr and "limits.max_nodes" in result.stderr


def test_submit_status_run_once_and_explain(env):
    submitted = burst_json_here("submit", "--policy", str(FAST_POLICY), "--project", "research",
                                "--gpus", "4", "--duration", "10m", "--count", "3", env=env)
    assert len(submitted) == 3 and all(j["id"].startswith("j-") for j in submitted)
    status = burst_json_here("status", "--policy", str(FAST_POLICY), env=env)
    [pool] = status["pools"]
    # One 4-GPU on-prem node: the loop has not dispatched yet, so all three wait.
    assert pool["pending_jobs"] == 3 and pool["onprem_gpus"] == 4
    run = run_burst("run", "--policy", str(FAST_POLICY), "--once", env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    decisions = burst_json_here("decisions", env=env)
    assert decisions and decisions[0]["policy"] == "fast"
    # First tick: the trigger starts its sustain period; the decision says so.
    assert decisions[0]["rule"] in ("sustaining", "scale-up")
    explained = burst_json_here("explain", decisions[0]["id"], env=env)
    assert explained["id"] == decisions[0]["id"] and "inputs" in explained
    text = run_burst_here("explain", decisions[0]["id"], env=env, check=True).stdout
    assert "rule:" in text and "why:" in text
    missing = run_burst_here("explain", "d-000000000000", env=env)
    assert missing.returncode == 2 and "no decision" in missing.stderr


def test_submit_rejects_bad_input_clearly(env):
    result = run_burst_here("submit", "--project", "p", "--gpus", "1", "--duration", "10 minutes",
                            env=env)
    assert result.returncode == 2 and "--duration" in result.stderr and "Traceback" not in result.stderr
    result = run_burst_here("submit", "--project", "p", "--gpus", "1", "--duration", "1m",
                            "--pool", "nope", env=env)
    assert result.returncode == 2 and "no running policy watches pool 'nope'" in result.stderr


def test_status_human_output_has_tables(env):
    run_burst_here("submit", "--policy", str(FAST_POLICY), "--project", "vision", "--gpus", "2",
                   "--duration", "1m", env=env, check=True)
    text = run_burst_here("status", "--policy", str(FAST_POLICY), env=env, check=True).stdout
    assert "pools" in text and "burst nodes" in text and "vision" in text


def test_db_upgrade_on_postgresql_and_settings_file(tmp_path):
    name = f"burst_cli_{uuid.uuid4().hex[:8]}"
    admin = "postgresql://postgres@127.0.0.1:5432/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        url = f"postgresql://postgres@127.0.0.1:5432/{name}"
        result = run_burst("db", "upgrade", "--database-url", url)
        assert result.returncode == 0, result.stderr
        with psycopg.connect(url) as conn:
            tables = {r[0] for r in conn.execute("select tablename from pg_tables where schemaname='public'")}
        assert {"nodes", "node_events", "decisions", "jobs", "alembic_version"} <= tables
        # The same URL from a settings file (BURST_SETTINGS_FILE) drives submit and status.
        settings = tmp_path / "burst.yaml"
        settings.write_text(f"database_url: {url}\nstate_dir: {tmp_path / 'state'}\n")
        env = {"BURST_SETTINGS_FILE": str(settings)}
        burst_json("submit", "--project", "research", "--gpus", "1", "--duration", "5m", env=env)
        with psycopg.connect(url) as conn:
            assert conn.execute("select count(*) from jobs").fetchone()[0] == 1
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_bad_settings_are_reported_by_name(tmp_path):
    result = run_burst("status", env={"BURST_TICK_S": "-1", "BURST_STATE_DIR": str(tmp_path)})
    assert result.returncode == 2
    assert "BURST_TICK_S" in result.stderr and "Traceback" not in result.stderr
    settings = tmp_path / "s.yaml"
    settings.write_text("tick_seconds: 5\n")
    result = run_burst("status", env={"BURST_SETTINGS_FILE": str(settings), "BURST_STATE_DIR": str(tmp_path)})
    assert result.returncode == 2 and "tick_seconds" in result.stderr.replace("TICK_SECONDS", "tick_seconds")


def test_submit_from_a_trace_file_queues_it_whole_or_says_where_it_is_wrong(env, tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,submit_s,duration_s,gpus,project,priority\n"
                   "a,0,600,2,research,0\nb,30,soon,8,vision,5\n")
    refused = run_burst_here("submit", "--policy", str(FAST_POLICY), "--from-file", str(bad),
                             env=env)
    assert refused.returncode == 2 and f"{bad}:3: duration_s:" in refused.stderr
    good = tmp_path / "jobs.csv"
    good.write_text("job_id,submit_s,duration_s,gpus,project,priority\n"
                    "a,0,600,2,research,0\nb,30,3600,4,vision,5\n")
    submitted = burst_json_here("submit", "--policy", str(FAST_POLICY), "--from-file", str(good),
                                env=env)
    assert [(j["project"], j["gpus"]) for j in submitted] == [("research", 2), ("vision", 4)]
    status = burst_json_here("status", "--policy", str(FAST_POLICY), env=env)
    assert status["pools"][0]["pending_jobs"] == 2  # the refused file queued nothing
    waits = {j["project"]: j["wait_s"] for j in status["queue"]}
    assert waits["research"] - waits["vision"] == pytest.approx(30, abs=1)  # the file's offsets
