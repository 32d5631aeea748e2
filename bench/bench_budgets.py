"""Benchmark: ``GET /v1/budgets`` at 10,000 live nodes the ledger has not reached, each figure
next to a floor measured in the same run. Prints figures; not a test.

    python bench/bench_budgets.py [--nodes 10000] [--lines 300000] [--pending 2000]
                                  [--clients 8] [--seconds 5] [--rounds 3] [--pg [URL]]
                                  [--no-sqlite] [--spread] [--rolled] [--churn [SECONDS]]
                                  [--profile | --writes]

The scale bench's site (``bench_scale.build_site``: ``--nodes`` ready burst nodes of 50 projects,
``--lines`` cost lines over 90 days, the bench policy's 11 month budgets) without its tick
figures, then its budgets set-up (``bench_scale.measure_budgets``: every node launched at its
creation, the reach rebuilt, so each accrues with no line: ``budget_statuses`` in process next
to the plain ``SELECT`` of the live nodes' rows). ``--spread``: each node launched at its own
instant instead (one second apart), so no two nodes accrue alike. ``--rolled``: every node's
ledger rolled up first as a running site's ticks do it (the first roll-up, then each tick of the
two windows in which each node rolls at its own lag), so the reach's groups are a live site's:
the state ``bench_scale.py`` measures the route in.

Then ``burst api`` (uvicorn, one process, as deployed) under ``--clients`` keep-alive clients,
``--rounds`` rounds of ``GET /healthz`` (the floor: what any answer costs through uvicorn and the
middleware) then ``GET /v1/budgets``, ``--seconds`` each, so every budgets figure has a floor
taken just before it. The API runs on the real clock: its month window is the current one.
Before the rounds, ``--clients`` clients ask for budgets for a second, so the API's database
connections are open as on a running site. Each round's line ends with the API process's own CPU
per answer (user + system, read from the process before and after the round) and, on PostgreSQL,
the local server processes' (backends that end during a round are not counted).

``--churn [SECONDS]``: while each ``GET /v1/budgets`` round runs, a writer in this process rolls
up 100 nodes every SECONDS (default 1; a line each, their marks moved to a new instant, so their
reach groups change and their version moves): the API's kept groups go stale and are read again
under load, as on a site whose roll-up writes while budgets are read. The floor rounds run
without it. The line printed after the round says how many writes it made and their CPU.

``--writes``: instead of the API under load, what the writers of the reach cost: the roll-up's
batch of every node (``Store.write_ledgers``, a line each, marks moved; three rounds) next to the
plain ``SELECT`` of the reach rows, and a state change (``save_transition``, 300 nodes ready ->
draining -> terminating -> terminated), in CPU.

``--profile``: instead of the API under load, ``budget_statuses`` and the route through an ASGI
transport in this process (its sync endpoint inline, so ``cProfile`` sees it), one thread.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
import sqlalchemy as sa
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_report  # noqa: E402
import bench_scale  # noqa: E402
from bench_api_load import Route, _quantile, _run, serve_api, server_cpu_s  # noqa: E402

from orchestrator.policy import load_policy_text  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.store import tables as T  # noqa: E402


def spread_launches(store: Store) -> None:
    """Every node's first launch at its own instant (a second apart, before the bench's)."""
    with store.engine.begin() as conn:
        ids = [r.id for r in conn.execute(sa.select(T.nodes.c.id).order_by(T.nodes.c.id))]
        rows = [dict(node_id=node_id, at=bench_scale.NOW - timedelta(hours=3, seconds=i),
                     from_state="requested", to_state="launching", reason="bench", details={})
                for i, node_id in enumerate(ids)]
        for i in range(0, len(rows), 2000):
            conn.execute(sa.insert(T.node_events), rows[i:i + 2000])


def roll_as_a_site(store: Store) -> None:
    """Roll every node's ledger up as a running site's ticks do: the first roll-up of every
    node, then every tick (10 s apart) of the two windows in which each node is rolled up at
    its own lag (``costs.ledger.spread_lag``): its lines then reach about thirty different
    instants, so the reach's groups are as a live site's (about 1,500 here), not one per
    project."""
    from orchestrator.tick import roll_up_costs

    with tempfile.TemporaryDirectory(prefix="bench-budgets-roll-") as state:
        rt, _ = bench_scale.bench_runtime(store, state)
        clock_at = [bench_scale.NOW + bench_scale.TICK]
        roll_up_costs(rt, clock_at[0], skip_fresh=True)
        bench_scale.window_ticks(rt, clock_at, bench_scale.NOW + bench_scale.SETTLE)
        bench_scale.window_ticks(rt, clock_at, bench_scale.NOW + timedelta(hours=1))


class Churn:
    """A thread that rolls up ``batch`` nodes every ``every`` seconds until stopped (``--churn``):
    each write moves its nodes' marks to an instant no earlier write used, so their reach groups
    change."""

    def __init__(self, store: Store, every: float, batch: int = 100) -> None:
        with store.engine.connect() as conn:
            self.ids = [r.id for r in conn.execute(sa.select(T.nodes.c.id).order_by(T.nodes.c.id))]
        self.store, self.every, self.batch = store, every, batch
        self.writes, self.cpu_s, self.k = 0, 0.0, 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def version(self) -> int | None:
        """The reach groups' version (None before there was one: a run of older code)."""
        try:
            from orchestrator.store import reach_version
        except ImportError:
            return None
        with self.store.engine.connect() as conn:
            return reach_version.read(conn)

    def __enter__(self) -> Churn:
        self.writes, self.cpu_s = 0, 0.0
        self.began_at = self.version()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        from orchestrator.domain.costs import CostKind, CostLine
        from orchestrator.store.ledger_batch import LedgerWrite

        while not self._stop.wait(self.every):
            self.k += 1
            first = (self.k * self.batch) % max(len(self.ids), 1)
            nodes = self.ids[first:first + self.batch]
            start = bench_scale.NOW + timedelta(hours=2, seconds=self.k)
            writes = [LedgerWrite(n, [CostLine(
                line_key=f"{n}:churn:{self.k}", subject=n, node_id=n, period_start=start,
                period_end=start + timedelta(seconds=1), kind=CostKind.IDLE,
                project="project-00", job_id=None, policy="bench", pool="gpu", provider="sim",
                region="r", instance_type="t", market="spot", price_usd_hour=9.5,
                instance_seconds=1.0, gpu_seconds=0.0, cost_micros=2_639, onprem_equiv_micros=0,
                user=None)], since=start, mark=start) for n in nodes]
            began = time.thread_time()
            self.store.write_ledgers(writes, at=start + timedelta(seconds=1))
            self.cpu_s += time.thread_time() - began
            self.writes += 1


