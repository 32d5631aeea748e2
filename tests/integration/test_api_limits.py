"""The API under abuse, over real HTTP (raw sockets where the client's own behaviour matters):
bounded request bodies (413 on Content-Length before the body is read, and on a chunked body as
it passes the limit), a per-source rate limit on the anonymous registration route (429 with
Retry-After), answers that do not tell an anonymous caller which node ids exist, and a bounded,
pruned ``join_attempts`` audit log.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import httpx
import pytest

from orchestrator.api import create_app
from orchestrator.api.limits import AGENT_BODY_LIMIT, BODY_LIMIT, Rate
from orchestrator.api.server import ApiServer
from orchestrator.domain import NodeState
from orchestrator.wiring import Runtime
from tests.builders import Rig
from tests.integration.api_support import PROBLEM_JSON, add_node, bearer

MIB = 1024 * 1024


@contextmanager
def serve(rt: Runtime, rate: Rate = Rate(burst=1000, per_s=1)) -> Iterator[tuple[int, httpx.Client]]:
    server = ApiServer(create_app(rt, register_rate=rate), "127.0.0.1", 0)
    port = server.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield port, client
    finally:
        server.stop()


def raw_request(port: int, head: str, chunks: list[bytes] = ()) -> tuple[int, dict[str, str], dict]:
    """Send ``head`` and ``chunks`` as they are, then read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n")
        for chunk in chunks:
            sock.sendall(chunk)
        data = b""
        while True:
            try:
                part = sock.recv(65536)
            except ConnectionResetError:
                break
            if not part:
                break
            data += part
            if b"\r\n\r\n" in data:
                header, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in header.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), None)
                if length is not None and len(body) >= length:
                    break
    header, _, body = data.partition(b"\r\n\r\n")
    lines = header.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return int(lines[0].split()[1]), headers, json.loads(body) if body else {}


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def test_a_declared_100_mib_body_is_refused_before_it_is_sent(rt: Runtime) -> None:
    with serve(rt) as (port, _):
        # Only the head goes out: the answer comes without the server waiting for the body.
        status, headers, problem = raw_request(
            port, "POST /v1/agent/register HTTP/1.1\nHost: burst\nContent-Type: application/json\n"
                  f"Content-Length: {100 * MIB}\n")
        assert status == 413 and headers["content-type"] == PROBLEM_JSON
        assert problem["title"] == "request body too large"
        assert problem["limit_bytes"] == AGENT_BODY_LIMIT
        assert headers["connection"] == "close"
        status, _, problem = raw_request(
            port, "POST /v1/jobs HTTP/1.1\nHost: burst\nContent-Type: application/json\n"
                  f"Content-Length: {2 * MIB}\n")
        assert status == 413 and problem["limit_bytes"] == BODY_LIMIT


def test_a_chunked_body_is_refused_as_it_passes_the_limit(rt: Runtime) -> None:
    head = ("POST /v1/agent/register HTTP/1.1\nHost: burst\nContent-Type: application/json\n"
            "Transfer-Encoding: chunked\n")
    with serve(rt) as (port, client):
        # 72 KiB of an endless body (no final chunk): refused once past 64 KiB.
        status, headers, problem = raw_request(port, head, [_chunk(b" " * 8192)] * 9)
        assert status == 413 and headers["content-type"] == PROBLEM_JSON, problem
        assert problem["limit_bytes"] == AGENT_BODY_LIMIT
        # Under the limit, chunked or not, the body reaches the route.
        small = json.dumps({"node_id": "n1", "join_token": "x"}).encode()
        status, _, problem = raw_request(port, head, [_chunk(small), b"0\r\n\r\n"])
        assert status == 401 and problem["title"] == "join refused"
        padded = client.post("/v1/agent/register", content=small[:-1] + b" " * 60_000 + b"}",
                             headers={"Content-Type": "application/json"})
        assert padded.status_code == 401


