"""The usage report (``burst report --usage``, ``GET /v1/usage``) on real stores (SQLite and
PostgreSQL) and over real HTTP: the ledger written by a real roll-up of jobs of named users on
burst nodes and on-prem, one of them measured through the store's GPU-reading path.

* Allocation on-prem and burst side by side, measured share and used GPU-hours from the job's
  measured use, "unknown" (null) where nothing was measured, never 0; cost; queue wait and jobs.
* Group-by combinations; an invalid key names the allowed ones; an unknown user or project is an
  empty report; a viewer sees its projects' rows (and users) only; CSV by format or Accept.
"""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import httpx
import pytest

from orchestrator.costs.ledger import roll_up
from orchestrator.costs.usage_report import usage_report
from orchestrator.domain import NodeState
from orchestrator.domain.jobs import JobState
from orchestrator.domain.utilisation import GpuUse
from orchestrator.store import Store
from tests.builders import POOL, T0, Rig, make_policy, make_rig
from tests.integration.api_support import Tokens, bearer

S = NodeState
M = timedelta(minutes=1)
H = timedelta(hours=1)
WINDOW = {"from": "2025-03-01T00:00:00Z", "to": "2025-03-02T00:00:00Z"}
DAY = T0.replace(hour=0)


def seed_usage(store: Store) -> Rig:
    """On-prem at $2 per GPU-hour; $10/h 8-GPU nodes n1 (research) and n2 (vision) from T0, rolled up at +3h. research: ada
    (4 GPUs on n1, 2 h, measured at 50 %) and bob (4 GPUs on n1, 2 h, not measured), dan (8 GPUs
    on-prem, 2 h); vision: cy (8 GPUs on n2, 1 h). Waits: ada 10m, bob 30m, dan 2h, cy 1h."""
    rig = make_rig(store, policy=make_policy(pool={"onprem": {"nodes": 1, "gpus_per_node": 8,
                                                             "gpu_hour_usd": 2}}))
    for n, project in ((1, "research"), (2, "vision")):
        rig.executor.run([rig.launch_action(n, project=project)])
        rig.move(f"n{n}", S.BOOTING, S.JOINING, S.READY)
    runs = {}
    for user, project, gpus, wait, node, hours in (
            ("ada", "research", 4, 10 * M, "n1", 2), ("bob", "research", 4, 30 * M, "n1", 2),
            ("dan", "research", 8, 2 * H, None, 2), ("cy", "vision", 8, H, "n2", 1)):
        job = store.submit_job(project, POOL, gpus, 0, None, None, T0 - wait, user=user)
        started = store.start_job(job, placement="burst" if node else "onprem", node_id=node,
                                  at=T0)
        assert started is not None
        runs[user] = (started, T0 + hours * H)
    ada = runs["ada"][0]
    store.record_gpu_readings(store.get_node("n1"), T0 + H, 2 * 3600.0,
                              [GpuUse(i, 50.0, 1000.0, 80000.0, ada.id) for i in range(4)],
                              below_percent=5.0)
    for started, end in runs.values():
        assert store.finish_job(started, state=JobState.DONE, exit_code=0, at=end)
    rig.clock.advance(hours=3)
    roll_up(store, [rig.policy], rig.now)
    return rig


@pytest.fixture
def rig(store: Store) -> Rig:
    return seed_usage(store)


def rows_by(report: dict, *keys: str) -> dict[tuple, dict]:
    return {tuple(r[k] for k in keys): r for r in report["rows"]}


def test_allocation_measured_use_cost_and_waits_per_user_and_project(store: Store, rig: Rig):
    report = usage_report(store, ("project", "user"), since=DAY, until=DAY + 24 * H).as_json()
    rows = rows_by(report, "project", "user")
    ada, bob, dan, cy = (rows[("research", "ada")], rows[("research", "bob")],
                         rows[("research", "dan")], rows[("vision", "cy")])
    assert (ada["burst_gpu_hours"], ada["onprem_gpu_hours"]) == (8.0, 0.0)
    assert (ada["measured_gpu_hours"], ada["measured_share"], ada["used_gpu_hours"],
            ada["utilisation_percent"]) == (8.0, 1.0, 4.0, 50.0)
    assert ada["burst_cost_usd"] == "10.00" and ada["jobs"] == 1 and ada["wait_p50_s"] == 600.0
    # Nothing measured: unknown, never 0.
    assert (bob["burst_gpu_hours"], bob["measured_share"], bob["used_gpu_hours"],
            bob["utilisation_percent"]) == (8.0, 0.0, None, None)
    assert (dan["onprem_gpu_hours"], dan["burst_gpu_hours"], dan["onprem_cost_usd"],
            dan["wait_p95_s"]) == (16.0, 0.0, "32.00", 7200.0)
    assert cy["burst_gpu_hours"] == 8.0 and cy["wait_p50_s"] == 3600.0
    # The nodes' idle hours are cost of no user (the bucket of no known user).
    assert rows[("research", None)]["burst_cost_usd"] == "10.00"
    assert rows[("vision", None)]["burst_cost_usd"] == "20.00"
    total = report["total"]
    assert (total["jobs"], total["burst_gpu_hours"], total["onprem_gpu_hours"]) == (4, 24.0, 16.0)
    assert total["measured_share"] == round(8 / 40, 4) and total["utilisation_percent"] == 50.0

    by_provider = rows_by(usage_report(store, ("provider",), since=DAY, until=DAY + 24 * H)
                          .as_json(), "provider")
    assert by_provider[("onprem",)]["onprem_gpu_hours"] == 16.0
    assert by_provider[("onprem",)]["jobs"] == 1
    assert usage_report(store, ("user",), users=frozenset({"nobody"})).rows == ()
    assert usage_report(store, ("day",), projects=frozenset({"nobody"})).rows == ()


def usage(client: httpx.Client, secret: str, **params: str) -> httpx.Response:
    return client.get("/v1/usage", params={**WINDOW, **params}, headers=bearer(secret))


def test_the_api_serves_it_scoped_and_as_csv(client: httpx.Client, store: Store, tokens: Tokens):
    admin = usage(client, tokens.admin, group_by="project,user")
    assert admin.status_code == 200, admin.text
    assert admin.json() == usage_report(store, ("project", "user"), since=DAY,
                                        until=DAY + 24 * H).as_json()
    mine = usage(client, tokens.viewer, group_by="user").json()
    assert {r["user"] for r in mine["rows"]} == {"ada", "bob", "dan", None}  # not vision's cy
    assert usage(client, tokens.viewer, group_by="user", user="cy").json()["rows"] == []
    assert usage(client, tokens.viewer, project="vision").status_code == 403
    assert usage(client, tokens.admin, user="nobody").json()["rows"] == []

    bad = usage(client, tokens.admin, group_by="project,colour")
    assert bad.status_code == 422
    assert "colour" in bad.text and "user, project, provider, pool, day" in bad.text

    for response in (usage(client, tokens.other_viewer, group_by="user", format="csv"),
                     client.get("/v1/usage", params={**WINDOW, "group_by": "user"},
                                headers={**bearer(tokens.other_viewer), "Accept": "text/csv"})):
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(response.text)))
        assert [(r["user"], r["burst_gpu_hours"], r["utilisation_percent"]) for r in rows] == [
            ("cy", "8.0", ""), ("", "0.0", "")]
