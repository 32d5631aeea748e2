"""`burst report --usage`: who used how many GPU-hours, on-prem and burst, how much of it was
measurably used, cost, queue wait and jobs (:mod:`orchestrator.costs.usage_report`, the same
report as ``GET /v1/usage``), as a table, JSON, CSV, and a chart.

``--png FILE`` draws one bar per user or project (the first of the two in ``--group-by``; project
when neither is): its allocated GPU-hours stacked on-prem then burst, and over each part the
measurably used GPU-hours shaded (hatched, darker). A bar with no shading was not measured
(unknown), not idle: its label says "unknown".
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import fail, line, load_settings, open_store

if TYPE_CHECKING:
    from rich.table import Table

    from orchestrator.costs.usage_report import UsageReport

MAX_BARS = 60  # users or projects per chart; more are summed into "others"


def usage_main(start: datetime, end: datetime, group_by: str, project: list[str] | None,
               user: list[str] | None, pool: str | None, png: Path | None, as_json: bool,
               as_csv: bool, state_dir: Path | None) -> None:
    from orchestrator.costs.usage_report import parse_usage_group_by, usage_report

    try:
        keys = parse_usage_group_by(group_by)
    except ValueError as exc:
        fail(f"--group-by: {exc}")
    if png is not None and png.suffix.lower() != ".png":
        fail(f"--png: {png} should end in .png")
    projects = frozenset(p.strip() for item in project or [] for p in item.split(",") if p.strip())
    users = frozenset(u.strip() for item in user or [] for u in item.split(",") if u.strip())
    by = next((k for k in keys if k in ("user", "project")), "project")
    window = {"since": start, "until": end, "projects": projects or None,
              "users": users or None, "pool": pool}
    store = open_store(load_settings(state_dir=state_dir))
    try:
        report = usage_report(store, keys, **window)
        chart = usage_report(store, (by,), **window) if png is not None else None
    finally:
        store.close()
    from orchestrator.cli.report_cmd import emit

    emit(report, as_json, as_csv, render_usage)
    if chart is not None and png is not None:
        try:
            write_usage_chart(chart, by, png)
        except OSError as exc:
            fail(f"--png: cannot write {png}: {exc}")
        if not as_json and not as_csv:
            line(f"chart written to {png}")


def _hours(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.1f}"


def _wait(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.0f}s" if seconds < 120 else (
        f"{seconds / 60:.0f}m" if seconds < 7200 else f"{seconds / 3600:.1f}h")


def render_usage(report: UsageReport) -> Table:
    from rich.table import Table

    from orchestrator.cli.report_cmd import _iso, key_label

    table = Table(title=f"GPU use, {_iso(report.since)} to {_iso(report.until)}")
    for key in report.group_by:
        table.add_column(key)
    for column in ("on-prem GPU h", "burst GPU h", "measured", "used GPU h", "util",
                   "on-prem $", "burst $", "jobs", "wait p50", "wait p95"):
        table.add_column(column, justify="right")

    def values(data: dict) -> list[str]:
        share = data["measured_share"]
        util = data["utilisation_percent"]
        return [f"{data['onprem_gpu_hours']:,.1f}", f"{data['burst_gpu_hours']:,.1f}",
                "-" if share is None else f"{100 * share:.0f}%", _hours(data["used_gpu_hours"]),
                "unknown" if util is None else f"{util:.0f}%", data["onprem_cost_usd"],
                data["burst_cost_usd"], str(data["jobs"]), _wait(data["wait_p50_s"]),
                _wait(data["wait_p95_s"])]

    for row in report.rows:
        table.add_row(*(key_label(k, row.keys[k]) for k in report.group_by),
                      *values(row.as_json()))
    table.add_section()
    table.add_row("total", *([""] * (len(report.group_by) - 1)), *values(report.total.as_json()),
                  style="bold")
    return table


def write_usage_chart(report: UsageReport, by: str, path: Path) -> None:
    """One bar per user or project: allocated GPU-hours on-prem and burst, used share shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from orchestrator.cli.report_cmd import key_label

    bars: list[tuple[str, Any]] = sorted(
        ((key_label(by, r.keys[by]), r) for r in report.rows), key=lambda b: -b[1].gpu_s)
    labels = [name for name, _ in bars[:MAX_BARS]]
    rows = [r for _, r in bars[:MAX_BARS]]
    if len(bars) > MAX_BARS:
        labels.append(f"{len(bars) - MAX_BARS} others")
        rest = bars[MAX_BARS:]

        class _Sum:
            onprem_gpu_s = sum(r.onprem_gpu_s for _, r in rest)
            burst_gpu_s = sum(r.burst_gpu_s for _, r in rest)
            gpu_s = onprem_gpu_s + burst_gpu_s
            measured_gpu_s = sum(r.measured_gpu_s for _, r in rest)
            used_gpu_s = sum(r.used_gpu_s for _, r in rest)

        rows.append(_Sum())
    fig, ax = plt.subplots(figsize=(max(8.0, 0.5 * len(rows) + 4), 5), dpi=110)
    x = list(range(len(rows)))
    onprem = [r.onprem_gpu_s / 3600 for r in rows]
    burst = [r.burst_gpu_s / 3600 for r in rows]
    ax.bar(x, onprem, color="#8fb3d9", label="on-prem GPU-h allocated", width=0.8)
    ax.bar(x, burst, bottom=onprem, color="#f2b27a", label="burst GPU-h allocated", width=0.8)
    # The used share, spread over each part in proportion (a job's measured use is per job).
    used_on = [(r.used_gpu_s / r.gpu_s) * a if r.gpu_s else 0.0 for r, a in zip(rows, onprem)]
    used_burst = [(r.used_gpu_s / r.gpu_s) * b if r.gpu_s else 0.0 for r, b in zip(rows, burst)]
    ax.bar(x, used_on, color="#2f5d8a", hatch="//", edgecolor="white", width=0.8,
           label="used (measured), on-prem")
    ax.bar(x, used_burst, bottom=onprem, color="#b5601c", hatch="//", edgecolor="white",
           width=0.8, label="used (measured), burst")
    ticks = [f"{name}\n{'unknown' if r.measured_gpu_s <= 0 else f'{100 * r.used_gpu_s / r.measured_gpu_s:.0f}% used'}"
             for name, r in zip(labels, rows)]
    ax.set_xticks(x, ticks, rotation=90 if len(rows) > 12 else 0, fontsize="small")
    ax.set_ylabel("GPU-hours")
    ax.set_title(f"GPU-hours by {by}: allocated on-prem and burst, measured use shaded")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


__all__ = ["render_usage", "usage_main", "write_usage_chart"]