def test_anonymous_registrations_are_rate_limited_per_source(rig: Rig, rt: Runtime) -> None:
    add_node(rig, 1, "research", NodeState.BOOTING, NodeState.JOINING, NodeState.READY)
    with serve(rt, Rate(burst=3, per_s=0.01)) as (_, client):
        body = {"node_id": "n1", "join_token": "guess"}
        answers = [client.post("/v1/agent/register", json=body) for _ in range(5)]
        assert [a.status_code for a in answers] == [401, 401, 401, 429, 429]
        limited = answers[3]
        assert limited.headers["content-type"] == PROBLEM_JSON
        assert int(limited.headers["retry-after"]) >= 1
        assert limited.json()["retry_after_s"] == int(limited.headers["retry-after"])
        # Routes with a credential are not limited (a wrong one is refused as before).
        beat = client.post("/v1/agent/heartbeat", headers=bearer("bnc_wrong"),
                           json={"node_id": "n1", "status": "idle"})
        assert beat.status_code == 401
    # Only the registrations that got through reached the audit log.
    assert len(rig.store.join_attempts()) == 3


def test_answers_do_not_tell_which_node_ids_exist(rig: Rig, rt: Runtime) -> None:
    add_node(rig, 1, "research", NodeState.BOOTING)
    with serve(rt) as (_, client):
        known = client.post("/v1/agent/register", json={"node_id": "n1", "join_token": "guess"})
        unknown = client.post("/v1/agent/register", json={"node_id": "n9", "join_token": "guess"})
        assert known.status_code == unknown.status_code == 401
        assert known.json() == unknown.json()
        beat = {"status": "idle"}
        known = client.post("/v1/agent/heartbeat", headers=bearer("bnc_x"),
                            json={**beat, "node_id": "n1"})
        unknown = client.post("/v1/agent/heartbeat", headers=bearer("bnc_x"),
                              json={**beat, "node_id": "n9"})
        assert known.status_code == unknown.status_code == 401
        assert known.json()["title"] == unknown.json()["title"]
        assert known.json()["detail"].replace("n1", "N") == unknown.json()["detail"].replace("n9", "N")
    # The audit log keeps the real reasons.
    assert [a["reason"] for a in rig.store.join_attempts()] == ["wrong-token", "unknown-node"]


def test_join_attempts_are_bounded_and_pruned(rig: Rig, rt: Runtime) -> None:
    store = rig.store
    store.join_attempts_cap = 10  # type: ignore[misc]
    old = rig.now - store.join_attempts_retention - timedelta(hours=1)
    for _ in range(5):
        store.record_join_attempt("n-old", old, False, "wrong-token")
    with serve(rt) as (_, client):
        assert client.post("/v1/agent/register",
                           json={"node_id": "n9", "join_token": "x"}).status_code == 401
        assert [a["node_id"] for a in store.join_attempts()] == ["n9"]  # the old ones pruned
        for i in range(25):
            client.post("/v1/agent/register", json={"node_id": f"spray-{i}", "join_token": "x"})
    attempts = store.join_attempts()
    assert len(attempts) <= 10
    assert attempts[-1]["node_id"] == "spray-24"  # the newest kept
    store.record_join_attempt("n-old", old, False, "wrong-token")
    assert store.prune_join_attempts(rig.now) == 1
    assert all(a["at"] > old for a in store.join_attempts())


@pytest.mark.parametrize("path", ["/v1/agent/heartbeat", "/v1/agent/jobs/next"])
def test_agent_routes_refuse_big_bodies_with_a_credential_too(rt: Runtime, path: str) -> None:
    with serve(rt) as (_, client):
        answer = client.post(path, content=b"{" + b" " * (AGENT_BODY_LIMIT + 10) + b"}",
                             headers={**bearer("bnc_x"), "Content-Type": "application/json",
                                      "Connection": "close"})
    assert answer.status_code == 413 and answer.headers["content-type"] == PROBLEM_JSON


def test_the_registration_rate_comes_from_the_settings(rt: Runtime, tmp_path) -> None:
    from orchestrator.wiring import Settings

    rt.settings = Settings(state_dir=tmp_path / "state", register_burst=2, register_per_s=0.01)
    server = ApiServer(create_app(rt), "127.0.0.1", 0)
    port = server.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
            codes = [client.post("/v1/agent/register", json={"node_id": "n1", "join_token": "x"})
                     .status_code for _ in range(3)]
    finally:
        server.stop()
    assert codes == [401, 401, 429]
