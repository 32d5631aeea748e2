"""`burst demo`: run a whole burst cycle on the embedded defaults with live progress."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Annotated

import typer

from orchestrator.cli.common import DEFAULT_POLICY, err, fail, line, load_policies, out, print_json


def demo_command(
    policy: Annotated[Path | None, typer.Option("--policy", "-p", help="Policy to demo (default: the shipped default).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON summary object instead.")] = False,
    timeout: Annotated[float, typer.Option("--timeout", help="Give up after this many seconds.")] = 240.0,
    fabric: Annotated[str, typer.Option(
        "--fabric", help="builtin: the built-in queue's cycle; torch: a burst node joins and "
        "drains out of a running PyTorch elastic job (needs torch).")] = "builtin",
    keep_state: Annotated[Path | None, typer.Option(
        "--keep-state", help="Keep the demo's state in this new or empty directory (default: a "
        "temporary one, deleted at the end), to read its decisions afterwards with "
        "BURST_STATE_DIR=DIR burst decisions / explain.")] = None,
) -> None:
    """Run a whole burst cycle (spike -> launch -> join -> run -> drain -> terminate) in ~1 minute."""
    from rich.live import Live

    from orchestrator.demo import SPIKE

    if fabric not in ("builtin", "torch"):
        fail(f"--fabric: {fabric!r} is not builtin or torch")
    kept = _state_dir(keep_state) if keep_state is not None else None
    if fabric == "torch":
        _torch_demo(as_json, timeout, kept)
        return

    # The demo needs a local-provider policy: the shipped default unless -p names one (never
    # BURST_POLICY_FILES, which names what the control plane runs).
    [chosen] = load_policies([policy] if policy else [DEFAULT_POLICY])
    logging.basicConfig(level=logging.ERROR)
    if as_json:
        summary = _run(chosen, None, timeout, kept)
        print_json({**summary.to_json(), **({"state_dir": str(kept)} if kept else {})})
    else:
        err.print(f"burst demo: policy {chosen.name!r}, on-prem {chosen.pool.onprem.total_gpus} GPUs, "
                  f"spike of {len(SPIKE)} jobs / {sum(g for _, g, _ in SPIKE)} GPUs; "
                  "timings shortened to seconds for the demo")
        progress = _Progress()
        if err.is_terminal:
            with Live(progress.render(), console=err.get(), refresh_per_second=4,
                      transient=False) as live:
                def on_tick(runtime, report) -> None:
                    progress.update(runtime, report)
                    live.update(progress.render())
                summary = _run(chosen, on_tick, timeout, kept)
        else:
            # Piped or redirected: no live view (it would be cropped to the pipe's 80 columns and
            # end without a newline, gluing the summary's title to its last line). Each event is
            # one whole line as it happens, then the final counts.
            def on_tick(runtime, report) -> None:
                progress.update(runtime, report)
                for event in progress.take_new():
                    line(event, stderr=True)
            summary = _run(chosen, on_tick, timeout, kept)
            line(progress.head(), stderr=True)
        _print_summary(summary, kept)
    if summary.timed_out or summary.leftover_processes or summary.nodes_launched == 0:
        raise typer.Exit(1)


def _state_dir(path: Path) -> Path:
    """--keep-state's directory, absolute (the printed hint works from any directory); it must be
    new or empty, so that the demo's decisions and jobs are the only ones in it."""
    path = path.expanduser().absolute()
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        fail(f"--keep-state: {path} {'is not a directory' if not path.is_dir() else 'is not empty'}; "
             "name a new or empty directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"--keep-state: cannot create {path}: {exc.strerror or exc}")
    return path


def _run(policy, on_tick, timeout: float, kept: Path | None):
    from orchestrator.demo import run_demo
    from orchestrator.wiring import ProviderUnavailable

    try:
        return run_demo(policy, on_tick=on_tick, timeout_s=timeout, keep_state=kept)
    except ProviderUnavailable as exc:
        fail(f"{exc} (the demo needs a policy whose offerings use provider: local)")


class _Progress:
    """The live view: queue, nodes and the latest decision."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lines: list[str] = []
        self.launches: list[str] = []  # kept whole: the launches are the point of the demo
        self.nodes: list = []
        self.counts: dict[str, int] = {}
        self.elapsed = 0.0
        self.first = None
        self._new: list[str] = []  # events not yet taken by take_new()

    def update(self, runtime, report) -> None:
        from orchestrator.domain.jobs import JobState, Placement

        jobs = runtime.store.jobs()
        with self._lock:
            self.first = self.first or report.at
            self.elapsed = (report.at - self.first).total_seconds()
            self.counts = {
                "pending": sum(j.state is JobState.PENDING for j in jobs),
                "on-prem": sum(j.state is JobState.RUNNING and j.placement is Placement.ONPREM for j in jobs),
                "burst": sum(j.state is JobState.RUNNING and j.placement is Placement.BURST for j in jobs),
                "done": sum(j.state is JobState.DONE for j in jobs),
            }
            self.nodes = runtime.store.nodes(include_terminated=True)
            for d in report.decisions:
                if d.actions and any(a != "hold" for a in d.actions):
                    event = f"[{self.elapsed:5.1f}s] {d.rule}: {d.summary}"
                    (self.launches if d.rule in ("scale-up", "min-nodes") else self.lines).append(event)
                    self._new.append(event)
            for n in report.execution.drained:
                self.lines.append(f"[{self.elapsed:5.1f}s] draining {n}")
                self._new.append(self.lines[-1])
            self.lines = self.lines[-6:]

    def take_new(self) -> list[str]:
        """The events since the last call, oldest first."""
        with self._lock:
            new, self._new = self._new, []
        return new

    def head(self) -> str:
        with self._lock:
            return f"t={self.elapsed:5.1f}s  jobs: " + "  ".join(f"{k} {v}" for k, v in self.counts.items())

    def render(self):
        from rich.console import Group
        from rich.table import Table
        from rich.text import Text

        from orchestrator.domain.nodes import NodeState

        with self._lock:
            head = Text(f"t={self.elapsed:5.1f}s  jobs: " + "  ".join(f"{k} {v}" for k, v in self.counts.items()))
            table = Table(box=None, pad_edge=False)
            for col in ("node", "state", "type", "$/h"):
                table.add_column(col)
            colours = {NodeState.READY: "green", NodeState.DRAINING: "yellow", NodeState.TERMINATED: "dim",
                       NodeState.FAILED: "red"}
            for n in self.nodes:
                c = colours.get(n.state, "cyan")
                table.add_row(n.id, Text(str(n.state), style=c), f"{n.instance_type} ({n.market})",
                              f"{n.price_usd_hour:.2f}")
            return Group(head, table, Text("\n".join(self.launches[-4:] + self.lines)))


def explain_hint(state_dir: Path, decision_id: str) -> str:
    """The command that shows a kept demo's launch decision (shell-quoted, runnable as printed)."""
    import shlex

    return f"BURST_STATE_DIR={shlex.quote(str(state_dir))} burst explain {shlex.quote(decision_id)}"


def _print_summary(s, kept: Path | None = None) -> None:
    from rich.table import Table

    table = Table(title="burst demo summary", show_header=False)
    rows = [
        ("jobs run on-prem / burst", f"{s.jobs_onprem} / {s.jobs_burst} (of {s.jobs_total})"),
        ("queue wait p50 / p95 / max", f"{s.wait_p50_s:.1f}s / {s.wait_p95_s:.1f}s / {s.wait_max_s:.1f}s"),
        ("burst nodes launched / terminated / failed", f"{s.nodes_launched} / {s.nodes_terminated} / {s.nodes_failed}"),
        ("burst node-minutes", f"{s.burst_node_minutes:.2f}"),
        ("burst cost at policy prices", f"${s.cost_usd:.4f}"),
        ("on-prem GPU-hours (amortised cost)", f"{s.onprem_gpu_hours:.4f} (${s.onprem_cost_usd:.4f})"),
        ("decisions recorded", str(s.decisions)),
        ("wall time", f"{s.wall_s:.1f}s"),
        ("processes left behind", str(s.leftover_processes)),
    ]
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)
    # The hint only where it works: without --keep-state the demo's state is deleted by now.
    if s.launch_decisions and kept is not None:
        line(f"why it launched: {explain_hint(kept, s.launch_decisions[0])}")
    elif s.launch_decisions:
        line("to read why it launched afterwards, run it with --keep-state DIR")
    if s.timed_out:
        line("the demo timed out before the cycle completed", style="red")


