"""Chaos through Celery: workers and beat killed with SIGKILL, Redis restarted, over burst cycles.

The distributed mode run for real (``burst api``, two ``burst worker``, ``burst beat``, a private
redis-server without persistence, PostgreSQL), each cycle's jobs on burst nodes (local-provider
processes running the real node agent). While a cycle runs, random events strike: a worker killed
(and started again), both workers killed, beat killed, Redis stopped and started empty. Then the
cycle must finish by itself. The invariants are those of the embedded chaos test
(``tests/e2e/test_chaos_embedded.py``), exact; the timing is only bounded by conditions:

0 leaked instances, 0 jobs executed twice after a successful finish (a marker line per execution),
0 lost jobs (every job done), no node failed (the agents were healthy throughout).
"""

from __future__ import annotations

import os
import random
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import pytest

from orchestrator.domain.jobs import JobState
from orchestrator.domain.nodes import NodeState
from tests.controlplane.conftest import CLUSTER, POLICY_NAME

pytestmark = [pytest.mark.long, pytest.mark.postgres, pytest.mark.timeout(600)]

CYCLES = int(os.environ.get("BURST_CHAOS_CELERY_CYCLES", "4"))
JOBS = 4
EVENTS_PER_CYCLE = 8
SEED = int(os.environ.get("BURST_CHAOS_SEED", "13"))


@pytest.fixture(scope="module")
def cp_policy() -> str:
    return f"""\
# Celery chaos test: every job on a burst node, second-scale timings.
version: 1
name: {POLICY_NAME}
cluster: {CLUSTER}
pool:
  name: gpu
  onprem: {{nodes: 0, gpus_per_node: 4}}
trigger: {{pending_gpus_above: 0, oldest_wait_above: 0s, sustained_for: 0s}}
offerings:
  - {{provider: local, region: local, zone: local-a, instance_type: local.4gpu, market: on-demand,
     gpus: 4, price_usd_hour: 4.10}}
limits: {{max_nodes: 3, max_concurrent_launches: 3}}
scale_down: {{idle_for: 2s, drain_grace: 30s}}
timeouts: {{launch: 30s, boot: 60s, join: 30s, terminate: 30s, heartbeat: 10s,
           controller_lease: 300s}}
cooldowns: {{scale_up: 0s, scale_down: 1s}}
"""


def test_workers_beat_and_redis_killed_over_burst_cycles(cp, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    markers = tmp_path / "markers"
    command = (f'echo "start $BURST_JOB_ID" >> {markers}; sleep 2; '
               f'echo "done $BURST_JOB_ID" >> {markers}')
    cp.api()
    cp.worker("w1", wait=False)
    cp.worker("w2", wait=False)
    cp.wait_ready("w1", "w2")
    cp.beat()
    events: Counter[str] = Counter()
    started = time.monotonic()

    def restart_workers(*names: str) -> None:
        for name in names:
            cp.kill(name)
        time.sleep(rng.uniform(0.0, 2.0))
        for name in names:
            cp.worker(name, wait=False)

    for _cycle in range(CYCLES):
        for _ in range(JOBS):
            cp.store.submit_job("research", "gpu", 4, 0, 2.0, command, datetime.now(UTC))
        for _ in range(EVENTS_PER_CYCLE):
            time.sleep(rng.uniform(0.5, 3.0))
            roll = rng.random()
            if roll < 0.4:
                restart_workers(rng.choice(["w1", "w2"]))
                events["worker killed"] += 1
            elif roll < 0.55:
                restart_workers("w1", "w2")
                events["both workers killed"] += 1
            elif roll < 0.8:
                cp.kill("beat")
                time.sleep(rng.uniform(0.0, 2.0))
                cp.beat()
                events["beat killed"] += 1
            else:
                cp.redis.stop()
                time.sleep(rng.uniform(0.5, 3.0))
                cp.redis.start()
                events["redis restarted"] += 1

        def finished():
            jobs = cp.store.jobs()
            nodes = cp.store.nodes(include_terminated=True)
            done = all(j.state is JobState.DONE for j in jobs)
            gone = all(n.state is NodeState.TERMINATED for n in nodes)
            return (jobs, nodes) if done and gone else None

        cp.wait(finished, 180, "the cycle finished: every job done, every node terminated")
    wall = time.monotonic() - started

    jobs = cp.store.jobs()
    nodes = cp.store.nodes(include_terminated=True)
    failed = [(e.node_id, e.reason) for n in nodes for e in cp.store.events(n.id)
              if e.to_state is NodeState.FAILED]
    lines = [line for line in markers.read_text().split("\n") if line]
    runs = Counter(line.split()[1] for line in lines if line.startswith("start "))
    done_seen: set[str] = set()
    again = []
    for line in lines:
        kind, job = line.split()
        if kind == "done":
            done_seen.add(job)
        elif job in done_seen:
            again.append(job)
    per_node = cp.instances_per_node()
    print(f"\ncelery chaos: {dict(events)}, {CYCLES} cycles, {len(jobs)} jobs, "
          f"{sum(runs.values())} executions, {len(nodes)} nodes, {len(failed)} failed nodes, "
          f"{len(again)} re-runs after success, wall {wall:.0f}s")

    assert len(jobs) == CYCLES * JOBS
    assert [j.id for j in jobs if j.state is not JobState.DONE] == [], "lost jobs"
    assert again == [], f"jobs executed again after a successful finish: {again}"
    assert set(runs) == {j.id for j in jobs}
    assert failed == [], f"healthy nodes were failed: {failed}"
    assert all(count == 1 for count in per_node.values()), per_node
    assert set(per_node) <= {n.id for n in nodes}, "an instance without a node record"
    cp.wait(lambda: cp.node_processes() == [], 30, "no local-provider process left")
