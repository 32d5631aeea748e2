"""Benchmark: the tick at a site of bench_scale's size under the collector's settings, and the
queue read against its floor. Prints figures; not a test.

    python bench/tick_parts.py [--pending 100000] [--nodes 10000] [--ticks 5] [--pg [URL]] [--parts]

Builds the store as ``bench/bench_scale.py`` does (SQLite in a temporary directory, or with
``--pg`` a fresh PostgreSQL database, dropped after), then in one process times ``--ticks``
planning passes (10 s apart, median CPU) with CPython's default collector thresholds, with
burst's (``orchestrator.gctune``) and with the collector off, in that order; and
``Store.queue_read`` next to the plain ``SELECT`` of the pending rows. ``--parts``: instead, the
CPU of each part of a tick (dispatch and its read, the roll-up and its reads, the snapshot's
reads, ``plan()``, the executor), each timed where the pass calls it.
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

from orchestrator.gctune import THRESHOLDS
from orchestrator.tick import planning_pass, roll_up_costs


def _median_cpu(fn, n: int) -> float:
    samples = []
    for _ in range(n):
        began = time.process_time()
        fn()
        samples.append(time.process_time() - began)
    return statistics.median(samples) * 1000


def _parts(rt, tick, label: str, args: argparse.Namespace) -> None:
    """The CPU of each part of a tick under burst's thresholds (mean of ``--ticks``): the
    functions a pass calls, each timed where it is called (nested parts indented)."""
    import orchestrator.tick as tick_module

    spent: dict[str, float] = {}
    undo = []

    def timed(owner: object, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            began = time.process_time()
            try:
                return original(*a, **k)
            finally:
                spent[label] = spent.get(label, 0.0) + time.process_time() - began

        setattr(owner, name, wrapper)
        undo.append((owner, name, original))

    queue, observer, store = type(rt.queue), type(rt.observer), type(rt.store)
    for owner, name, what in (
            (queue, "dispatch", "on-prem dispatch, with the one read of the queue"),
            (store, "queue_read", "  Store.queue_read"),
            (tick_module, "roll_up_costs", "cost roll-up"),
            (store, "ledger_candidates", "  Store.ledger_candidates"),
            (store, "burst_job_usages", "  Store.burst_job_usages (runs on burst nodes)"),
            (store, "write_ledgers", "  Store.write_ledgers"),
            (observer, "snapshot", "snapshot"),
            (store, "node_fields", "  Store.node_fields (the nodes' rows)"),
            (store, "tick_nodes", "  Store.tick_nodes (the nodes' rows, once a tick)"),
            (queue, "node_usage", "  node_usage"),
            (queue, "burst_runs", "  burst_runs (runs on burst nodes)"),
            (observer, "budget_spend", "  budget_spend"),
            (tick_module, "make_plan", "plan()"),
            (type(rt.executor), "execute", "execute")):
        if hasattr(owner, name):
            timed(owner, name, what)
    gc.set_threshold(*THRESHOLDS)
    try:
        began = time.process_time()
        for _ in range(args.ticks):
            tick()
        total = (time.process_time() - began) * 1000 / args.ticks
    finally:
        for owner, name, original in undo:
            setattr(owner, name, original)
    print(f"== {label}: {args.pending:,} pending, {args.nodes:,} nodes; CPU of each part, mean "
          f"of {args.ticks} ticks: {total:.0f} ms a tick")
    for what, seconds in spent.items():
        print(f"  {what:54} {seconds * 1000 / args.ticks:7.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--pg", nargs="?", const=b.PG_DEFAULT, default=None)
    parser.add_argument("--parts", action="store_true",
                        help="instead of the collector settings: the CPU of each part of a tick")
    args = parser.parse_args()
    args.no_sqlite = args.pg is not None
    for store, label in bench_report.each_store(args, "tick-parts"):
        b.build_site(store, args.pending, args.nodes, 0, random.Random(42))
        with tempfile.TemporaryDirectory(prefix="tick-parts-") as state:
            rt, policy = b.bench_runtime(store, state)
            at = [b.NOW + b.TICK]
            roll_up_costs(rt, at[0], skip_fresh=True)

            def tick() -> None:
                at[0] += b.TICK
                planning_pass(rt, [policy], at[0], rt.executor.execute)

            tick()
            if args.parts:
                _parts(rt, tick, label, args)
                continue
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
