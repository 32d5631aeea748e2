"""Users through the API over real HTTP on a real store (SQLite and PostgreSQL): a job submitted
with a token is its subject's (a submitter may not submit for another user, an admin may), jobs
and cost reports carry and filter by user, and the tenant rule holds: a viewer of a project sees
that project's users and nobody else's, and a user unknown to it is an empty answer.
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import httpx
import pytest

from orchestrator.costs.ledger import roll_up
from orchestrator.domain import NodeState
from orchestrator.store import Store
from orchestrator.store.jobruns import JobRun, RunSource, slurm_run_key
from tests.builders import POOL, Rig, make_rig
from tests.integration.api_support import PROBLEM_JSON, bearer

S = NodeState
WINDOW = {"from": "2025-03-01T00:00:00Z", "to": "2025-03-03T00:00:00Z"}
JOB = {"project": "research", "gpus": 1, "duration": "10m"}


@pytest.fixture
def rig(store: Store) -> Rig:
    """n1 (research) runs a job of ada's and one of bob's; n2 (vision) one of ada's, one of eve's
    and a Slurm job of no project of carol's; rolled up two hours later."""
    rig = make_rig(store)
    for n, project in ((1, "research"), (2, "vision")):
        rig.executor.run([rig.launch_action(n, project=project)])
        rig.move(f"n{n}", S.BOOTING, S.JOINING, S.READY)
    for n, project, user in ((1, "research", "ada"), (1, "research", "bob"),
                             (2, "vision", "ada"), (2, "vision", "eve")):
        job = store.submit_job(project, POOL, 2, 0, None, None, rig.now, user=user)
        started = store.start_job(job, placement="burst", node_id=f"n{n}", at=rig.now)
        assert started is not None
    run = JobRun(run_key=slurm_run_key("slurm:t", "9", "n2", rig.now), job_id="9", project=None,
                 user="carol", node_id="n2", gpus=2, started_at=rig.now, source=RunSource.SLURM)
    assert store.observe_slurm_runs("slurm:t", [run], rig.now) == (1, 0)
    rig.clock.advance(hours=2)
    roll_up(store, [rig.policy], rig.now)
    return rig


@pytest.fixture
def people(store: Store, rig: Rig) -> dict[str, str]:
    """Secrets: a viewer of research, submitters of research as ada and with no user, an admin
    as root."""
    made = {
        "viewer": store.create_api_token("viewer", ["research"], created_at=rig.now),
        "vision": store.create_api_token("viewer", ["vision"], created_at=rig.now),
        "ada": store.create_api_token("submitter", ["research"], created_at=rig.now,
                                      subject="ada"),
        "anonymous": store.create_api_token("submitter", ["research"], created_at=rig.now),
        "admin": store.create_api_token("admin", [], created_at=rig.now, subject="root"),
    }
    return {name: secret for name, (secret, _) in made.items()}


def post(client: httpx.Client, secret: str, **body: object) -> httpx.Response:
    return client.post("/v1/jobs", json={**JOB, **body}, headers=bearer(secret))


def costs(client: httpx.Client, secret: str, **params: str) -> dict:
    response = client.get("/v1/costs", params={**WINDOW, **params}, headers=bearer(secret))
    assert response.status_code == 200, response.text
    return response.json()


def users(report: dict) -> set[str | None]:
    return {r["user"] for r in report["rows"]}


