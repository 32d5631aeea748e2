"""Redis restarted mid-run: the loop resumes without losing or duplicating nodes.

During a burst (nodes booting, joined, running jobs) the module's redis-server is stopped with
SIGTERM and started again on the same port a few seconds later. It runs without persistence, so
everything in it is gone: queued and unacknowledged tasks, results, leader leases, fencing
counters. The workers and beat reconnect by themselves; the loop state lives in PostgreSQL, so the
cycle completes: every node created reaches ``terminated`` (none lost), each with exactly one
instance (none duplicated), and every job finishes.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime

import pytest

from orchestrator.domain.jobs import JobState
from orchestrator.domain.nodes import NodeState
from tests.controlplane.conftest import POLICY_NAME

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

JOBS = 5
DOWN_S = 3.0
LIVE = (NodeState.BOOTING, NodeState.JOINING, NodeState.READY)


def test_redis_restart_mid_burst_loses_and_duplicates_no_node(cp):
    cp.api()
    cp.worker("w1", wait=False)
    cp.worker("w2", wait=False)
    cp.wait_ready("w1", "w2")
    cp.beat()
    started = time.monotonic()
    cp.burst("submit", "--policy", str(cp.policy_path), "--project", "research", "--gpus", "4",
             "--duration", "6s", "--count", str(JOBS))
    cp.wait(lambda: sum(n.state in LIVE for n in cp.store.nodes()) >= 2, 60,
            "a burst under way (two nodes booting or joined)")

    before = {n.id: n.state for n in cp.store.nodes(include_terminated=True)}
    client = cp.redis.client(0)
    client.set("controlplane-test:sentinel", "before the restart")
    cp.redis.stop()
    stopped_at = datetime.now(UTC)
    time.sleep(DOWN_S)
    cp.redis.start()
    restarted_at = datetime.now(UTC)
    assert client.get("controlplane-test:sentinel") is None, "Redis kept data across the restart"
    client.close()

    def finished():
        jobs = cp.store.jobs()
        nodes = cp.store.nodes(include_terminated=True)
        done = len(jobs) == JOBS and all(j.state is JobState.DONE for j in jobs)
        gone = bool(nodes) and all(n.state is NodeState.TERMINATED for n in nodes)
        return (jobs, nodes) if done and gone else None

    jobs, nodes = cp.wait(finished, 120, "every job done and every node terminated after the restart")
    cycle_s = time.monotonic() - started
    for name in ("w1", "w2", "beat", "api"):
        assert cp.procs[name].poll() is None, f"{name} did not survive the Redis restart"

    # No node lost: every node that existed before the restart was carried to the end.
    final = {n.id: n for n in nodes}
    assert set(before) <= set(final), set(before) - set(final)
    # No node duplicated: one instance per node, and every instance gone.
    per_node = cp.instances_per_node()
    assert per_node == Counter({node_id: 1 for node_id in final}), per_node
    assert all(r["state"] == "terminated" for r in cp.instance_records())
    for node_id in final:
        steps = Counter((e.from_state, e.to_state) for e in cp.store.events(node_id))
        assert steps[(NodeState.REQUESTED, NodeState.LAUNCHING)] == 1, (node_id, steps)
    cp.wait(lambda: cp.node_processes() == [], 10, "no local-provider process left")

    # The loop resumed after the restart: ticks planned again (fencing tokens restarted above
    # the store's highest, or the store would refuse every tick).
    # (A tick deciding what the previous one did is counted on that decision: last_seen moves.)
    resumed = [d for d in cp.store.decisions(policy=POLICY_NAME, limit=10_000)
               if d.last_seen > restarted_at]
    assert resumed, "no tick planned after the restart"
    gap_s = (min(d.at if d.at > restarted_at else d.last_seen for d in resumed)
             - stopped_at).total_seconds()
    stale = sum(cp.log(name).count("StaleLeaderError") for name in ("w1", "w2"))
    print(f"\nredis restart: down {DOWN_S:.0f}s with nodes {dict(Counter(map(str, before.values())))}; "
          f"first tick planned {gap_s:.1f}s after the stop; cycle {cycle_s:.1f}s; "
          f"{len(final)} node(s), all terminated, one instance each; job attempts "
          f"{sorted(j.attempts for j in jobs)}; stale-leader refusals in worker logs: {stale}")
