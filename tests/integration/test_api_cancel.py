"""``DELETE /v1/jobs/{id}`` over real HTTP (SQLite and PostgreSQL): cancel a pending job (a
second cancel answers 200 with the same body), 404 for an unknown id or another project's job,
409 with the state for a finished one, and a job running on a burst node: the node's agent is
told to stop it in its heartbeat answer, and its run ends as cancelled."""

from __future__ import annotations

from datetime import timedelta

import httpx

from orchestrator.domain import NodeState
from orchestrator.domain.jobs import JobState, Placement
from orchestrator.store import Store
from tests.builders import POOL, Rig
from tests.integration.api_support import Tokens, add_node, bearer
from tests.integration.test_api_routes import assert_problem


def _job(store: Store, rig: Rig, project: str = "research", job_id: str | None = None):
    return store.submit_job(project, POOL, 2, 0, 600.0, None, rig.now - timedelta(minutes=5),
                            job_id=job_id)


def test_cancel_a_pending_job_twice_gives_the_same_answer(
        client: httpx.Client, store: Store, rig: Rig, tokens: Tokens) -> None:
    job = _job(store, rig)
    first = client.delete(f"/v1/jobs/{job.id}", headers=bearer(tokens.submitter))
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["id"], body["state"], body["wait_s"]) == (job.id, "cancelled", 300.0)
    assert body["finished_at"] is not None
    rig.clock.advance(minutes=10)  # later: a pending job's wait would have grown; this one's not
    again = client.delete(f"/v1/jobs/{job.id}", headers=bearer(tokens.admin))
    assert again.status_code == 200 and again.json() == body
    assert store.get_job(job.id).state is JobState.CANCELLED
    queue = client.get("/v1/queue", headers=bearer(tokens.admin)).json()
    assert job.id not in [j["id"] for j in queue["jobs"]]


def test_unknown_foreign_and_finished_jobs_are_refused(
        client: httpx.Client, store: Store, rig: Rig, tokens: Tokens) -> None:
    missing = assert_problem(client.delete("/v1/jobs/j-nope", headers=bearer(tokens.admin)), 404)
    assert "j-nope" in missing["detail"]
    foreign = _job(store, rig, project="vision")
    assert_problem(client.delete(f"/v1/jobs/{foreign.id}", headers=bearer(tokens.submitter)), 404)
    assert store.get_job(foreign.id).state is JobState.PENDING  # untouched
    assert_problem(client.delete(f"/v1/jobs/{foreign.id}", headers=bearer(tokens.viewer)), 403)

    done = _job(store, rig)
    running = store.start_job(done, placement="onprem", node_id=None, at=rig.now)
    store.finish_job(running, state=JobState.DONE, exit_code=0, at=rig.now)
    problem = assert_problem(client.delete(f"/v1/jobs/{done.id}", headers=bearer(tokens.admin)), 409)
    assert problem["state"] == "done" and "done" in problem["detail"]
    assert_problem(client.delete("/v1/jobs/bad%20id", headers=bearer(tokens.admin)), 422)


def test_a_job_running_on_a_burst_node_is_stopped_through_its_agent(
        client: httpx.Client, store: Store, rig: Rig, tokens: Tokens) -> None:
    node = add_node(rig, 1, "research", NodeState.BOOTING)
    join, _, _ = rig.tokens.issue(node.id, node.request_id, node.created_at)
    registered = client.post("/v1/agent/register", json={
        "node_id": node.id, "join_token": join, "gpus": 8, "gpu_model": "H100"})
    assert registered.status_code == 200, registered.text
    agent = bearer(registered.json()["credential"])
    job = store.start_job(_job(store, rig), placement="burst", node_id="n1", at=rig.now)
    assert job is not None and job.placement is Placement.BURST

    def beat() -> dict:
        answer = client.post("/v1/agent/heartbeat", headers=agent,
                             json={"node_id": "n1", "status": "busy", "job_id": job.id})
        assert answer.status_code == 200, answer.text
        return answer.json()

    assert beat()["stop_job"] is None
    rig.clock.advance(minutes=3)
    cancelled = client.delete(f"/v1/jobs/{job.id}", headers=bearer(tokens.submitter))
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    answer = beat()
    assert answer["stop_job"] == job.id and answer["drain"] is False
    [run] = [r for r in store.job_runs(node_id="n1")]
    assert run.outcome == "cancelled" and run.ended_at == rig.now
    # The agent stops the job and reports it handed back: the report changes nothing now.
    report = client.post(f"/v1/agent/jobs/{job.id}/finish", headers=agent,
                         json={"node_id": "n1", "outcome": "handed-back", "exit_code": None})
    assert report.status_code == 200 and report.json() == {"accepted": False}
    assert store.get_job(job.id).state is JobState.CANCELLED
    idle = client.post("/v1/agent/heartbeat", headers=agent, json={"node_id": "n1", "status": "idle"})
    assert idle.json()["stop_job"] is None
