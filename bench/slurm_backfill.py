"""Benchmark: the on-prem scheduler model (orchestrator/planner/backfill.py) against real Slurm.

    python bench/slurm_backfill.py                          # 320 ITP jobs, 8 nodes x 4 GPUs, ~12 min
    python bench/slurm_backfill.py --jobs 40 --nodes 2      # a quick look

Needs root and the Slurm packages (.ci/run installs them). A slice of a real trace (consecutive
jobs of one ITP cluster, ``$BURST_TRACE_DIR``, default ../shared/data) is replayed through a
private Slurm mini-cluster (infra/slurm/minicluster.py, on its own ports) running
``sched/backfill``: each job is submitted at its scaled submit time as ``sleep`` for its scaled
duration, with ``--gres=gpu:N`` (one node) or ``--nodes=K --gres=gpu:4`` (wider: whole nodes),
and a time limit of its runtime rounded up to whole minutes (Slurm plans with minutes). Slurm's
own record (jobcomp) gives each job's submit, start and end.

The model then replays the same jobs (Slurm's recorded submits and run lengths, the same time
limits and node shapes) as an event simulation: the main scheduler (:func:`fifo_pass`) at every
job event and a backfill pass (:func:`backfill_pass`, every tested job reserved, as Slurm does)
every ``bf_interval``. Printed: the median and p90 absolute error of each job's start, and the
share of jobs within one scheduling interval plus 5 % of their wait (the issue's target is p90).
"""

from __future__ import annotations

import argparse
import csv
import heapq
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.planner.backfill import (BackfillConfig, NodeSpace, PendingJob,  # noqa: E402
                                           backfill_pass, fifo_pass)

NODE_GPUS = 4  # the mini-cluster's nodes (infra/slurm/slurm.conf.in)


@dataclass(frozen=True)
class SliceJob:
    name: str
    submit_s: float  # scaled, from the slice's first submit
    runtime_s: int
    gpus: int

    @property
    def nodes(self) -> int:
        return max(math.ceil(self.gpus / NODE_GPUS), 1)

    @property
    def limit_min(self) -> int:  # runtime + launch slack, in whole minutes
        return max(math.ceil((self.runtime_s + 5) / 60), 1)


@dataclass(frozen=True)
class Observed:
    job: SliceJob
    submit: int  # Slurm's epoch seconds
    start: int
    end: int


def load_slice(cluster: str, jobs: int, skip: int, scale: float, cap_s: int,
               max_gpus: int) -> list[SliceJob]:
    """``jobs`` consecutive jobs (by submit time, after ``skip``) no wider than ``max_gpus``,
    submit times and durations divided by ``scale`` (durations at least 1 s, at most ``cap_s``)."""
    base = Path(os.environ.get("BURST_TRACE_DIR", ROOT.parent / "shared" / "data"))
    path = base / "microsoft-itp-elasticflow-traces" / "raw-traces" / f"cluster{cluster}.csv"
    with path.open(newline="") as handle:
        rows = sorted((int(r["submission_time"]), int(r["duration"]), int(r["num_gpu"]), r["job_id"])
                      for r in csv.DictReader(handle))
    rows = [r for r in rows if 1 <= r[2] <= max_gpus][skip:skip + jobs]
    first = rows[0][0]
    return [SliceJob(f"j{i:04d}", (submit - first) / scale,
                     min(max(round(duration / scale), 1), cap_s), gpus)
            for i, (submit, duration, gpus, _) in enumerate(rows)]


# -- real Slurm ------------------------------------------------------------------------------


