"""The ``--png`` chart of a simulation: queue depth, burst nodes and cumulative cloud cost over
time, one line per run (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.sim.replay import SimResult


def write_chart(result: SimResult, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    data = result.data
    fig, axes = plt.subplots(3, 1, figsize=(11, 8.5), sharex=True, constrained_layout=True)
    depth, nodes, cost = axes
    for run in data["runs"]:
        name = run["name"]
        samples = result.series.get(name) or []
        if not samples:
            continue
        days = [s.t / 86400.0 for s in samples]
        style = {"linestyle": "--"} if run["kind"] == "baseline" else {}
        if name != "clairvoyant":
            depth.plot(days, [s.pending for s in samples], label=name, linewidth=1.0, **style)
            nodes.plot(days, [s.nodes for s in samples], label=name, linewidth=1.0, **style)
        cost.plot(days, [s.cost_usd for s in samples], label=f"{name} (${run['cloud_cost_usd']:,.0f})",
                  linewidth=1.2, **style)
    trace = data["trace"]
    onprem = data["onprem"]
    fig.suptitle(f"burst simulate: trace {trace['name']} ({trace['jobs']:,} jobs), on-prem "
                 f"{onprem['gpus']:,} GPUs, wait SLO {data['slo_s'] / 60:g} min")
    depth.set_ylabel("jobs pending")
    nodes.set_ylabel("burst nodes alive")
    cost.set_ylabel("cloud cost so far (USD)")
    cost.set_xlabel("days from the start of the trace")
    for axis in axes:
        axis.grid(True, alpha=0.3)
    depth.legend(loc="upper right", fontsize="small")
    cost.legend(loc="upper left", fontsize="small")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