def _database_cpu_s(store: Store) -> float:
    """CPU seconds of this machine's PostgreSQL server processes (0 on SQLite): the bench's
    server is local, so its backends' CPU per answer is the database's share of each."""
    if store.dialect != "postgresql":
        return 0.0
    total = 0.0
    for proc in psutil.process_iter(["name", "cpu_times"]):
        if (proc.info["name"] or "").startswith("postgres") and proc.info["cpu_times"]:
            total += proc.info["cpu_times"].user + proc.info["cpu_times"].system
    return total


def measure_api(store: Store, policy_file: Path, state: str, args: argparse.Namespace) -> None:
    url = store.url if store.dialect == "postgresql" else str(store.engine.url)
    admin, _ = store.create_api_token("admin", [], created_at=datetime.now(UTC),
                                      description="bench")
    auth = {"Authorization": f"Bearer {admin}"}
    churn = Churn(store, args.churn) if args.churn else None
    with serve_api(bench_scale.cli_env(url, policy_file, state)) as base:
        for _ in range(20):  # warm: first answers import and build what later ones reuse
            _run(base, Route("warm", "GET", "/v1/budgets", auth), 1, 0.01)
        # ... and as many at once as the rounds send, so the API's connection pool has grown to
        # what they use (a running site's API has): otherwise the first round's tail is the
        # database connecting its new sessions.
        _run(base, Route("warm", "GET", "/v1/budgets", auth), args.clients, 1.0)
        print(f"  API under {args.clients} clients, {args.seconds:g} s per route:")
        for n in range(args.rounds):
            for route in (Route("floor: GET /healthz", "GET", "/healthz", {}),
                          Route("GET /v1/budgets", "GET", "/v1/budgets", auth)):
                cpu_before, db_before = server_cpu_s(base), _database_cpu_s(store)
                if churn is not None and route.path == "/v1/budgets":
                    with churn:
                        took = _run(base, route, args.clients, args.seconds)
                else:
                    took = _run(base, route, args.clients, args.seconds)
                cpu_ms = (server_cpu_s(base) - cpu_before) * 1000
                db_ms = (_database_cpu_s(store) - db_before) * 1000
                ms = [v * 1000 for v in route.latencies]
                print(f"    round {n + 1} {route.name:22} {len(ms):>6} req "
                      f"{len(ms) / took:>6.0f}/s  p50 {_quantile(ms, 0.50):6.1f} ms  "
                      f"p99 {_quantile(ms, 0.99):6.1f} ms  errors {len(route.errors)}  "
                      f"API CPU {cpu_ms / max(len(ms), 1):.2f} ms/answer"
                      + (f", PostgreSQL {db_ms / max(len(ms), 1):.2f}" if db_ms else ""))
                if churn is not None and route.path == "/v1/budgets":
                    now_at = churn.version()
                    moved = ("" if now_at is None or churn.began_at is None else
                             f", the groups' version moved {now_at - churn.began_at} times")
                    print(f"      churn: {churn.writes} roll-ups of {churn.batch} nodes "
                          f"({churn.cpu_s / max(churn.writes, 1) * 1000:.0f} ms CPU each){moved}")
                for error in route.errors[:2]:
                    print(f"      {error}")


