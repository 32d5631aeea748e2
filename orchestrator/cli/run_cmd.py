"""`burst run`, `burst agent` and `burst db upgrade`: the long-running processes and migrations."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli import running
from orchestrator.cli.common import (
    POLICY_HELP,
    err,
    fail,
    load_policies,
    load_settings,
    open_store,
    policy_files,
    print_json,
    setup_logging,
)


def run_command(
    policy: Annotated[list[Path] | None, typer.Option("--policy", "-p", help=POLICY_HELP)] = None,
    tick: Annotated[float | None, typer.Option("--tick", help="Seconds between ticks (default 10, or BURST_TICK_S).")] = None,
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="State directory (BURST_STATE_DIR).")] = None,
    port: Annotated[int | None, typer.Option("--port", help="Controller API port (BURST_API_PORT).")] = None,
    once: Annotated[bool, typer.Option("--once", help="Run a single tick and exit.")] = False,
) -> None:
    """Run the control loop: observe -> plan -> execute -> reconcile, every tick, until stopped."""
    from orchestrator.api import create_app
    from orchestrator.api.presence import PresenceRecorder
    from orchestrator.api.server import ApiServer
    from orchestrator.loop import ControlLoop, TickReport
    from orchestrator.domain.credentials import credentials_message, is_credentials_problem
    from orchestrator.domain.ports import ProviderError
    from orchestrator.wiring import ProviderUnavailable, build_runtime, credential_problems

    settings = load_settings(tick_s=tick, state_dir=state_dir, api_port=port)
    setup_logging(settings.log_level, settings.log_format)
    policies = load_policies(policy, settings)
    try:
        runtime = build_runtime(settings, policies)
    except ProviderUnavailable as exc:
        fail(str(exc))
    except ProviderError as exc:  # e.g. a libcloud key variable the policy names is unset
        fail(credentials_message(exc.provider, f"{exc.kind}: {exc}")
             if is_credentials_problem(f"{exc.code} {exc}") else f"provider {exc.provider}: {exc}")
    # Credentials are checked before the first tick: without them every launch would fail, tick
    # after tick, with the same error. One line per provider says what to do.
    problems = credential_problems(runtime.providers)
    if problems:
        runtime.close()
        for name, detail in problems[:-1]:
            err.print(f"error: {credentials_message(name, detail)}")
        fail(credentials_message(*problems[-1]))
    server = ApiServer(create_app(runtime), settings.api_host, settings.api_port)
    try:
        bound = server.start()
    except RuntimeError as exc:
        runtime.close()
        fail(f"{exc} (is another `burst run` using it? set --port or BURST_API_PORT)")
    runtime.executor.config.controller_url = settings.agent_url(bound)
    # From now on agents can be heard: the liveness rules count silence from here, not before.
    presence = PresenceRecorder(runtime.store, runtime.clock)
    presence.start()
    stop = threading.Event()

    def _stop(signum, _frame) -> None:
        err.print(f"received {signal.Signals(signum).name}: finishing the current tick, then stopping")
        stop.set()

    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGTERM, _stop)
    # What this loop runs, for the commands a user types beside it (submit, status, plan...).
    running.record(settings.state_dir, policy_files(policy, settings), runtime.executor.config.controller_url)
    names = ", ".join(p.name for p in policies)
    err.print(f"burst: running policies [{names}], tick {settings.tick_s:g}s, state {settings.store_url}, "
              f"agents call {runtime.executor.config.controller_url}")
    loop = ControlLoop(runtime, settings.tick_s)

    shown_skips: dict[str, str] = {}

    def _report(report: TickReport) -> None:
        for decision in report.decisions:
            if decision.actions:
                err.print(f"{decision.at:%H:%M:%S} {decision.policy} [{decision.id}] {decision.rule}: {decision.summary}")
        for scope, holder in report.skipped.items():
            if shown_skips.get(scope) != holder:
                err.print(f"{scope} is led by another live controller ({holder}): not acting on it")
        shown_skips.clear()
        shown_skips.update(report.skipped)

    try:
        if once:
            _report(loop.tick())
            loop.close()
        else:
            loop.run(stop, on_tick=_report)  # releases its leases when it stops
    finally:
        server.stop()
        presence.stop()
        runtime.close()
        running.clear(settings.state_dir)
    err.print("burst: stopped; burst nodes keep running and are picked up by the next `burst run`")


def agent_command(
    user_data: Annotated[Path | None, typer.Option("--user-data", help="Bootstrap file (cloud-init user-data).")] = None,
) -> None:
    """Run the node agent (what a burst node starts from its bootstrap)."""
    from orchestrator.fabric.agent import main as agent_main

    argv = ["--user-data", str(user_data)] if user_data else []
    raise typer.Exit(agent_main(argv))


db_app = typer.Typer(rich_markup_mode=None, help="State database maintenance.", no_args_is_help=True, add_completion=False)


@db_app.command("upgrade")
def db_upgrade(
    database_url: Annotated[str | None, typer.Option("--database-url", help="SQLAlchemy URL (BURST_DATABASE_URL).")] = None,
) -> None:
    """Apply the database migrations (Alembic) up to the newest."""
    from orchestrator.store import Store

    settings = load_settings(database_url=database_url)
    from sqlalchemy.engine import make_url

    shown = make_url(settings.store_url).render_as_string(hide_password=True)
    try:
        store = Store(settings.store_url)
        store.upgrade()
        store.close()
    except Exception as exc:  # noqa: BLE001 - a connection or migration error, reported plainly
        fail(f"cannot upgrade {shown}: {type(exc).__name__}")
    err.print(f"database at {shown} is at the newest schema")


@db_app.command("rebuild-rollups")
def db_rebuild_rollups(
    database_url: Annotated[str | None, typer.Option("--database-url", help="SQLAlchemy URL (BURST_DATABASE_URL).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the row counts as JSON.")] = False,
) -> None:
    """Rebuild the cost ledger's hour, day and month roll-ups from its lines, and each node's
    ledger reach (what budgets' accrual reads), in one transaction (what migrations 0014, 0016
    and 0019 did on upgrade; for rows loaded by hand, e.g. a restore of cost_lines alone).
    Reports read the roll-ups; the roll-up keeps them as it writes lines."""
    settings = load_settings(database_url=database_url)
    store = open_store(settings)
    try:
        with err.status("rebuilding the cost roll-ups from the ledger's lines"):
            hours, days, months = store.rebuild_cost_rollups()
    finally:
        store.close()
    if as_json:
        print_json({"hour_rows": hours, "day_rows": days, "month_rows": months})
    else:
        err.print(f"cost roll-ups rebuilt: {hours:,} hour rows, {days:,} day rows, "
                  f"{months:,} month rows")
