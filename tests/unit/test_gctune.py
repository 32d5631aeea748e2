"""The collector's thresholds of burst's processes (orchestrator.gctune): every ``burst``
command sets them at its start, and a Celery worker of the control plane when it starts. Each in
a fresh interpreter (the test process keeps CPython's defaults)."""

from __future__ import annotations

import subprocess
import sys

from orchestrator.gctune import THRESHOLDS


def _thresholds_after(code: str) -> tuple[int, ...]:
    script = ("import gc, sys\n" + code
              + "\nprint(tuple(gc.get_threshold()))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, check=True)
    return tuple(int(x) for x in out.stdout.strip().splitlines()[-1].strip("()").split(","))


def test_a_burst_command_sets_the_thresholds() -> None:
    assert THRESHOLDS != (700, 10, 10)  # CPython's defaults
    code = ("from orchestrator.cli import main\n"
            "sys.argv = ['burst', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass")
    assert _thresholds_after(code) == THRESHOLDS


def test_a_celery_worker_sets_them_when_it_starts() -> None:
    code = ("from celery.signals import worker_init\n"
            "import orchestrator.automation.app as app\n"
            "before = tuple(gc.get_threshold())\n"
            "assert before == (700, 10, 10), before\n"
            "worker_init.send(sender=None)")
    assert _thresholds_after(code) == THRESHOLDS
