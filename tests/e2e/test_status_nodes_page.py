"""`burst status` at a site of many nodes lists a page of them: every node is counted (per pool,
state and offering, by SQL), the first ``--limit`` are listed oldest first with how many more
there are, and ``--all`` lists every one, terminated included; a job with idle GPUs on a node
past the page is still flagged. In process (typer's runner)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from orchestrator.store import Store, default_sqlite_url
from orchestrator.store import tables as T
from tests.e2e.helpers import run_burst_here

POLICY = """\
version: 1
name: paged
pool: {name: gpu, onprem: {nodes: 1, gpus_per_node: 4}}
offerings:
  - {provider: local, region: local, zone: local-a, instance_type: local.4gpu, market: spot,
     gpus: 4, price_usd_hour: 1.0}
"""


def _nodes(state_dir: Path) -> None:
    """Five live nodes on two offerings (the oldest first by creation) and one terminated."""
    now = datetime.now(UTC)
    rows = []
    for i, state in enumerate(["ready"] * 3 + ["booting", "draining", "terminated"]):
        offering = "local/local/local-a/local.4gpu/spot" if i % 2 else "local/local/-/big/spot"
        rows.append(dict(
            id=f"n{i}", policy="paged", pool="gpu", provider="local", offering_key=offering,
            instance_type="local.4gpu", market="spot", gpus=4, price_usd_hour=1.0, state=state,
            state_since=now, created_at=now - timedelta(minutes=10 - i), request_id=f"r{i}"))
    # A job on n4 (past the first page) whose GPUs sit idle for a day: flagged all the same.
    job = dict(id="j-idle", project="cv", pool="gpu", gpus=4, priority=0, duration_s=None,
               state="running", placement="burst", node_id="n4", submitted_at=now,
               started_at=now, attempts=1, version=1)
    use = dict(job_id="j-idle", project="cv", node_id="n4", source="agent",
               first_at=now - timedelta(days=1), last_at=now, sampled_gpu_s=3600.0,
               measured_gpu_s=3600.0, used_gpu_s=36.0, low_since=now - timedelta(days=1))
    with Store(default_sqlite_url(state_dir)) as store:
        store.upgrade()
        with store.engine.begin() as conn:
            conn.execute(sa.insert(T.nodes), rows)
            conn.execute(sa.insert(T.jobs), [job])
            conn.execute(sa.insert(T.job_usage), [use])


def test_status_counts_every_node_and_lists_the_first_limit(tmp_path: Path) -> None:
    policy = tmp_path / "paged.yaml"
    policy.write_text(POLICY)
    state = tmp_path / "state"
    _nodes(state)
    env = {"BURST_STATE_DIR": str(state)}

    def status(*extra: str) -> dict:
        done = run_burst_here("status", "--policy", str(policy), "--json", *extra, env=env,
                              check=True)
        return json.loads(done.stdout)

    page = status("--limit", "2")
    assert [n["id"] for n in page["nodes"]] == ["n0", "n1"]
    assert (page["nodes_listed"], page["nodes_total"]) == (2, 5)
    counts = {(c["state"], c["offering"]): c["nodes"] for c in page["node_counts"]}
    assert counts == {("ready", "local/local/-/big/spot"): 2,
                      ("ready", "local/local/local-a/local.4gpu/spot"): 1,
                      ("booting", "local/local/local-a/local.4gpu/spot"): 1,
                      ("draining", "local/local/-/big/spot"): 1}
    assert sum(c["gpus"] for c in page["node_counts"]) == 20
    assert [(j["id"], j["node"]) for j in page["low_utilisation_jobs"]] == [("j-idle", "n4")]
    every = status("--all", "--limit", "2")
    assert [n["id"] for n in every["nodes"]] == [f"n{i}" for i in range(6)]
    assert every["nodes_total"] == 6 and len(every["queue"]) == 0
    text = run_burst_here("status", "--policy", str(policy), "--limit", "2",
                          env={**env, "COLUMNS": "200"}, check=True).stdout
    assert "burst nodes (the first 2 of 5)" in text and "3 more node(s)" in text
    assert "burst nodes by pool and state (5)" in text
