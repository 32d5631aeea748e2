"""Learned boot time in production: the Observer estimates each offering's launch-to-ready time
(decayed p90) from the store's node events (a real store), only when a policy asks for it
(``trigger.learn_boot``), and the planner's wait-aware rule reads it from the snapshot."""

from __future__ import annotations

from orchestrator.domain import NodeState
from orchestrator.observe import Observer
from orchestrator.planner.boot import choose_boot
from orchestrator.store import Store
from tests.builders import make_policy, make_rig, offering_spec

OFFER = offering_spec("g5.12xlarge", gpus=4, price=2)


def test_boots_seen_in_node_events_become_the_offerings_learned_boot(store: Store) -> None:
    policy = make_policy(offerings=[OFFER], trigger={"wait_slo": "30m", "learn_boot": True})
    rig = make_rig(store, policy=policy)
    observer = Observer(store, rig.queue, {rig.provider.name: rig.provider}, policies=[policy])
    key = policy.offerings[0].key
    assert observer.snapshot(rig.now).boot_estimates == {}
    for n in range(1, 9):  # boots of 1..8 minutes
        rig.executor.run([rig.launch_action(n)])
        rig.clock.advance(minutes=n)
        rig.move(f"n{n}", NodeState.BOOTING, NodeState.JOINING, NodeState.READY,
                 last_heartbeat=rig.now)
    estimate = observer.snapshot(rig.now).boot_estimates[key]
    # The p90 of 1..8 minutes (nearly equal weights: 90 % of the weight needs the eighth).
    assert estimate.boot_s == 8 * 60.0
    assert 7.9 < estimate.samples < 8
    chosen = choose_boot(policy, {key: estimate})
    assert chosen.source == "policy"  # under 8 decayed boots: one short of the 8 required
    rig.executor.run([rig.launch_action(9)])
    rig.move("n9", NodeState.BOOTING, NodeState.JOINING, NodeState.READY, last_heartbeat=rig.now)
    chosen = choose_boot(policy, observer.snapshot(rig.now).boot_estimates)
    assert (chosen.source, chosen.offering) == ("learned", key)


def test_without_learn_boot_the_observer_reads_no_boots(store: Store) -> None:
    policy = make_policy(offerings=[OFFER])
    rig = make_rig(store, policy=policy)
    observer = Observer(store, rig.queue, {rig.provider.name: rig.provider}, policies=[policy])
    rig.executor.run([rig.launch_action(1)])
    rig.move("n1", NodeState.BOOTING, NodeState.JOINING, NodeState.READY, last_heartbeat=rig.now)
    assert observer.snapshot(rig.now).boot_estimates == {}
