"""`burst worker`, `burst beat` and `burst api` as the production units run them.

The API is served from a SQLite file `burst db upgrade` prepared and stops cleanly on SIGTERM; a
real Celery worker (solo pool) against the Redis server on 127.0.0.1 (database 13, flushed
afterwards) answers a ping and stops on SIGTERM; beat puts ticks on the control queue; bad settings are one line naming the setting.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest
import redis

from tests.e2e.helpers import FAST_POLICY, burst_cmd, free_port, run_burst, run_burst_here
from tests.processes import READY_S, alive_or_fail, start, stop, wait_for

REDIS_URL = "redis://127.0.0.1:6379/13"


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A complete settings environment: own state dir, SQLite file, Redis db 13, the fast policy."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BURST_")}
    return {**clean,
            "BURST_STATE_DIR": str(tmp_path / "state"),
            "BURST_DATABASE_URL": f"sqlite:///{tmp_path / 'burst.db'}",
            "BURST_POLICY_FILES": f'["{FAST_POLICY}"]',
            "BURST_BROKER_URL": REDIS_URL, "BURST_RESULT_BACKEND": REDIS_URL,
            "BURST_REDIS_URL": REDIS_URL, "BURST_SECRET_KEY": "e2e-" + "0" * 60}


@pytest.fixture
def redis13():
    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3)
    client.ping()
    try:
        yield client
    finally:
        client.flushdb()
        client.close()


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return start(burst_cmd(*args), env)


@pytest.mark.parametrize("command", ["worker", "beat", "api"])
def test_help_exits_0(command: str):
    # In-process: the help text and exit code (what `burst CMD --help` imports at start-up is
    # tests/e2e/test_cli_consistency.py's check, in a real process).
    result = run_burst_here(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout


def test_api_serves_health_and_stops_cleanly_on_sigterm(env):
    run_burst("db", "upgrade", env=env, check=True, timeout=60)
    port = free_port()
    proc = _start(["api", "--port", str(port)], env)
    try:
        def healthy():
            alive_or_fail(proc, "burst api")
            try:
                return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).json()
            except httpx.HTTPError:
                return None

        assert wait_for(healthy, READY_S, what="/healthz") == {"status": "ok"}
    finally:
        code, output = stop(proc)
    assert code == 0, output
    assert "stopped (SIGTERM)" in output
    assert "Traceback" not in output


def test_worker_answers_a_ping_and_stops_on_sigterm(env, redis13):
    from celery import Celery

    name = f"e2e-{uuid.uuid4().hex[:8]}@%h"
    proc = _start(["worker", "--pool", "solo", "--queues", "burst.control", "--hostname", name,
                   "--loglevel", "warning"], env)
    client = Celery("e2e-ping", broker=REDIS_URL, backend=REDIS_URL)
    try:
        def pong():
            alive_or_fail(proc, "burst worker")
            replies = client.control.ping(timeout=0.5)
            return [r for r in replies if next(iter(r)).startswith(name.split("@")[0])]

        [reply] = wait_for(pong, READY_S, interval=0.2, what="a ping reply")
        assert next(iter(reply.values())) == {"ok": "pong"}
    finally:
        client.close()
        code, output = stop(proc)  # fails the test if SIGTERM does not stop it (READY_S)
    assert code == 0, output
    assert "Traceback" not in output


def test_beat_sends_ticks_to_the_control_queue_and_stops_on_sigterm(env, redis13, tmp_path):
    schedule = tmp_path / "beat" / "schedule"
    proc = _start(["beat", "--schedule", str(schedule)], {**env, "BURST_TICK_S": "1"})
    try:
        # A tick of the fast policy waits in the control queue (no worker consumes it here).
        wait_for(lambda: alive_or_fail(proc, "burst beat") and redis13.llen("burst.control") > 0,
                 READY_S, interval=0.2, what="a tick in burst.control")
    finally:
        code, output = stop(proc)
    assert code == 0, output
    assert schedule.parent.is_dir() and "Traceback" not in output


@pytest.mark.parametrize("command", ["worker", "beat", "api"])
def test_bad_settings_exit_2_naming_the_setting(env, command: str):
    result = run_burst(command, env={**env, "BURST_TICK_S": "-1"}, timeout=30)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "BURST_TICK_S" in result.stderr
    assert "Traceback" not in result.stderr


def test_worker_rejects_an_unknown_queue(env):
    result = run_burst("worker", "--queues", "burst.contrl", env=env, timeout=30)
    assert result.returncode == 2
    assert "burst.contrl" in result.stderr and "Traceback" not in result.stderr


def test_worker_events_reach_a_monitor_and_its_logs_are_json(env, redis13):
    """`burst worker --events` with BURST_LOG_FORMAT=json: a monitor (what Flower runs) receives
    the task's events, and every log line the worker writes is one JSON object."""
    import json
    import threading

    from celery import Celery

    name = f"e2e-{uuid.uuid4().hex[:8]}@%h"
    proc = _start(["worker", "--pool", "solo", "--queues", "burst.control", "--hostname", name,
                   "--events"], {**env, "BURST_LOG_FORMAT": "json"})
    client = Celery("e2e-events", broker=REDIS_URL, backend=REDIS_URL)
    seen: list[str] = []
    try:
        wait_for(lambda: alive_or_fail(proc, "burst worker") and client.control.ping(timeout=0.5),
                 READY_S, interval=0.2, what="the worker up")
        with client.connection_for_read() as conn:
            receiver = client.events.Receiver(conn, handlers={"*": lambda e: seen.append(e["type"])})
            listening = threading.Thread(target=lambda: receiver.capture(limit=None, timeout=20),
                                         daemon=True)
            listening.start()
            # Listening once the worker's heartbeat (sent every 2 s) arrives; then a built-in task
            # on the worker's queue: the worker runs it and, with --events, says so.
            wait_for(lambda: bool(seen), READY_S, interval=0.2, what="a worker event")
            client.send_task("celery.backend_cleanup", queue="burst.control")
            wait_for(lambda: "task-succeeded" in seen, READY_S, interval=0.2, what="task events")
            receiver.should_stop = True
    finally:
        client.close()
        code, output = stop(proc)
    assert code == 0, output
    assert "task-received" in seen and "task-succeeded" in seen
    logged = [line for line in output.splitlines() if line.startswith("{")]
    records = [json.loads(line) for line in logged]  # every one parses
    assert any(r["logger"] == "celery.apps.worker" and "ready" in r["message"] for r in records)
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
