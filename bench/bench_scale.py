"""Benchmark: a site of a real size in the store, each figure next to a floor measured in the same
run, so the ratios hold on any machine. Prints figures; not a test.

    python bench/bench_scale.py [--pending 100000] [--nodes 10000] [--lines 300000]
                                [--clients 8] [--seconds 5] [--pg [URL]] [--no-sqlite]
                                [--skip-cli | --api-only] [--profile [--profile-out FILE]]

Builds, through the real migrations, a store (SQLite in a temporary directory; with ``--pg`` also
a fresh PostgreSQL database created on the server of URL, default the test server, dropped
afterwards) holding ``--pending`` pending jobs (queued with ``Store.submit_jobs``, 10,000 a
batch), ``--nodes`` ready burst nodes each running one 8-GPU job, 500 on-prem nodes of 8 GPUs
full of work, and ``--lines`` cost lines over 90 days (bench_report's spread). Then measures:

* the tick's planning pass (``orchestrator.tick.planning_pass`` with the real executor over the
  sim provider: on-prem dispatch, cost roll-up, observe, plan, act; each pass 10 s after the one
  before, after every node's first roll-up) in CPU time, and its CPU per
  pending job, next to the floor of reading a pending row (the plain ``SELECT`` of the pending
  jobs' columns through the driver, fetched whole);
* the cost roll-ups that write live nodes (CPU and wall, what each wrote): every node's first
  roll-up (the first tick's, one-off), and the ticks of the two windows an hour in which every
  live node is rolled up for the clock alone, each node ``spread_lag`` into its window (the
  buckets before the hour become final, ``SETTLE`` after it; a new hour bucket opens): every tick
  of each window at 10-second ticks, the dearest and the sum, next to the plain ``SELECT`` of
  every column of the open buckets' lines through the driver (what those ticks read and rewrite);
* ``plan()`` on the observed snapshot, cold (order memo cleared) and warm, next to one
  ``numpy.argsort`` of the submit times;
* ``burst status --json`` and ``burst submit --count 10000`` as processes (wall and CPU), next to
  ``burst submit --count 1`` (the command's start-up: imports, settings, policy checks);
* ``burst api`` under ``--clients`` concurrent keep-alive clients for ``--seconds`` per route:
  p50/p99 of ``/v1/costs`` over 30 and 90 days grouped by project and of ``/v1/budgets``, next to
  ``/healthz`` (what any answer costs through uvicorn and the middleware);
* peak memory (max RSS) of this process after the tick and plan figures;
* ``budget_statuses`` in process once every node has launched and the ledger has not reached
  any (:func:`measure_budgets`), next to the plain ``SELECT`` of the live nodes' rows.

The planning pass leaves the reconcile phase out: the nodes are written to the store, not
launched at the sim provider, which would report them gone.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_report  # noqa: E402
from bench_api_load import Route, _quantile, _run, serve_api  # noqa: E402

from orchestrator.costs.ledger import ROLL_SPREAD, SETTLE, RollupResult  # noqa: E402
from orchestrator.domain import NodeState  # noqa: E402
from orchestrator.domain.offerings import Offering  # noqa: E402
from orchestrator.planner import demand, plan  # noqa: E402
from orchestrator.policy import Market, load_policy_text  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.store import tables as T  # noqa: E402
from orchestrator.store.bulk import MAX_BATCH, JobSpec  # noqa: E402
from orchestrator.tick import planning_pass, roll_up_costs  # noqa: E402
from orchestrator.wiring import Settings, build_runtime  # noqa: E402

NOW = bench_report.END + timedelta(hours=6)
PROJECTS = 50
TICK = timedelta(seconds=10)  # between the measured planning passes
OFFERINGS = 500
PG_DEFAULT = bench_report.PG_DEFAULT


class FixedClock:
    def now(self) -> datetime:
        return NOW


def policy_doc(provider: str = "sim") -> dict:
    """The bench's policy: 500 on-prem nodes of 8 GPUs, the shipped default's wait_slo, 500 sim
    offerings, a budget per project and one for the pool (so budgets have work to do)."""
    specs = [{"provider": provider, "region": "r", "zone": "z", "instance_type": f"t{i}",
              "market": "spot" if i % 2 else "on-demand", "gpus": [1, 2, 4, 8][i % 4],
              "price_usd_hour": round(1.0 + i * 0.37 % 30, 2)} for i in range(OFFERINGS)]
    return {"version": 1, "name": "bench", "cluster": "bench",
            "pool": {"name": "gpu", "onprem": {"nodes": 500, "gpus_per_node": 8}},
            "trigger": {"sustained_for": "0s", "wait_slo": "30m", "expected_boot": "10m"},
            "offerings": specs,
            "limits": {"max_nodes": 10000, "max_concurrent_launches": 200},
            "projects": [{"name": f"project-{i:02d}", "priority": i % 3} for i in range(PROJECTS)],
            "budgets": [{"name": "pool-month", "window": "month", "limit_usd": 5_000_000},
                        *({"name": f"b-{i:02d}", "project": f"project-{i:02d}", "window": "month",
                           "limit_usd": 100_000} for i in range(10))]}


def cli_policy_doc() -> dict:
    """The bench policy as the CLI and API load it: the same pool, projects and budgets, with
    the shipped default's local offering (the sim provider is the simulator's only)."""
    return {**policy_doc(), "offerings": [{
        "provider": "local", "region": "local", "zone": "local-a", "instance_type": "local.4gpu",
        "market": "spot"}]}


def sim_offerings(doc: dict) -> list[Offering]:
    return [Offering("sim", o["region"], o["zone"], o["instance_type"], Market(o["market"]),
                     o["gpus"], o["price_usd_hour"]) for o in doc["offerings"]]


def build_site(store: Store, pending: int, nodes: int, lines: int, rng: random.Random) -> dict:
    """Fill the store; returns how long each part took (wall seconds)."""
    took: dict[str, float] = {}
    widths = [1] * 50 + [2] * 25 + [4] * 15 + [8] * 10
    specs = [JobSpec(project=f"project-{rng.randrange(PROJECTS):02d}", pool="gpu",
                     gpus=rng.choice(widths), priority=rng.randrange(3),
                     duration_s=rng.choice([600.0, 3600.0, 14400.0]),
                     submitted_at=NOW - timedelta(seconds=rng.randrange(1, 86400)))
             for _ in range(pending)]
    began = time.perf_counter()
    for i in range(0, len(specs), MAX_BATCH):
        store.submit_jobs(specs[i:i + MAX_BATCH], submitted_at=NOW)
    took["submit_jobs"] = time.perf_counter() - began
    began = time.perf_counter()
    node_rows, job_rows, event_rows = [], [], []
    for i in range(nodes):
        node_id = f"n{i:05d}"
        offering = i % OFFERINGS
        node_rows.append(dict(
            id=node_id, policy="bench", pool="gpu", provider="sim",
            offering_key=f"sim/r/z/t{offering}/{'spot' if offering % 2 else 'on-demand'}",
            instance_type=f"t{offering}", market="spot" if offering % 2 else "on-demand",
            gpus=8, price_usd_hour=9.5, state=NodeState.READY.value,
            state_since=NOW - timedelta(hours=2), created_at=NOW - timedelta(hours=2, minutes=5),
            request_id=f"r-{node_id}", instance_id=f"i-{node_id}",
            project=f"project-{i % PROJECTS:02d}", last_heartbeat=NOW - timedelta(seconds=20)))
        # Its launch, which the cost roll-up bills from (a node without one costs nothing).
        event_rows.append(dict(node_id=node_id, at=NOW - timedelta(hours=2, minutes=4),
                               from_state="requested", to_state=NodeState.LAUNCHING.value,
                               reason="bench", details={}))
        job_rows.append(_running(f"j-burst{i:05d}", i, "burst", node_id, 8))
    for i in range(500):  # on-prem full: two 4-GPU jobs per node
        for half in range(2):
            job_rows.append(_running(f"j-onprem{i:03d}{half}", i, "onprem", f"onprem:gpu:{i}", 4))
    with store.engine.begin() as conn:
        for i in range(0, len(node_rows), 2000):
            conn.execute(sa.insert(T.nodes), node_rows[i:i + 2000])
        for i in range(0, len(job_rows), 2000):
            conn.execute(sa.insert(T.jobs), job_rows[i:i + 2000])
        for i in range(0, len(event_rows), 2000):
            conn.execute(sa.insert(T.node_events), event_rows[i:i + 2000])
    took["nodes"] = time.perf_counter() - began
    began = time.perf_counter()
    (bench_report.load_pg if store.dialect == "postgresql" else bench_report.load_sqlite)(
        store, lines)
    store.rebuild_ledger_reach()  # the nodes were written around add_node
    took["ledger"] = time.perf_counter() - began
    if store.dialect == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    else:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    return took


def _running(job_id: str, i: int, placement: str, node_id: str, gpus: int) -> dict:
    return dict(id=job_id, project=f"project-{i % PROJECTS:02d}", pool="gpu", gpus=gpus,
                priority=0, duration_s=86400.0, command=None, state="running",
                placement=placement, node_id=node_id,
                submitted_at=NOW - timedelta(hours=3), started_at=NOW - timedelta(hours=1),
                finished_at=None, exit_code=None, attempts=1, version=1, user=None)


def cpu(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(median, min) CPU seconds of ``fn`` over ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        gc.collect()
        began = time.process_time()
        fn()
        samples.append(time.process_time() - began)
    return statistics.median(samples), min(samples)


@dataclass(frozen=True, slots=True)
class Timed:
    """One call's CPU and wall seconds and what the roll-up it timed did."""

    cpu: float
    wall: float
    result: RollupResult | None

    def __str__(self) -> str:
        done = self.result
        what = "failed" if done is None else (
            f"{done.nodes:,} nodes, {done.lines_written:,} lines written, "
            f"{done.lines_deleted:,} deleted")
        return f"{self.cpu * 1000:,.0f} ms CPU, {self.wall * 1000:,.0f} ms wall ({what})"


