"""The API is strict about types (issue 13, finding 3): a number is a JSON number, so
``"gpus": "1"`` and ``"gpus": true`` are a 422 naming the field on every body that carries a
number, never read as 1. Real HTTP against the served app (tests/integration/api_support.py)."""

from __future__ import annotations

import httpx
from orchestrator.store import Store
from tests.integration.api_support import PROBLEM_JSON, Tokens, bearer

JOB = {"project": "research", "gpus": 2, "duration": "30m"}
BODIES = [
    ("/v1/jobs", JOB, "gpus"),
    ("/v1/jobs", JOB, "priority"),
    ("/v1/agent/register", {"node_id": "n-1", "join_token": "t", "gpus": 4}, "gpus"),
    ("/v1/agent/register", {"node_id": "n-1", "join_token": "t", "pid": 7}, "pid"),
    ("/v1/agent/jobs/next", {"node_id": "n-1", "free_gpus": 4}, "free_gpus"),
    ("/v1/agent/jobs/j-1/finish", {"node_id": "n-1", "outcome": "done", "exit_code": 0},
     "exit_code"),
]


def test_numbers_in_bodies_are_strict(client: httpx.Client, store: Store, tokens: Tokens) -> None:
    for path, body, field in BODIES:
        for value in ("1", True, 1.5):
            response = client.post(path, json={**body, field: value}, headers=bearer(tokens.admin))
            assert response.status_code == 422, (path, field, value, response.text)
            assert response.headers["content-type"].startswith(PROBLEM_JSON)
            assert f"body.{field}" in response.json()["detail"], (path, field, value)
    assert store.jobs() == []


def test_text_fields_are_strict_too(client: httpx.Client, tokens: Tokens) -> None:
    response = client.post("/v1/jobs", json={**JOB, "project": 7}, headers=bearer(tokens.admin))
    assert response.status_code == 422 and "body.project" in response.json()["detail"]
    heartbeat = client.post("/v1/agent/heartbeat", json={"node_id": "n-1", "status": 1})
    assert heartbeat.status_code == 422 and "body.status" in heartbeat.json()["detail"]
