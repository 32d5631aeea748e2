"""Settings from files (``BURST_*_FILE``, ``BURST_SECRETS_DIR``), their provenance and redaction."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.settings_sources import REDACTED, SettingsSourceError, provenance, redacted
from orchestrator.wiring import Settings


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ("BURST_SECRET_KEY", "BURST_DATABASE_URL", "BURST_SETTINGS_FILE",
                 "BURST_SECRETS_DIR", "BURST_TICK_S", "BURST_POLICY_FILES", "BURST_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name + "_FILE", raising=False)


def sources(settings: Settings, overrides=None) -> dict[str, tuple[object, str]]:
    return {row.env: (row.value, row.source) for row in provenance(settings, overrides)}


def test_a_file_variable_gives_the_value_without_its_trailing_newline(tmp_path, monkeypatch):
    key = tmp_path / "key"
    key.write_text("s3cr3t\n")
    monkeypatch.setenv("BURST_SECRET_KEY_FILE", str(key))
    (tmp_path / "files").write_text(json.dumps(["/etc/burst/a.yaml", "/etc/burst/b.yaml"]))
    monkeypatch.setenv("BURST_POLICY_FILES_FILE", str(tmp_path / "files"))  # a JSON list, as in env
    settings = Settings(state_dir=tmp_path)
    assert settings.secret() == b"s3cr3t"
    assert [str(p) for p in settings.policy_files] == ["/etc/burst/a.yaml", "/etc/burst/b.yaml"]
    shown = sources(settings, {"state_dir": tmp_path})
    assert shown["BURST_SECRET_KEY"] == (REDACTED, f"file {key} (BURST_SECRET_KEY_FILE)")
    assert shown["BURST_STATE_DIR"] == (str(tmp_path), "command line")
    assert shown["BURST_TICK_S"] == (10.0, "default")


def test_a_variable_and_its_file_variable_together_are_refused(tmp_path, monkeypatch):
    (tmp_path / "key").write_text("a")
    monkeypatch.setenv("BURST_SECRET_KEY", "b")
    monkeypatch.setenv("BURST_SECRET_KEY_FILE", str(tmp_path / "key"))
    with pytest.raises(SettingsSourceError, match="BURST_SECRET_KEY and BURST_SECRET_KEY_FILE"):
        Settings()


def test_an_unreadable_file_names_the_variable_and_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("BURST_DATABASE_URL_FILE", str(tmp_path / "missing"))
    with pytest.raises(SettingsSourceError, match=r"BURST_DATABASE_URL_FILE=.*missing: cannot read"):
        Settings()


def test_the_secrets_dir_is_read_after_the_environment_and_before_the_settings_file(
        tmp_path, monkeypatch):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "BURST_SECRET_KEY").write_text("from-the-secret")
    (secrets / "BURST_DATABASE_URL").write_text("postgresql+psycopg://burst:hunter2@db/burst")
    (secrets / "BURST_TICK_S").write_text("7")
    settings_file = tmp_path / "settings.yaml"
    settings_file.write_text("tick_s: 30\napi_port: 9000\nsecret_key: from-the-yaml\n")
    monkeypatch.setenv("BURST_SECRETS_DIR", str(secrets))
    monkeypatch.setenv("BURST_SETTINGS_FILE", str(settings_file))
    monkeypatch.setenv("BURST_TICK_S", "5")
    settings = Settings()
    assert settings.tick_s == 5  # the environment wins over the secrets dir
    assert settings.secret() == b"from-the-secret"  # the secrets dir wins over the YAML file
    assert settings.api_port == 9000
    shown = sources(settings)
    assert shown["BURST_TICK_S"] == (5.0, "environment BURST_TICK_S")
    assert shown["BURST_SECRET_KEY"] == (REDACTED, f"secrets dir {secrets}")
    assert shown["BURST_DATABASE_URL"] == ("postgresql+psycopg://burst:***@db/burst",
                                           f"secrets dir {secrets}")
    assert shown["BURST_API_PORT"] == (9000, f"settings file {settings_file}")
    assert "hunter2" not in json.dumps(list(shown.values())) and "from-the" not in json.dumps(
        list(shown.values()))


def test_a_secrets_dir_that_is_not_a_directory_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("BURST_SECRETS_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(SettingsSourceError, match="BURST_SECRETS_DIR=.*nowhere: not a directory"):
        Settings()


def test_settings_file_is_a_setting_not_the_file_variable_of_one(tmp_path, monkeypatch):
    settings_file = tmp_path / "s.yaml"
    settings_file.write_text("tick_s: 3\n")
    monkeypatch.setenv("BURST_SETTINGS_FILE", str(settings_file))
    settings = Settings()
    assert settings.tick_s == 3 and settings.settings_file == settings_file


@given(user=st.from_regex(r"[a-z]{1,8}", fullmatch=True),
       # What a URL may hold (printable, no space); '@' and '/' are percent-encoded in one.
       password=st.text(st.characters(min_codepoint=33, max_codepoint=126,
                                      exclude_characters="@/"), min_size=1, max_size=20))
def test_no_url_password_survives_redaction(user, password):
    shown = redacted(f"postgresql://{user}:{password}@db.example:5432/burst")
    assert shown == f"postgresql://{user}:{REDACTED}@db.example:5432/burst"


def test_durations_and_plain_values_show_as_a_settings_file_spells_them():
    assert redacted(timedelta(days=30)) == "30d"
    assert redacted(timedelta(hours=12)) == "12h"
    assert redacted(timedelta(seconds=90)) == "90s"
    assert redacted("redis://redis:6379/0") == "redis://redis:6379/0"