def cpu_result(fn: Callable[[], RollupResult | None]) -> Timed:
    """CPU and wall seconds of one call of ``fn``, with its roll-up's result."""
    gc.collect()
    began, wall = time.process_time(), time.perf_counter()
    result = fn()
    return Timed(time.process_time() - began, time.perf_counter() - wall, result)


def window_ticks(rt, clock_at: list, start: datetime) -> list[Timed]:
    """The tick roll-ups (skip_fresh) from ``start`` to ``ROLL_SPREAD`` past it, ``TICK``
    apart: the window in which every live node is rolled up once for the clock."""
    ticks = []
    clock_at[0] = start
    while clock_at[0] <= start + ROLL_SPREAD:
        ticks.append(cpu_result(lambda: roll_up_costs(rt, clock_at[0], skip_fresh=True)))
        clock_at[0] += TICK
    return ticks


def ledger_rows_floor(store: Store) -> Callable[[], list]:
    """The plain SELECT of every column of the lines in the buckets from NOW on (the open
    buckets the last two roll-ups read and rewrote), through the driver, fetched whole."""
    sql = sa.select(T.cost_lines).where(T.cost_lines.c.period_start >= NOW)

    def read() -> list:
        with store.engine.connect() as conn:
            return list(conn.exec_driver_sql(str(sql.compile(
                dialect=conn.dialect, compile_kwargs={"literal_binds": True}))))
    return read


