"""GET /v1/agent/wheels/NAME: the controller serves the wheels of BURST_NODE_WHEEL_DIR, no token."""

from __future__ import annotations

from dataclasses import replace

from orchestrator.wiring import Runtime, Settings
from tests.integration.api_support import served


def test_the_wheel_dir_is_served_and_nothing_else(rt: Runtime, tmp_path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = wheels / "burst-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK\x03\x04 a zip")
    (tmp_path / "secret.whl").write_bytes(b"outside the directory")
    (wheels / "notes.txt").write_text("not a wheel")
    with_wheels = replace(rt, settings=Settings(state_dir=tmp_path / "state", node_wheel_dir=wheels))
    with served(with_wheels) as client:
        got = client.get(f"/v1/agent/wheels/{wheel.name}")
        assert got.status_code == 200 and got.content == wheel.read_bytes()
        assert got.headers["content-type"] == "application/zip"
        for name in ("missing-1.0-py3-none-any.whl", "..%2Fsecret.whl", ".hidden.whl"):
            assert client.get(f"/v1/agent/wheels/{name}").status_code == 404, name
        refused = client.get("/v1/agent/wheels/notes.txt")  # not a wheel's name at all
        assert refused.status_code == 422 and refused.headers["content-type"].startswith(
            "application/problem+json")
    with served(rt) as client:  # no BURST_NODE_WHEEL_DIR: nothing is served
        problem = client.get(f"/v1/agent/wheels/{wheel.name}")
        assert problem.status_code == 404 and "BURST_NODE_WHEEL_DIR" in problem.json()["detail"]