def _torch_demo(as_json: bool, timeout: float, kept: Path | None) -> None:
    """`burst demo --fabric torch`: the elastic job, its burst node's join and checkpoint drain."""
    import importlib.util

    from orchestrator.demo import run_torch_demo

    if importlib.util.find_spec("torch") is None:
        fail("burst demo --fabric torch needs PyTorch: pip install 'burst[train]'")
    logging.basicConfig(level=logging.ERROR)
    if not as_json:
        err.print("burst demo --fabric torch: a PyTorch elastic job (CPU, gloo) trains on an "
                  "on-prem node; a burst node joins it and later drains out through the "
                  "checkpoint hook. Timings shortened to seconds.")
    summary = run_torch_demo(on_event=None if as_json else err.print, timeout_s=timeout,
                             keep_state=kept)
    if as_json:
        print_json(summary.to_json())
    else:
        from rich.table import Table

        table = Table(title="burst demo --fabric torch", show_header=False)
        for key, value in (
            ("world size over time", " -> ".join(str(w) for w in summary.world_sizes)),
            ("steps (contiguous, none lost or redone)", f"{summary.steps} ({summary.contiguous})"),
            ("drain checkpoint at step / last step in the larger world",
             f"{summary.checkpoint_step} / {summary.last_step_in_larger_world}"),
            ("loss, first 5 -> last 5 steps", f"{summary.loss_first:.4f} -> {summary.loss_last:.6f}"),
            ("join (instance launched -> training)", f"{summary.join_s}s"),
            ("drain (ordered -> released)", f"{summary.drain_s}s ({summary.release_reason})"),
            ("restarts of the survivors", str(summary.restarts)),
            ("wall time", f"{summary.wall_s:.1f}s"),
            ("processes left behind", str(summary.leftover_processes)),
        ):
            table.add_row(key, value)
        out.print(table)
    if not summary.ok:
        raise typer.Exit(1)
