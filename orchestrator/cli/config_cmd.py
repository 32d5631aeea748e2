"""`burst config show`: the effective service settings and where each came from.

Every setting of :class:`~orchestrator.wiring.Settings` with its value and its source (command
line, a ``BURST_*`` variable, a ``BURST_*_FILE`` file, the ``BURST_SECRETS_DIR`` directory, the
``BURST_SETTINGS_FILE`` YAML file, or the default; see :mod:`orchestrator.settings_sources`).
Secrets print as ``***`` and passwords inside URLs are masked, so the output can be pasted into a
ticket.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import load_settings, out, print_json

config_app = typer.Typer(rich_markup_mode=None, no_args_is_help=True,
                         help="Show the effective service settings (BURST_*) and their sources.")


@config_app.command("show")
def show_command(
    state_dir: Annotated[Path | None, typer.Option("--state-dir", help="State directory (BURST_STATE_DIR).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the settings as JSON: a list of {setting, env, value, source, secret}.")] = False,
) -> None:
    """Every setting's effective value (secrets redacted) and the source it came from."""
    from orchestrator.settings_sources import provenance

    overrides = {"state_dir": state_dir} if state_dir is not None else {}
    rows = provenance(load_settings(**overrides), overrides)
    if as_json:
        print_json([{"setting": r.name, "env": r.env, "value": r.value, "source": r.source,
                     "secret": r.secret} for r in rows])
        return
    from rich.table import Table

    table = Table(title=f"Effective settings ({len(rows)})")
    table.add_column("setting", no_wrap=True)
    table.add_column("value", overflow="fold")
    table.add_column("source", overflow="fold")
    for row in rows:
        value = "" if row.value is None else str(row.value)
        table.add_row(row.env, value, row.source,
                      style="dim" if row.source == "default" else None)
    out.print(table)
