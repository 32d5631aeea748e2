"""`burst plan` as a dry-run against the live world: observe as the loop does, write nothing.

Driven through the CLI in-process (run_burst_here: the same typer app the entry point runs; the
process start is what tests/e2e/test_cli.py covers): jobs submitted to the built-in queue of a state
directory (SQLite, and a PostgreSQL store), then `burst plan` with no snapshot; the store's bytes
(SQLite) or rows (PostgreSQL) are compared before and after, and no node process may appear.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.e2e.helpers import burst_json_here, kill_all, node_processes, run_burst_here

# A trigger that must hold for 5 minutes: a first dry-run is "sustaining" unless told otherwise.
POLICY = """\
version: 1
name: live
cluster: e2e-live
pool:
  name: gpu
  onprem: {nodes: 1, gpus_per_node: 4}
trigger: {pending_gpus_above: 0, sustained_for: 5m}
offerings:
  - {provider: local, region: local, zone: local-a, instance_type: local.4gpu, market: spot,
     fallback_on_demand: true}
limits: {max_nodes: 3}
"""

# An AWS offering whose GPUs the policy gives but whose price only the bundled catalogue has.
AWS_POLICY = """\
version: 1
name: cloud
cluster: e2e-cloud
pool:
  name: gpu
  onprem: {nodes: 1, gpus_per_node: 4}
trigger: {pending_gpus_above: 0}
providers:
  aws: {ami: ami-0a1b2c3d4e5f67890}
offerings:
  - {provider: aws, region: us-east-1, instance_type: p4d.24xlarge, market: on-demand, gpus: 8}
limits: {max_nodes: 2}
"""


@pytest.fixture
def live(tmp_path: Path):
    state = tmp_path / "state"
    policy = tmp_path / "live.yaml"
    policy.write_text(POLICY)
    env = {"BURST_STATE_DIR": str(state)}
    yield env, policy, state
    kill_all(str(state))


def _digest(state: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(state.iterdir())}


def test_dry_run_without_state_plans_an_empty_world_and_creates_nothing(live):
    env, policy, state = live
    result = run_burst_here("plan", "-p", str(policy), env=env, check=True)
    assert "no state at" in result.stderr and "empty" in result.stderr
    assert "rule: no-demand" in result.stdout
    assert not state.exists()


def test_dry_run_sees_the_queue_and_writes_nothing(live):
    env, policy, state = live
    run_burst_here("submit", "-p", str(policy), "--project", "vision", "--gpus", "4",
              "--duration", "1h", "--count", "3", env=env, check=True)
    before = _digest(state)

    plan = burst_json_here("plan", "-p", str(policy), env=env)
    [decision] = plan["decisions"]
    assert decision["rule"] == "sustaining", decision
    assert decision["inputs"]["pending_gpus"] == 12
    assert [a["type"] for a in plan["actions"]] == ["hold"]

    plan = burst_json_here("plan", "-p", str(policy), "--assume-sustained", env=env)
    [decision] = plan["decisions"]
    assert decision["rule"] == "scale-up", decision
    launches = [a for a in plan["actions"] if a["type"] == "launch"]
    # 12 pending GPUs, 4 of them on-prem: two 4-GPU burst nodes.
    assert len(launches) == 2
    assert decision["chosen"] == "local/local/local-a/local.4gpu/spot"

    human = run_burst_here("plan", "-p", str(policy), "--assume-sustained", env=env, check=True)
    assert "offerings considered" in human.stdout
    assert "✔ chosen" in human.stdout and "launch" in human.stdout

    assert _digest(state) == before  # not a byte of the store changed, no file appeared
    assert node_processes(str(state)) == []
    status = burst_json_here("status", "-p", str(policy), env=env)
    assert status["nodes"] == []


def test_saved_snapshot_replans_to_the_same_decision(live, tmp_path):
    env, policy, state = live
    run_burst_here("submit", "-p", str(policy), "--project", "nlp", "--gpus", "8",
              "--duration", "30m", env=env, check=True)
    saved = tmp_path / "observed.json"
    live_plan = burst_json_here("plan", "-p", str(policy), "--assume-sustained",
                           "--save-snapshot", str(saved), env=env)
    replayed = burst_json_here("plan", "-p", str(policy), "--assume-sustained",
                          "--snapshot", str(saved), env=env)
    keep = ("rule", "summary", "chosen", "inputs")
    assert ([{k: d[k] for k in keep} for d in replayed["decisions"]]
            == [{k: d[k] for k in keep} for d in live_plan["decisions"]])
    assert [a["type"] for a in replayed["actions"]] == [a["type"] for a in live_plan["actions"]]
    assert json.loads(saved.read_text())["queues"]["gpu"]["pending"][0]["project"] == "nlp"


def test_snapshot_without_offerings_is_filled_from_the_catalogue(tmp_path):
    policy = tmp_path / "cloud.yaml"
    policy.write_text(AWS_POLICY)
    snapshot = tmp_path / "world.json"
    snapshot.write_text(json.dumps({
        "taken_at": "2026-12-01T12:00:00Z",
        "queues": {"gpu": {
            "pool": "gpu", "onprem": {"total_gpus": 4, "free_gpus": 0},
            "pending": [{"id": "j1", "project": "nlp", "pool": "gpu", "gpus": 8,
                         "submitted_at": "2026-12-01T11:00:00Z", "duration_s": 3600}]}},
    }))
    env = {"BURST_STATE_DIR": str(tmp_path / "state")}
    plan = burst_json_here("plan", "-p", str(policy), "--snapshot", str(snapshot), env=env)
    [decision] = plan["decisions"]
    options = {o["offering_key"]: o for o in decision["options"]}
    listed = options["aws/us-east-1/-/p4d.24xlarge/on-demand"]
    assert listed["rejected"] is None and listed["price_usd_hour"] > 0  # the catalogue's price
    assert decision["rule"] != "no-offering", decision


@pytest.mark.postgres
def test_dry_run_on_postgresql_writes_no_row(tmp_path, pg_url):
    policy = tmp_path / "live.yaml"
    policy.write_text(POLICY)
    env = {"BURST_STATE_DIR": str(tmp_path / "state"), "BURST_DATABASE_URL": pg_url}
    run_burst_here("db", "upgrade", env=env, check=True)
    run_burst_here("submit", "-p", str(policy), "--project", "vision", "--gpus", "4",
              "--duration", "1h", "--count", "2", env=env, check=True)
    engine = sa.create_engine(pg_url)
    tables = ("jobs", "nodes", "node_events", "decisions", "policy_memory")

    def counts() -> dict[str, int]:
        with engine.connect() as conn:
            present = set(sa.inspect(conn).get_table_names())
            return {t: conn.exec_driver_sql(f'SELECT count(*) FROM "{t}"').scalar_one()
                    for t in tables if t in present}

    before = counts()
    plan = burst_json_here("plan", "-p", str(policy), "--assume-sustained", env=env)
    # (The session's PostgreSQL database may hold other tests' jobs too: at least ours launch.)
    assert "launch" in [a["type"] for a in plan["actions"]]
    assert counts() == before
    engine.dispose()