def measure_writes(store: Store) -> None:
    """CPU of the reach's writers: the roll-up's batch of every node, and state changes."""
    import gc

    from orchestrator.domain import NodeState
    from orchestrator.domain.costs import CostKind, CostLine
    from orchestrator.lifecycle import transition
    from orchestrator.store.ledger_batch import LedgerWrite

    with store.engine.connect() as conn:
        ids = [r.id for r in conn.execute(sa.select(T.nodes.c.id).order_by(T.nodes.c.id))]
    for k in range(1, 4):
        start = bench_scale.NOW + timedelta(hours=k)
        writes = [LedgerWrite(n, [CostLine(
            line_key=f"{n}:{k}", subject=n, node_id=n, period_start=start,
            period_end=start + timedelta(minutes=30), kind=CostKind.IDLE, project="project-00",
            job_id=None, policy="bench", pool="gpu", provider="sim", region="r",
            instance_type="t", market="spot", price_usd_hour=9.5, instance_seconds=1800.0,
            gpu_seconds=0.0, cost_micros=4_750_000, onprem_equiv_micros=0, user=None)],
            since=start, mark=start) for n in ids]
        gc.collect()
        began = time.process_time()
        store.write_ledgers(writes, at=start + timedelta(minutes=30))
        print(f"  write_ledgers of {len(ids):,} nodes, round {k}: "
              f"{(time.process_time() - began) * 1000:6.0f} ms CPU")
    gc.collect()
    began = time.process_time()
    with store.engine.connect() as conn:
        conn.exec_driver_sql("SELECT * FROM ledger_reach").all()
    print(f"    floor: SELECT * FROM ledger_reach {(time.process_time() - began) * 1000:.1f} ms CPU")
    steps, began = 0, time.process_time()
    for node_id in ids[:300]:
        node = store.get_node(node_id)
        at = bench_scale.NOW + timedelta(hours=5)
        for target in (NodeState.DRAINING, NodeState.TERMINATING, NodeState.TERMINATED):
            new, event = transition(node, target, at=at, reason="bench")  # type: ignore[arg-type]
            assert store.save_transition(node, new, event)  # type: ignore[arg-type]
            node, steps = new, steps + 1
    print(f"  save_transition {(time.process_time() - began) / steps * 1000:.3f} ms CPU a "
          f"transition ({steps}, a third of them to terminated; with get_node)")


