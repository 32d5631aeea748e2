"""Benchmark: the tick at a site of bench_scale's size under the collector's settings, and the
queue read against its floor. Prints figures; not a test.

    python bench/tick_parts.py [--pending 100000] [--nodes 10000] [--ticks 5] [--pg [URL]]

Builds the store as ``bench/bench_scale.py`` does (SQLite in a temporary directory, or with
``--pg`` a fresh PostgreSQL database, dropped after), then in one process times ``--ticks``
planning passes (10 s apart, median CPU) with CPython's default collector thresholds, with
burst's (``orchestrator.gctune``) and with the collector off, in that order; and
``Store.queue_read`` next to the plain ``SELECT`` of the pending rows.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time

import bench_report
import bench_scale as b
import yaml

from orchestrator.gctune import THRESHOLDS
from orchestrator.policy import load_policy_text
from orchestrator.tick import planning_pass, roll_up_costs
from orchestrator.wiring import Settings, build_runtime
from providers.sim import SimProvider


def _median_cpu(fn, n: int) -> float:
    samples = []
    for _ in range(n):
        began = time.process_time()
        fn()
        samples.append(time.process_time() - began)
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--pg", nargs="?", const=b.PG_DEFAULT, default=None)
    args = parser.parse_args()
    args.no_sqlite = args.pg is not None
    for store, label in bench_report.each_store(args, "tick-parts"):
        b.build_site(store, args.pending, args.nodes, 0, random.Random(42))
        doc = b.policy_doc()
        policy = load_policy_text(yaml.safe_dump(doc), "bench")
        clock = b.FixedClock()
        with tempfile.TemporaryDirectory(prefix="tick-parts-") as state:
            rt = build_runtime(Settings(state_dir=state), [policy], clock=clock, store=store,
                               providers={"sim": SimProvider(catalogue=b.sim_offerings(doc),
                                                             clock=clock)})
            at = [b.NOW + b.TICK]
            roll_up_costs(rt, at[0], skip_fresh=True)

            def tick() -> None:
                at[0] += b.TICK
                planning_pass(rt, [policy], at[0], rt.executor.execute)

            tick()
            print(f"== {label}: {args.pending:,} pending, {args.nodes:,} nodes; "
                  f"median CPU of {args.ticks} ticks")
            gc.set_threshold(700, 10, 10)
            print(f"  tick, CPython's thresholds (700, 10, 10)  {_median_cpu(tick, args.ticks):7.0f} ms")
            gc.set_threshold(*THRESHOLDS)
            print(f"  tick, burst's thresholds {THRESHOLDS}    {_median_cpu(tick, args.ticks):7.0f} ms")
            gc.disable()
            print(f"  tick, collector off                       {_median_cpu(tick, args.ticks):7.0f} ms")
            gc.enable()
            floor = b.read_floor(store)
            print(f"  floor: plain SELECT of the pending rows   {_median_cpu(floor, 5):7.0f} ms")
            print(f"  Store.queue_read                          "
                  f"{_median_cpu(lambda: store.queue_read(b.NOW), 5):7.0f} ms")


if __name__ == "__main__":
    main()
