"""A whole burst cycle driven only by Celery beat and workers, against the local provider.

Jobs go in with `burst submit`; from then on nothing in the test process drives the loop: beat
sends `burst.loop.tick` / `burst.reconcile.run`, two worker processes plan (under the leader
lease), launch local nodes (`burst.provider.launch`), the nodes' agents register with the
controller API and run the jobs, and the idle nodes are drained and terminated. The test only
watches the database and the local provider's records.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

from orchestrator.domain.jobs import JobState, Placement
from orchestrator.domain.nodes import NodeState
from orchestrator.domain.plan import Rule
from tests.controlplane.conftest import POLICY_NAME

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

JOBS = 5  # 4 GPUs each: one fits on-prem (4 GPUs), the rest need burst nodes (max 3)


def test_full_burst_cycle_driven_by_beat_and_workers(cp):
    cp.api()
    cp.worker("w1", wait=False)
    cp.worker("w2", wait=False)
    cp.wait_ready("w1", "w2")
    cp.beat()
    started = time.monotonic()
    cp.burst("submit", "--policy", str(cp.policy_path), "--project", "research", "--gpus", "4",
             "--duration", "3s", "--count", str(JOBS))

    def finished():
        jobs = cp.store.jobs()
        nodes = cp.store.nodes(include_terminated=True)
        done = len(jobs) == JOBS and all(j.state is JobState.DONE for j in jobs)
        gone = bool(nodes) and all(n.state is NodeState.TERMINATED for n in nodes)
        return (jobs, nodes) if done and gone else None

    jobs, nodes = cp.wait(finished, 120, "every job done and every node terminated")
    cycle_s = time.monotonic() - started

    # Each job ran exactly once, some of them on burst nodes.
    assert [j.attempts for j in jobs] == [1] * JOBS, [(j.id, j.attempts) for j in jobs]
    placements = Counter(j.placement for j in jobs)
    assert placements[Placement.BURST] >= 1, placements

    # Nodes were launched, each exactly once, and every instance is gone.
    assert nodes, "no node was launched"
    per_node = cp.instances_per_node()
    assert per_node == Counter({n.id: 1 for n in nodes}), per_node
    assert all(r["state"] == "terminated" for r in cp.instance_records())
    for node in nodes:
        steps = [(e.from_state, e.to_state) for e in cp.store.events(node.id)]
        assert steps.count((NodeState.REQUESTED, NodeState.LAUNCHING)) == 1, (node.id, steps)
        assert steps[-1][1] is NodeState.TERMINATED, (node.id, steps)
    cp.wait(lambda: cp.node_processes() == [], 10, "no local-provider process left")

    # The ticks planned: decisions stored, and every node's intent names a stored decision.
    decisions = cp.store.decisions(policy=POLICY_NAME, limit=10_000)
    assert any(d.rule is Rule.SCALE_UP for d in decisions), Counter(d.rule for d in decisions)
    decision_ids = {d.id for d in decisions}
    for node in nodes:
        intent = cp.store.events(node.id)[0]
        assert intent.to_state is NodeState.REQUESTED
        assert intent.details.get("decision") in decision_ids, intent.details
    ticks = [r["result"] for r in cp.task_results()
             if isinstance(r.get("result"), dict) and r["result"].get("policy") == POLICY_NAME]
    led = [t for t in ticks if t.get("leader")]
    assert led, "no tick ran as leader"
    launched_by_tasks = sum(t.get("launch", 0) for t in led)
    assert launched_by_tasks == len(nodes), (launched_by_tasks, len(nodes))

    where = {str(place): count for place, count in placements.items()}
    print(f"\nfull cycle: {JOBS} jobs ({where}), {len(nodes)} burst node(s), "
          f"{len(decisions)} decisions from {len(led)} leader ticks, cycle {cycle_s:.1f}s "
          "(submit -> all jobs done and all nodes terminated)")
