"""The API's routes over real HTTP against a real store (SQLite and PostgreSQL): bearer-token
auth on every route, roles, project scoping, the built-in queue, problem bodies and 422s naming
the parameter, readiness.

Every /v1 route (but the agents') must be in ``ROUTES``: a test reads the served OpenAPI schema
and fails on a route this file does not check, so a new route cannot ship without auth tests.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from orchestrator.domain import NodeState, Rule
from orchestrator.domain.plan import Decision
from orchestrator.store import Store
from orchestrator.wiring import Runtime
from tests.builders import POOL, T0, Rig
from tests.integration.api_support import (
    PROBLEM_JSON,
    Tokens,
    add_node,
    bearer,
    served,
)

S = NodeState
JOB = {"project": "research", "gpus": 2, "duration": "30m"}

# (method, path, JSON body, roles that may call it). "submitter" may also read; every read route
# is open to every role (rows filtered by project), except the admin-only ones.
ROUTES: list[tuple[str, str, dict | None, set[str]]] = [
    ("GET", "/v1/nodes", None, {"admin", "viewer", "submitter"}),
    ("GET", "/v1/queue", None, {"admin", "viewer", "submitter"}),
    ("POST", "/v1/jobs", JOB, {"admin", "submitter"}),
    ("DELETE", "/v1/jobs/j-route", None, {"admin", "submitter"}),  # idempotent: 200 each time
    ("GET", "/v1/decisions", None, {"admin"}),
    ("GET", "/v1/decisions/d-1", None, {"admin"}),
    ("GET", "/v1/costs", None, {"admin", "viewer", "submitter"}),
    ("GET", "/v1/budgets", None, {"admin", "viewer", "submitter"}),
    ("GET", "/v1/roi", None, {"admin", "viewer", "submitter"}),
    ("GET", "/v1/usage", None, {"admin", "viewer", "submitter"}),
    ("GET", "/metrics", None, {"admin"}),
]
PUBLIC = {"/healthz", "/readyz"}


def call(client: httpx.Client, method: str, path: str, body: dict | None,
         headers: dict | None = None) -> httpx.Response:
    return client.request(method, path, json=body, headers=headers or {})


def assert_problem(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM_JSON), response.headers
    body = response.json()
    assert body["status"] == status and body["title"] and "Traceback" not in response.text
    return body


def seed_decision(store: Store, i: int = 1) -> Decision:
    decision = Decision(id=f"d-{i}", policy="train", at=T0 + timedelta(minutes=i),
                        rule=Rule.SCALE_UP, summary=f"launch {i}",
                        inputs={"unmet_gpus_by_project": {"research": 8, "vision": 16}})
    store.add_decision(decision)
    return decision


# -- auth on every route --------------------------------------------------------------------------


def test_routes_table_covers_every_served_route(client: httpx.Client) -> None:
    schema = client.get("/openapi.json").json()
    served_routes = {(m.upper(), p) for p, ops in schema["paths"].items() for m in ops
                     if not p.startswith("/v1/agent/")}
    checked = {(m, p.replace("/d-1", "/{decision_id}").replace("/j-route", "/{job_id}"))
               for m, p, _, _ in ROUTES}
    assert served_routes - {("GET", p) for p in PUBLIC} == checked
    # Every checked route declares the bearer scheme in the schema; the public ones do not.
    for method, path in checked:
        assert schema["paths"][path][method.lower()].get("security"), (method, path)
    for path in PUBLIC:
        assert not schema["paths"][path]["get"].get("security"), path


def test_every_route_refuses_a_missing_or_bad_token(
        client: httpx.Client, store: Store, rig: Rig, tokens: Tokens) -> None:
    expiring, _ = store.create_api_token("admin", [], created_at=rig.now,
                                         expires_at=rig.now + timedelta(minutes=5))
    revoked, record = store.create_api_token("admin", [], created_at=rig.now)
    store.revoke_api_token(record.id, rig.now)
    rig.clock.advance(minutes=6)
    cases = {
        "missing": {},
        "not bearer": {"Authorization": f"Basic {tokens.admin}"},
        "unknown": bearer("bat_not-a-real-token"),
        "expired": bearer(expiring),
        "revoked": bearer(revoked),
    }
    for method, path, body, _ in ROUTES:
        for case, headers in cases.items():
            response = call(client, method, path, body, headers)
            problem = assert_problem(response, 401)
            assert response.headers["www-authenticate"].startswith('Bearer realm="burst"'), case
            if case in ("expired", "revoked"):
                assert case in problem["detail"], (path, problem)
                assert 'error="invalid_token"' in response.headers["www-authenticate"]
    for path in PUBLIC:
        assert client.get(path).status_code == 200, path


def test_each_role_gets_exactly_the_routes_it_may_call(
        client: httpx.Client, store: Store, tokens: Tokens) -> None:
    seed_decision(store)
    store.submit_job("research", POOL, 2, 0, 600.0, None, T0, job_id="j-route")
    secrets = {"admin": tokens.admin, "viewer": tokens.viewer, "submitter": tokens.submitter}
    for method, path, body, allowed in ROUTES:
        for role, secret in secrets.items():
            response = call(client, method, path, body, bearer(secret))
            if role in allowed:
                assert response.status_code in (200, 201), (role, path, response.text)
            else:
                problem = assert_problem(response, 403)
                assert tokens.ids[role] in problem["detail"], problem


def test_a_project_token_never_reads_another_projects_rows(
        client: httpx.Client, rig: Rig, store: Store, tokens: Tokens) -> None:
    add_node(rig, 1, "research", S.BOOTING, S.JOINING, S.READY)
    add_node(rig, 2, "vision", S.BOOTING)
    add_node(rig, 3, None)  # min_nodes / pre-warm: no project
    store.submit_job("research", POOL, 8, 0, 600.0, None, rig.now - timedelta(minutes=10))
    store.submit_job("vision", POOL, 16, 0, 600.0, None, rig.now - timedelta(minutes=30))

    def nodes(secret: str, query: str = "") -> list[str]:
        response = client.get(f"/v1/nodes{query}", headers=bearer(secret))
        assert response.status_code == 200, response.text
        return sorted(n["id"] for n in response.json()["nodes"])

    assert nodes(tokens.admin) == ["n1", "n2", "n3"]
    assert nodes(tokens.viewer) == ["n1"]
    assert nodes(tokens.other_viewer) == ["n2"]
    assert nodes(tokens.admin, "?project=vision,research") == ["n1", "n2"]
    assert nodes(tokens.admin, "?state=ready&state=booting") == ["n1", "n2"]
    assert nodes(tokens.admin, f"?pool={POOL}&provider=aws&state=launching") == ["n3"]
    assert nodes(tokens.admin, "?pool=elsewhere") == []
    for query in ("?project=vision", "?project=research&project=vision", "?project=research,vision"):
        problem = assert_problem(client.get(f"/v1/nodes{query}", headers=bearer(tokens.viewer)), 403)
        assert "vision" in problem["detail"] and "research" not in problem["detail"]

    viewer_queue = client.get("/v1/queue", headers=bearer(tokens.viewer)).json()
    assert [j["project"] for j in viewer_queue["jobs"]] == ["research"]
    # The pool summary is computed over the caller's jobs only: vision's 16 GPUs and its longer
    # wait do not show through.
    assert viewer_queue["pools"] == [{"pool": POOL, "pending_jobs": 1, "pending_gpus": 8,
                                      "running_jobs": 0, "oldest_wait_s": 600.0,
                                      "mean_wait_s": 600.0}]
    admin_queue = client.get("/v1/queue", headers=bearer(tokens.admin)).json()
    assert admin_queue["pools"][0]["pending_gpus"] == 24
    assert admin_queue["pools"][0]["oldest_wait_s"] == 1800.0
    assert_problem(client.get("/v1/queue?project=vision", headers=bearer(tokens.viewer)), 403)


def test_submit_a_job_then_see_it_in_the_queue(
        client: httpx.Client, rig: Rig, store: Store, tokens: Tokens) -> None:
    response = client.post("/v1/jobs", headers=bearer(tokens.submitter),
                           json={**JOB, "priority": 5, "command": "python train.py"})
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["id"].startswith("j-") and job["state"] == "pending" and job["pool"] == POOL
    assert job["duration_s"] == 1800.0 and job["priority"] == 5
    stored = store.get_job(job["id"])
    assert stored is not None and stored.project == "research" and stored.gpus == 2
    assert stored.command == "python train.py"

    rig.clock.advance(minutes=3)
    queue = client.get("/v1/queue", headers=bearer(tokens.viewer)).json()
    assert [(j["id"], j["wait_s"]) for j in queue["jobs"]] == [(job["id"], 180.0)]
    assert client.get("/v1/queue?state=running", headers=bearer(tokens.viewer)).json()["jobs"] == []

    foreign = client.post("/v1/jobs", headers=bearer(tokens.submitter),
                          json={**JOB, "project": "vision"})
    assert "vision" in assert_problem(foreign, 403)["detail"]
    by_viewer = client.post("/v1/jobs", headers=bearer(tokens.viewer), json=JOB)
    assert_problem(by_viewer, 403)
    assert len(store.jobs()) == 1  # nothing written by the refused calls


def test_a_retried_submission_with_an_idempotency_key_queues_the_job_once(
        client: httpx.Client, rig: Rig, store: Store, tokens: Tokens) -> None:
    keyed = {**bearer(tokens.submitter), "Idempotency-Key": "nightly-eval-2026-11-30"}
    first = client.post("/v1/jobs", headers=keyed, json=JOB)
    assert first.status_code == 201, first.text
    rig.clock.advance(minutes=1)
    again = client.post("/v1/jobs", headers=keyed, json=JOB)  # e.g. the answer was lost: retry
    assert again.status_code == 200, again.text
    assert again.json()["id"] == first.json()["id"] and again.json()["wait_s"] == 60.0
    assert len(store.jobs()) == 1

    other = assert_problem(client.post("/v1/jobs", headers=keyed, json={**JOB, "gpus": 4}), 409)
    assert "Idempotency-Key" in other["detail"] and len(store.jobs()) == 1
    # Keys are per token: the admin's same key is another job, not a replay of the submitter's.
    admin = client.post("/v1/jobs", json=JOB, headers={**bearer(tokens.admin),
                                                        "Idempotency-Key": keyed["Idempotency-Key"]})
    assert admin.status_code == 201 and admin.json()["id"] != first.json()["id"]
    # Without a key every POST is a new job.
    assert client.post("/v1/jobs", headers=bearer(tokens.submitter), json=JOB).status_code == 201
    assert len(store.jobs()) == 3
    bad = client.post("/v1/jobs", json=JOB, headers={**bearer(tokens.submitter),
                                                      "Idempotency-Key": "has space"})
    assert "idempotency-key" in assert_problem(bad, 422)["detail"].lower()


def test_a_list_of_jobs_is_queued_in_one_transaction_once_per_key(
        client: httpx.Client, store: Store, tokens: Tokens) -> None:
    from orchestrator.api.v1 import MAX_API_BATCH

    keyed = {**bearer(tokens.submitter), "Idempotency-Key": "sweep-42"}
    jobs = [{**JOB, "gpus": g} for g in (1, 2, 4)]
    first = client.post("/v1/jobs", headers=keyed, json=jobs)
    assert first.status_code == 201, first.text
    assert [j["gpus"] for j in first.json()] == [1, 2, 4]
    again = client.post("/v1/jobs", headers=keyed, json=jobs)
    assert again.status_code == 200 and again.json() == first.json()
    assert_problem(client.post("/v1/jobs", headers=keyed, json=jobs[:2]), 409)
    assert len(store.jobs()) == 3
    # All or none: one bad job (named by its index), one foreign project, too many jobs.
    bad = assert_problem(client.post("/v1/jobs", headers=bearer(tokens.submitter),
                                     json=[JOB, {**JOB, "gpus": 0}]), 422)
    assert "body.1.gpus" in bad["detail"]
    foreign = client.post("/v1/jobs", headers=bearer(tokens.submitter),
                          json=[JOB, {**JOB, "project": "vision"}])
    assert "vision" in assert_problem(foreign, 403)["detail"]
    nowhere = assert_problem(client.post("/v1/jobs", headers=bearer(tokens.admin),
                                         json=[JOB, {**JOB, "pool": "nowhere"}]), 422)
    assert "body.1.pool" in nowhere["detail"]
    many = client.post("/v1/jobs", headers=bearer(tokens.admin), json=[JOB] * (MAX_API_BATCH + 1))
    assert str(MAX_API_BATCH) in assert_problem(many, 413)["detail"]
    assert_problem(client.post("/v1/jobs", headers=bearer(tokens.admin), json=[]), 422)
    assert len(store.jobs()) == 3


@pytest.mark.parametrize(("body", "names"), [
    ({"project": "research", "duration": "30m"}, "body.gpus"),
    ({**JOB, "gpus": 0}, "body.gpus"),
    ({**JOB, "duration": "soon"}, "body.duration"),
    ({**JOB, "project": "bad project"}, "body.project"),
    ({**JOB, "pool": "nowhere"}, "body.pool"),
    ({**JOB, "command": "a\x00b"}, "body.command"),
    ({**JOB, "gpu": 2}, "body.gpu"),
])
def test_bad_job_fields_are_422_naming_the_field(
        client: httpx.Client, store: Store, tokens: Tokens, body: dict, names: str) -> None:
    problem = assert_problem(client.post("/v1/jobs", headers=bearer(tokens.admin), json=body), 422)
    assert names in problem["detail"], problem
    assert store.jobs() == []


@pytest.mark.parametrize(("path", "names"), [
    ("/v1/nodes?limit=0", "query.limit"),
    ("/v1/nodes?state=sleeping", "query.state"),
    ("/v1/nodes?include_terminated=perhaps", "query.include_terminated"),
    ("/v1/nodes?project=no%20spaces", "query.project"),
    ("/v1/queue?state=done", "query.state"),
    ("/v1/decisions?since=yesterday", "query.since"),
    ("/v1/decisions?since=2025-03-01T12:00:00", "query.since"),  # no timezone
    ("/v1/decisions?limit=abc", "query.limit"),
    ("/v1/costs?from=someday", "query.from"),
    ("/v1/costs?to=2025-03-01T00:00", "query.to"),  # no timezone (a bare date is UTC midnight)
    ("/v1/costs?from=2025-03-02T00:00:00Z&to=2025-03-01T00:00:00Z", "query.from"),
    ("/v1/costs?group_by=project,colour", "query.group_by"),
    ("/v1/costs?pool=%00", "query.pool"),
])
def test_bad_query_parameters_are_422_naming_the_parameter(
        client: httpx.Client, tokens: Tokens, path: str, names: str) -> None:
    problem = assert_problem(client.get(path, headers=bearer(tokens.admin)), 422)
    assert names in problem["detail"], problem
    assert any(".".join(str(p) for p in e["loc"]).startswith(names) for e in problem["errors"])


def test_every_error_is_a_problem_document(client: httpx.Client, tokens: Tokens) -> None:
    assert_problem(client.get("/v1/nowhere", headers=bearer(tokens.admin)), 404)
    assert_problem(client.delete("/v1/nodes", headers=bearer(tokens.admin)), 405)
    missing = assert_problem(client.get("/v1/decisions/d-404", headers=bearer(tokens.admin)), 404)
    assert "d-404" in missing["detail"]
    not_json = client.post("/v1/jobs", headers={**bearer(tokens.admin),
                                                 "content-type": "application/json"},
                           content=b"{not json")
    assert_problem(not_json, 422)


def test_decisions_are_served_to_admins(client: httpx.Client, store: Store, tokens: Tokens) -> None:
    for i in (1, 2, 3):
        seed_decision(store, i)
    listed = client.get("/v1/decisions", headers=bearer(tokens.admin)).json()
    assert [d["id"] for d in listed] == ["d-3", "d-2", "d-1"]
    since = (T0 + timedelta(minutes=2)).isoformat()
    recent = client.get("/v1/decisions", params={"since": since, "limit": 10},
                        headers=bearer(tokens.admin)).json()
    assert [d["id"] for d in recent] == ["d-3", "d-2"]
    one = client.get("/v1/decisions/d-2", headers=bearer(tokens.admin)).json()
    assert one["rule"] == "scale-up" and one["inputs"]["unmet_gpus_by_project"]["vision"] == 16
    # Pool-level inputs carry every project's numbers: a project token gets none of them.
    for path in ("/v1/decisions", "/v1/decisions/d-2"):
        refused = client.get(path, headers=bearer(tokens.viewer))
        assert_problem(refused, 403)
        assert "vision" not in refused.text and "inputs" not in refused.text


def test_tokens_record_when_they_were_last_used(
        client: httpx.Client, rig: Rig, store: Store, tokens: Tokens) -> None:
    assert client.get("/v1/nodes", headers=bearer(tokens.viewer)).status_code == 200
    used = store.get_api_token(tokens.ids["viewer"])
    assert used is not None and used.last_used_at == rig.now
    assert store.get_api_token(tokens.ids["admin"]).last_used_at is None  # type: ignore[union-attr]


def test_agent_routes_keep_node_credentials_not_api_tokens(
        client: httpx.Client, tokens: Tokens) -> None:
    beat = client.post("/v1/agent/heartbeat", headers=bearer(tokens.admin),
                       json={"node_id": "n1", "status": "idle"})
    assert assert_problem(beat, 401)["title"] == "bad credential"
    register = client.post("/v1/agent/register", json={"node_id": "n1", "join_token": "x"})
    assert assert_problem(register, 401)["title"] == "join refused"  # no API token asked for


# -- readiness ------------------------------------------------------------------------------------


def test_readyz_reports_the_store_and_its_migration(
        client: httpx.Client, rt: Runtime, tmp_path: Path) -> None:
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"

    old = Store(f"sqlite:///{tmp_path / 'old.db'}")
    old.upgrade("0003")
    unreachable = Store("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2")
    try:
        rt.store = old
        problem = assert_problem(client.get("/readyz"), 503)
        assert problem["title"] == "store not migrated"
        assert "0003" in problem["detail"] and "burst db upgrade" in problem["detail"]
        rt.store = unreachable
        assert assert_problem(client.get("/readyz"), 503)["title"] == "store unreachable"
    finally:
        old.close()
        unreachable.close()
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_of_the_production_api_also_needs_the_broker(rt: Runtime) -> None:
    with served(rt, broker_url="redis://127.0.0.1:6379/0") as client:
        assert client.get("/readyz").json()["status"] == "ready"
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with served(rt, broker_url=f"redis://:hunter2@127.0.0.1:{port}/0") as client:
        problem = assert_problem(client.get("/readyz"), 503)
        assert problem["title"] == "broker unreachable" and "hunter2" not in str(problem)
        assert client.get("/healthz").json() == {"status": "ok"}  # liveness does not depend on it
