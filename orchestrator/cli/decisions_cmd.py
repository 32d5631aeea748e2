"""`burst decisions` and `burst explain`: why the loop did what it did."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import fail, line, load_settings, open_store, out, print_json

if TYPE_CHECKING:
    from orchestrator.domain.plan import Decision

_StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="State directory (BURST_STATE_DIR).")]


def decisions_command(
    name: Annotated[str | None, typer.Option("--name", help="Only the decisions of the policy with this name (policy.name).")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="How many, newest first.")] = 20,
    acted: Annotated[bool, typer.Option("--acted", help="Only decisions that launched, drained or terminated.")] = False,
    state_dir: _StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decisions as a JSON list.")] = False,
) -> None:
    """List recent decisions, newest first."""
    from rich.table import Table

    from orchestrator.domain.snapshot_json import decision_to_jsonable

    store = open_store(load_settings(state_dir=state_dir))
    found = store.decisions(policy=name, limit=limit * 20 if acted else limit)
    store.close()
    if acted:
        found = [d for d in found if any(a != "hold" for a in d.actions)][:limit]
    if as_json:
        print_json([decision_to_jsonable(d) for d in found])
        return
    table = Table(title="decisions (burst explain ID for details)")
    for col in ("id", "at", "policy", "rule", "summary", "repeats"):
        table.add_column(col, overflow="fold")
    for d in found:
        table.add_row(d.id, d.at.strftime("%Y-%m-%d %H:%M:%S"), d.policy, str(d.rule), d.summary,
                      _repeats(d))
    out.print(table)


def _repeats(decision: Decision) -> str:
    """How often a stored decision was made in a row, and when last (empty: made once)."""
    if decision.repeats <= 1:
        return ""
    return f"x{decision.repeats}, last {decision.last_seen.strftime('%Y-%m-%d %H:%M:%S')}"


def explain_command(
    decision_id: Annotated[str, typer.Argument(help="Decision id, e.g. d-1a2b3c4d5e6f.")],
    state_dir: _StateOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the decision record as JSON.")] = False,
) -> None:
    """Show one decision: inputs, rule, offerings weighed with their cost, and actions."""
    from orchestrator.cli.plan_cmd import render_plan
    from orchestrator.domain.plan import Plan
    from orchestrator.domain.snapshot_json import decision_to_jsonable

    store = open_store(load_settings(state_dir=state_dir))
    decision = store.get_decision(decision_id)
    store.close()
    if decision is None:
        fail(f"no decision {decision_id!r} (list them with `burst decisions`; a tick that "
             "decided what the one before it did is counted on that decision, under its id)")
    if as_json:
        print_json(decision_to_jsonable(decision))
        return
    render_plan(Plan(at=decision.at, decisions=(decision,)))
    if decision.repeats > 1:
        line(f"repeated: made {decision.repeats} ticks in a row, last at "
             f"{decision.last_seen.isoformat()} (the inputs shown are the first tick's)")
    if decision.actions:
        line("actions:", style="bold")
        for action in decision.actions:
            line(f"  - {action}")
