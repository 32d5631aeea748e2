"""Starting, waiting for and stopping processes in tests: the one place these helpers live.

Waits are bounded by readiness, never by a fixed sleep: a test polls for the condition it needs
(an HTTP answer, a log line, a ping reply) and goes on the moment it holds. The limits are
generous on purpose (``READY_S``): on a busy 2-core machine a fresh `burst` process can take tens
of seconds to import and bind, and a limit is only there so that a broken process fails the test
instead of hanging it. A passing test never waits for a limit; only a failing one does.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# How long a process may take to become ready (answer, log "ready", register...) before the test
# fails; also how long it may take to stop after SIGTERM.
READY_S = 120.0


def wait_for(predicate: Callable[[], T], timeout: float = READY_S, interval: float = 0.1,
             what: str = "condition") -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns something truthy (returned),
    or fail after ``timeout`` seconds naming ``what`` and the last value seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {last!r}")
        time.sleep(interval)


def start(argv: Sequence[str], env: Mapping[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """Start ``argv`` with stdout and stderr captured together as text (read them with :func:`stop`)."""
    return subprocess.Popen(list(argv), env=dict(env) if env is not None else None,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


def stop(proc: subprocess.Popen, timeout: float = READY_S) -> tuple[int, str]:
    """SIGTERM (if still running), then the exit status and everything the process printed; fails
    the test if it has not exited ``timeout`` seconds after the signal."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        output, _ = proc.communicate()
        raise AssertionError(f"did not stop within {timeout}s of SIGTERM:\n{output}") from None
    return proc.returncode, output or ""


def alive_or_fail(proc: subprocess.Popen, name: str) -> bool:
    """True while ``proc`` runs; fails the test with its output once it has exited (a wait on a
    dead process would otherwise run to its limit)."""
    if proc.poll() is None:
        return True
    output = proc.stdout.read() if proc.stdout is not None else ""
    raise AssertionError(f"{name} exited {proc.returncode}:\n{output}")