def read_floor(store: Store) -> Callable[[], object]:
    """The plain SELECT of the pending jobs' columns, through the driver, fetched whole."""
    from orchestrator.store.queueread import PENDING_COLUMNS

    columns = ", ".join(f'"{c}"' for c in PENDING_COLUMNS)
    sql = f"SELECT {columns} FROM jobs WHERE state = 'pending'"

    def read() -> object:
        raw = store.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(sql)
            rows = cursor.fetchall()
            cursor.close()
            return rows
        finally:
            raw.close()
    return read


def bench_runtime(store: Store, state: str):  # type: ignore[no-untyped-def]
    """The runtime every bench of this site plans with (the bench policy, the sim provider with
    its offerings, a fixed clock at NOW), over ``store`` with its state in ``state``; and the
    policy."""
    from providers.sim import SimProvider

    doc = policy_doc()
    policy = load_policy_text(yaml.safe_dump(doc), "bench")
    clock = FixedClock()
    rt = build_runtime(Settings(state_dir=state), [policy], clock=clock, store=store,
                       providers={"sim": SimProvider(catalogue=sim_offerings(doc), clock=clock)})
    return rt, policy


def measure_store(store: Store, label: str, args: argparse.Namespace) -> None:
    rng = random.Random(42)
    print(f"\n== {label}: {args.pending:,} pending jobs, {args.nodes:,} burst nodes, "
          f"{args.lines:,} cost lines")
    took = build_site(store, args.pending, args.nodes, args.lines, rng)
    print("  built in " + ", ".join(f"{k} {v:.1f} s" for k, v in took.items())
          + f" (submit_jobs: {args.pending / took['submit_jobs']:,.0f} jobs/s)")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as state:
        rt, policy = bench_runtime(store, state)
        floor = read_floor(store)
        floor_med, floor_min = cpu(floor, args.repeat)
        n = args.pending

        # Each pass 10 s after the one before, as the loop's ticks come: the clock moves, so a
        # full roll-up would rewrite every live node's open bucket.
        clock_at = [NOW]

        def tick() -> object:
            clock_at[0] += TICK
            return planning_pass(rt, [policy], clock_at[0], rt.executor.execute)

        # Every node's first roll-up, as the first tick's (NOW is on the hour: its bucket opens
        # here), on its own; then the first pass starts what fits on-prem, launches and writes
        # its decision.
        clock_at[0] += TICK
        first_rollup = cpu_result(lambda: roll_up_costs(rt, clock_at[0], skip_fresh=True))
        first, _ = cpu(tick, 1)
        began = time.perf_counter()
        tick_med, tick_min = cpu(tick, args.tick_repeat)
        tick_wall = (time.perf_counter() - began) / args.tick_repeat

        def rollup() -> object:
            clock_at[0] += TICK
            return roll_up_costs(rt, clock_at[0], skip_fresh=True)

        rollup_med, _ = cpu(rollup, 1)
        # The two windows an hour in which every live node is rolled up for the clock alone,
        # each node spread_lag into the window: its mark moves (from SETTLE after the hour: the
        # last bucket becomes final) and a new hour bucket opens (from the hour). Every tick of
        # each window, 10 s apart, as the loop's.
        mark_window = window_ticks(rt, clock_at, NOW + SETTLE)
        hour_window = window_ticks(rt, clock_at, NOW + timedelta(hours=1))
        ledger_floor = cpu(ledger_rows_floor(store), args.repeat)[0]
        dispatch_med, _ = cpu(lambda: rt.queue.dispatch(NOW), args.repeat)
        read = store.queue_read(NOW)
        read_med, _ = cpu(lambda: store.queue_read(NOW), args.repeat)
        snapshot = rt.observer.snapshot(NOW, queue_read=read)

        def cold() -> object:
            demand._ORDER_MEMO.clear()
            return plan(snapshot, [policy], NOW)

        cold_med, cold_min = cpu(cold, args.repeat)
        warm_med, warm_min = cpu(lambda: plan(snapshot, [policy], NOW), args.repeat)
        sort_floor = _argsort_floor(snapshot, args.repeat)
        print(f"  floor: read a pending row       {floor_med / n * 1e6:8.2f} µs/job "
              f"(SELECT of {n:,} rows: {floor_med * 1000:.0f} ms CPU, min {floor_min * 1000:.0f})")
        print(f"  one read of the queue            {read_med / n * 1e6:8.2f} µs/job "
              f"({read_med / floor_med:.1f}x the floor)")
        print(f"  first roll-up of every node      {first_rollup}")
        print(f"  first planning pass (after it)   {first * 1000:,.0f} ms CPU")
        print(f"  planning pass (tick)             {tick_med / n * 1e6:8.2f} µs/job "
              f"({tick_med * 1000:.0f} ms CPU, min {tick_min * 1000:.0f}; "
              f"{tick_wall * 1000:.0f} ms wall a pass; {tick_med / floor_med:.1f}x the floor)")
        print(f"    of which: the tick's cost roll-up {rollup_med * 1000:.0f} ms CPU "
              f"({rollup_med / max(args.nodes, 1) * 1000:.2f} ms per burst node), on-prem "
              f"dispatch with the one read {dispatch_med * 1000:.0f} ms, plan() below; without "
              f"the roll-up {(tick_med - rollup_med) / n * 1e6:.2f} µs/job "
              f"({(tick_med - rollup_med) / floor_med:.1f}x the floor)")
        lines_now = ledger_rows_floor(store)()
        for what, ticks in (("marks move (the last bucket final)", mark_window),
                            ("a new hour bucket opens", hour_window)):
            dearest = max(ticks, key=lambda t: t.cpu)
            print(f"  the {len(ticks)} ticks in which {what}: dearest {dearest}; all "
                  f"{sum(t.cpu for t in ticks) * 1000:,.0f} ms CPU, "
                  f"{sum(t.result.nodes for t in ticks if t.result):,} nodes rolled up")
        print(f"    floor: plain SELECT of the ledger rows of the open buckets ({len(lines_now):,} "
              f"lines, every column, through the driver) {ledger_floor * 1000:.0f} ms CPU; "
              f"dearest tick of the two windows "
              f"{max(t.cpu for t in mark_window + hour_window) / ledger_floor:.1f}x the floor")
        print(f"  plan() cold / warm               {cold_med * 1000:8.0f} / {warm_med * 1000:.0f} ms "
              f"CPU (min {cold_min * 1000:.0f} / {warm_min * 1000:.0f})"
              + (f"; floor: one numpy.argsort of the submit times {sort_floor * 1000:.1f} ms"
                 if sort_floor is not None else ""))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"  peak memory (max RSS of this process so far) {peak:,.0f} MiB")
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.runcall(tick)
            stats = pstats.Stats(profiler)
            stats.sort_stats("tottime").print_stats(15)
            stats.sort_stats("cumulative").print_stats(40)
            if args.profile_out:
                stats.dump_stats(args.profile_out)
        measure_budgets(store, policy, args)
        if not args.skip_cli:
            policy_file = Path(state) / "bench.yaml"
            policy_file.write_text(yaml.safe_dump(cli_policy_doc()))
            measure_cli(store.url if store.dialect == "postgresql" else _raw_url(store),
                        policy_file, state, args)


