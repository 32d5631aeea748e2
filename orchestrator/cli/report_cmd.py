"""`burst report`: what was spent, from the cost ledger, as a table, JSON, CSV or a chart.

The same report as ``GET /v1/costs`` (:func:`orchestrator.costs.report.cost_report`), read straight
from the store (the embedded SQLite file, or ``BURST_DATABASE_URL``). The table ends with a total
row; its cents are the rows' cents added up (the report reconciles them).

``--png FILE`` draws, whatever ``--group-by`` says, the cost per UTC day as bars stacked by
project, and each budget of the policies as a dashed step line at its *daily pace*: the budget's
limit spread evenly over the window it applies to (a monthly $3,000 budget is $100 a day in a
30-day month, $96.77 in a 31-day one). A project budget's line has its project's colour: when that
project's part of a bar is taller than its line, the project spent faster than its budget allows
that day. A pool-wide budget's line is black and compares with the whole bar.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from orchestrator.cli.common import (
    POLICY_HELP,
    fail,
    line,
    load_policies,
    load_settings,
    open_store,
    out,
    print_json,
)

if TYPE_CHECKING:
    from rich.table import Table

    from orchestrator.costs.report import CostReport
    from orchestrator.policy import Policy
    from orchestrator.policy.models import Budget

_StateOpt = Annotated[Path | None, typer.Option("--state-dir", help="State directory (BURST_STATE_DIR).")]
_PolicyOpt = Annotated[list[Path] | None, typer.Option(
    "--policy", "-p", help="Policy file(s) whose budgets the chart draws (repeatable); default: the "
                           "files in BURST_POLICY_FILES, else the shipped default policy.")]


def report_command(
    since: Annotated[str | None, typer.Option("--from", "--since", help="Start: ISO 8601 with a timezone, a date (UTC midnight) or a span back from now (7d, 30d); default: the start of this month, UTC.")] = None,
    until: Annotated[str | None, typer.Option("--to", "--until", help="End: ISO 8601 with a timezone, a date (UTC midnight) or a span back from now (30m); default: now.")] = None,
    group_by: Annotated[str, typer.Option("--group-by", help="Comma-separated: project, pool, policy, provider, region, instance_type, market, node, job, kind, day, user.")] = "project",
    project: Annotated[list[str] | None, typer.Option("--project", help="Only this project (repeat for several).")] = None,
    user: Annotated[list[str] | None, typer.Option("--user", help="Only this user's jobs (repeat for several).")] = None,
    pool: Annotated[str | None, typer.Option("--pool", help="Only this pool.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="Print the report as CSV.")] = False,
    png: Annotated[Path | None, typer.Option("--png", help="Also write a chart: cost per day stacked by project, with budget lines.")] = None,
    usage: Annotated[bool, typer.Option("--usage", help="The usage report instead: per group (--group-by of user, project, provider, pool, day) GPU-hours allocated on-prem and burst, measured and used, cost, queue wait p50/p95, jobs; --png: GPU-hours stacked by user or project, the used share shaded.")] = False,
    roi: Annotated[bool, typer.Option("--roi", help="The return on burst spend instead: per project and month, burst $, GPU-hours burst, researcher-hours of waiting avoided, $ per hour avoided (default --from: the start of this year).")] = False,
    policy: _PolicyOpt = None,
    state_dir: _StateOpt = None,
) -> None:
    """Spend per project, provider, day... from the cost ledger."""
    from orchestrator.costs.report import CostQuery, cost_report, parse_group_by

    if as_json and as_csv:
        fail("--json and --csv: choose one")
    now = datetime.now(UTC)
    end = _time(until, "--to", now) if until is not None else now
    start = _time(since, "--from", now) if since is not None else end.replace(
        day=1, hour=0, minute=0, second=0, microsecond=0)
    if roi:
        if since is None:
            start = start.replace(month=1)
        _roi(start, end, project, png, as_json, as_csv, state_dir)
        return
    if since is None and start >= end:
        start = end - timedelta(days=1)
    if start >= end:
        fail(f"--from: {_iso(start)} must be before --to ({_iso(end)})")
    if usage:
        from orchestrator.cli.usage_cmd import usage_main

        usage_main(start, end, group_by, project, user, pool, png, as_json, as_csv, state_dir)
        return
    try:
        keys = parse_group_by(group_by)
    except ValueError as exc:
        fail(f"--group-by: {exc}")
    projects = frozenset(p.strip() for item in project or [] for p in item.split(",") if p.strip())
    users = frozenset(u.strip() for item in user or [] for u in item.split(",") if u.strip())
    settings = load_settings(state_dir=state_dir)
    policies = load_policies(policy, settings) if png else []
    if png is not None and png.suffix.lower() != ".png":
        fail(f"--png: {png} should end in .png")
    if png is not None and (end - start).days > MAX_CHART_DAYS:
        fail(f"--png: a chart shows at most {MAX_CHART_DAYS} days (one bar a day); narrow "
             "--from/--to")
    store = open_store(settings)
    try:
        query = CostQuery(since=start, until=end, group_by=keys, projects=projects or None,
                          pool=pool, users=users or None)
        report = cost_report(store, query)
        daily = None
        if png is not None:
            daily = cost_report(store, CostQuery(since=start, until=end,
                                                 group_by=parse_group_by("day,project"),
                                                 projects=projects or None, pool=pool,
                                                 users=users or None))
    finally:
        store.close()

    emit(report, as_json, as_csv, render_table)
    if png is not None and daily is not None:
        try:
            write_chart(daily, policies, png, start, end, pool)
        except OSError as exc:
            fail(f"--png: cannot write {png}: {exc}")
        if not as_json and not as_csv:
            line(f"chart written to {png}")


def emit(report: Any, as_json: bool, as_csv: bool, render: Any) -> None:
    """Print a report (anything with ``as_json`` and ``as_csv``) as JSON, CSV or its table."""
    if as_json:
        print_json(report.as_json())
    elif as_csv:
        typer.echo(report.as_csv(), nl=False)
    else:
        out.print(render(report))


def _roi(start: datetime, end: datetime, project: list[str] | None, png: Path | None,
         as_json: bool, as_csv: bool, state_dir: Path | None) -> None:
    """``burst report --roi`` (see :mod:`orchestrator.costs.roi`)."""
    from orchestrator.costs.roi import roi_report

    if png is not None:
        fail("--png: not with --roi (the chart draws costs or GPU-hours)")
    if start >= end:
        fail(f"--from: {_iso(start)} must be before --to ({_iso(end)})")
    projects = frozenset(p.strip() for item in project or [] for p in item.split(",") if p.strip())
    store = open_store(load_settings(state_dir=state_dir))
    try:
        report = roi_report(store, since=start, until=end, projects=projects or None)
    finally:
        store.close()
    emit(report, as_json, as_csv, render_roi)


def render_roi(report: Any) -> Table:
    from rich.table import Table

    table = Table(title=f"return on burst spend, {_iso(report.since)} to {_iso(report.until)}")
    for column in ("project", "month"):
        table.add_column(column)
    for column in ("burst $", "burst GPU h", "burst jobs", "predicted", "late",
                   "wait avoided h", "$ / h avoided"):
        table.add_column(column, justify="right")

    def values(row: Any) -> list[str]:
        data = row.as_json()
        per_hour = data["usd_per_hour_avoided"]
        return [f"{Decimal(data['burst_cost_usd']):,.2f}", f"{data['burst_gpu_hours']:,.2f}",
                str(row.burst_jobs), str(row.predicted_jobs), str(row.late_jobs),
                f"{row.hours_avoided:,.2f}", "-" if per_hour is None else f"{Decimal(per_hour):,.2f}"]

    for row in report.rows:
        table.add_row(key_label("project", row.project), row.month, *values(row))
    table.add_section()
    table.add_row("total", "", *values(report.total), style="bold")
    return table


def render_table(report: CostReport) -> Table:
    from rich.table import Table

    keys = [str(k) for k in report.query.group_by]
    table = Table(title=f"burst cost, {_iso(report.query.since)} to {_iso(report.query.until)} (USD)")
    for key in keys:
        table.add_column(key)
    for column in ("cost", "idle", "on-prem", "on-prem equiv", "GPU h", "instance h"):
        table.add_column(column, justify="right")

    def values(row: Any) -> list[str]:
        return [f"{row.cost_usd:,.2f}", f"{row.idle_cost_usd:,.2f}", f"{row.onprem_cost_usd:,.2f}",
                f"{row.onprem_equiv_usd:,.2f}", f"{row.gpu_hours:,.2f}", f"{row.instance_hours:,.2f}"]

    for row in report.rows:
        table.add_row(*(key_label(k, row.keys[k]) for k in keys), *values(row))
    table.add_section()
    table.add_row("total", *([""] * (len(keys) - 1)), *values(report.total), style="bold")
    return table


def key_label(key: str, value: str | None) -> str:
    """A group key as a table shows it: the bucket of no project or no user named as such."""
    from orchestrator.domain.jobs import NO_PROJECT_LABEL, NO_USER_LABEL

    if value is not None:
        return value
    return NO_USER_LABEL if key == "user" else NO_PROJECT_LABEL if key == "project" else "-"


# -- the chart ------------------------------------------------------------------------------------


def budget_window_days(budget: Budget, day: date) -> float:
    """Length in days of the budget window that holds (the middle of) ``day``."""
    from orchestrator.planner.budgets import window_bounds

    start, end = window_bounds(budget, datetime.combine(day, time(12), UTC))
    return (end - start).total_seconds() / 86_400


def daily_pace(budget: Budget, days: list[date]) -> list[float]:
    """The budget's limit spread evenly over its window, for each day."""
    return [float(budget.limit_usd) / budget_window_days(budget, day) for day in days]


