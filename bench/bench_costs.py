"""Benchmark: the cost API over a quarter of ledger, through the real API, each figure next to a
floor measured in the same run. Prints figures; not a test.

    python bench/bench_costs.py [--lines 300000] [--nodes 100] [--clients 1,8] [--seconds 5]
                                [--repeat 20] [--writes 300] [--writes-only] [--pg [URL]]
                                [--no-sqlite] [--profile]

Builds, through the real migrations, a store (SQLite in a temporary directory; with ``--pg`` a
fresh PostgreSQL database on the server of URL, default the test server, dropped afterwards)
holding ``--lines`` cost lines over 90 days (bench_report's spread, loaded in bulk, then the
roll-ups rebuilt from them as migration 0014 does) and ``--nodes`` ready burst nodes (the scale
bench's site without its pending queue), with the scale bench's policy (11 budgets). Then:

* in this process, ``--repeat`` times each: the floor, a plain ``SELECT SUM(lines)`` of the day
  roll-up's rows in the 91 days, through the driver; the 90-day sums by project from the roll-ups and from the lines
  (what every report read before the roll-ups);
* first, on the empty store: ``write_ledger``'s CPU per subject keeping the roll-ups, next to
  the same writes with their upkeep skipped (the floor; ``--writes-only``: only this);
* ``burst api`` (uvicorn, one process, as deployed) under each of ``--clients`` concurrent
  keep-alive clients for ``--seconds`` per route: p50/p99 of ``/v1/costs`` over 30 and 90 days
  grouped by project and of ``/v1/budgets``, next to ``/healthz`` (what any answer costs through
  uvicorn and the middleware).

``--profile``: instead of the API under load, one thread's profile of the routes in this process
(the app over an ASGI transport, its sync endpoints run inline so ``cProfile`` sees them; the
scale bench's fixed clock, so a month budget reads the loaded November): p50 of 30 requests
each and the functions their time goes to (SQL, the roll-up reads, auth, serialisation).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import sqlalchemy as sa
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_report  # noqa: E402
import bench_scale  # noqa: E402
from bench_api_load import _quantile  # noqa: E402

from orchestrator.store import Store  # noqa: E402


def _ms(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(p50, p99) wall milliseconds of ``fn`` over ``repeat`` calls, after one warm call."""
    fn()
    samples = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples), _quantile(samples, 0.99)


def _scan_floor(store: Store, since: str, until: str) -> Callable[[], object]:
    """A plain ``SELECT SUM(lines)`` of the day roll-up's rows in the window, through the driver:
    reading the rows a report by project sums (``COUNT(*)`` would read none on SQLite)."""
    sql = (f"SELECT SUM(lines) FROM cost_rollup_days WHERE day >= '{since}' "
           f"AND day < '{until}'")

    def count() -> object:
        raw = store.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute(sql)
            rows = cursor.fetchall()
            cursor.close()
            return rows
        finally:
            raw.close()
    return count


def measure_writes(store: Store, subjects: int) -> None:
    """CPU of ``write_ledger`` per subject (three lines of three projects rewritten in its open
    hour, as each tick's roll-up does for a live node), keeping the roll-ups and, as the floor,
    with their upkeep skipped; paired, twice each."""
    from orchestrator.domain.costs import CostKind, CostLine
    from orchestrator.store import rollups

    at = bench_report.END
    epoch = at - timedelta(days=365)

    def one_round(version: int) -> float:
        began = time.process_time()
        for s in range(subjects):
            lines = [CostLine(
                line_key=f"w-{s}:{i}", subject=f"w-{s}", node_id=f"w-{s}", period_start=at,
                period_end=at + timedelta(minutes=version % 59 + 1), kind=CostKind.USAGE,
                project=f"project-{i:02d}", job_id=f"j-{s}-{i}", policy="train", pool="gpu",
                provider="aws", region="r", instance_type="t", market="spot",
                price_usd_hour=9.5, instance_seconds=60.0 * version, gpu_seconds=480.0 * version,
                cost_micros=1000 * version + i, user="ada") for i in range(3)]
            store.write_ledger(f"w-{s}", lines, since=epoch, mark=None, at=at)
        return (time.process_time() - began) / subjects * 1000

    kept = rollups.apply_changes
    figures: dict[str, list[float]] = {"kept": [], "skipped": []}
    try:
        for version in range(1, 5):
            mode = "kept" if version % 2 else "skipped"
            rollups.apply_changes = kept if mode == "kept" else (lambda *a, **k: None)
            figures[mode].append(one_round(version))
    finally:
        rollups.apply_changes = kept
    floor, with_rollups = min(figures["skipped"]), min(figures["kept"])
    print(f"  write_ledger, {subjects} subjects of 3 lines: {with_rollups:.2f} ms CPU a subject "
          f"with the roll-ups kept; floor, their upkeep skipped: {floor:.2f} ms "
          f"({with_rollups / floor:.2f}x)")


