"""The return on burst spend (``burst report --roi``, ``GET /v1/roi``) on real stores (SQLite and
PostgreSQL) and over real HTTP: a scale-up decision's predicted on-prem starts are kept per job
with its first burst start, and the report folds them with the cost ledger per project and month.

* Waiting avoided is predicted on-prem start minus actual burst start, floored at 0 per job (a job
  that started on burst later than predicted counts as late, not negative); a job without a
  prediction counts its dollars and its start, not a wait.
* A newer prediction replaces an older one until the job starts; after that the row is final,
  and a second run of the job changes nothing.
* Viewers see their projects' rows only; an unknown project is an empty report; CSV by
  ``format=csv`` or ``Accept``.
"""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import httpx
import pytest

from orchestrator.costs.ledger import roll_up
from orchestrator.costs.roi import roi_report
from orchestrator.domain import NodeState
from orchestrator.domain.plan import Decision, Rule
from orchestrator.store import Store
from tests.builders import POOL, T0, Rig, make_rig
from tests.integration.api_support import Tokens, bearer

S = NodeState
M = timedelta(minutes=1)
H = timedelta(hours=1)
WINDOW = {"from": "2025-03-01T00:00:00Z", "to": "2025-04-01T00:00:00Z"}


def _decision(n: int, at, starts: dict) -> Decision:
    return Decision(id=f"d-roi{n}", policy="default", at=at, rule=Rule.SCALE_UP,
                    summary=f"launching {n}", actions=(f"launch n{n}",),
                    inputs={"burst_wait": {"predicted_onprem_start_s": starts}})


def seed_roi(store: Store) -> Rig:
    """$10/h nodes n1 (research) and n2 (vision) from T0; research's jobs: ``early`` predicted
    on-prem at +3h, ``late`` at +5m, ``never`` never; vision's ``v`` at +1h; all start on burst at
    +10m; rolled up at +2h."""
    rig = make_rig(store)
    for n, project in ((1, "research"), (2, "vision")):
        rig.executor.run([rig.launch_action(n, project=project)])
        rig.move(f"n{n}", S.BOOTING, S.JOINING, S.READY)
    jobs = {name: store.submit_job(project, POOL, 1, 0, None, None, T0 - M)
            for name, project in (("early", "research"), ("late", "research"),
                                  ("never", "research"), ("v", "vision"))}
    rig.ids = {name: job.id for name, job in jobs.items()}  # type: ignore[attr-defined]
    # A first prediction for "early", replaced by the launching decision's.
    store.add_decision(_decision(1, T0 - 5 * M, {jobs["early"].id: 600.0}))
    store.add_decision(_decision(2, T0, {
        jobs["early"].id: 3 * 3600.0, jobs["late"].id: 300.0, jobs["never"].id: None,
        jobs["v"].id: 3600.0}))
    for name, job in jobs.items():
        node = "n2" if name == "v" else "n1"
        assert store.start_job(job, placement="burst", node_id=node, at=T0 + 10 * M)
    rig.clock.advance(hours=2)
    roll_up(store, [rig.policy], rig.now)
    return rig


@pytest.fixture
def rig(store: Store) -> Rig:
    return seed_roi(store)


def test_the_wait_avoided_is_kept_per_job_and_final_once_the_job_starts(store: Store,
                                                                         rig: Rig) -> None:
    ids = rig.ids  # type: ignore[attr-defined]
    early = store.burst_wait(ids["early"])
    assert early is not None
    assert (early.decision_id, early.predicted_start, early.started_at, early.node_id,
            early.project) == ("d-roi2", T0 + 3 * H, T0 + 10 * M, "n1", "research")
    assert early.avoided_s == 3 * 3600 - 600
    assert store.burst_wait(ids["late"]).avoided_s == 0.0  # started after its prediction
    assert store.burst_wait(ids["never"]).avoided_s is None
    # A decision made after the start changes nothing; neither does a second run of the job.
    store.add_decision(_decision(3, T0 + H, {ids["early"]: 60.0}))
    job = store.get_job(ids["early"])
    back = store.requeue_job(job, T0 + H)
    assert store.start_job(back, placement="burst", node_id="n1", at=T0 + H + M)
    assert store.burst_wait(ids["early"]) == early


def test_the_report_folds_spend_and_waits_per_project_and_month(store: Store, rig: Rig) -> None:
    report = roi_report(store, since=T0.replace(day=1, hour=0), until=T0.replace(month=4, day=1, hour=0))
    rows = {r["project"]: r for r in (row.as_json() for row in report.rows)}
    assert rows["research"] == {
        "project": "research", "month": "2025-03", "burst_cost_usd": "20.00",
        "burst_gpu_hours": 16.0, "burst_jobs": 3, "predicted_jobs": 2, "late_jobs": 1,
        "hours_avoided": round((3 * 3600 - 600) / 3600, 4),
        "usd_per_hour_avoided": str(round(20 / ((3 * 3600 - 600) / 3600), 2))}
    assert rows["vision"]["hours_avoided"] == round(50 / 60, 4)
    assert rows["vision"]["usd_per_hour_avoided"] == "24.00"  # $20 for 50 minutes
    assert report.total.burst_jobs == 4 and report.total.predicted_jobs == 3
    assert roi_report(store, projects=frozenset({"nobody"})).rows == ()
    # The month a job started in counts its wait; a window after it sees none of it.
    later = roi_report(store, since=T0 + H, until=T0 + 2 * H)
    assert later.total.predicted_jobs == 0 and later.total.avoided_s == 0


def roi(client: httpx.Client, secret: str, **params: str) -> httpx.Response:
    return client.get("/v1/roi", params={**WINDOW, **params}, headers=bearer(secret))


def test_the_api_serves_the_report_scoped_to_the_callers_projects(
        client: httpx.Client, store: Store, tokens: Tokens) -> None:
    admin = roi(client, tokens.admin)
    assert admin.status_code == 200, admin.text
    expected = roi_report(store, since=T0.replace(day=1, hour=0), until=T0.replace(month=4, day=1, hour=0))
    assert admin.json() == expected.as_json()
    assert {r["project"] for r in admin.json()["rows"]} == {"research", "vision"}

    mine = roi(client, tokens.viewer).json()
    assert [r["project"] for r in mine["rows"]] == ["research"]
    assert mine["total"]["burst_cost_usd"] == "20.00" and mine["total"]["burst_jobs"] == 3
    assert roi(client, tokens.viewer, project="vision").status_code == 403
    assert roi(client, tokens.admin, project="nobody").json()["rows"] == []

    by_format = roi(client, tokens.other_viewer, format="csv")
    by_accept = client.get("/v1/roi", params=WINDOW, headers={
        **bearer(tokens.other_viewer), "Accept": "text/csv"})
    for response in (by_format, by_accept):
        assert response.headers["content-type"].startswith("text/csv")
        rows = list(csv.DictReader(io.StringIO(response.text)))
        assert [(r["project"], r["month"], r["burst_cost_usd"]) for r in rows] == [
            ("vision", "2025-03", "20.00")]
    bad = roi(client, tokens.admin, **{"from": "2025-04-02T00:00:00Z"})
    assert bad.status_code == 422 and "from" in bad.text
