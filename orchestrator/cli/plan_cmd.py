"""`burst plan`: what the planner would do for a given world state, touching nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from orchestrator.cli.common import err, fail, load_policies, out, print_json
from orchestrator.domain.plan import Drain, Hold, Launch, Plan, Terminate
from orchestrator.domain.snapshot_json import (
    SnapshotError,
    load_snapshot,
    plan_to_json,
    snapshot_json_schema,
)
from orchestrator.planner import plan as make_plan


def plan_command(
    policy: Annotated[list[Path] | None, typer.Option("--policy", "-p", help="Policy file (repeatable); default: the shipped default policy.")] = None,
    snapshot: Annotated[Path | None, typer.Option("--snapshot", "-s", help="Snapshot JSON (see --snapshot-schema).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    snapshot_schema: Annotated[bool, typer.Option("--snapshot-schema", help="Print the JSON Schema of snapshot files and exit.")] = False,
) -> None:
    """Show the actions and decision record the planner would produce for a snapshot."""
    if snapshot_schema:
        print(json.dumps(snapshot_json_schema(), indent=2, sort_keys=True))
        return
    if snapshot is None:
        fail("--snapshot FILE is required (print its format with --snapshot-schema)")
    policies = load_policies(policy)
    try:
        world = load_snapshot(snapshot)
    except SnapshotError as exc:
        for line in str(exc).splitlines():
            err.print(line, markup=False)
        raise typer.Exit(2) from None
    result = make_plan(world, policies, world.taken_at)
    if as_json:
        print_json(plan_to_json(result))
        return
    render_plan(result)


def render_plan(result: Plan) -> None:
    for decision in result.decisions:
        out.rule(f"policy {decision.policy} — decision {decision.id}")
        out.print(f"[bold]rule:[/bold] {decision.rule}    [bold]at:[/bold] {decision.at.isoformat()}")
        out.print(f"[bold]why:[/bold] {decision.summary}", markup=True)
        inputs = Table(title="inputs", show_header=False, box=None)
        for key, value in decision.inputs.items():
            inputs.add_row(key, str(value))
        out.print(inputs)
        if decision.options:
            options = Table(title="offerings considered")
            options.add_column("offering", overflow="fold")
            for col in ("GPUs", "$/h", "nodes", "expected $", "note"):
                options.add_column(col)
            for o in decision.options:
                note = o.rejected or ("chosen" if o.offering_key == decision.chosen else "")
                options.add_row(o.offering_key, str(o.gpus), f"{o.price_usd_hour:.2f}", str(o.nodes),
                                f"{o.expected_cost_usd:.2f}", note)
            out.print(options)
        if decision.held_back_by:
            out.print(f"[yellow]held back by:[/yellow] {', '.join(decision.held_back_by)}")
    actions = Table(title="actions")
    for col in ("action", "node", "detail", "reason"):
        actions.add_column(col)
    for action in result.actions:
        if isinstance(action, Launch):
            actions.add_row("launch", action.node_id, f"{action.offering.key} for {action.project or '-'}", str(action.reason))
        elif isinstance(action, Drain):
            actions.add_row("drain", action.node_id, f"deadline {action.deadline.isoformat()}", str(action.reason))
        elif isinstance(action, Terminate):
            actions.add_row("terminate", action.node_id or action.instance_id or "", "", str(action.reason))
        elif isinstance(action, Hold):
            actions.add_row("hold", "", action.reason, "")
    if result.actions:
        out.print(actions)
    else:
        out.print("no actions")
