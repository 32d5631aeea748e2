"""`burst config show`: effective settings with their sources, secrets redacted, table or JSON."""

from __future__ import annotations

import json
import os

from tests.e2e.helpers import run_burst


def _env(tmp_path, **extra: str) -> dict:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BURST_")}
    return {**clean, "BURST_STATE_DIR": str(tmp_path), **extra}


def test_config_show_names_each_source_and_never_prints_a_secret(tmp_path):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "BURST_DATABASE_URL").write_text("postgresql+psycopg://burst:pg-pass@db/burst\n")
    (tmp_path / "key").write_text("the-join-key\n")
    env = _env(tmp_path, BURST_SECRETS_DIR=str(secrets), BURST_SECRET_KEY_FILE=str(tmp_path / "key"),
               BURST_LOG_FORMAT="json")
    result = run_burst("config", "show", "--json", env=env, check=True)
    assert "pg-pass" not in result.stdout and "the-join-key" not in result.stdout
    rows = {row["env"]: row for row in json.loads(result.stdout)}
    assert rows["BURST_DATABASE_URL"]["value"] == "postgresql+psycopg://burst:***@db/burst"
    assert rows["BURST_DATABASE_URL"]["source"] == f"secrets dir {secrets}"
    assert rows["BURST_SECRET_KEY"] == {
        "setting": "secret_key", "env": "BURST_SECRET_KEY", "value": "***", "secret": True,
        "source": f"file {tmp_path / 'key'} (BURST_SECRET_KEY_FILE)"}
    assert rows["BURST_LOG_FORMAT"]["source"] == "environment BURST_LOG_FORMAT"
    assert rows["BURST_TICK_S"]["source"] == "default"
    table = run_burst("config", "show", env=env, check=True).stdout
    assert "BURST_SECRET_KEY" in table and "pg-pass" not in table and "the-join-key" not in table


def test_config_show_reports_a_bad_source_in_one_line(tmp_path):
    result = run_burst("config", "show", env=_env(tmp_path, BURST_SECRET_KEY="a",
                                                  BURST_SECRET_KEY_FILE=str(tmp_path / "k")))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "BURST_SECRET_KEY and BURST_SECRET_KEY_FILE are both set" in result.stderr
