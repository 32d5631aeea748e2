"""What moving data costs, as a user sees it: ``burst plan`` and ``burst explain`` show per burst
job its staging time and egress next to its compute cost, and say which job was not burst
because staging its data would outlast its on-prem wait. `burst run --once` starts a process; the
other commands run in-process (run_burst_here: the same typer app, output and exit code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import FAST_POLICY, burst_json_here, free_port, kill_all, run_burst, run_burst_here

ROOT = Path(__file__).resolve().parents[2]
SPIKE = ROOT / "policies" / "snapshots" / "spike.json"
STORAGE = {"datasets": [{"uri": "nfs://fs/corpus", "size_gb": 200}],
           "checkpoints": "s3://ckpt/gpu", "checkpoint_size_gb": 20,
           "egress_usd_per_gb": 0.09, "bandwidth_gbps": 1}


def _with_storage(source: Path, target: Path, **changes) -> Path:
    policy = yaml.safe_load(source.read_text())
    policy["pool"]["storage"] = STORAGE
    policy.update(changes)
    target.write_text(yaml.safe_dump(policy, sort_keys=False))
    return target


def test_plan_shows_staging_and_egress_next_to_compute(tmp_path):
    policy = _with_storage(ROOT / "policies" / "examples" / "default.yaml", tmp_path / "p.yaml",
                           trigger={"pending_gpus_above": 0, "oldest_wait_above": "10m",
                                    "sustained_for": "1m"})
    spike = json.loads(SPIKE.read_text())
    queue = spike["queues"]["gpu"]
    # On-prem frees 8 GPUs in 20 minutes: the 8-GPU job would start there first; its own 2 TB
    # would take 4.4 hours to stage at 1 Gbit/s, so it stays. The sweeps queue behind it for
    # 2 hours: their 200 GB (27 minutes) is worth staging.
    queue["onprem_releases"] = [{"gpus": 8, "ends_at": "2026-11-30T03:20:00Z"}]
    queue["pending"][0]["dataset_gb"] = 2000
    snapshot = tmp_path / "s.json"
    snapshot.write_text(json.dumps(spike))
    plan = burst_json_here("plan", "--policy", str(policy), "--snapshot", str(snapshot))
    [decision] = plan["decisions"]
    staging = decision["inputs"]["staging"]
    assert staging["jobs"]["train-llm-1"]["burst"] is False
    assert staging["jobs"]["train-llm-1"]["staging_s"] == 16000.0
    assert "storage.staging" in decision["held_back_by"]
    assert "train-llm-1 (2000 GB: 16000s > 1200s)" in decision["summary"]
    burst = {job: row for job, row in staging["jobs"].items() if row["burst"]}
    assert burst and all(row["egress_usd"] == 19.8 and row["compute_usd"] > 0
                         for row in burst.values())
    launched = {job for a in plan["actions"] if a["type"] == "launch" for job in a["jobs"]}
    assert launched == set(burst)
    text = run_burst_here("plan", "--policy", str(policy), "--snapshot", str(snapshot),
                          check=True).stdout
    assert "data staging per job" in text and "egress $" in text and "compute $" in text
    assert "no: staging > on-prem wait" in text


@pytest.fixture
def env(tmp_path: Path):
    state = tmp_path / "state"
    yield {"BURST_STATE_DIR": str(state), "BURST_API_PORT": str(free_port()),
           "BURST_LOCAL_BOOT_DELAY_S": "0"}
    kill_all(str(state))


def test_explain_shows_the_staging_of_a_stored_decision(env, tmp_path):
    policy = _with_storage(FAST_POLICY, tmp_path / "fast.yaml",
                           trigger={"pending_gpus_above": 0, "oldest_wait_above": "0s",
                                    "sustained_for": "0s"})
    burst_json_here("submit", "--policy", str(policy), "--project", "research", "--gpus", "4",
                    "--duration", "2h", "--count", "2", env=env)
    run = run_burst("run", "--policy", str(policy), "--once", env=env, timeout=60)
    assert run.returncode == 0, run.stderr
    [decision] = [d for d in burst_json_here("decisions", env=env) if d["rule"] == "scale-up"]
    # The list carries each decision whole: its staging is what explain shows.
    rows = decision["inputs"]["staging"]["jobs"]
    assert rows and all(r["staging_s"] == 1600.0 and r["egress_gb"] == 220.0 for r in rows.values())
    text = run_burst_here("explain", decision["id"], env=env, check=True).stdout
    assert "data staging per job" in text and "1600s" in text and "19.80" in text