def measure(store: Store, label: str, args: argparse.Namespace) -> None:
    print(f"\n== {label}: {args.lines:,} cost lines over 90 days, {args.nodes:,} burst nodes")
    measure_writes(store, args.writes)
    if args.writes_only:
        return
    began = time.perf_counter()
    bench_scale.build_site(store, 0, args.nodes, args.lines, random.Random(42))
    with store.engine.connect() as conn:
        hours, days, months = (int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {t}")).scalar())
                               for t in ("cost_rollup_hours", "cost_rollup_days",
                                         "cost_rollup_months"))
    print(f"  built in {time.perf_counter() - began:.1f} s; roll-ups: {hours:,} hour rows, "
          f"{days:,} day rows, {months:,} month rows")
    end = bench_report.END
    since = end - timedelta(days=91)
    floor = _ms(_scan_floor(store, since.date().isoformat(), end.date().isoformat()),
                args.repeat)
    fast = _ms(lambda: store.cost_sums(["project"], since=since, until=end), args.repeat)
    slow = _ms(lambda: store.cost_sums(["project"], since=since, until=end, from_lines=True),
               max(args.repeat // 4, 3))
    print(f"  in process, p50 / p99 of {args.repeat} calls:")
    print(f"    floor: SELECT SUM over the day roll-up      {floor[0]:7.1f} / {floor[1]:7.1f} ms")
    print(f"    91 days by project from the roll-ups        {fast[0]:7.1f} / {fast[1]:7.1f} ms "
          f"({fast[0] / floor[0]:.1f}x the floor)")
    print(f"    91 days by project from the lines           {slow[0]:7.1f} / {slow[1]:7.1f} ms "
          f"({slow[0] / fast[0]:.0f}x the roll-ups)")
    if args.profile:
        profile_routes(store)
        return
    with tempfile.TemporaryDirectory(prefix="bench-costs-") as state:
        policy_file = Path(state) / "bench.yaml"
        policy_file.write_text(yaml.safe_dump(bench_scale.cli_policy_doc()))
        url = store.url if store.dialect == "postgresql" else str(store.engine.url)
        if store.dialect == "postgresql":
            url = store.engine.url.render_as_string(hide_password=False)
        env = bench_scale.cli_env(url, policy_file, state)
        for clients in args.clients:
            bench_scale.measure_api(env, url, argparse.Namespace(clients=clients,
                                                                 seconds=args.seconds))


def profile_routes(store: Store) -> None:
    """p50 of each route in this process, then where one thread's time goes (see --profile)."""
    import asyncio
    import cProfile
    import io
    import pstats
    from datetime import UTC, datetime

    import fastapi.dependencies.utils
    import fastapi.routing
    import httpx

    from orchestrator.api import create_app
    from orchestrator.policy import load_policy_text
    from orchestrator.wiring import Settings, build_runtime

    async def inline(func: Callable[..., object], *a: object, **k: object) -> object:
        return func(*a, **k)  # the sync endpoint in this thread: cProfile sees it

    fastapi.routing.run_in_threadpool = inline  # type: ignore[assignment]
    fastapi.dependencies.utils.run_in_threadpool = inline  # type: ignore[assignment]
    policy = load_policy_text(yaml.safe_dump(bench_scale.cli_policy_doc()))
    with tempfile.TemporaryDirectory(prefix="bench-costs-") as state:
        url = store.engine.url.render_as_string(hide_password=False)
        runtime = build_runtime(Settings(database_url=url, state_dir=state), [policy],
                                store=store, clock=bench_scale.FixedClock())
        admin, _ = store.create_api_token("admin", [], created_at=datetime.now(UTC),
                                          description="bench")
        app = create_app(runtime)
        end = bench_report.END
        routes = [("floor: GET /healthz", "/healthz"),
                  ("costs 91 days by project", f"/v1/costs?from={(end - timedelta(days=91)).date()}"
                                               f"&to={end.date()}&group_by=project"),
                  ("GET /v1/budgets", "/v1/budgets")]

        async def run() -> None:
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                auth = {"Authorization": f"Bearer {admin}"}
                for name, path in routes:
                    answer = await client.get(path, headers=auth)
                    assert answer.status_code == 200, answer.text
                    samples = []
                    for _ in range(30):
                        began = time.perf_counter()
                        await client.get(path, headers=auth)
                        samples.append((time.perf_counter() - began) * 1000)
                    print(f"  in process, one thread: {name:26} p50 "
                          f"{statistics.median(samples):6.1f} ms")
                    if path == "/healthz":
                        continue
                    profiler = cProfile.Profile()
                    profiler.enable()
                    for _ in range(10):
                        await client.get(path, headers=auth)
                    profiler.disable()
                    text = io.StringIO()
                    pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(
                        r"orchestrator|execute|fetch|jsonable|render")
                    print("\n".join(line for line in text.getvalue().splitlines()[:60]
                                    if line.strip()))
        asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lines", type=int, default=300_000)
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--clients", type=lambda t: [int(x) for x in t.split(",")], default=[1, 8])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--writes", type=int, default=300, help="subjects written per round")
    ap.add_argument("--writes-only", action="store_true", help="only the write_ledger figure")
    ap.add_argument("--pg", nargs="?", const=bench_report.PG_DEFAULT, default=None,
                    help="also on PostgreSQL (a fresh database on this server, dropped after)")
    ap.add_argument("--no-sqlite", action="store_true", help="with --pg: PostgreSQL only")
    ap.add_argument("--profile", action="store_true",
                    help="profile the routes in this process instead of the API under load")
    args = ap.parse_args()
    for store, label in bench_report.each_store(args, "bench-costs"):
        measure(store, label, args)


if __name__ == "__main__":
    main()