def profile(store: Store, policy: object, state: str) -> None:
    """``budget_statuses`` and the route in this process, one thread, under ``cProfile``."""
    import asyncio
    import cProfile
    import io
    import pstats

    import fastapi.dependencies.utils
    import fastapi.routing
    import httpx

    import orchestrator.api.one_hop
    from orchestrator.api import create_app
    from orchestrator.costs.budgets import budget_statuses
    from orchestrator.wiring import Settings, build_runtime

    async def inline(func, *a, **k):  # type: ignore[no-untyped-def]
        return func(*a, **k)

    fastapi.routing.run_in_threadpool = inline  # type: ignore[assignment]
    fastapi.dependencies.utils.run_in_threadpool = inline  # type: ignore[assignment]
    orchestrator.api.one_hop.run_in_threadpool = inline  # type: ignore[assignment]

    def show(profiler: cProfile.Profile, what: str) -> None:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(20)
        stats.sort_stats("cumulative").print_stats(35)
        print(f"  -- profile: {what}\n" + "\n".join(
            line for line in text.getvalue().splitlines() if line.strip()))

    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(20):
        budget_statuses(store, [policy], bench_scale.NOW)  # type: ignore[list-item]
    profiler.disable()
    show(profiler, "budget_statuses x20 (November's window)")
    url = store.engine.url.render_as_string(hide_password=False)
    served = load_policy_text(yaml.safe_dump(bench_scale.cli_policy_doc()), "bench")
    runtime = build_runtime(Settings(database_url=url, state_dir=state), [served],
                            store=store, clock=bench_scale.FixedClock())
    admin, _ = store.create_api_token("admin", [], created_at=datetime.now(UTC),
                                      description="bench")
    app = create_app(runtime)

    async def run() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            auth = {"Authorization": f"Bearer {admin}"}
            for path in ("/healthz", "/v1/budgets"):
                answer = await client.get(path, headers=auth)
                assert answer.status_code == 200, answer.text
                samples = []
                for _ in range(50):
                    began = time.process_time()
                    await client.get(path, headers=auth)
                    samples.append((time.process_time() - began) * 1000)
                samples.sort()
                print(f"  in process, one thread, CPU: {path:12} p50 {samples[25]:6.2f} ms "
                      f"min {samples[0]:.2f} ms")
            profiler = cProfile.Profile(time.process_time)
            profiler.enable()
            for _ in range(20):
                await client.get("/v1/budgets", headers=auth)
            profiler.disable()
            show(profiler, "GET /v1/budgets x20 through ASGI")
    asyncio.run(run())


def main() -> None:
    from orchestrator.gctune import tune_gc

    tune_gc()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pending", type=int, default=2_000)
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--lines", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=20, help="in-process calls measured")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--spread", action="store_true", help="every node launched at its own instant")
    ap.add_argument("--rolled", action="store_true",
                    help="every node rolled up as a running site's ticks do (spread lags)")
    ap.add_argument("--churn", nargs="?", type=float, const=1.0, default=None, metavar="SECONDS",
                    help="roll up 100 nodes every SECONDS (default 1) while budgets are read")
    ap.add_argument("--profile", action="store_true", help="profile in process, no API run")
    ap.add_argument("--writes", action="store_true", help="the reach writers' CPU, no API run")
    ap.add_argument("--pg", nargs="?", const=bench_report.PG_DEFAULT, default=None)
    ap.add_argument("--no-sqlite", action="store_true")
    args = ap.parse_args()
    if args.nodes < 1 or args.clients < 1 or args.seconds <= 0 or args.rounds < 1:
        ap.error("--nodes, --clients and --rounds must be at least 1 and --seconds above 0")
    import random

    for store, label in bench_report.each_store(args, "bench-budgets"):
        print(f"\n== {label}: {args.nodes:,} live burst nodes, {args.lines:,} cost lines")
        began = time.perf_counter()
        bench_scale.build_site(store, args.pending, args.nodes, args.lines, random.Random(42))
        if args.spread:
            spread_launches(store)
        if args.rolled:
            roll_as_a_site(store)
        print(f"  built in {time.perf_counter() - began:.1f} s")
        policy = load_policy_text(yaml.safe_dump(bench_scale.policy_doc()), "bench")
        bench_scale.measure_budgets(store, policy, args)
        with tempfile.TemporaryDirectory(prefix="bench-budgets-") as state:
            if args.profile:
                profile(store, policy, state)
                continue
            if args.writes:
                measure_writes(store)
                continue
            policy_file = Path(state) / "bench.yaml"
            policy_file.write_text(yaml.safe_dump(bench_scale.cli_policy_doc()))
            measure_api(store, policy_file, state, args)


if __name__ == "__main__":
    main()