def run_slurm(jobs: list[SliceJob], nodes: int, bf_interval: int, base: Path,
              log=print, timeout_s: float = 3600.0) -> list[Observed]:
    """Replay ``jobs`` through a private mini-cluster; Slurm's record of each job. ``base``
    must be a short path (Slurm's socket paths under it are limited to 108 bytes)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("burst_minicluster",
                                                  ROOT / "infra" / "slurm" / "minicluster.py")
    mc = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules.setdefault("burst_minicluster", mc)
    mc = sys.modules["burst_minicluster"]
    if not hasattr(mc, "MiniCluster"):
        spec.loader.exec_module(mc)  # type: ignore[union-attr]

    class Cluster(mc.MiniCluster):
        def render(self) -> None:
            super().render()
            conf = self.conf.read_text()
            conf = re.sub(r"^SchedulerParameters=.*$",
                          f"SchedulerParameters=sched_interval=1,bf_interval={bf_interval},"
                          "bf_resolution=1,bf_max_job_test=1000,bf_continue", conf, flags=re.M)
            conf = conf.replace("MinJobAge=300", "MinJobAge=600")
            self.conf.write_text(conf)

    cluster = Cluster(base, onprem_nodes=nodes, burst_slots=1,
                      ports=mc.Ports(ctld=16817, slurmd=16818, onprem=27001, burst=27901))
    cluster.start(timeout_s=60)
    try:
        began = time.time()
        for index, job in enumerate(jobs):
            delay = began + job.submit_s - time.time()
            if delay > 0:
                time.sleep(delay)
            gres = min(job.gpus, NODE_GPUS) if job.nodes == 1 else NODE_GPUS
            cluster.run("sbatch", "--parsable", "-J", job.name, "-p", "gpu", "-N", str(job.nodes),
                        "--ntasks-per-node=1", f"--gres=gpu:{gres}", "-t", str(job.limit_min),
                        "-o", "/dev/null", "--wrap", f"sleep {job.runtime_s}")
            if index % 50 == 49:
                log(f"  submitted {index + 1}/{len(jobs)} at +{time.time() - began:.0f} s")
        record = base / "log" / "jobcomp.txt"
        while True:
            done = _jobcomp(record)
            if len(done) >= len(jobs):
                break
            if time.time() - began > timeout_s:
                raise RuntimeError(f"only {len(done)} of {len(jobs)} jobs completed within "
                                   f"{timeout_s:.0f} s; see {base / 'log'}")
            time.sleep(2)
            if int(time.time() - began) % 60 == 0:
                log(f"  finished {len(done)}/{len(jobs)} at +{time.time() - began:.0f} s")
    finally:
        cluster.stop()
    by_name = {j.name: j for j in jobs}
    return sorted((Observed(by_name[name], *times) for name, times in done.items()),
                  key=lambda o: o.job.name)


def _jobcomp(path: Path) -> dict[str, tuple[int, int, int]]:
    """Finished jobs in Slurm's jobcomp file: name -> (submit, start, end) in epoch seconds."""
    out = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if fields.get("JobState") != "COMPLETED":
            continue

        def epoch(key: str) -> int:
            return int(datetime.fromisoformat(fields[key]).timestamp())

        out[fields["Name"]] = (epoch("SubmitTime"), epoch("StartTime"), epoch("EndTime"))
    return out


# -- the model -------------------------------------------------------------------------------


def predict(observed: list[Observed], nodes: int, bf_interval: float,
            config: BackfillConfig = BackfillConfig(1000, 1000)) -> dict[str, float]:
    """Each job's start under the model, replaying Slurm's recorded submits and run lengths."""
    jobs = sorted(observed, key=lambda o: (o.submit, o.job.name))
    t0 = jobs[0].submit
    events: list[tuple[float, int, int]] = []  # (time, 0 end / 1 arrival, index)
    for index, o in enumerate(jobs):
        heapq.heappush(events, (o.submit - t0, 1, index))
    pending: list[int] = []  # by submit order (Slurm's priority/basic: FIFO)
    running: dict[int, tuple[float, tuple[tuple[int, int], ...]]] = {}  # index -> (end, alloc)
    starts: dict[str, float] = {}
    next_pass = 0.0

    def space(now: float) -> NodeSpace:
        free = [NODE_GPUS] * nodes
        ends = []
        for index, (_, alloc) in running.items():
            o = jobs[index]
            started = starts[o.job.name]
            for node, used in alloc:
                free[node] -= used
                ends.append((node, started + 60 * o.job.limit_min, used))
        return NodeSpace([NODE_GPUS] * nodes, free, ends, now)

    def apply(now: float, started: list) -> None:
        for index, alloc in started:
            o = jobs[index]
            starts[o.job.name] = now
            running[index] = (now + (o.end - o.start), alloc)
            heapq.heappush(events, (now + (o.end - o.start), 0, index))
            pending.remove(index)

    def queue() -> list[PendingJob]:
        return [PendingJob(i, jobs[i].job.gpus if jobs[i].job.nodes == 1
                           else jobs[i].job.nodes * NODE_GPUS, 60.0 * jobs[i].job.limit_min)
                for i in pending]

    clock = 0.0
    while events or pending:
        event_at = events[0][0] if events else math.inf
        pass_at = max(next_pass, clock) if pending else math.inf
        if pass_at < event_at:  # a backfill pass (every bf_interval while work is pending)
            clock = pass_at
            apply(clock, backfill_pass(space(clock), queue(), config).started)
            next_pass = clock + bf_interval
            continue
        clock = event_at
        while events and events[0][0] == clock:
            _, kind, index = heapq.heappop(events)
            if kind == 0:
                running.pop(index, None)
            else:
                pending.append(index)
        apply(clock, fifo_pass(space(clock), queue()))
    return {name: t + t0 for name, t in starts.items()}


