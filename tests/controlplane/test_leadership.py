"""Leadership: two beats and three workers at once plan each tick once; a deposed leader is fenced.

Two beats (high availability the plain way: each sends every tick) and three workers run for
about ten tick periods while jobs wait for burst capacity. For every tick period of the policy at
most one tick task plans (the others are refused by the lease or find the period planned), the
leaders' fencing tokens grow from one to the next, and nothing is launched twice.

Then a stale leader, through the tick task's own code: A takes the lease (token t1) and is paused
past its expiry; B's tick takes the lease (t2 > t1) and writes; A wakes up and carries on with
its tick believing it still leads. The store refuses A's first write with StaleLeaderError and
leaves every row as B left it.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from contextlib import contextmanager
from datetime import datetime

import pytest

from orchestrator.automation.leader import LeaderLease
from orchestrator.domain.nodes import NodeState
from orchestrator.store.fencing import StaleLeaderError
from tests.controlplane.conftest import POLICY_NAME, TICK_S

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SCOPE = f"policy:{POLICY_NAME}"
PERIODS = 10


def led_ticks(cp) -> list[dict]:
    """Results of the ticks that planned (as leader). Decisions cannot count them: a tick that
    decides what the previous one did is counted on the stored decision, not stored anew."""
    return [r["result"] for r in cp.task_results()
            if isinstance(r.get("result"), dict) and r["result"].get("policy") == POLICY_NAME
            and r["result"].get("leader")]


def planned_times(cp) -> list[datetime]:
    return [datetime.fromisoformat(t["at"]) for t in led_ticks(cp)]


def test_two_beats_and_three_workers_plan_each_tick_once(cp):
    for name in ("w1", "w2", "w3"):
        cp.worker(name, concurrency=2, wait=False)
    cp.wait_ready("w1", "w2", "w3")
    # Two jobs of 4 GPUs: one runs on-prem, the other needs a burst node (no API here: the node
    # launches and boots but never joins, so the demand stays and every tick has work to plan).
    cp.burst("submit", "--policy", str(cp.policy_path), "--project", "research", "--gpus", "4",
             "--duration", "60s", "--count", "2")
    cp.beat("beat-a")
    time.sleep(0.45)  # out of phase: the two beats' ticks of a period arrive apart
    cp.beat("beat-b")
    cp.wait(lambda: len(planned_times(cp)) >= PERIODS, 60, f"{PERIODS} planned ticks")
    cp.stop("beat-a")
    cp.stop("beat-b")
    time.sleep(2 * TICK_S)  # let the last ticks and launches finish
    cp.stop_all()

    sent = {name: cp.log(name).count("Sending due task tick:") for name in ("beat-a", "beat-b")}
    assert all(count >= PERIODS // 2 for count in sent.values()), sent

    # At most one planner per (policy, tick period).
    per_period = Counter(int(at.timestamp() // TICK_S) for at in planned_times(cp))
    assert max(per_period.values()) == 1, sorted(per_period.items())

    ticks = [r for r in cp.task_results()
             if isinstance(r.get("result"), dict) and r["result"].get("policy") == POLICY_NAME]
    led = sorted(led_ticks(cp), key=lambda t: datetime.fromisoformat(t["at"]))
    refused = [r for r in ticks if not r["result"]["leader"]]
    assert len(led) == sum(per_period.values())
    assert refused, "two beats sent every tick, yet no tick was refused"
    # Every planned tick's decision is stored: as a row, or counted on the row it repeats.
    assert cp.store.get_decision(led[-1]["decisions"][0]) is not None, led[-1]
    fences = [t["fence"] for t in led]  # in planning order: each leader's is larger
    assert all(a < b for a, b in itertools.pairwise(fences)), fences

    # Nothing launched twice.
    nodes = cp.store.nodes(include_terminated=True)
    assert 1 <= len(nodes) <= 3
    assert cp.instances_per_node() == Counter({n.id: 1 for n in nodes})
    for node in nodes:
        steps = Counter((e.from_state, e.to_state) for e in cp.store.events(node.id))
        assert steps[(NodeState.REQUESTED, NodeState.LAUNCHING)] <= 1, steps
    print(f"\nleadership: ticks sent {sent}, planned {len(led)} in {len(per_period)} periods "
          f"(max {max(per_period.values())} per period), refused {len(refused)} "
          f"({Counter(r['result'].get('reason', 'lease held') for r in refused)}), "
          f"fences {fences[0]}..{fences[-1]}, nodes {len(nodes)}")


def rows(cp) -> dict:
    """Everything a tick may write, to compare before and after the stale leader."""
    store = cp.store
    return {
        "decisions": sorted((d.id, d.repeats) for d in store.decisions(limit=100_000)),
        "memory": store.load_memory(),
        "nodes": sorted((n.id, n.state, n.version) for n in store.nodes(include_terminated=True)),
        "events": len(store.events(limit=100_000)),
        "jobs": sorted((j.id, j.state, j.version) for j in store.jobs()),
        "fence": store.fence_token(SCOPE),
    }


def test_a_stale_leaders_tick_is_refused_by_the_fence(cp, monkeypatch):
    from orchestrator.automation import runtime as runtime_module
    from orchestrator.automation import tasks

    # The tick task's code runs here, wired from the same BURST_* settings as the workers.
    for key, value in cp.env.items():
        monkeypatch.setenv(key, value)
    runtime_module.runtime.cache_clear()
    runtime_module.redis_client.cache_clear()
    cp.celery.set_current()  # anything the tick dispatches goes to the module's private Redis
    client = cp.redis.client(2)
    try:
        # A leads with t1, then stops (GC pause, frozen VM) for longer than its lease.
        lease_a = LeaderLease(client, SCOPE, lease_s=0.5)
        t1 = lease_a.acquire(floor=cp.store.fence_token(SCOPE) or 0)
        assert t1 is not None
        time.sleep(0.8)
        assert not lease_a.held

        # B: an ordinary tick takes the lease with a larger token and writes its plan.
        b = tasks.tick.run(POLICY_NAME)
        assert b["leader"] is True and b["fence"] > t1, b
        before = rows(cp)
        assert before["fence"] == b["fence"]

        # A wakes up inside its tick, still believing it leads with t1.
        @contextmanager
        def still_believes_it_leads(*_args, **_kwargs):
            yield t1

        monkeypatch.setattr(tasks, "lead", still_believes_it_leads)
        with pytest.raises(StaleLeaderError) as refused:
            tasks.tick.run(POLICY_NAME, replan=True)  # replan: B claimed this period already
        assert (refused.value.token, refused.value.current) == (t1, b["fence"])
        assert rows(cp) == before, "the stale leader's tick changed rows"

        # The same through the fenced store directly: t1 refused, B's token still accepted.
        memory = before["memory"][POLICY_NAME]
        with pytest.raises(StaleLeaderError):
            cp.store.fenced(SCOPE, t1).save_memory(POLICY_NAME, memory)
        cp.store.fenced(SCOPE, b["fence"]).save_memory(POLICY_NAME, memory)
        assert cp.store.fence_token(SCOPE) == b["fence"]
        print(f"\nstale leader: A's token {t1} refused after B took over with {b['fence']}; "
              "no row changed")
    finally:
        client.close()
        if runtime_module.runtime.cache_info().currsize:
            runtime_module.runtime().close()
        runtime_module.runtime.cache_clear()
        runtime_module.redis_client.cache_clear()