def write_chart(daily: CostReport, policies: list[Policy], path: Path, start: datetime,
                end: datetime, pool: str | None) -> None:
    """Stacked bars of cost per day by project, with each budget's daily pace (module docstring)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, last = start.astimezone(UTC).date(), (end - timedelta(microseconds=1)).astimezone(UTC).date()
    days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    projects = sorted({key_label("project", row.keys["project"]) for row in daily.rows})
    cost = {(row.keys["day"], key_label("project", row.keys["project"])): float(row.cost_usd)
            for row in daily.rows}
    budgets = [(policy, budget) for policy in policies
               if pool is None or policy.pool.name == pool
               for budget in getattr(policy, "budgets", None) or []]
    # A project with a budget but no spend still gets its own colour, for its line.
    named = projects + sorted({b.project for _, b in budgets if b.project} - set(projects))
    colours = {p: plt.get_cmap("tab10")(i % 10) for i, p in enumerate(named)}

    fig, ax = plt.subplots(figsize=(max(9.0, 0.35 * len(days) + 5), 5), dpi=110)
    x = list(range(len(days)))
    bottom = [0.0] * len(days)
    for project in projects:
        heights = [cost.get((d.isoformat(), project), 0.0) for d in days]
        ax.bar(x, heights, bottom=bottom, color=colours[project], label=project, width=0.8)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    edges = [i - 0.5 for i in range(len(days) + 1)]  # each step spans its day's bar
    for policy, budget in budgets:
        colour = colours[budget.project] if budget.project else "black"
        scope = budget.project or f"pool {policy.pool.name}"
        ax.stairs(daily_pace(budget, days), edges, linestyle="--", linewidth=2.2, color=colour,
                  baseline=None, zorder=3, label=f"budget {budget.name} ({scope})")
    ax.set_xticks(x, [d.strftime("%m-%d") for d in days], rotation=90 if len(days) > 14 else 0)
    ax.set_ylabel("USD per day")
    if budgets:
        ax.set_xlabel("dashed: each budget's limit spread evenly over its window (daily pace)")
    ax.set_title(f"burst cost per day by project, {first} to {last}"
                 + (f", pool {pool}" if pool else "") + f" (total ${daily.total.cost_usd:,.2f})")
    ax.grid(axis="y", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


MAX_CHART_DAYS = 400  # one bar a day: wider charts are unreadable (and past matplotlib's limits)


def _time(value: str, option: str, now: datetime) -> datetime:
    from orchestrator.policy.timefmt import TimeFormatError, parse_when

    try:
        return parse_when(value, option, now)
    except TimeFormatError as exc:
        fail(str(exc) if "got " in str(exc) else f"{exc} (got {value[:60]!r})")


def _iso(moment: datetime | None) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z") if moment else "-"


__all__ = ["budget_window_days", "daily_pace", "emit", "render_roi", "render_table", "report_command", "write_chart"]