def compare(observed: list[Observed], predicted: dict[str, float], interval: float) -> dict:
    signed = sorted(o.start - predicted[o.job.name] for o in observed)
    errors = sorted(abs(e) for e in signed)
    waits = [o.start - o.submit for o in observed]
    within = sum(1 for o in observed
                 if abs(predicted[o.job.name] - o.start) <= interval + 0.05 * (o.start - o.submit))
    p90 = errors[min(int(0.9 * len(errors)), len(errors) - 1)]
    return {"jobs": len(observed), "median_signed_error_s": statistics.median(signed),
            "exact_share": sum(1 for e in errors if e <= 1) / len(errors),
            "median_error_s": statistics.median(errors), "p90_error_s": p90,
            "max_error_s": errors[-1], "median_wait_s": statistics.median(waits),
            "p90_wait_s": sorted(waits)[int(0.9 * (len(waits) - 1))],
            "share_within_target": within / len(observed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="02", help="ITP cluster number (01-10)")
    parser.add_argument("--jobs", type=int, default=320)
    parser.add_argument("--skip", type=int, default=1760, help="jobs of the cluster to skip first")
    parser.add_argument("--nodes", type=int, default=8, help="on-prem nodes of 4 GPUs")
    parser.add_argument("--scale", type=float, default=600.0, help="trace seconds per second")
    parser.add_argument("--cap", type=int, default=90, help="longest scaled runtime, s")
    parser.add_argument("--bf-interval", type=int, default=5, help="Slurm's bf_interval, s")
    parser.add_argument("--base", type=Path, default=None, help="the cluster's directory")
    args = parser.parse_args()

    jobs = load_slice(args.cluster, args.jobs, args.skip, args.scale, args.cap, args.nodes * NODE_GPUS)
    widths = statistics.multimode(j.gpus for j in jobs)
    print(f"slice: ITP cluster{args.cluster}, {len(jobs)} jobs from #{args.skip}, "
          f"{jobs[-1].submit_s:.0f} s of submits (1/{args.scale:g} scale), runtimes "
          f"{min(j.runtime_s for j in jobs)}-{max(j.runtime_s for j in jobs)} s (median "
          f"{statistics.median(j.runtime_s for j in jobs):.0f}), widths 1-{max(j.gpus for j in jobs)} "
          f"GPUs (mode {widths[0]}), {sum(j.nodes > 1 for j in jobs)} multi-node; "
          f"{args.nodes} nodes x {NODE_GPUS} GPUs; bf_interval {args.bf_interval} s")
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bbf-", dir="/tmp") as tmp:
        observed = run_slurm(jobs, args.nodes, args.bf_interval, args.base or Path(tmp))
    slurm_s = time.perf_counter() - began
    began = time.perf_counter()
    predicted = predict(observed, args.nodes, args.bf_interval)
    model_s = time.perf_counter() - began
    result = compare(observed, predicted, args.bf_interval)
    print(f"real Slurm replay {slurm_s:.0f} s; model replay {model_s:.2f} s")
    print(f"waits under Slurm: median {result['median_wait_s']:.0f} s, p90 {result['p90_wait_s']:.0f} s")
    print(f"start error |model - Slurm| over {result['jobs']} jobs: median "
          f"{result['median_error_s']:.1f} s, p90 {result['p90_error_s']:.1f} s, max "
          f"{result['max_error_s']:.0f} s; within {args.bf_interval} s + 5 % of the wait: "
          f"{100 * result['share_within_target']:.1f} % of jobs (target >= 90 %)")
    print(f"Slurm starts later than the model by a median {result['median_signed_error_s']:.1f} s; "
          f"{100 * result['exact_share']:.1f} % of starts within 1 s")


if __name__ == "__main__":
    main()
