"""Benchmark: how much the store grows per policy-day from decisions. Prints figures; not a test.

    python bench/bench_decision_growth.py [--ticks 8640] [--tick-s 10] [--database-url URL]

One policy is planned ``--ticks`` times ``--tick-s`` apart (8640 x 10 s = one day at the default
tick) by the real planner, and every decision is recorded through ``Store.add_decision`` into a
fresh store (SQLite in a temporary directory unless ``--database-url`` names an empty database),
exactly as the loop records them. Two queues:

* steady: six 8-GPU jobs pending while the policy sits at ``max_nodes`` (the "held back, nothing
  changes" case of a long day): after the sustain period every tick decides the same;
* waiting: the same six jobs under a trigger that never fires (``pending_gpus_above: 1000``,
  ``combine: all``), no burst nodes: the decision says "trigger not met" with the oldest wait,
  which grows every tick (elapsed times do not make a tick a new decision);
* changing: a job arrives or starts every tick, so each tick's summary differs from the last
  (the worst case: one row per tick, as before repeats were counted).

Growth is the store's size after minus before: on SQLite the pages in use ((page_count -
freelist_count) x page_size), on PostgreSQL ``pg_total_relation_size('decisions')``; both per
policy-day (scaled to 86400 s when ``--ticks`` covers less).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import sqlalchemy as sa
import yaml

from orchestrator.domain import Job, Node, NodeState, OnPremState, PoolQueue, Snapshot
from orchestrator.planner import plan
from orchestrator.policy import Market, load_policy_text
from orchestrator.store import Store, default_sqlite_url

START = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)
POLICY = {"version": 1, "name": "growth",
          "pool": {"name": "gpu", "onprem": {"nodes": 2, "gpus_per_node": 8}},
          "offerings": [{"provider": "sim", "region": "r", "zone": "z", "instance_type": "t8",
                         "market": "spot", "gpus": 8, "price_usd_hour": 9.5}],
          "limits": {"max_nodes": 2}}


def _fleet(now: datetime) -> tuple[Node, ...]:
    return tuple(Node(f"n{i}", "growth", "gpu", "sim", "sim/r/z/t8/spot", "t8", Market.SPOT, 8,
                      9.5, NodeState.READY, START - timedelta(hours=2), START - timedelta(hours=2),
                      f"r{i}", instance_id=f"i{i}", gpus_busy=8, running_jobs=1, idle_since=None,
                      last_heartbeat=now) for i in range(2))


WAITING = {**POLICY, "trigger": {"pending_gpus_above": 1000, "oldest_wait_above": "30d",
                                 "combine": "all"}}


def _pending(tick: int, changing: bool) -> tuple[Job, ...]:
    # changing: between 3 and 9 jobs, a different count every tick.
    count = 3 + tick % 7 if changing else 6
    first = tick if changing else 0
    return tuple(Job(f"j{first + i}", "p", "gpu", 8, START - timedelta(hours=1), duration_s=3600)
                 for i in range(count))


def _size(store: Store) -> int:
    with store.engine.connect() as conn:
        if store.engine.dialect.name == "sqlite":
            pages = conn.exec_driver_sql("PRAGMA page_count").scalar_one()
            free = conn.exec_driver_sql("PRAGMA freelist_count").scalar_one()
            size = conn.exec_driver_sql("PRAGMA page_size").scalar_one()
            return int((pages - free) * size)
        return int(conn.execute(sa.text("select pg_total_relation_size('decisions')")).scalar_one())


def run(url: str, ticks: int, tick_s: float, queue_kind: str) -> dict:
    changing = queue_kind == "changing"
    waiting = queue_kind == "waiting"
    policy = load_policy_text(yaml.safe_dump(WAITING if waiting else POLICY), "growth")
    store = Store(url)
    store.upgrade()
    before = _size(store)
    memory: dict = {}
    started = time.perf_counter()
    for tick in range(ticks):
        now = START + timedelta(seconds=tick * tick_s)
        queue = PoolQueue("gpu", OnPremState(16, 0, (0, 0)), _pending(tick, changing))
        fleet = () if waiting else _fleet(now)
        result = plan(Snapshot(now, {"gpu": queue}, fleet, (), memory=memory), [policy], now)
        memory = result.memory
        for decision in result.decisions:
            store.add_decision(decision)
    elapsed = time.perf_counter() - started
    grown = _size(store) - before
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("select count(*), coalesce(sum(repeats), 0) from decisions")).one()
    store.close()
    scale = 86_400 / (ticks * tick_s)
    return {"queue": queue_kind, "ticks": ticks, "rows": rows[0],
            "ticks_counted": rows[1], "grown_bytes": grown, "mb_per_policy_day": grown * scale / 1e6,
            "seconds": elapsed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ticks", type=int, default=8640, help="ticks to plan (default: one day at 10 s)")
    ap.add_argument("--tick-s", type=float, default=10.0, help="seconds between ticks (default 10)")
    ap.add_argument("--database-url", help="an empty database to use (default: SQLite in a temp dir)")
    args = ap.parse_args()
    if args.ticks < 1 or args.tick_s <= 0:
        ap.error("--ticks must be at least 1 and --tick-s positive")
    print(f"{'queue':9} {'ticks':>6} {'rows':>6} {'counted':>8} {'grown KB':>9} {'MB/policy-day':>14} {'s':>6}")
    for kind in ("steady", "waiting", "changing"):
        with tempfile.TemporaryDirectory() as tmp:
            url = args.database_url or default_sqlite_url(Path(tmp))
            if args.database_url:
                Store(url).downgrade("base")
            r = run(url, args.ticks, args.tick_s, kind)
        print(f"{r['queue']:9} {r['ticks']:6d} {r['rows']:6d} {r['ticks_counted']:8d} "
              f"{r['grown_bytes'] / 1e3:9.1f} {r['mb_per_policy_day']:14.3f} {r['seconds']:6.1f}")


if __name__ == "__main__":
    main()