def measure_budgets(store: Store, policy: object, args: argparse.Namespace) -> None:
    """Budgets at 10,000 live nodes the ledger has not reached: after the tick figures, every
    bench node gets its ``launching`` event (at its creation) and the ledger reach is rebuilt
    (what a load around the store does), so each node accrues from its launch with no line:
    the accrual's worst case, one row per node in the aggregate. ``budget_statuses`` in process
    (11 budgets, November's window) next to the plain ``SELECT`` of the live nodes' pool,
    project and price; the API figures below read the same store."""
    from orchestrator.costs.budgets import budget_statuses

    with store.engine.begin() as conn:
        rows = [dict(node_id=r.id, at=r.created_at, from_state="requested",
                     to_state="launching", reason="bench", details={})
                for r in conn.execute(sa.select(T.nodes.c.id, T.nodes.c.created_at))]
        for i in range(0, len(rows), 2000):
            conn.execute(sa.insert(T.node_events), rows[i:i + 2000])
    store.rebuild_ledger_reach()
    statuses = budget_statuses(store, [policy], NOW)  # type: ignore[list-item]
    med, low = cpu(lambda: budget_statuses(store, [policy], NOW),  # type: ignore[list-item]
                   max(args.repeat, 5))
    sql = "SELECT pool, project, price_usd_hour FROM nodes WHERE state != 'terminated'"

    def floor() -> object:
        with store.engine.connect() as conn:
            return conn.exec_driver_sql(sql).all()

    floor_med, _ = cpu(floor, max(args.repeat, 5))
    spent = sum(s.spent_usd for s in statuses if s.project is None)
    groups = len(store.budget_groups()[0])  # nodes that accrue alike, counted as one
    print(f"  budget_statuses, {len(statuses)} budgets, {len(rows):,} launched nodes "
          f"unrolled in {groups:,} groups   {med * 1000:6.1f} ms CPU (min {low * 1000:.1f}); floor: SELECT of the "
          f"live nodes' rows {floor_med * 1000:.1f} ms ({med / floor_med:.2f}x); "
          f"pool spend ${spent:,.2f}")


