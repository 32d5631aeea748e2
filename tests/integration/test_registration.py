"""Agent registration over real HTTP against the real API and store (SQLite and PostgreSQL):
atomic and retryable.

Spending the join token, storing the credential, moving the node to joining and the audit row are
one transaction, so a controller that dies inside a registration leaves the node as it was, its
token unspent. A registration that was written but whose answer the agent never got (the
controller died before answering, the connection dropped) can be completed again with the same
token, for the same node, within the token's lifetime: the answer is the same, with a fresh
credential; the registration is final once the agent has used a credential.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from orchestrator.domain import NodeState
from orchestrator.fabric.bootstrap import Bootstrap
from orchestrator.store import Store
from tests.builders import Rig
from tests.integration.api_support import add_node, bearer
from tests.integration.test_agent import wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]


class Crash(RuntimeError):
    """The controller dying in the middle of a write."""


class _CrashingConnection:
    def __init__(self, conn: sa.Connection, table: str, countdown: list[int]):
        self._conn = conn
        self._table = table
        self._countdown = countdown

    def execute(self, statement: Any, *args: Any, **kwargs: Any) -> Any:
        table = getattr(statement, "table", None)  # INSERT, UPDATE, DELETE; a SELECT has none
        if self._countdown[0] > 0 and getattr(table, "name", None) == self._table:
            self._countdown[0] -= 1
            if self._countdown[0] == 0:
                raise Crash(f"controller killed while writing {self._table}")
        return self._conn.execute(statement, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@contextmanager
def crash_on_write_to(store: Store, table: str, nth: int = 1) -> Iterator[list[int]]:
    """The ``nth`` write statement to ``table`` raises (once), inside its transaction, which is
    rolled back as a killed controller's would be."""
    original = store._write
    countdown = [nth]

    @contextmanager
    def crashing() -> Iterator[Any]:
        with original() as conn:
            yield _CrashingConnection(conn, table, countdown)

    store._write = crashing  # type: ignore[method-assign]
    try:
        yield countdown  # [0] once the crash happened
    finally:
        del store._write


def _no_answer_or_500(client: httpx.Client, body: dict[str, Any]) -> bool:
    """A registration the controller dies in: uvicorn answers the crash with a 500 or drops the
    connection; to the agent both mean "retry"."""
    try:
        # Connection: close, as the agent (urllib) does: the crash may leave the connection dead.
        return client.post("/v1/agent/register", json=body,
                           headers={"Connection": "close"}).status_code == 500
    except httpx.TransportError:
        return True


def _booting(rig: Rig, n: int = 1) -> dict[str, Any]:
    node = add_node(rig, n, "research", NodeState.BOOTING)
    token, _, _ = rig.tokens.issue(node.id, node.request_id, node.created_at)
    return {"node_id": node.id, "join_token": token, "gpus": 8, "gpu_model": "H100"}


@pytest.mark.parametrize("table", ["nodes", "node_events", "join_attempts"])
def test_a_controller_dying_inside_a_registration_leaves_the_node_registrable(
        rig: Rig, client: httpx.Client, table: str) -> None:
    """Killed at any write of the registration: nothing of it stays, the token is unspent."""
    body = _booting(rig)
    with crash_on_write_to(rig.store, table) as countdown:
        assert _no_answer_or_500(client, body)
    assert countdown == [0]
    assert rig.node("n1").state is NodeState.BOOTING
    assert rig.store.join_attempts("n1") == []
    # The agent retries on a 5xx with the same token; it must not find it spent.
    again = client.post("/v1/agent/register", json=body)
    assert again.status_code == 200, again.text
    assert rig.node("n1").state is NodeState.READY
    beat = client.post("/v1/agent/heartbeat", headers=bearer(again.json()["credential"]),
                       json={"node_id": "n1", "status": "idle"})
    assert beat.status_code == 200, beat.text


def test_a_controller_dying_after_the_registration_is_finished_by_the_retry(
        rig: Rig, client: httpx.Client) -> None:
    """Killed after the registration was written, before the node was made ready and answered
    (the built-in fabric's joining -> ready): the retry answers and finishes it."""
    body = _booting(rig)
    with crash_on_write_to(rig.store, "node_events", nth=2) as countdown:
        assert _no_answer_or_500(client, body)
    assert countdown == [0]
    assert rig.node("n1").state is NodeState.JOINING  # registered, never answered
    again = client.post("/v1/agent/register", json=body)
    assert again.status_code == 200, again.text
    assert rig.node("n1").state is NodeState.READY
    assert [a["reason"] for a in rig.store.join_attempts("n1")] == ["ok", "again"]


