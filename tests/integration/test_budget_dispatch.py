"""Budgets on the production dispatch path (issue 13, finding 2): ``POST /v1/agent/jobs/next``
on a burst node starts a job only if the budgets of the job's project, of the node's project and
of the pool cover the job's declared run there, whoever's node it is.

Before the fix, project ``vision`` with a $0.02/day budget spent $0.55 (27.5x) running its jobs on
project ``research``'s burst nodes: no budget stopped it. Real store (SQLite and PostgreSQL), real
HTTP through uvicorn.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from orchestrator.domain.jobs import JobState
from orchestrator.domain.nodes import NodeState
from orchestrator.fabric.tokens import new_credential
from orchestrator.store import Store
from tests.builders import Rig, make_policy, make_rig
from tests.integration.api_support import add_node, runtime_of, served

S = NodeState
BUDGETS = [{"name": "vision-daily", "project": "vision", "window": "day", "limit_usd": 0.02,
            "grades": []}]


@pytest.fixture
def rig(store: Store) -> Rig:
    return make_rig(store, policy=make_policy(budgets=BUDGETS))


@pytest.fixture
def client(rig: Rig, tmp_path: Path) -> Iterator[httpx.Client]:
    with served(runtime_of(rig, tmp_path)) as c:
        yield c


def ready_node(rig: Rig, n: int, project: str) -> tuple[str, str]:
    """Node ``n<n>`` of ``project``, ready, with an agent credential; (node id, credential)."""
    node = add_node(rig, n, project, S.BOOTING, S.JOINING, S.READY)
    credential, digest = new_credential()
    rig.store.set_credential(node.id, digest)
    return node.id, credential


def pull(client: httpx.Client, node_id: str, credential: str) -> httpx.Response:
    return client.post("/v1/agent/jobs/next", json={"node_id": node_id, "free_gpus": 8},
                       headers={"Authorization": f"Bearer {credential}"})


def submit(rig: Rig, project: str, gpus: int = 8, hours: float = 1.0) -> str:
    record = rig.store.submit_job(project, rig.policy.pool.name, gpus, 0, hours * 3600, "true",
                                  rig.now - timedelta(minutes=10))
    return record.id


def test_a_tiny_project_budget_stops_its_work_on_another_projects_node(
        rig: Rig, client: httpx.Client) -> None:
    node_id, credential = ready_node(rig, 1, "research")
    vision = submit(rig, "vision")  # 1 h of an 8-GPU $10/h node: $10 on a $0.02 budget
    research = submit(rig, "research")
    answer = pull(client, node_id, credential)
    assert answer.status_code == 200, answer.text
    assert answer.json()["job"]["id"] == research  # vision's job is passed over, research's runs
    assert rig.store.get_job(vision).state is JobState.PENDING
    finished = client.post(f"/v1/agent/jobs/{research}/finish",
                           json={"node_id": node_id, "outcome": "done", "exit_code": 0},
                           headers={"Authorization": f"Bearer {credential}"})
    assert finished.status_code == 200, finished.text
    assert pull(client, node_id, credential).status_code == 204  # nothing vision may start
    assert rig.store.get_job(vision).state is JobState.PENDING


def test_work_the_budget_covers_still_starts_and_commits_the_node(
        rig: Rig, client: httpx.Client) -> None:
    node_id, credential = ready_node(rig, 1, "research")
    before = rig.store.get_node(node_id).budget_commit_usd
    job = submit(rig, "vision", gpus=1, hours=0.001)  # 3.6 s of 1/8 of $10/h: $0.00125
    answer = pull(client, node_id, credential)
    assert answer.status_code == 200 and answer.json()["job"]["id"] == job
    # research's node is kept up for the run plus the idle tail: its commitment grew by that
    assert rig.store.get_node(node_id).budget_commit_usd > before