def test_a_job_is_its_tokens_users_and_a_submitter_cannot_submit_for_another(
        client: httpx.Client, store: Store, people: dict[str, str]) -> None:
    before = len(store.jobs())
    mine = post(client, people["ada"])
    assert mine.status_code == 201, mine.text
    assert mine.json()["user"] == "ada" and store.get_job(mine.json()["id"]).user == "ada"
    assert post(client, people["ada"], user="ada").json()["user"] == "ada"  # its own: fine

    for secret in (people["ada"], people["anonymous"]):
        refused = post(client, secret, user="bob")
        assert refused.status_code == 403, refused.text
        assert refused.headers["content-type"].startswith(PROBLEM_JSON)
        problem = refused.json()
        assert problem["field"] == "body.user" and problem["detail"].startswith("body.user: ")
        assert "bob" in problem["detail"]
    assert post(client, people["anonymous"]).json()["user"] is None  # a token of no user
    # An admin's token submits for anyone; without a user, for its own subject.
    assert post(client, people["admin"], user="bob").json()["user"] == "bob"
    assert post(client, people["admin"]).json()["user"] == "root"
    assert len(store.jobs()) == before + 5  # the refused ones queued nothing

    bad = post(client, people["admin"], user="has space")
    assert bad.status_code == 422 and "body.user" in bad.json()["detail"]

    queue = client.get("/v1/queue", params={"user": "bob"}, headers=bearer(people["viewer"]))
    assert queue.status_code == 200
    assert {(j["project"], j["user"]) for j in queue.json()["jobs"]} == {("research", "bob")}


def test_a_viewer_sees_its_projects_users_and_nobody_elses(
        client: httpx.Client, people: dict[str, str]) -> None:
    admin = costs(client, people["admin"], group_by="project,user")
    keys = {(r["project"], r["user"]) for r in admin["rows"]}
    # Idle lines have no user; carol's Slurm job of no project is its own null bucket.
    assert keys == {("research", "ada"), ("research", "bob"), ("research", None),
                    ("vision", "ada"), ("vision", "eve"), ("vision", None), (None, "carol")}

    mine = costs(client, people["viewer"], group_by="user")
    assert users(mine) == {"ada", "bob", None}  # research's users; not eve, not carol
    assert "eve" not in str(mine) and "carol" not in str(mine)
    assert users(costs(client, people["vision"], group_by="user")) == {"ada", "eve", None}

    # ada in research only, for research's viewer; in both projects for the admin.
    ada = costs(client, people["viewer"], group_by="project", user="ada")
    assert [r["project"] for r in ada["rows"]] == ["research"]
    both = costs(client, people["admin"], group_by="project", user="ada")
    assert [r["project"] for r in both["rows"]] == ["research", "vision"]
    assert Decimal(both["total"]["cost_usd"]) == 2 * Decimal(ada["total"]["cost_usd"]) > 0

    # Another project's user, or nobody's: an empty answer, not an error.
    for user in ("eve", "carol", "nobody"):
        empty = costs(client, people["viewer"], group_by="user", user=user)
        assert empty["rows"] == [] and empty["total"]["cost_usd"] == "0.00"
    assert costs(client, people["admin"], user="nobody")["rows"] == []
    assert costs(client, people["admin"], project="nosuch", group_by="user")["rows"] == []
    queue = client.get("/v1/queue", params={"user": "nobody"}, headers=bearer(people["admin"]))
    assert queue.status_code == 200 and queue.json()["jobs"] == []
    refused = client.get("/v1/costs", params={**WINDOW, "user": "a b"},
                         headers=bearer(people["viewer"]))
    assert refused.status_code == 422 and "query.user" in refused.json()["detail"]


def test_the_bucket_of_no_project_is_null_in_json_and_empty_in_csv(
        client: httpx.Client, people: dict[str, str]) -> None:
    report = costs(client, people["admin"], group_by="project", user="carol")
    assert [r["project"] for r in report["rows"]] == [None]
    # ``project=-`` (no project) selects it, beside the lines of nodes launched for no project.
    none = costs(client, people["admin"], group_by="project,user", project="-")
    assert {(r["project"], r["user"]) for r in none["rows"]} == {(None, "carol")}
    response = client.get("/v1/costs", params={**WINDOW, "group_by": "project,user"},
                          headers={**bearer(people["admin"]), "Accept": "text/csv"})
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert ("", "carol") in {(r["project"], r["user"]) for r in rows}


def test_the_cost_metric_of_work_of_no_project_has_an_empty_project_label(rt) -> None:
    from orchestrator.api.fleet_metrics import ledger_families

    [cost] = [f for f in ledger_families(rt) if f.name == "burst_cost_usd"]
    projects = {s.labels["project"] for s in cost.samples}
    assert projects == {"research", "vision", ""}  # "": carol's Slurm job of no project
