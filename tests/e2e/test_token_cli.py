"""`burst token create / list / revoke` as a user runs them, against the API they govern: the
token is printed once, never listed, works at once, and is refused (401) once revoked. The
controller is wired from the same settings the CLI reads (the ``store`` fixture's database:
SQLite and PostgreSQL), with the system clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli import app
from orchestrator.policy import DEFAULT_POLICY_PATH, load_policy
from orchestrator.store import Store
from orchestrator.wiring import Runtime, Settings, build_runtime
from tests.integration.api_support import bearer, served


def run(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.fixture
def rt(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Runtime]:
    url = store.engine.url.render_as_string(hide_password=False)
    monkeypatch.setenv("BURST_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("BURST_DATABASE_URL", url)
    runtime = build_runtime(Settings(state_dir=tmp_path / "state", database_url=url),
                            [load_policy(DEFAULT_POLICY_PATH)], providers={}, upgrade=False)
    yield runtime
    runtime.close()


def test_a_token_is_shown_once_listed_without_its_secret_and_revocable(rt: Runtime) -> None:
    created = run("token", "create", "--role", "viewer", "--project", "research",
                  "--project", "vision", "--expires", "30d", "--description", "grafana")
    assert created.exit_code == 0, created.output
    secret = created.stdout.strip()
    assert secret.startswith("bat_") and "\n" not in secret  # stdout is the token alone
    assert "not shown again" in created.stderr and secret not in created.stderr
    as_json = json.loads(run("token", "create", "--role", "admin", "--json").stdout)
    assert as_json["role"] == "admin" and as_json["token"].startswith("bat_")

    listed = run("token", "list")
    assert listed.exit_code == 0 and "viewer" in listed.stdout and "grafana" in listed.stdout
    listed_json = run("token", "list", "--json").stdout
    for token in (secret, as_json["token"]):
        assert token not in listed.stdout and token not in listed_json
        assert token[4:20] not in listed_json  # not even a prefix of the secret part
    [viewer] = [t for t in json.loads(listed_json) if t["role"] == "viewer"]
    assert viewer["projects"] == ["research", "vision"] and viewer["status"] == "ok"
    assert viewer["expires_at"] is not None

    with served(rt) as client:
        assert client.get("/v1/nodes", headers=bearer(secret)).status_code == 200
        assert client.get("/v1/decisions", headers=bearer(secret)).status_code == 403
        revoked = run("token", "revoke", viewer["id"])
        assert revoked.exit_code == 0 and f"token {viewer['id']} revoked" in revoked.stdout
        refused = client.get("/v1/nodes", headers=bearer(secret))
        assert refused.status_code == 401 and "revoked" in refused.json()["detail"]
        assert client.get("/v1/nodes", headers=bearer(as_json["token"])).status_code == 200

    assert "already" in run("token", "revoke", viewer["id"]).stdout
    assert [t["id"] for t in json.loads(run("token", "list", "--json").stdout)] == [as_json["id"]]
    with_revoked = json.loads(run("token", "list", "--all", "--json").stdout)
    assert {t["id"]: t["status"] for t in with_revoked}[viewer["id"]] == "revoked"


@pytest.mark.parametrize(("args", "text"), [
    (("--role", "owner", "--project", "x"), "--role:"),
    (("--role", "viewer"), "--project:"),
    (("--role", "admin", "--project", "x"), "--project:"),
    (("--role", "viewer", "--project", "x", "--expires", "soon"), "--expires:"),
    (("--role", "viewer", "--project", "x", "--expires", "0s"), "--expires:"),
    (("--role", "viewer", "--project", "x", "--expires", "99999999d"), "--expires:"),
])
def test_bad_token_options_name_the_option(rt: Runtime, args: tuple[str, ...], text: str) -> None:
    result = run("token", "create", *args)
    assert result.exit_code == 2, result.output
    assert text in result.output and "Traceback" not in result.output
    assert "bat_" not in result.output
    assert rt.store.api_tokens(include_revoked=True) == []


def test_revoking_an_unknown_token_fails_clearly(rt: Runtime) -> None:
    result = run("token", "revoke", "tok-nope")
    assert result.exit_code == 2 and "no token 'tok-nope'" in result.output
