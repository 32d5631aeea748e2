"""The ``burst`` command line (typer + rich). Nothing imports this package.

Every ``*_cmd`` module is imported here to register its commands, so each keeps its top-level
imports to the standard library and typer (see :mod:`orchestrator.cli.common`): ``burst --help``
must not pay for pydantic, the store or the API (tests/e2e/test_cli_consistency.py checks it).
"""

from __future__ import annotations

from typing import Annotated

import typer

from orchestrator.cli.cancel_cmd import cancel_command
from orchestrator.cli.config_cmd import config_app
from orchestrator.cli.control_cmd import api_command, beat_command, worker_command
from orchestrator.cli.pool_cmd import pool_app
from orchestrator.cli.decisions_cmd import decisions_command, explain_command
from orchestrator.cli.demo_cmd import demo_command
from orchestrator.cli.plan_cmd import plan_command
from orchestrator.cli.policy_cmd import policy_app
from orchestrator.cli.provider_cmd import catalog_app, provider_app
from orchestrator.cli.queue_cmd import status_command, submit_command
from orchestrator.cli.run_cmd import agent_command, db_app, run_command
from orchestrator.cli.simulate_cmd import simulate_command
from orchestrator.cli.slurm_cmd import slurm_app
from orchestrator.cli.report_cmd import report_command
from orchestrator.cli.token_cmd import token_app

# rich_markup_mode=None (on every sub-app too): help and usage errors are plain click text. Rich
# help panels would import rich's markdown and table machinery on every `--help` (start-up time)
# and read any `[...]` in a help text or an echoed argument as a style tag.
app = typer.Typer(
    rich_markup_mode=None,
    help="burst: burst on-prem GPU training queues to the cloud when a policy says it pays.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, pwsh
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from orchestrator import __version__

        typer.echo(f"burst {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="Print burst's version and exit.")] = False,
) -> None:
    """burst: burst on-prem GPU training queues to the cloud when a policy says it pays."""
app.add_typer(policy_app, name="policy")
app.add_typer(db_app, name="db")
app.add_typer(provider_app, name="provider")
app.add_typer(catalog_app, name="catalog")
app.add_typer(pool_app, name="pool")
app.add_typer(token_app, name="token")
app.add_typer(config_app, name="config")
app.add_typer(slurm_app, name="slurm")
app.command("plan")(plan_command)
app.command("run")(run_command)
app.command("submit")(submit_command)
app.command("status")(status_command)
app.command("cancel")(cancel_command)
app.command("decisions")(decisions_command)
app.command("explain")(explain_command)
app.command("demo")(demo_command)
app.command("agent")(agent_command)
app.command("worker")(worker_command)
app.command("beat")(beat_command)
app.command("api")(api_command)
# One command answers "what did we spend": `spend` is `report` (same options, same totals).
app.command("spend", help="Alias of `burst report`: spend from the cost ledger.")(report_command)
app.command("simulate")(simulate_command)
app.command("report")(report_command)


# A module an optional extra provides -> the extra (pyproject's [project.optional-dependencies]).
EXTRAS = {"celery": "celery", "kombu": "celery", "redis": "celery", "boto3": "aws",
          "botocore": "aws", "google": "gcp", "libcloud": "libcloud", "psycopg": "postgres",
          "torch": "train"}


def main() -> None:
    import sys

    # Tick lines and logs reach a file or a pipe as they happen, not when the loop exits.
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    from orchestrator.gctune import tune_gc

    tune_gc()  # the collector's thresholds for a process of burst's size (orchestrator.gctune)
    try:
        # prog_name: usage lines and shell completion (_BURST_COMPLETE) say `burst` however the
        # entry point was started (console script, `python -m`, `python -c`).
        app(prog_name="burst")
    except ModuleNotFoundError as exc:
        extra = EXTRAS.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        sys.stderr.write(f"error: this needs the optional {extra!r} dependencies ({exc.name} is "
                         f"not installed): pip install 'burst[{extra}]'\n")
        raise SystemExit(2) from None