def _raw_url(store: Store) -> str:
    return str(store.engine.url)


def _argsort_floor(snapshot: object, repeat: int) -> float | None:
    try:
        import numpy as np
    except ImportError:
        return None
    pending = [j for q in snapshot.queues.values() for j in q.pending]  # type: ignore[attr-defined]
    times = np.array([j.submitted_at.timestamp() for j in pending])
    med, _ = cpu(lambda: np.argsort(times, kind="stable"), repeat)
    return med


def _process(cmd: list[str], env: dict) -> tuple[float, float, subprocess.CompletedProcess]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr[-2000:]}")
    return wall, used, done


def cli_env(url: str, policy_file: Path, state: str) -> dict:
    """The environment the CLI and ``burst api`` run under: this store and the bench policy."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "BURST_STATE_DIR": state,
            "BURST_DATABASE_URL": url, "BURST_POLICY_FILES": json.dumps([str(policy_file)]),
            "BURST_LOG_LEVEL": "WARNING"}


def measure_cli(url: str, policy_file: Path, state: str, args: argparse.Namespace) -> None:
    burst = [sys.executable, "-c", "from orchestrator.cli import main; main()"]
    env = cli_env(url, policy_file, state)
    if args.api_only:
        measure_api(env, url, args)
        return
    submit = [*burst, "submit", "--project", "project-00", "--gpus", "1", "--duration", "1h",
              "--json", "--count"]
    one = _process([*submit, "1"], env)
    many = _process([*submit, "10000"], env)
    status = _process([*burst, "status", "--json", "--limit", "30"], env)
    print(f"  floor: burst submit --count 1    {one[0]:6.2f} s wall, {one[1]:5.2f} s CPU")
    print(f"  burst submit --count 10000       {many[0]:6.2f} s wall, {many[1]:5.2f} s CPU "
          f"(+{many[1] - one[1]:.2f} s CPU over the floor)")
    print(f"  burst status --json              {status[0]:6.2f} s wall, {status[1]:5.2f} s CPU "
          f"(+{status[1] - one[1]:.2f} s CPU over the floor)")
    measure_api(env, url, args)


def measure_api(env: dict, url: str, args: argparse.Namespace) -> None:
    store = Store(url)
    try:
        admin, _ = store.create_api_token("admin", [], created_at=datetime.now(UTC),
                                          description="bench")
    finally:
        store.close()
    auth = {"Authorization": f"Bearer {admin}"}
    end = bench_report.END.date().isoformat()
    routes = [
        Route("floor: GET /healthz", "GET", "/healthz", {}),
        Route("costs 30 days by project", "GET",
              f"/v1/costs?from={(bench_report.END - timedelta(days=30)).date()}&to={end}"
              "&group_by=project", auth),
        Route("costs 90 days by project", "GET",
              f"/v1/costs?from={(bench_report.END - timedelta(days=91)).date()}&to={end}"
              "&group_by=project", auth),
        Route("GET /v1/budgets", "GET", "/v1/budgets", auth),
    ]
    with serve_api(env) as base:
        print(f"  API under {args.clients} clients, {args.seconds:g} s per route:")
        for route in routes:
            took = _run(base, route, args.clients, args.seconds)
            ms = [v * 1000 for v in route.latencies]
            print(f"    {route.name:28} {len(ms):>6} req {len(ms) / took:>7.0f}/s  "
                  f"p50 {_quantile(ms, 0.50):7.1f} ms  p99 {_quantile(ms, 0.99):7.1f} ms  "
                  f"errors {len(route.errors)}")
            for error in route.errors[:2]:
                print(f"      {error}")


def main() -> None:
    from orchestrator.gctune import tune_gc

    tune_gc()  # the collector's thresholds every burst process runs with (orchestrator.gctune)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--lines", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=3, help="repeats of the sub-second figures")
    ap.add_argument("--tick-repeat", type=int, default=1, help="measured planning passes")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--pg", nargs="?", const=PG_DEFAULT, default=None,
                    help="also on PostgreSQL (a fresh database on this server, dropped after)")
    ap.add_argument("--skip-cli", action="store_true", help="leave out the CLI and API figures")
    ap.add_argument("--api-only", action="store_true",
                    help="of the CLI and API figures, only the API's (no burst submit/status)")
    ap.add_argument("--profile", action="store_true", help="profile one planning pass")
    ap.add_argument("--profile-out", metavar="FILE", help="with --profile: write the pstats")
    ap.add_argument("--no-sqlite", action="store_true", help="with --pg: PostgreSQL only")
    args = ap.parse_args()
    for store, label in bench_report.each_store(args, "bench-scale"):
        measure_store(store, label, args)


if __name__ == "__main__":
    main()
