"""Shared CLI plumbing: consoles, settings and policy loading with clean errors, JSON output."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from pydantic import ValidationError
from rich.console import Console

from orchestrator.policy import Policy, PolicyError, load_policy

if TYPE_CHECKING:
    from orchestrator.wiring import Settings

# Piped or redirected, rich would lay tables out for 80 columns and cut numbers short ("$606,4…");
# a file or a pager gets the full rows instead (COLUMNS, when set, still wins).
_PIPED_WIDTH = 200
out = Console(highlight=False, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS")
              else _PIPED_WIDTH)
err = Console(stderr=True, highlight=False, soft_wrap=True)

from orchestrator.policy import DEFAULT_POLICY_PATH as DEFAULT_POLICY  # noqa: E402


def fail(message: str, code: int = 2) -> NoReturn:
    err.print(f"[red]error:[/red] {message}", markup=True)
    raise typer.Exit(code)


def load_settings(**overrides: Any) -> Settings:
    """Settings from BURST_* variables / BURST_SETTINGS_FILE, with CLI overrides on top."""
    from orchestrator.wiring import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"BURST_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()
        )
        fail(f"bad settings: {problems}")
    except (OSError, ValueError) as exc:
        fail(f"bad settings file: {exc}")


def open_store(settings: Settings):
    """The store the settings name, ready for a command that reads or writes records.

    The embedded default (a SQLite file in the state directory) is created and migrated on first
    use. A database named by ``BURST_DATABASE_URL`` is never migrated behind the operator's back
    (controllers may be running on the old schema): it must be at this build's migration, or the
    command stops and says to run ``burst db upgrade``.
    """
    from orchestrator.store import Store
    from orchestrator.store.migrate import head_revision

    try:
        store = Store(settings.store_url)
        if settings.database_url is None:
            store.upgrade()
            return store
        revision = store.schema_revision()
    except Exception as exc:  # noqa: BLE001 - any connection/driver error, reported plainly
        fail(f"cannot open the state store {settings.store_url.split('@')[-1]}: "
             f"{type(exc).__name__}: {exc}")
    head = head_revision()
    if revision != head:
        store.close()
        fail(f"the store is at migration {revision or 'none'}, this build needs {head}: "
             "run `burst db upgrade` first")
    return store


def load_policies(paths: list[Path] | None, notes: list[str] | None = None) -> list[Policy]:
    """Load policy files (the shipped default when none is given), expand their accelerators and
    check them against the provider catalogues; exit 2 listing every problem. ``notes`` collects
    the catalogue's warnings and what it filled in or expanded (shown by `plan`)."""
    paths = paths or [DEFAULT_POLICY]
    policies: list[Policy] = []
    problems: list[str] = []
    for path in paths:
        try:
            policies.append(load_policy(path))
        except PolicyError as exc:
            problems.extend(str(p) for p in exc.problems)
    if problems:
        for line in problems:
            err.print(line, markup=False)
        raise typer.Exit(2)
    names = [p.name for p in policies]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        fail(f"several policies are named {', '.join(duplicates)}; policy names must be unique")
    from orchestrator.catalogue_check import resolve_with_catalogue

    try:
        policies, found = resolve_with_catalogue(policies, list(paths))
    except PolicyError as exc:
        for problem in exc.problems:
            err.print(str(problem), markup=False)
        raise typer.Exit(2) from None
    if notes is not None:
        notes.extend(str(p) for p in found)
    return policies


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def age(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
