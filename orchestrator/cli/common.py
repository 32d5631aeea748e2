"""Shared CLI plumbing: consoles, settings and policy loading with clean errors, JSON output.

Two rules every command keeps, both enforced here:

* **Nothing is imported before it is needed.** ``burst --help`` (and every command's ``--help``)
  must cost about what importing typer and rich costs (docs/performance.md,
  bench/bench_cli_startup.py), so this module, and the top of every ``*_cmd`` module, import only
  the standard library and typer; pydantic, the policy model, the store, the API and rich's
  consoles are imported inside the functions that use them.
* **Data is never markup.** The consoles are built with ``markup=False``: a policy, budget, job or
  decision named ``vision[day]`` or ``[bold]`` prints verbatim, in tables and titles too. Styling
  is applied with ``style=`` or :class:`rich.text.Text` spans, never by writing tags into a
  string that also holds data.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.policy import Policy
    from orchestrator.wiring import Settings

# Piped or redirected, rich would lay tables out for 80 columns and cut numbers short ("$606,4…");
# a file or a pager gets the full rows instead (COLUMNS, when set, still wins).
_PIPED_WIDTH = 200


class _LazyConsole:
    """A rich Console built on first use (importing rich.console costs start-up time)."""

    def __init__(self, factory: Callable[[], Console]) -> None:
        self._factory = factory
        self._console: Console | None = None

    def get(self) -> Console:
        """The Console itself, for rich objects that take one (Live, Progress)."""
        if self._console is None:
            self._console = self._factory()
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)


def _stdout_console() -> Console:
    from rich.console import Console

    piped = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
    # soft_wrap off (tables need a width), but a plain line is never folded mid-sentence: see
    # `line` below, which prints with soft_wrap=True.
    return Console(highlight=False, markup=False, width=_PIPED_WIDTH if piped else None)


def _stderr_console() -> Console:
    from rich.console import Console

    # soft_wrap: a log or event line stays one line however narrow the terminal or pipe.
    return Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


out: Any = _LazyConsole(_stdout_console)
err: Any = _LazyConsole(_stderr_console)


# The shipped default policy: orchestrator.policy.DEFAULT_POLICY_PATH, spelled out here so that
# naming it does not import the policy model (a unit test checks the two agree).
DEFAULT_POLICY = Path(__file__).resolve().parent.parent / "policy" / "default.yaml"


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: MESSAGE`` (the message verbatim, whatever brackets it holds) and exit."""
    from rich.text import Text

    line = Text("error:", style="red")
    line.append(f" {message}")
    err.print(line)
    raise typer.Exit(code)


def load_settings(**overrides: Any) -> Settings:
    """Settings from BURST_* variables / BURST_SETTINGS_FILE, with CLI overrides on top."""
    from pydantic import ValidationError

    from orchestrator.settings_sources import SettingsSourceError
    from orchestrator.wiring import Settings

    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"BURST_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}" for e in exc.errors()
        )
        fail(f"bad settings: {problems}")
    except SettingsSourceError as exc:
        fail(f"bad settings: {exc}")
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


# The help text of every --policy/-p option that takes policy files (one wording everywhere).
POLICY_HELP = ("Policy file (repeatable); default: the files in BURST_POLICY_FILES, else those "
               "the state directory's running `burst run` uses, else the shipped default policy.")


def policy_files(paths: list[Path] | None, settings: Settings | None = None) -> list[Path]:
    """The policy files a command works on: the one resolver every command uses.

    ``-p FILE`` (repeatable) when given; else the settings' ``policy_files`` (``BURST_POLICY_FILES``,
    a JSON list, or ``policy_files`` in ``BURST_SETTINGS_FILE``), which is what the control plane
    runs; else the files the state directory's `burst run` loop runs
    (:mod:`orchestrator.cli.running`); else the shipped default policy.
    """
    from orchestrator.cli import running

    if paths:
        return list(paths)
    settings = settings or load_settings()
    if settings.policy_files:
        return list(settings.policy_files)
    loop = running.read(settings.state_dir)
    if loop is not None and loop.policy_files and all(p.exists() for p in loop.policy_files):
        return list(loop.policy_files)
    return [DEFAULT_POLICY]


def load_policies(paths: list[Path] | None, settings: Settings | None = None,
                  notes: list[str] | None = None) -> list[Policy]:
    """Load the policies :func:`policy_files` names, expand their accelerators and check them
    against the provider catalogues; exit 2 listing every problem. ``notes`` collects the
    catalogue's warnings and what it filled in or expanded (shown by `plan`)."""
    from orchestrator.policy import PolicyError, load_policy

    files = policy_files(paths, settings)
    policies: list[Policy] = []
    problems: list[str] = []
    for path in files:
        try:
            policies.append(load_policy(path))
        except PolicyError as exc:
            problems.extend(str(p) for p in exc.problems)
    if problems:
        for line in problems:
            err.print(line)
        raise typer.Exit(2)
    names = [p.name for p in policies]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        fail(f"several policies are named {', '.join(duplicates)}; policy names must be unique")
    from orchestrator.catalogue_check import resolve_with_catalogue

    try:
        policies, found = resolve_with_catalogue(
            policies, files, settings.state_dir if settings is not None else None)
    except PolicyError as exc:
        for problem in exc.problems:
            err.print(str(problem))
        raise typer.Exit(2) from None
    if notes is not None:
        notes.extend(str(p) for p in found)
    return policies


def line(text: Any = "", *, style: str | None = None, stderr: bool = False) -> None:
    """Print one line (a str is verbatim; a Text keeps its spans), never folded mid-sentence."""
    (err if stderr else out).print(text, style=style, soft_wrap=True)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, sort_keys=False, default=str) + "\n")


def setup_logging(level: str, fmt: Any = "text") -> None:
    """The process's log lines at ``level``, as text or JSON (``BURST_LOG_FORMAT``)."""
    # Plain logging (no rich handler): a log message is data and is written as it is.
    from orchestrator.logs import setup_logging as configure

    configure(level, fmt)


def age(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
