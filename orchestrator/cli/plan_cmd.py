"""`burst plan`: what the planner would do for a given world state, touching nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from orchestrator.cli.common import POLICY_HELP, err, fail, load_policies, load_settings, out, print_json

if TYPE_CHECKING:
    from rich.table import Table

    from orchestrator.domain.plan import Plan


def plan_command(
    policy: Annotated[list[Path] | None, typer.Option("--policy", "-p", help=POLICY_HELP)] = None,
    snapshot: Annotated[Path | None, typer.Option("--snapshot", "-s", help="Plan this snapshot JSON (see --snapshot-schema) instead of observing the live world.")] = None,
    assume_sustained: Annotated[bool, typer.Option("--assume-sustained", help="Treat each trigger's sustained_for as already met, to see what would be launched.")] = False,
    save_snapshot: Annotated[Path | None, typer.Option("--save-snapshot", help="Write the observed snapshot to FILE (the --snapshot format), for a bug report or a what-if.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan (actions and decisions) as JSON.")] = False,
    snapshot_schema: Annotated[bool, typer.Option("--snapshot-schema", help="Print the JSON Schema of snapshot files and exit.")] = False,
) -> None:
    """Dry-run: what the planner would do now (or for a snapshot), writing and launching nothing.

    Without --snapshot it observes the live world as `burst run` does (the policies' queue, the
    store's nodes, budgets and memory, the provider catalogues) through a read-only store."""
    from orchestrator.domain.snapshot_json import (
        SnapshotError,
        load_snapshot,
        plan_to_json,
        snapshot_json_schema,
    )
    from orchestrator.planner import plan as make_plan

    if snapshot_schema:
        print(json.dumps(snapshot_json_schema(), indent=2, sort_keys=True))
        return
    from orchestrator.cli.live_plan import (
        LivePlanError,
        assume_sustained as sustained,
        fill_offerings,
        observe_live,
    )

    settings = load_settings()
    catalogue_notes: list[str] = []
    policies = load_policies(policy, settings, catalogue_notes)
    try:
        if snapshot is None:
            observed = observe_live(settings, policies, datetime.now(UTC))
        else:
            try:
                world = load_snapshot(snapshot)
            except SnapshotError as exc:
                for problem in str(exc).splitlines():
                    err.print(problem, markup=False)
                raise typer.Exit(2) from None
            observed = fill_offerings(settings, policies, world)
    except LivePlanError as exc:
        fail(str(exc))
    world = observed.snapshot
    if save_snapshot is not None:
        write_snapshot(save_snapshot, world)
    if assume_sustained:
        world = sustained(world, policies)
    result = make_plan(world, policies, world.taken_at)
    if as_json:
        print_json(plan_to_json(result))
        return
    for line in catalogue_notes:
        err.print(line, markup=False)
    for note in observed.notes:
        err.print(f"note: {note}", markup=False)
    if save_snapshot is not None:
        err.print(f"snapshot written to {save_snapshot}", markup=False)
    render_plan(result)


def write_snapshot(path: Path, world) -> None:
    """Write ``world`` atomically (a partial file is never left behind)."""
    from orchestrator.domain.snapshot_json import snapshot_to_json

    text = json.dumps(snapshot_to_json(world), indent=2, sort_keys=True) + "\n"
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        fail(f"--save-snapshot {path}: cannot write: {exc.strerror}")


def owners_text(owners: object) -> str:
    """``unmet_by_owner`` as a line: ``research/ada 16 GPUs (2 jobs), (no project)/carol ...``,
    the buckets of no project or user named as such (anything else as it is)."""
    from orchestrator.domain.jobs import NO_PROJECT_LABEL, NO_USER_LABEL

    if not isinstance(owners, list) or not all(isinstance(o, dict) for o in owners):
        return str(owners)
    if not owners:
        return "-"
    return ", ".join(f"{o.get('project') or NO_PROJECT_LABEL}/{o.get('user') or NO_USER_LABEL} "
                     f"{o.get('gpus')} GPUs ({o.get('jobs')} jobs)" for o in owners)


def render_plan(result: Plan) -> None:
    """The decision of each policy and the actions, every data string printed verbatim."""
    from rich.table import Table
    from rich.text import Text

    from orchestrator.domain.plan import Drain, Hold, Launch, Terminate

    for decision in result.decisions:
        out.rule(Text(f"policy {decision.policy} — decision {decision.id}"))
        out.print(Text.assemble(("rule: ", "bold"), str(decision.rule), "    ", ("at: ", "bold"),
                                decision.at.isoformat()), soft_wrap=True)
        out.print(Text.assemble(("why: ", "bold"), decision.summary), soft_wrap=True)
        inputs = Table(title="inputs", show_header=False, box=None)
        for key, value in decision.inputs.items():
            if key == "unmet_by_owner":
                shown = owners_text(value)
            elif key == "staging" and isinstance(value, dict):
                shown = staging_text(value)
            else:
                shown = str(value)
            inputs.add_row(Text(str(key)), Text(shown))
        out.print(inputs)
        if decision.options:
            out.print(optimizer_table(decision))
        if isinstance(decision.inputs.get("staging"), dict):
            out.print(staging_table(decision.inputs["staging"]))
        if decision.held_back_by:
            out.print(Text.assemble(("held back by: ", "yellow"), ", ".join(decision.held_back_by)),
                      soft_wrap=True)
    actions = Table(title="actions")
    for col in ("action", "node", "detail", "reason"):
        actions.add_column(col, overflow="fold")
    for action in result.actions:
        if isinstance(action, Launch):
            row = ("launch", action.node_id, f"{action.offering.key} for {action.project or '-'}",
                   str(action.reason))
        elif isinstance(action, Drain):
            row = ("drain", action.node_id, f"deadline {action.deadline.isoformat()}", str(action.reason))
        elif isinstance(action, Terminate):
            row = ("terminate", action.node_id or action.instance_id or "", "", str(action.reason))
        else:
            assert isinstance(action, Hold)
            row = ("hold", "", action.reason, "")
        actions.add_row(*(Text(cell) for cell in row))
    if result.actions:
        out.print(actions)
    else:
        out.print("no actions")


def staging_text(staging: dict) -> str:
    """``inputs.staging`` as a line: jobs weighed, held, and the egress of those burst."""
    jobs = staging.get("jobs") or {}
    return (f"{len(jobs)} job(s) weighed, {staging.get('held_jobs', 0)} not burst for staging; "
            f"egress ${float(staging.get('egress_usd') or 0):.2f} (table below)")


def _seconds_text(value: object) -> str:
    return "never (model)" if value is None else f"{float(value):.0f}s"  # type: ignore[arg-type]


def staging_table(staging: dict) -> Table:
    """Per job weighed for a burst: the data it stages and how long that takes, its predicted
    on-prem wait, the egress (GB and $), and the compute cost of its node share."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="data staging per job")
    table.add_column("job", overflow="fold")
    for col in ("data GB", "staging", "on-prem wait", "egress GB", "egress $", "compute $",
                "total $"):
        table.add_column(col, justify="right")
    table.add_column("burst")
    for job, row in (staging.get("jobs") or {}).items():
        money = ("compute_usd", "total_usd")
        compute, total = (f"{row[k]:.2f}" if row.get(k) is not None else "-" for k in money)
        verdict = (Text("yes", "green") if row.get("burst")
                   else Text("no: staging > on-prem wait", "yellow"))
        table.add_row(Text(str(job)), f"{row.get('dataset_gb', 0):g}",
                      _seconds_text(row.get("staging_s")),
                      _seconds_text(row.get("predicted_onprem_start_s")),
                      f"{row.get('egress_gb', 0):g}", f"{row.get('egress_usd', 0):.2f}", compute,
                      total, verdict)
    return table


def optimizer_table(decision) -> Table:
    """The offerings weighed, as an optimizer view: one row per offering and market, the nodes
    it would take, its price and expected cost, and either "chosen" or why it was not."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="offerings considered")
    table.add_column("offering", overflow="fold")
    table.add_column("market")
    for col in ("GPUs", "nodes", "$/h", "expected $"):
        table.add_column(col, justify="right")
    table.add_column("chosen", overflow="fold")
    for option in sorted(decision.options, key=lambda o: (o.rejected is not None, o.expected_cost_usd)):
        head, _, market = option.offering_key.rpartition("/")
        if option.offering_key == decision.chosen:
            verdict = Text("✔ chosen", "green")
        else:
            verdict = Text(option.rejected or "")
        table.add_row(Text(head), Text(market), str(option.gpus), str(option.nodes),
                      f"{option.price_usd_hour:.2f}", f"{option.expected_cost_usd:.2f}", verdict)
    return table
