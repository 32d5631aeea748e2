"""Benchmark: cost_report() and spend() latency on a ledger of 1M cost lines. Prints figures;
not a test.

    python bench/bench_report.py [--lines 1000000] [--repeat 5] [--pg [URL]]

Fills a fresh SQLite store (and, with ``--pg``, a fresh PostgreSQL database created on the server
of URL, default the test server, dropped afterwards) through the real migrations, then bulk-loads
``--lines`` cost lines with a realistic spread: 2,000 nodes over 90 days, 50 projects, 6
provider/instance-type pairs in 4 regions, both markets, each node-hour one idle line plus 0-3
usage lines of jobs from several projects. Then times the report shapes the API and CLI ask for.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.costs.report import CostQuery, GroupKey, cost_report  # noqa: E402
from orchestrator.costs.spend import spend  # noqa: E402
from orchestrator.store import Store  # noqa: E402
from orchestrator.store import tables as T  # noqa: E402

END = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
START = END - timedelta(days=90)
PG_DEFAULT = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
TYPES = [("aws", "p4d.24xlarge", 8, 32.77), ("aws", "g5.12xlarge", 4, 5.67),
         ("gcp", "a2-highgpu-8g", 8, 29.39), ("gcp", "g2-standard-48", 4, 4.0),
         ("libcloud", "gpu.a100.8", 8, 18.0), ("libcloud", "gpu.l4.1", 1, 0.8)]
REGIONS = {"aws": ["us-east-1", "us-west-2"], "gcp": ["us-central1"], "libcloud": ["regionone"]}
COLUMNS = ("line_key", "subject", "node_id", "period_start", "period_end", "day", "kind",
           "project", "job_id", "policy", "pool", "provider", "region", "instance_type", "market",
           "price_usd_hour", "instance_seconds", "gpu_seconds", "cost_micros",
           "onprem_equiv_micros", "final", "rolled_at")


@contextlib.contextmanager
def scratch_pg_store(admin_url: str, prefix: str) -> Iterator[Store]:
    """A migrated store on a fresh PostgreSQL database of the server at ``admin_url``, dropped
    on the way out (the benches' PostgreSQL runs)."""
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        url = sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        with Store(url) as store:
            store.upgrade()
            yield store
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def each_store(args: argparse.Namespace, prefix: str) -> Iterator[tuple[Store, str]]:
    """(store, label) for a scratch SQLite store unless ``--no-sqlite`` with ``--pg``, then a
    scratch PostgreSQL one when ``--pg`` is given: the benches' ``--pg``/``--no-sqlite`` flags."""
    if not (args.no_sqlite and args.pg):
        with tempfile.TemporaryDirectory(prefix=f"{prefix}-db-") as tmp:
            with Store(f"sqlite:///{Path(tmp) / 'burst.db'}") as store:
                store.upgrade()
                yield store, "SQLite"
    if args.pg:
        with scratch_pg_store(args.pg, prefix.replace("-", "_")) as store:
            yield store, "PostgreSQL"


def lines(total: int, seed: int = 7) -> Iterator[tuple]:
    """``total`` cost lines as tuples in COLUMNS order."""
    rng = random.Random(seed)
    projects = [f"project-{i:02d}" for i in range(50)]
    made = 0
    node = 0
    per_node = max(total // 2000, 1)
    while made < total:
        provider, itype, gpus, price = TYPES[node % len(TYPES)]
        region = rng.choice(REGIONS[provider])
        market = "spot" if rng.random() < 0.6 else "on-demand"
        owner = rng.choice(projects)
        pool, policy = ("gpu", "train") if node % 3 else ("big", "big-train")
        node_id = f"n-{node:05d}"
        hours = max(1, int(rng.uniform(0.3, 1.7) * per_node / 2.5))
        start = START + timedelta(hours=rng.randrange(0, 90 * 24 - hours))
        price_hour = price * (0.4 if market == "spot" else 1.0)
        cost_hour = round(price_hour * 1_000_000)
        for h in range(hours):
            if made >= total:
                return
            bucket = start + timedelta(hours=h)
            day = bucket.date().isoformat()
            users = rng.choice([0, 1, 1, 2, 3])
            shares = sorted(rng.sample(range(1, gpus * 8), min(users, gpus * 8 - 1)))
            cuts = [0, *shares, gpus * 8] if users else [0, gpus * 8]
            for i in range(len(cuts) - 1):
                weight = cuts[i + 1] - cuts[i]
                usage = users and i < len(cuts) - 2
                kind = "usage" if usage else "idle"
                project = rng.choice(projects) if usage else owner
                job = f"j-{node:05d}-{h:04d}-{i}" if usage else None
                cost = cost_hour * weight // (gpus * 8)
                yield (f"{node_id}:{bucket:%Y-%m-%dT%H}:{kind}:{job or '-'}", node_id, node_id,
                       bucket, bucket + timedelta(hours=1), day, kind, project, job, policy, pool,
                       provider, region, itype, market, price_hour, 3600 * weight / (gpus * 8),
                       450.0 * weight, cost, cost // 3 if usage else 0, True, END)
                made += 1
                if made >= total:
                    return
        node += 1


def load_sqlite(store: Store, total: int) -> None:
    insert = sa.insert(T.cost_lines)
    batch: list[dict] = []
    with store.engine.begin() as conn:
        for row in lines(total):
            batch.append(dict(zip(COLUMNS, row, strict=True)))
            if len(batch) == 20_000:
                conn.execute(insert, batch)
                batch.clear()
        if batch:
            conn.execute(insert, batch)
    store.rebuild_cost_rollups()  # loaded around write_ledger: the roll-ups as an upgrade builds
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE")


def load_pg(store: Store, total: int) -> None:
    raw = store.engine.raw_connection()
    try:
        cursor = raw.cursor()
        with cursor.copy(f"COPY cost_lines ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for row in lines(total):
                copy.write_row(row)
        raw.commit()
    finally:
        raw.close()
    store.rebuild_cost_rollups()  # loaded around write_ledger: the roll-ups as an upgrade builds
    # What autovacuum does to a table that grows by inserts: statistics, and the visibility map
    # that lets the covering indexes answer without visiting the table.
    with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE cost_lines")
        conn.exec_driver_sql("VACUUM ANALYZE cost_rollup_hours")
        conn.exec_driver_sql("VACUUM ANALYZE cost_rollup_days")
        conn.exec_driver_sql("VACUUM ANALYZE cost_rollup_months")


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float, object]:
    fn()  # warm: caches, the first compile of each statement
    samples = []
    result = None
    for _ in range(repeat):
        began = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - began)
    return statistics.median(samples), min(samples), result


def run(store: Store, label: str, repeat: int) -> None:
    month = (END - timedelta(days=30), END)
    cases: list[tuple[str, Callable[[], object]]] = [
        ("group_by project (all 90 days)",
         lambda: cost_report(store, CostQuery(group_by=(GroupKey.PROJECT,)))),
        ("group_by project,day",
         lambda: cost_report(store, CostQuery(group_by=(GroupKey.PROJECT, GroupKey.DAY)))),
        ("group_by provider,instance_type",
         lambda: cost_report(store, CostQuery(group_by=(GroupKey.PROVIDER,
                                                        GroupKey.INSTANCE_TYPE)))),
        ("project filter (1 project), group_by day",
         lambda: cost_report(store, CostQuery(group_by=(GroupKey.DAY,),
                                              projects=frozenset({"project-07"})))),
        ("last 30 days, group_by project",
         lambda: cost_report(store, CostQuery(since=month[0], until=month[1],
                                              group_by=(GroupKey.PROJECT,)))),
        ("spend(): 30-day budget window, everything",
         lambda: spend(store, since=month[0], until=month[1], now=END)),
        ("spend(): 30-day budget window, one project",
         lambda: spend(store, since=month[0], until=month[1], now=END, project="project-07")),
        ("spend(): 30-day budget window, one pool",
         lambda: spend(store, since=month[0], until=month[1], now=END, pool="big")),
    ]
    print(f"\n{label}")
    print(f"{'query':<44} {'rows':>6} {'median ms':>10} {'min ms':>8}")
    for name, fn in cases:
        median, best, result = timed(fn, repeat)
        rows = len(result.rows) if hasattr(result, "rows") else 1
        print(f"{name:<44} {rows:>6} {median * 1000:>10.0f} {best * 1000:>8.0f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--pg", nargs="?", const=PG_DEFAULT, default=None,
                        help="also PostgreSQL: an admin URL of its server (default: the tests')")
    parser.add_argument("--sqlite-file", type=Path, default=None,
                        help="keep the SQLite store in this file, and reuse it if it exists")
    parser.add_argument("--no-sqlite", action="store_true", help="PostgreSQL only")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        path = args.sqlite_file or Path(tmp) / "burst.db"
        if not args.no_sqlite:
            fresh = not path.exists()
            store = Store(f"sqlite:///{path}")
            store.upgrade()
            if fresh:
                began = time.perf_counter()
                load_sqlite(store, args.lines)
                print(f"SQLite: loaded in {time.perf_counter() - began:.1f} s")
            count = _count(store)
            size = path.stat().st_size / 2**20
            run(store, f"SQLite ({count:,} lines, {size:.0f} MiB)", args.repeat)
            store.close()

    if args.pg:
        with scratch_pg_store(args.pg, "burst_bench") as store:
            began = time.perf_counter()
            load_pg(store, args.lines)
            count = _count(store)
            print(f"PostgreSQL: loaded {count:,} lines in {time.perf_counter() - began:.1f} s")
            run(store, f"PostgreSQL ({count:,} lines)", args.repeat)


def _count(store: Store) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(T.cost_lines)).scalar())


if __name__ == "__main__":
    main()
