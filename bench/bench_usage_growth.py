"""Benchmark: how much measured GPU use grows the store in a day. Prints figures; not a test.

    python bench/bench_usage_growth.py [--nodes 100] [--jobs 1000] [--gpus 8]
                                       [--heartbeat-s 300] [--database-url URL]

``--nodes`` burst nodes of ``--gpus`` GPUs each run ``--jobs`` jobs over one day (each node runs
its share one after another, every job holding all the node's GPUs), and every node heartbeats its
readings every ``--heartbeat-s`` seconds through ``Store.record_gpu_readings``, exactly as the
API's heartbeat handler records them (utilisation varies per job and reading; memory too).

Growth is the store's pages in use after minus before (SQLite: (page_count - freelist_count) x
page_size; PostgreSQL: ``pg_total_relation_size`` of ``job_usage`` and ``node_usage_hours``).
The floor it is printed next to, measured in the same run: the same readings kept raw (one row
per GPU reading: node, job, time, GPU index, utilisation, memory), written for the first hour and
scaled to the day at the agent's real heartbeat (5 s). The aggregates' size does not depend on
the heartbeat rate (one row per job, one per node-hour): run with two ``--heartbeat-s`` to see it.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa

from orchestrator.domain import Node, NodeState
from orchestrator.domain.utilisation import GpuUse
from orchestrator.policy import Market
from orchestrator.store import Store, default_sqlite_url

START = datetime(2026, 12, 1, 0, 0, tzinfo=UTC)
DAY_S = 86400
AGENT_HEARTBEAT_S = 5.0  # the controller's heartbeat_s for ticks above 2 s


def _used_bytes(store: Store, tables: tuple[str, ...]) -> int:
    with store.engine.connect() as conn:
        if store.dialect == "sqlite":
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
            size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
            return (pages - free) * size
        return sum(conn.execute(sa.text("SELECT pg_total_relation_size(:t)"), {"t": t})
                   .scalar_one() for t in tables)


def _node(i: int, gpus: int) -> Node:
    return Node(f"n{i:03d}", "growth", "gpu", "sim", "sim/r/z/t8/spot", "t8", Market.SPOT, gpus,
                9.5, NodeState.READY, START, START, f"r{i}", instance_id=f"i{i}",
                project="research")


def _readings(node: int, job: str, gpus: int, step: int) -> list[GpuUse]:
    # Deterministic variety: every job has its own level, readings wander around it.
    level = (node * 37 + step // 50) % 100
    return [GpuUse(g, float((level + 7 * g + step) % 101), 1000.0 + 97 * ((step + g) % 400),
                   81920.0, job) for g in range(gpus)]


def run(store: Store, nodes: int, jobs: int, gpus: int, heartbeat_s: float) -> dict[str, float]:
    per_node = max(jobs // nodes, 1)
    job_s = DAY_S / per_node
    for n in range(nodes):
        for k in range(per_node):
            store.submit_job("research", "gpu", gpus, 0, job_s, None, START, job_id=f"j-{n:03d}-{k:02d}")
    fleet = [_node(n, gpus) for n in range(nodes)]
    tables = ("job_usage", "node_usage_hours")
    before = _used_bytes(store, tables)
    steps = int(DAY_S // heartbeat_s)
    started = time.perf_counter()
    for step in range(steps):
        at = START + timedelta(seconds=step * heartbeat_s)
        k = min(int(step * heartbeat_s // job_s), per_node - 1)
        for n, node in enumerate(fleet):
            store.record_gpu_readings(node, at, heartbeat_s,
                                      _readings(n, f"j-{n:03d}-{k:02d}", gpus, step),
                                      below_percent=5.0)
    elapsed = time.perf_counter() - started
    after = _used_bytes(store, tables)
    with store.engine.connect() as conn:
        rows = {t: conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one() for t in tables}
    return {"bytes": after - before, "writes": steps * nodes, "seconds": elapsed, **rows}


def raw_floor(store: Store, nodes: int, gpus: int) -> float:
    """Bytes per day of the same readings kept raw at the agent's heartbeat (one hour written,
    scaled to the day)."""
    meta = sa.MetaData()
    raw = sa.Table("raw_gpu_readings", meta,
                   sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
                   sa.Column("node_id", sa.String(64)), sa.Column("job_id", sa.String(64)),
                   sa.Column("at", sa.DateTime(timezone=True)), sa.Column("gpu", sa.Integer),
                   sa.Column("utilisation", sa.Float), sa.Column("memory_mib", sa.Float))
    meta.create_all(store.engine)
    before = _used_bytes(store, ("raw_gpu_readings",))
    steps = int(3600 // AGENT_HEARTBEAT_S)
    with store.engine.begin() as conn:
        for step in range(steps):
            at = START + timedelta(seconds=step * AGENT_HEARTBEAT_S)
            conn.execute(sa.insert(raw), [
                {"node_id": f"n{n:03d}", "job_id": f"j-{n:03d}-00", "at": at, "gpu": u.index,
                 "utilisation": u.utilisation_percent, "memory_mib": u.memory_used_mib}
                for n in range(nodes) for u in _readings(n, "j", gpus, step)])
    return (_used_bytes(store, ("raw_gpu_readings",)) - before) * 24.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--heartbeat-s", type=float, nargs="+", default=[300.0])
    parser.add_argument("--database-url", help="an empty database (default: SQLite in a temp dir)")
    parser.add_argument("--no-floor", action="store_true", help="skip the raw-readings floor")
    args = parser.parse_args()
    print(f"{args.nodes} nodes x {args.gpus} GPUs, {args.jobs} jobs, one day")
    with tempfile.TemporaryDirectory() as tmp:
        for beat in args.heartbeat_s:
            where = Path(tmp) / f"beat-{beat:g}"
            where.mkdir()
            url = args.database_url or default_sqlite_url(where)
            store = Store(url)
            store.upgrade()
            try:
                got = run(store, args.nodes, args.jobs, args.gpus, beat)
            finally:
                store.close()
            print(f"heartbeat {beat:g}s: {got['writes']:,} heartbeats recorded in "
                  f"{got['seconds']:.0f}s; job_usage {got['job_usage']:,} rows, node_usage_hours "
                  f"{got['node_usage_hours']:,} rows; growth {got['bytes'] / 1e6:.2f} MB/day")
        if not args.no_floor:
            store = Store(default_sqlite_url(Path(tmp)))
            store.upgrade()
            try:
                floor = raw_floor(store, args.nodes, args.gpus)
            finally:
                store.close()
            print(f"floor (same readings kept raw at a {AGENT_HEARTBEAT_S:g}s heartbeat, SQLite): "
                  f"{floor / 1e6:,.0f} MB/day")


if __name__ == "__main__":
    main()