def test_a_registration_whose_answer_was_lost_is_answered_again(
        rig: Rig, client: httpx.Client) -> None:
    body = _booting(rig)
    first = client.post("/v1/agent/register", json=body)
    assert first.status_code == 200, first.text
    # The agent never got that answer (the controller died before sending it): it retries.
    again = client.post("/v1/agent/register", json=body)
    assert again.status_code == 200, again.text
    assert again.json().keys() == first.json().keys()
    assert again.json()["credential"] != first.json()["credential"]
    assert rig.node("n1").state is NodeState.READY
    assert [(a["ok"], a["reason"]) for a in rig.store.join_attempts("n1")] == [
        (True, "ok"), (True, "again")]
    assert [e.to_state for e in rig.store.events("n1")].count(NodeState.JOINING) == 1
    # The credential of the lost answer is no good; the re-issued one is.
    beat = {"node_id": "n1", "status": "idle"}
    stale = client.post("/v1/agent/heartbeat", headers=bearer(first.json()["credential"]), json=beat)
    assert stale.status_code == 401
    fresh = client.post("/v1/agent/heartbeat", headers=bearer(again.json()["credential"]), json=beat)
    assert fresh.status_code == 200, fresh.text
    # Once the agent has used a credential its registration is final: the token is spent.
    late = client.post("/v1/agent/register", json=body)
    assert late.status_code == 401 and late.json()["detail"].endswith("replayed")
    assert client.post("/v1/agent/heartbeat", headers=bearer(again.json()["credential"]),
                       json=beat).status_code == 200


def test_a_retry_after_the_token_lifetime_is_refused(rig: Rig, client: httpx.Client) -> None:
    body = _booting(rig)
    assert client.post("/v1/agent/register", json=body).status_code == 200
    rig.clock.advance(seconds=rig.tokens.ttl.total_seconds() + 1)
    late = client.post("/v1/agent/register", json=body)
    assert late.status_code == 401, late.text


def test_a_token_spent_without_the_node_moving_completes_the_registration(
        rig: Rig, client: httpx.Client) -> None:
    """A node stranded by a controller that spent the token and died before moving the node (as
    registration was before it was one transaction) joins on its agent's next try."""
    body = _booting(rig)
    from orchestrator.fabric.tokens import token_hash

    assert rig.store.consume_join_token("n1", token_hash(body["join_token"]), rig.now) == "ok"
    assert rig.node("n1").state is NodeState.BOOTING
    again = client.post("/v1/agent/register", json=body)
    assert again.status_code == 200, again.text
    assert rig.node("n1").state is NodeState.READY


def test_registration_refuses_other_nodes_and_states(rig: Rig, client: httpx.Client) -> None:
    body = _booting(rig)
    other = _booting(rig, 2)
    # n1's token is no good for n2, and nothing of n2 is spent by the try.
    stolen = client.post("/v1/agent/register", json={**other, "join_token": body["join_token"]})
    assert stolen.status_code == 401
    assert client.post("/v1/agent/register", json=other).status_code == 200
    rig.move("n1", NodeState.FAILED)
    gone = client.post("/v1/agent/register", json=body)
    assert gone.status_code == 401 and "node is failed" in gone.json()["detail"]


def test_the_agent_retries_a_registration_the_controller_died_in(
        rig: Rig, client: httpx.Client, tmp_path: Path) -> None:
    """A real agent process: its first registration dies with the controller; it retries with
    its token (backoff from 0.5 s) and the node becomes ready, well before any boot timeout."""
    body = _booting(rig)
    boot = Bootstrap(node_id="n1", controller_url=str(client.base_url), join_token=body["join_token"],
                     cluster="lab", policy=rig.policy.name, gpus=8, gpu_model="H100",
                     boot_delay_s=0.0, heartbeat_s=0.2)
    user_data = tmp_path / "n1.user-data"
    user_data.write_text(boot.render())
    log = tmp_path / "agent.log"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("BURST_BOOT_DELAY_S", None)
    with crash_on_write_to(rig.store, "node_events") as armed, open(log, "wb") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.fabric.agent", "--user-data", str(user_data),
             "--work-dir", str(tmp_path / "work")],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, start_new_session=True)
        try:
            wait_for(lambda: armed[0] == 0, timeout=60, what="the first registration")
            wait_for(lambda: rig.node("n1").state is NodeState.READY, timeout=60,
                     what="the node ready after the agent's retry")
            wait_for(lambda: "registered;" in log.read_text(), timeout=60, what="the agent's log")
        finally:
            agent.kill()
            agent.wait(10)
    # The registration the controller died in left nothing, not even its audit row.
    assert [a["reason"] for a in rig.store.join_attempts("n1")] == ["ok"], log.read_text()
    assert "registered" in log.read_text()


def test_racing_registrations_of_one_node_join_it_once(rig: Rig, client: httpx.Client) -> None:
    """Four registrations with the node's token at once (an agent retrying over a slow answer):
    every one is answered, the node joins once, and only the last credential handed out works."""
    from concurrent.futures import ThreadPoolExecutor

    body = _booting(rig)
    base = str(client.base_url)

    def register(_: int) -> httpx.Response:
        with httpx.Client(base_url=base, timeout=30) as own:
            return own.post("/v1/agent/register", json=body)

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(register, range(4)))
    assert [a.status_code for a in answers] == [200] * 4, [a.text for a in answers]
    assert sorted(a["reason"] for a in rig.store.join_attempts("n1")) == ["again"] * 3 + ["ok"]
    assert [e.to_state for e in rig.store.events("n1")].count(NodeState.JOINING) == 1
    assert rig.node("n1").state is NodeState.READY
    working = [a for a in answers if client.post(
        "/v1/agent/heartbeat", headers=bearer(a.json()["credential"]),
        json={"node_id": "n1", "status": "idle"}).status_code == 200]
    assert len(working) == 1
