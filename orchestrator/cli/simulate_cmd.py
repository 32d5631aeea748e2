"""`burst simulate`: what a policy would have done on a real trace, next to the baselines."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import err, fail, line, load_policies, out, policy_files, print_json


def simulate_command(
    trace: Annotated[str, typer.Option("--trace", "-t", help="itp | philly | alibaba | itp-sample (bundled) | a canonical CSV file (job_id,submit_s,duration_s,gpus,project,priority).")] = "itp-sample",
    policy: Annotated[list[Path] | None, typer.Option("--policy", "-p", help="Policy file (repeatable; each is one run); default: the files in BURST_POLICY_FILES, else the shipped default policy.")] = None,
    baselines: Annotated[bool, typer.Option("--baselines", help="Also run never, greedy, threshold and the clairvoyant reference.")] = False,
    onprem_gpus: Annotated[str, typer.Option("--onprem-gpus", help="On-prem GPUs: N, pNN (that percentile of the trace's concurrent GPU demand) or 'policy' (the policy's pool.onprem).")] = "p70",
    node_gpus: Annotated[int | None, typer.Option("--node-gpus", help="GPUs per on-prem node (default: the policy's pool.onprem.gpus_per_node).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the sim provider's boot times, capacity errors and interruptions.")] = 0,
    slo: Annotated[str, typer.Option("--slo", help="Queue-wait SLO, e.g. 30m.")] = "30m",
    tick: Annotated[str, typer.Option("--tick", help="Virtual time between planner ticks.")] = "1m",
    onprem_backfill: Annotated[str, typer.Option("--onprem-backfill", help="On-prem scheduler: easy (a job that does not fit reserves the nodes that free first; later jobs may not delay it), slurm (Slurm's main scheduler and backfill pass: every tested job that does not fit reserves) or first-fit (it is skipped).")] = "easy",
    bf_max_job_test: Annotated[int, typer.Option("--bf-max-job-test", help="slurm backfill: pending jobs a pass tests (Slurm's bf_max_job_test).")] = 100,
    bf_reservations: Annotated[int, typer.Option("--bf-reservations", help="slurm backfill: how many blocked jobs a pass reserves for (Slurm: every one it tests; fewer replays faster).")] = 8,
    bf_interval: Annotated[str, typer.Option("--bf-interval", help="slurm backfill: the least time between two backfill passes (Slurm's bf_interval).")] = "30s",
    threshold: Annotated[int, typer.Option("--threshold", help="N of the threshold baseline (pending minus free on-prem GPUs).")] = 64,
    boot_median: Annotated[str, typer.Option("--boot-median", help="Median launch-to-ready time of a burst node.")] = "3m20s",
    capacity_error_rate: Annotated[float, typer.Option("--capacity-error-rate", help="Probability that a spot launch fails for lack of capacity.")] = 0.0,
    interruption_rate: Annotated[float, typer.Option("--interruption-rate", help="Spot interruptions per running spot node-hour.")] = 0.0,
    roi: Annotated[bool, typer.Option("--roi", help="Also replay on-prem only and report each policy run's return on burst spend: waiting avoided exactly and as the planner predicted it (one more replay).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object with a `runs` list.")] = False,
    png: Annotated[Path | None, typer.Option("--png", help="Write a chart of queue depth, burst nodes and cumulative cost per run.")] = None,
) -> None:
    """Replay a job trace against policies (and baselines) on a virtual clock, with the
    production planner deciding every tick; compare cost and queue wait."""
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    from orchestrator.policy.units import parse_duration
    from orchestrator.sim import SimOptions, SimulationError, TraceError, load_trace, simulate
    from orchestrator.sim.world import Backfill

    def seconds(option: str, value: str) -> float:
        try:
            return parse_duration(value).total_seconds()
        except ValueError as exc:
            fail(f"{option}: {exc}")

    slo_s = seconds("--slo", slo)
    tick_s = seconds("--tick", tick)
    boot_s = seconds("--boot-median", boot_median)
    bf_interval_s = seconds("--bf-interval", bf_interval)
    if bf_max_job_test < 1:
        fail(f"--bf-max-job-test must be at least 1, got {bf_max_job_test}")
    if bf_reservations < 0:
        fail(f"--bf-reservations must not be negative, got {bf_reservations}")
    if tick_s <= 0:
        fail("--tick must be longer than 0s")
    if node_gpus is not None and node_gpus < 1:
        fail(f"--node-gpus must be at least 1, got {node_gpus}")
    try:
        backfill = Backfill(onprem_backfill)
    except ValueError:
        fail(f"--onprem-backfill must be one of {', '.join(b.value for b in Backfill)}, "
             f"got {onprem_backfill!r}")
    paths = policy_files(policy)
    policies = load_policies(paths)
    stems = [p.stem for p in paths]
    names = [s if stems.count(s) == 1 else f"{s}:{p.name}" for s, p in zip(stems, policies)]
    try:
        jobs = load_trace(trace)
    except TraceError as exc:
        fail(str(exc))
    boot = {"median_s": boot_s}
    if boot_s < 60:
        boot["min_s"] = boot_s  # a short median (tests, what-ifs) lowers the floor with it
    if boot_s > 900:
        boot["max_s"] = boot_s
    options = SimOptions(
        seed=seed, slo_s=slo_s, tick_s=tick_s, onprem=onprem_gpus, node_gpus=node_gpus,
        threshold=threshold, boot=boot, backfill=backfill, roi=roi,
        bf_max_job_test=bf_max_job_test, bf_reservations=bf_reservations,
        bf_interval_s=bf_interval_s,
        rates={"spot_capacity_error": capacity_error_rate,
               "interruptions_per_hour": interruption_rate})
    runs = list(zip(names, policies))
    labels = (["on-prem only (--roi)"] if roi else []) + names + (
        ["never", "greedy", "threshold", "clairvoyant"] if baselines else [])
    # markup=False: a run's name is a file name, and `[x]` in it must not be read as a tag.
    with Progress(TextColumn("{task.description:<14}", style="bold", markup=False), BarColumn(), TaskProgressColumn(),
                  TimeElapsedColumn(), console=err.get(), transient=True,
                  disable=not err.is_terminal) as bar:
        tasks = {label: bar.add_task(label, total=1.0) for label in labels}

        def progress(name: str, fraction: float) -> None:
            if name in tasks:
                bar.update(tasks[name], completed=min(max(fraction, 0.0), 1.0))

        try:
            result = simulate(jobs, runs, baselines=baselines, options=options, progress=progress)
        except SimulationError as exc:
            fail(str(exc))
    if png is not None:
        from orchestrator.sim.chart import write_chart

        try:
            write_chart(result, png)
        except OSError as exc:
            fail(f"--png {png}: cannot write: {exc.strerror or exc}")
    if as_json:
        print_json(result.data)
        return
    render(result.data)
    if png is not None:
        line(f"chart written to {png}")


def _money(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:,.0f}" if value >= 100 or value == 0 else f"${value:,.2f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _dur(seconds: float) -> str:
    """A wait, compactly: 45s, 12m, 5.2h, 8.2d."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def render(data: dict) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    trace, onprem = data["trace"], data["onprem"]
    head = Text()
    head.append("trace", style="bold")
    head.append(f" {trace['name']}: {trace['jobs']:,} jobs, "
                f"{trace['gpu_hours']:,.0f} GPU-hours over {_dur(trace['span_s'])}; ")
    head.append("on-prem", style="bold")
    head.append(f" {onprem['nodes']} x {onprem['gpus_per_node']} = "
                f"{onprem['gpus']:,} GPUs ({onprem['sizing']}; {onprem['backfill']} backfill); ")
    head.append("wait SLO", style="bold")
    head.append(f" {_dur(data['slo_s'])}; tick {_dur(data['tick_s'])}; seed {data['seed']}")
    line(head)
    cost = Table(title="cloud cost and use", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("run", "cloud\ncost", "x\nclv", "cloud\nGPUh", "onprem\nGPUh", "nodes\nlaunched",
                   "peak\nnodes", "burst\nutil", "idle\ncost"):
        cost.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
    wait = Table(title="queue wait", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("run", "wait\np50", "p95", "p99", "max", "SLO\njobs", "SLO\nGPUh", "over\n3x SLO",
                   "never\nran"):
        wait.add_column(column, justify="left" if column == "run" else "right", no_wrap=True)
    for run in data["runs"]:
        ratio = run.get("cost_vs_clairvoyant")
        cost.add_row(
            run["name"], _money(run["cloud_cost_usd"]),
            "-" if ratio is None else f"{ratio:.2f}", f"{run['cloud_gpu_hours']:,.0f}",
            f"{run['onprem_gpu_hours']:,.0f}",
            "-" if run["launches"] is None else f"{run['launches']:,}",
            "-" if run.get("peak_burst_nodes") is None else f"{run['peak_burst_nodes']:,}",
            _pct(run["burst_utilisation"]), _money(run["idle_burst_cost_usd"]))
        wait.add_row(
            run["name"], _dur(run["wait_p50_s"]), _dur(run["wait_p95_s"]),
            _dur(run["wait_p99_s"]), _dur(run["wait_max_s"]), _pct(run["slo_attainment"]),
            _pct(run["slo_attainment_gpu_hours"]), f"{run['jobs_over_3x_slo']:,}",
            f"{run['jobs_unfinished']:,}")
    out.print(cost)
    out.print(wait)
    line("x clv: cloud cost over the clairvoyant reference's; util: burst GPU time running jobs "
         "over GPU time billed; idle cost: what the unused part cost")
    for run in data["runs"]:
        held = run.get("held_back_by")
        if held:
            limits = ", ".join(f"{k} ({v:,} ticks)" for k, v in held.items())
            line(f"{run['name']}: launches held back by {limits}")
    for run in data["runs"]:
        if run.get("staged_gb"):
            line(f"{run['name']}: staged {run['staged_gb']:,.0f} GB to the cloud "
                 f"({run['staging_hours']:,.1f} h of staging on burst nodes), egress "
                 f"{_money(run['egress_usd'])} on top of the cloud cost")
    unfinished = [(r["name"], r["jobs_unfinished"]) for r in data["runs"] if r["jobs_unfinished"]]
    for name, count in unfinished:
        line(f"{name}: {count:,} job(s) never ran (no capacity it could use would fit them); "
             "their wait counts up to the end of the run", style="yellow")
    for run in data["runs"]:
        roi = run.get("roi")
        if roi:
            error = roi["prediction_error_h"]
            line(f"{run['name']}: return on burst spend: {roi['burst_jobs']:,} burst job(s), "
                 f"{_money(roi['burst_cost_usd'])}, waiting avoided {roi['hours_avoided_exact']:,.1f} h "
                 f"exactly ({_money(roi['usd_per_hour_avoided_exact'])}/h), "
                 f"{roi['hours_avoided_predicted']:,.1f} h as predicted for "
                 f"{roi['predicted_jobs']:,} job(s) (per-job error median "
                 f"{error['median_abs']:.2f} h, p90 {error['p90_abs']:.2f} h)")
    projects = sorted({p for r in data["runs"] for p in r["projects"]})
    if 1 < len(projects) <= 16:
        per = Table(title="SLO attainment by project (jobs / GPU-hours)")
        per.add_column("project")
        for run in data["runs"]:
            per.add_column(run["name"], justify="right")
        for project in projects:
            cells = []
            for run in data["runs"]:
                p = run["projects"].get(project)
                cells.append("-" if p is None else
                             f"{_pct(p['slo_attainment'])} / {_pct(p['slo_attainment_gpu_hours'])}")
            per.add_row(project, *cells)
        out.print(per)
