"""`burst worker`, `burst beat` and `burst api`: the processes of the production control plane.

Each runs in the foreground until SIGTERM/SIGINT, as a container's command or a systemd unit's
``ExecStart``. ``burst worker`` and ``burst beat`` run the Celery app of
:mod:`orchestrator.automation.app` (the same app ``celery -A orchestrator.automation.app`` finds);
``burst api`` serves the controller API with uvicorn over a runtime wired by
:func:`orchestrator.automation.runtime.runtime`. None of them runs migrations: ``burst db upgrade``
does that once, before they start.

Settings and policy files are checked before anything is imported that reads them (importing the
Celery app builds :class:`~orchestrator.wiring.Settings` from the environment), so a bad setting
is one line naming it and exit status 2, never a traceback.
"""

from __future__ import annotations

import logging
import signal
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import err, fail, load_policies, load_settings, setup_logging

if TYPE_CHECKING:
    from types import ModuleType

    from orchestrator.wiring import Settings

DEFAULT_QUEUES = "burst.control,burst.provider"


class Pool(str, Enum):
    """Celery execution pools burst supports."""

    prefork = "prefork"
    threads = "threads"
    solo = "solo"


def _check_settings_and_policies() -> Settings:
    """Settings from the environment and the policies they name, with clean errors (exit 2)."""
    settings = load_settings()
    load_policies(None, settings)
    return settings


def _warn_embedded_defaults(settings: Settings) -> None:
    """Warn where a production process would fall back to a per-process embedded default."""
    if settings.database_url is None:
        err.print(f"warning: BURST_DATABASE_URL is not set: using the embedded SQLite file in "
                  f"{settings.state_dir}; every process of the control plane must share one "
                  "database (PostgreSQL in production)")
    if settings.secret_key is None:
        err.print(f"warning: BURST_SECRET_KEY is not set: using the key file in {settings.state_dir}; "
                  "workers and the API must share one key, or agents cannot join")


def _celery_app() -> ModuleType:
    """The module of the Celery app (importing it builds Settings: check them first)."""
    from orchestrator.automation import app as app_module

    return app_module


def worker_command(
    queues: Annotated[str, typer.Option("--queues", "-Q", help="Comma-separated queues to consume: burst.control (planning, fast) and/or burst.provider (cloud calls, slow).")] = DEFAULT_QUEUES,
    concurrency: Annotated[int | None, typer.Option("--concurrency", "-c", min=1, help="Worker processes/threads (default: number of CPUs).")] = None,
    pool: Annotated[Pool, typer.Option("--pool", "-P", help="Execution pool.", case_sensitive=False)] = Pool.prefork,
    loglevel: Annotated[str | None, typer.Option("--loglevel", "-l", help="Log level (default BURST_LOG_LEVEL).")] = None,
    hostname: Annotated[str | None, typer.Option("--hostname", "-n", help="Worker node name, e.g. control@%h (default celery@%h).")] = None,
    events: Annotated[bool, typer.Option("--events", "-E", help="Send Celery task events (started, succeeded, failed, retried), for Flower or `celery events` to monitor.")] = False,
) -> None:
    """Run a Celery worker of the control plane (ticks, reconcile, provider calls) until SIGTERM."""
    settings = _check_settings_and_policies()
    _warn_embedded_defaults(settings)
    wanted = [q.strip() for q in queues.split(",") if q.strip()]
    module = _celery_app()
    known = {module.CONTROL_QUEUE, module.PROVIDER_QUEUE}
    unknown = [q for q in wanted if q not in known]
    if not wanted or unknown:
        fail(f"--queues: unknown queue(s) {', '.join(unknown) or '(none given)'}; "
             f"burst uses {module.CONTROL_QUEUE} and {module.PROVIDER_QUEUE}")
    argv = ["worker", "--queues", ",".join(wanted), "--pool", pool.value,
            "--loglevel", (loglevel or settings.log_level).upper()]
    if concurrency is not None:
        argv += ["--concurrency", str(concurrency)]
    if hostname:
        argv += ["--hostname", hostname]
    if events:
        argv.append("--task-events")
    setup_logging(loglevel or settings.log_level, settings.log_format)
    code = module.app.start(argv)
    raise typer.Exit(code or 0)


def beat_command(
    schedule: Annotated[Path | None, typer.Option("--schedule", "-s", help="Beat's schedule state file (default: celerybeat-schedule in BURST_STATE_DIR).")] = None,
    loglevel: Annotated[str | None, typer.Option("--loglevel", "-l", help="Log level (default BURST_LOG_LEVEL).")] = None,
) -> None:
    """Run Celery beat: a tick per policy every BURST_TICK_S, reconcile and catalogue refresh."""
    settings = _check_settings_and_policies()
    schedule = schedule or settings.state_dir / "celerybeat-schedule"
    try:
        schedule.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--schedule: cannot create {schedule.parent}: {exc}")
    module = _celery_app()
    setup_logging(loglevel or settings.log_level, settings.log_format)
    code = module.app.start(["beat", "--schedule", str(schedule),
                             "--loglevel", (loglevel or settings.log_level).upper()])
    raise typer.Exit(code or 0)


def api_command(
    host: Annotated[str | None, typer.Option("--host", help="Address to bind (BURST_API_HOST).")] = None,
    port: Annotated[int | None, typer.Option("--port", min=0, max=65535, help="Port to bind (BURST_API_PORT).")] = None,
) -> None:
    """Serve the controller API (agents, costs, budgets, nodes, queue, metrics; docs/api.md)
    with uvicorn in the foreground until SIGTERM."""
    import uvicorn

    from orchestrator.api import create_app

    settings = load_settings(api_host=host, api_port=port)
    load_policies(None, settings)
    _warn_embedded_defaults(settings)
    setup_logging(settings.log_level, settings.log_format)
    from orchestrator.automation.runtime import runtime
    from orchestrator.wiring import ProviderUnavailable

    try:
        rt = runtime()
    except ProviderUnavailable as exc:
        fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - a store or configuration error, reported plainly
        fail(f"cannot start the API: {type(exc).__name__}: {exc}")
    # JSON logs: no uvicorn logging config of its own, so its loggers reach the root's JSON lines.
    json_logs = settings.log_format.value == "json"
    config = uvicorn.Config(create_app(rt, broker_url=settings.broker_url), host=settings.api_host, port=settings.api_port,
                            log_level=getattr(logging, settings.log_level.upper(), logging.INFO),
                            access_log=False,
                            **({"log_config": None} if json_logs else {}),
                            lifespan="off", proxy_headers=True)
    server = uvicorn.Server(config)
    received: list[int] = []

    # uvicorn handles SIGTERM/SIGINT itself (graceful shutdown), then re-raises the signal into the
    # handler it found: this one, which only records it, so the process can close the store and
    # exit 0 instead of dying from the re-raised signal.
    def _record(signum, _frame) -> None:
        received.append(signum)

    signal.signal(signal.SIGTERM, _record)
    signal.signal(signal.SIGINT, _record)
    err.print(f"burst api: serving on {settings.api_host}:{settings.api_port}, "
              f"state {rt.store.url}")
    from orchestrator.api.presence import PresenceRecorder

    # The window in which agents can be heard: the liveness rules never count time before it.
    presence = PresenceRecorder(rt.store, rt.clock)
    try:
        presence.start()
        server.run()
    finally:
        presence.stop()
        rt.close()
    if not server.started:
        fail(f"the API could not start on {settings.api_host}:{settings.api_port}", code=1)
    name = signal.Signals(received[0]).name if received else "shutdown"
    err.print(f"burst api: stopped ({name})")
