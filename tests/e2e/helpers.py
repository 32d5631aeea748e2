"""Helpers for end-to-end tests: run the `burst` CLI as a user would, find node processes."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import psutil

from tests.processes import READY_S, wait_for  # noqa: F401 - the shared wait, re-exported

# Prefer the console script of the interpreter running the tests (a venv need not be activated).
_BESIDE = Path(sys.executable).with_name("burst")
BURST = str(_BESIDE) if _BESIDE.exists() else shutil.which("burst")
FAST_POLICY = Path(__file__).with_name("fast-policy.yaml")


def burst_cmd(*args: str) -> list[str]:
    """The `burst` console script if installed, else the same entry point through Python."""
    if BURST:
        return [BURST, *args]
    return [sys.executable, "-c", "from orchestrator.cli import main; main()", *args]


def run_burst(*args: str, env: dict | None = None, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    result = subprocess.run(burst_cmd(*args), capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, **(env or {})})
    if check and result.returncode != 0:
        raise AssertionError(f"burst {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


def burst_json(*args: str, env: dict | None = None):
    return json.loads(run_burst(*args, "--json", env=env, check=True).stdout)


def run_burst_here(*args: str, env: dict | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """`burst ARGS` in this process (typer's CliRunner), for stateless commands such as `plan`
    whose test is about the output, not the process: it saves an interpreter start and the CLI's
    imports (about 1-3 s a call on the 2-core machine). The tests that are about the process
    (exit on signals, start-up imports, settings errors, node processes) keep `run_burst`. ``env``
    is set in os.environ for the call only (the settings are read per command, not cached)."""
    from typer.testing import CliRunner

    from orchestrator.cli import app, common

    # A command may set up the root logger on the runner's stderr (orchestrator.logs): restore it
    # after, so later tests in this process do not log to a closed stream.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    # The consoles are built on first use and keep the width they saw then (COLUMNS, or piped):
    # build them afresh for each call, as each `burst` process does.
    _fresh_consoles(common)
    try:
        result = CliRunner().invoke(app, list(args), prog_name="burst", env=env)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        _fresh_consoles(common)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback the real CLI would have printed: fail the test on it
    done = subprocess.CompletedProcess(["burst", *args], result.exit_code, result.stdout,
                                       result.stderr)
    if check and done.returncode != 0:
        raise AssertionError(f"burst {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


def _fresh_consoles(common) -> None:
    for console in (common.out, common.err):
        console._console = None


def burst_json_here(*args: str, env: dict | None = None):
    return json.loads(run_burst_here(*args, "--json", env=env, check=True).stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_processes(marker: str) -> list[psutil.Process]:
    """Live processes whose command line mentions ``marker`` (a test's own state directory)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            if marker in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def kill_all(marker: str) -> None:
    for proc in node_processes(marker):
        try:
            os.killpg(os.getpgid(proc.pid), 9)
        except (ProcessLookupError, PermissionError):
            pass


__all__ = ["BURST", "FAST_POLICY", "READY_S", "burst_cmd", "burst_json", "burst_json_here",
           "free_port", "kill_all", "node_processes", "run_burst", "run_burst_here", "wait_for"]
