"""Where service settings come from, in order, and which one gave each value.

:class:`~orchestrator.wiring.Settings` reads, the first that has a value winning:

1. the command line's overrides (``burst api --port``);
2. ``BURST_<NAME>`` environment variables;
3. ``BURST_<NAME>_FILE`` variables: the named file's content is the value (trailing newline
   dropped), the way Docker and Kubernetes hand out secrets; setting both ``BURST_X`` and
   ``BURST_X_FILE`` is an error, not a silent choice;
4. a secrets directory, ``BURST_SECRETS_DIR``: one file per setting, named like its variable
   (``BURST_SECRET_KEY``, case-insensitive), as a Kubernetes Secret mounted as a volume is;
5. the YAML file ``BURST_SETTINGS_FILE``;
6. the field's default.

:func:`provenance` answers, per setting, which of these gave the effective value (``burst config
show``), and :func:`redacted` is how a value may be shown: secrets as ``***``, passwords in URLs
masked. Imports pydantic-settings and the standard library only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
    YamlConfigSettingsSource,
)

PREFIX = "BURST_"
FILE_SUFFIX = "_FILE"
SETTINGS_FILE_VAR = "BURST_SETTINGS_FILE"
SECRETS_DIR_VAR = "BURST_SECRETS_DIR"
REDACTED = "***"

# user:password@ in a URL (SQLAlchemy, Redis): the password is masked wherever a URL is shown.
_URL_PASSWORD = re.compile(r"(?P<head>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)(?P<password>[^@\s]+)@")


class SettingsSourceError(ValueError):
    """A settings source that cannot be read (names the variable and the file)."""


def env_name(field: str) -> str:
    return f"{PREFIX}{field.upper()}"


def file_variable(settings_cls: type[BaseSettings], field: str) -> str | None:
    """``BURST_<FIELD>_FILE``, unless that name is itself a setting (``BURST_SETTINGS_FILE``)."""
    if f"{field}_file" in settings_cls.model_fields:
        return None
    return env_name(field) + FILE_SUFFIX


class FileVariablesSource(PydanticBaseSettingsSource):
    """``BURST_<NAME>_FILE=/run/secrets/x``: the setting's value is the content of that file."""

    def __init__(self, settings_cls: type[BaseSettings],
                 environ: Mapping[str, str] | None = None) -> None:
        super().__init__(settings_cls)
        self.environ = os.environ if environ is None else environ
        self.paths: dict[str, Path] = {}  # field -> the file its value came from

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        variable = file_variable(self.settings_cls, field_name)
        path = self.environ.get(variable) if variable else None
        if not path:
            return None, field_name, False
        if self.environ.get(env_name(field_name)) is not None:
            raise SettingsSourceError(
                f"{env_name(field_name)} and {variable} are both set: set one of them")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SettingsSourceError(f"{variable}={path}: cannot read the file: {exc}") from None
        self.paths[field_name] = Path(path)
        # One trailing newline is how files end, not part of the secret.
        return text.removesuffix("\n").removesuffix("\r"), field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            value, key, complex_ = self.get_field_value(field, name)
            if value is not None:
                values[key] = self.prepare_field_value(name, field, value, complex_)
        return values


def secrets_dir_source(settings_cls: type[BaseSettings],
                       environ: Mapping[str, str] | None = None) -> SecretsSettingsSource | None:
    """The secrets directory ``BURST_SECRETS_DIR`` names (None when unset); it must exist."""
    environ = os.environ if environ is None else environ
    path = environ.get(SECRETS_DIR_VAR)
    if not path:
        return None
    if not Path(path).is_dir():
        raise SettingsSourceError(f"{SECRETS_DIR_VAR}={path}: not a directory")
    return SecretsSettingsSource(settings_cls, secrets_dir=path)


def yaml_source(settings_cls: type[BaseSettings],
                environ: Mapping[str, str] | None = None) -> YamlConfigSettingsSource | None:
    environ = os.environ if environ is None else environ
    path = environ.get(SETTINGS_FILE_VAR)
    return YamlConfigSettingsSource(settings_cls, yaml_file=path) if path else None


def file_sources(settings_cls: type[BaseSettings]) -> list[PydanticBaseSettingsSource]:
    """The sources after the environment, in order (``*_FILE``, secrets dir, settings file)."""
    optional = (secrets_dir_source(settings_cls), yaml_source(settings_cls))
    return [FileVariablesSource(settings_cls), *(s for s in optional if s is not None)]


@dataclass(frozen=True)
class SettingOrigin:
    """One effective setting: its variable, the value as it may be shown, and where it came from."""

    name: str
    env: str
    value: Any
    source: str
    secret: bool


def provenance(settings: BaseSettings, overrides: Mapping[str, Any] | None = None,
               environ: Mapping[str, str] | None = None) -> list[SettingOrigin]:
    """Each setting of ``settings`` with the source that gave it (values redacted)."""
    cls = type(settings)
    environ = os.environ if environ is None else environ
    files = FileVariablesSource(cls, environ)
    secrets = secrets_dir_source(cls, environ)
    yaml = yaml_source(cls, environ)
    found: list[tuple[dict[str, Any], Any]] = [
        ((dict(overrides or {})), lambda name: "command line"),
        (EnvSettingsSource(cls)(), lambda name: f"environment {env_name(name)}"),
        (files(), lambda name: f"file {files.paths[name]} ({file_variable(cls, name)})"),
    ]
    if secrets is not None:
        found.append((secrets(), lambda name: f"secrets dir {environ[SECRETS_DIR_VAR]}"))
    if yaml is not None:
        found.append((yaml(), lambda name: f"settings file {environ[SETTINGS_FILE_VAR]}"))
    rows = []
    for name, field in cls.model_fields.items():
        source = next((label(name) for values, label in found if name in values), "default")
        value = getattr(settings, name)
        rows.append(SettingOrigin(name, env_name(name), redacted(value), source,
                                  secret=isinstance(value, SecretStr)
                                  or field.annotation is SecretStr))
    return rows


def duration_text(value: timedelta) -> str:
    """A duration as a settings file would spell it: 30d, 12h, 90m or 45s."""
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{value.total_seconds():g}s"


def redacted(value: Any) -> Any:
    """``value`` as it may be printed: a secret as ``***``, URL passwords masked, JSON-ready."""
    if isinstance(value, SecretStr):
        return REDACTED
    if isinstance(value, str):
        return _URL_PASSWORD.sub(lambda m: f"{m['head']}{REDACTED}@", value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple):
        return [redacted(v) for v in value]
    if isinstance(value, timedelta):
        return duration_text(value)
    if hasattr(value, "value") and isinstance(getattr(value, "value"), str):  # an Enum
        return value.value
    return value
