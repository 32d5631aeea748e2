"""Learned capacity in production: the Observer estimates each offering's preemption hazard and
stockout odds from the store's node events (a real store: SQLite and PostgreSQL), on the bundled
Spot Advisor prior, and the planner's per-job choice reads it from the snapshot."""

from __future__ import annotations

from orchestrator.domain import NodeState
from orchestrator.domain.capacity import bucket_hazard
from orchestrator.observe import Observer
from orchestrator.store import Store
from orchestrator.wiring import capacity_prior
from tests.builders import make_policy, make_rig, offering_spec

SPOT = offering_spec("g5.12xlarge", gpus=4, price=2, market="spot")


def test_interruptions_seen_by_the_reconciler_raise_the_learned_hazard(store: Store) -> None:
    policy = make_policy(offerings=[SPOT], spot={"by_expected_cost": True})
    rig = make_rig(store, policy=policy)
    observer = Observer(store, rig.queue, {rig.provider.name: rig.provider}, policies=[policy],
                        capacity_prior=capacity_prior())
    key = policy.offerings[0].key
    before = observer.snapshot(rig.now).offering_health[key]
    # us-east-1 g5.12xlarge is in the Spot Advisor's top bucket (>20 %)
    assert before.preemptions_per_hour == float(f"{bucket_hazard(4):.2g}")
    assert before.stockout_odds == 0 and before.prior

    for n in (1, 2, 3):
        rig.executor.run([rig.launch_action(n)])
        rig.clock.advance(minutes=5)
        node = rig.move(f"n{n}", NodeState.BOOTING, NodeState.JOINING, NodeState.READY,
                        last_heartbeat=rig.now)
        rig.clock.advance(minutes=1)
        rig.provider.vanish(node.instance_id)  # the spot reclaim
        rig.reconcile()
        rig.clock.advance(minutes=1)
        rig.reconcile()
        assert rig.node(f"n{n}").state in (NodeState.FAILED, NodeState.TERMINATING,
                                           NodeState.TERMINATED)
    after = observer.snapshot(rig.now).offering_health[key]
    assert after.preemptions_per_hour > before.preemptions_per_hour * 10
    assert after.evidence_launches == 3 and 0.25 < after.evidence_hours < 0.45
    ends = [e for e in store.events("n1") if e.to_state is NodeState.FAILED]
    assert ends and ends[0].reason.startswith("instance vanished")


def test_capacity_errors_raise_the_stockout_odds(store: Store) -> None:
    from orchestrator.domain.ports import CapacityError

    policy = make_policy(offerings=[SPOT], spot={"by_expected_cost": True})
    rig = make_rig(store, policy=policy)
    observer = Observer(store, rig.queue, {rig.provider.name: rig.provider}, policies=[policy],
                        capacity_prior=capacity_prior())
    key = policy.offerings[0].key
    for n in (1, 2):
        rig.provider.inject("launch", CapacityError("no capacity", provider="aws",
                                                    offering_key=key, request_id=f"r-n{n}"))
        rig.executor.run([rig.launch_action(n)])
    health = observer.snapshot(rig.now).offering_health[key]
    assert health.stockout_odds == float(f"{2 / (4 + 2):.2g}")  # 2 refusals on a prior of 4
    off = Observer(store, rig.queue, {rig.provider.name: rig.provider}, policies=[make_policy()])
    assert off.snapshot(rig.now).offering_health == {}  # no policy chooses by expected cost
