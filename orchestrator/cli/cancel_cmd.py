"""`burst cancel JOB...`: withdraw jobs from the built-in queue, pending or running.

A running job keeps its node until the node's agent, told at its next heartbeat, stops it; the
node then takes other work or is drained when idle, as after any job. Each id gets one line; the
exit status is 0 when every job is cancelled now (or was before), 2 when an id is unknown or its
job had finished (the others are still cancelled).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import err, load_settings, open_store, out, print_json

_StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="State directory (BURST_STATE_DIR).")]
_MESSAGES = {
    "cancelled": "cancelled {id}",
    "already-cancelled": "{id} was cancelled already",
    "finished": "{id} had finished ({state}); not cancelled",
    "unknown": "no job {id!r} (list them with `burst status`)",
}


def cancel_command(
    job_ids: Annotated[list[str], typer.Argument(help="Job ids, e.g. j-1a2b3c4d5e.", show_default=False)],
    state_dir: _StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per job: id, state, result, node.")] = False,
) -> None:
    """Cancel jobs of the built-in queue (pending or running)."""
    from orchestrator.automation.operations import cancel_jobs  # the same rules as the task

    store = open_store(load_settings(state_dir=state_dir))
    try:
        results = cancel_jobs(store, job_ids, datetime.now(UTC))
    finally:
        store.close()
    if as_json:
        print_json(results)
    else:
        for r in results:
            line = _MESSAGES[r["result"]].format(**r)
            if r["node"]:
                line += f" (running on {r['node']}: its agent stops it at its next heartbeat)"
            (out if r["result"] in ("cancelled", "already-cancelled") else err).print(line, markup=False)
    if any(r["result"] in ("unknown", "finished") for r in results):
        raise typer.Exit(2)
