"""The reconciler against a real store (SQLite and PostgreSQL) and a FakeProvider: ``sync`` records
reality, ``step`` returns corrective actions, each checked with its timing (graces, timeouts).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestrator.domain import ActionReason, Launch, Node, NodeState, Terminate
from orchestrator.domain.jobs import JobState, Placement
from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.ports import InstanceState, LaunchRequest
from orchestrator.lifecycle import NodeEvent
from orchestrator.store import Store
from tests.builders import Rig, make_rig, offering_of

S = NodeState
PROVIDER = "aws"


@pytest.fixture
def rig(store: Store) -> Rig:
    return make_rig(store)


def record_intent(rig: Rig, n: int = 1) -> Node:
    """What the executor writes before calling the provider (and then the process died)."""
    action = rig.launch_action(n)
    offering = action.offering
    node = Node(id=action.node_id, policy=action.policy, pool=action.pool, provider=PROVIDER,
                offering_key=offering.key, instance_type=offering.instance_type,
                market=offering.market, gpus=offering.gpus, price_usd_hour=offering.price_usd_hour,
                state=S.REQUESTED, state_since=rig.now, created_at=rig.now,
                request_id=action.request_id, project=action.project)
    assert rig.store.add_node(node, NodeEvent(node.id, rig.now, None, S.REQUESTED, "demand", {}))
    return node


def cloud_launch(rig: Rig, node_id: str, request_id: str, cluster: str = "burst") -> str:
    """An instance created at the provider directly (by a launch whose outcome was lost)."""
    [instance] = rig.provider.launch(LaunchRequest(
        request_id, offering_of(rig.policy),
        OwnershipTags(cluster, rig.policy.name, node_id, request_id), "#!/bin/bash\n"))
    return instance.id


def launched(rig: Rig, n: int = 1, *states: NodeState, **changes) -> Node:
    rig.executor.run([rig.launch_action(n)])
    return rig.move(f"n{n}", *states, **changes)


def corrective(rig: Rig) -> list[tuple]:
    out = []
    for a in rig.reconciler.step(rig.now):
        if isinstance(a, Terminate):
            out.append(("terminate", a.node_id, a.reason, a.instance_id))
        elif isinstance(a, Launch):
            out.append(("launch", a.node_id, a.request_id, a.reason))
    return out


# -- sync: recording reality ---------------------------------------------------------------------

def test_adopts_an_instance_carrying_a_requested_nodes_request_id(rig: Rig) -> None:
    node = record_intent(rig)
    instance_id = cloud_launch(rig, node.id, node.request_id)
    events = rig.sync()
    adopted = rig.node(node.id)
    assert adopted.state is S.LAUNCHING and adopted.instance_id == instance_id
    assert [(e.from_state, e.to_state) for e in events] == [(S.REQUESTED, S.LAUNCHING)]
    assert corrective(rig) == []  # neither a leak nor a relaunch


def test_instance_of_another_request_is_not_adopted(rig: Rig) -> None:
    node = record_intent(rig)
    cloud_launch(rig, node.id, "r-someone-else")
    rig.sync()
    assert rig.node(node.id).state is S.REQUESTED


def test_launching_to_booting_when_running(rig: Rig) -> None:
    node = launched(rig, 1)
    rig.sync()
    assert rig.node("n1").state is S.LAUNCHING  # still pending at the provider
    rig.provider.set_state(node.instance_id, InstanceState.RUNNING)
    rig.sync()
    assert rig.node("n1").state is S.BOOTING


def test_terminating_to_terminated_once_gone(rig: Rig) -> None:
    node = launched(rig, 1, S.BOOTING, S.JOINING, S.READY, last_heartbeat=rig.now)
    rig.executor.run([Terminate("n1", ActionReason.IDLE)])
    rig.provider.set_state(node.instance_id, InstanceState.STOPPING)
    rig.sync()
    assert rig.node("n1").state is S.TERMINATING
    rig.provider.set_state(node.instance_id, InstanceState.TERMINATED)
    rig.sync()
    assert rig.node("n1").state is S.TERMINATED


def test_provider_missing_from_the_observation_is_left_alone(rig: Rig) -> None:
    launched(rig, 1, S.BOOTING, S.JOINING, S.READY, last_heartbeat=rig.now)
    rig.clock.advance(minutes=5)
    assert rig.reconciler.sync({}, rig.now) == []  # the listing failed: nothing is concluded
    assert rig.node("n1").state is S.READY


# -- vanished instances ----------------------------------------------------------------------------

def test_vanished_instance_fails_after_vanish_grace_and_requeues_jobs(rig: Rig) -> None:
    node = launched(rig, 1, S.BOOTING, S.JOINING, S.READY, last_heartbeat=rig.now)
    job = rig.store.submit_job("research", "gpu", 8, 0, 3600, "train.py", rig.now)
    rig.store.start_job(job, placement=Placement.BURST, node_id="n1", at=rig.now)
    rig.clock.advance(hours=1)  # the node has been ready for an hour
    rig.provider.vanish(node.instance_id)

    rig.sync()  # one listing without it proves nothing
    assert rig.node("n1").state is S.READY
    rig.clock.advance(rig.reconciler.config.vanish_grace.total_seconds() - 1)
    rig.sync()
    assert rig.node("n1").state is S.READY
    rig.clock.advance(1)
    rig.sync()
    assert rig.node("n1").state is S.FAILED
    assert rig.store.get_job(job.id).state is JobState.PENDING

    # and then the failed node's instance is terminated, and the node closed
    assert corrective(rig) == [("terminate", "n1", ActionReason.FAILED, None)]
    rig.reconcile()
    rig.sync()
    assert rig.node("n1").state is S.TERMINATED


def test_instance_back_in_the_listing_resets_the_vanish_clock(rig: Rig) -> None:
    node = launched(rig, 1, S.BOOTING, S.JOINING, S.READY, last_heartbeat=rig.now)
    grace = rig.reconciler.config.vanish_grace.total_seconds()
    rig.clock.advance(hours=1)
    rig.provider.vanish(node.instance_id)
    rig.sync()
    rig.provider.hidden.clear()  # a lagging listing, not a lost instance
    rig.clock.advance(grace)
    rig.sync()
    rig.provider.vanish(node.instance_id)
    rig.clock.advance(grace - 1)
    rig.sync()
    assert rig.node("n1").state is S.READY


def test_instance_reported_terminated_fails_the_node_at_once(rig: Rig) -> None:
    node = launched(rig, 1, S.BOOTING, S.JOINING, S.READY, last_heartbeat=rig.now)
    rig.clock.advance(minutes=10)
    rig.provider.set_state(node.instance_id, InstanceState.TERMINATED)  # spot interruption
    rig.sync()
    assert rig.node("n1").state is S.FAILED


def test_freshly_launched_instance_missing_from_listing_waits(rig: Rig) -> None:
    node = launched(rig, 1)
    rig.provider.vanish(node.instance_id)  # not listed yet (eventual consistency)
    rig.sync()
    rig.clock.advance(10)
    rig.sync()
    assert rig.node("n1").state is S.LAUNCHING
    rig.clock.advance(rig.reconciler.config.vanish_grace.total_seconds())
    rig.sync()
    assert rig.node("n1").state is S.FAILED


# -- leaks -----------------------------------------------------------------------------------------

def test_leaked_instance_terminated_only_after_leak_grace(rig: Rig) -> None:
    instance_id = cloud_launch(rig, "n-ghost", "r-ghost")
    grace = rig.reconciler.config.leak_grace.total_seconds()
    rig.sync()
    assert corrective(rig) == []
    rig.clock.advance(grace - 1)
    rig.sync()
    assert corrective(rig) == []
    rig.clock.advance(1)
    rig.sync()
    assert corrective(rig) == [("terminate", None, ActionReason.LEAKED, instance_id)]
    rig.reconcile()
    assert rig.provider.instances[instance_id].state is InstanceState.TERMINATED
    rig.sync()
    assert corrective(rig) == []  # gone: not terminated again


def test_instance_of_a_terminated_node_is_a_leak(rig: Rig) -> None:
    node = launched(rig, 1, S.FAILED, S.TERMINATED)
    rig.clock.advance(minutes=5)
    rig.sync()
    assert corrective(rig) == [("terminate", None, ActionReason.LEAKED, node.instance_id)]


def test_second_instance_of_a_live_node_is_a_leak(rig: Rig) -> None:
    node = launched(rig, 1, S.BOOTING)
    duplicate = cloud_launch(rig, node.id, "r-n1-again")  # same node, another request
    rig.clock.advance(rig.reconciler.config.leak_grace.total_seconds())
    rig.sync()
    assert corrective(rig) == [("terminate", None, ActionReason.LEAKED, duplicate)]
    rig.reconcile()
    assert rig.provider.instances[duplicate].state is InstanceState.TERMINATED
    assert rig.provider.instances[node.instance_id].state is not InstanceState.TERMINATED
    assert rig.node("n1").state is S.BOOTING


def test_other_clusters_instances_are_not_ours(rig: Rig) -> None:
    cloud_launch(rig, "n-x", "r-x", cluster="someone-else")
    rig.clock.advance(hours=1)
    rig.sync()
    assert corrective(rig) == []


# -- timeouts --------------------------------------------------------------------------------------

T = {"launch": 5, "boot": 15, "join": 10, "terminate": 10, "heartbeat": 2}  # minutes (defaults)


@pytest.mark.parametrize(("states", "limit_min", "reason"), [
    ((), T["launch"], ActionReason.LAUNCH_TIMEOUT),
    ((S.LAUNCHING,), T["launch"] + T["boot"], ActionReason.BOOT_TIMEOUT),
    ((S.LAUNCHING, S.BOOTING), T["boot"], ActionReason.BOOT_TIMEOUT),
    ((S.LAUNCHING, S.BOOTING, S.JOINING), T["join"], ActionReason.JOIN_TIMEOUT),
    ((S.LAUNCHING, S.BOOTING, S.JOINING, S.READY, S.TERMINATING), T["terminate"],
     ActionReason.TERMINATE_RETRY),
], ids=["requested", "launching", "booting", "joining", "terminating"])
def test_state_timeouts(rig: Rig, states, limit_min: int, reason: ActionReason) -> None:
    node = record_intent(rig)
    if states:
        rig.store.update_node(rig.node(node.id), instance_id="i-x")
        rig.move(node.id, *states)
    heartbeat_every = timedelta(minutes=1)
    end = rig.now + timedelta(minutes=limit_min)
    while rig.now + heartbeat_every < end:  # a live agent keeps the heartbeat check quiet
        rig.clock.advance(heartbeat_every.total_seconds())
        if rig.node(node.id).state in (S.JOINING, S.READY):
            rig.move(node.id, last_heartbeat=rig.now)
        actions = [a for a in corrective(rig) if a[0] == "terminate"]
        assert actions == [], (rig.now, actions)
    rig.clock.at = end
    assert ("terminate", node.id, reason, None) in corrective(rig)


def test_heartbeat_loss(rig: Rig) -> None:
    launched(rig, 1, S.BOOTING, S.JOINING, S.READY, last_heartbeat=rig.now)
    rig.clock.advance(minutes=1, seconds=59)
    assert corrective(rig) == []
    rig.clock.advance(1)
    assert corrective(rig) == [("terminate", "n1", ActionReason.HEARTBEAT_LOST, None)]
    rig.reconcile()
    assert rig.transitions("n1")[-2:] == [("ready", "failed"), ("failed", "terminating")]


def test_a_launch_lost_while_every_worker_was_down_is_relaunched_not_failed(rig: Rig) -> None:
    """The launch task vanished with a restarted broker and no pass ran for longer than the
    watch gap (but less than the lease): the node's launch timeout counts from the return, so
    the reconciler re-issues the launch instead of failing the node (Celery chaos run)."""
    from orchestrator.leadership import RECONCILE, Controller, Holder

    gap = timedelta(seconds=60)
    ctl = Controller(rig.store, Holder.deployment("celery", "redis://test"),
                     ttl=rig.policy.timeouts.launch * 2, max_gap=gap)
    ctl.claim([RECONCILE], rig.now)
    node = record_intent(rig)
    away = rig.policy.timeouts.launch + timedelta(seconds=1)  # no pass meanwhile
    back = rig.now + away
    ctl.claim([RECONCILE], back)
    assert ctl.observing_since(back) == back
    assert _terminations(rig, back, ctl.observing_since(back)) == []
    relaunch = [a for a in rig.reconciler.step(back, ctl.observing_since(back))
                if isinstance(a, Launch)]
    assert [(a.node_id, a.request_id) for a in relaunch] == [(node.id, node.request_id)]
    # Judged from the tenure's start instead (the old rule), the node was failed at once.
    assert _terminations(rig, back, back - away) == [(node.id, ActionReason.LAUNCH_TIMEOUT)]


def test_released_node_is_closed_as_drained_not_failed(rig: Rig) -> None:
    """An agent that confirmed its drain exits and stops heartbeating: when no planner tick
    terminated the node within the heartbeat timeout (workers down), the reconciler closes it as
    drained; the node never passes through ``failed`` (the Celery chaos run found this)."""
    launched(rig, 1, S.BOOTING, S.JOINING, S.READY, last_heartbeat=rig.now)
    rig.move("n1", S.DRAINING, released=True)
    rig.clock.advance(rig.policy.timeouts.heartbeat.total_seconds() - 1)
    assert corrective(rig) == []
    rig.clock.advance(1)
    assert corrective(rig) == [("terminate", "n1", ActionReason.DRAINED, None)]
    rig.reconcile()
    assert S.FAILED not in {to for _, to in rig.transitions("n1")}
    assert rig.transitions("n1")[-1] == ("draining", "terminating")


def test_failed_node_with_an_instance_is_terminated(rig: Rig) -> None:
    node = launched(rig, 1, S.FAILED)
    assert corrective(rig) == [("terminate", "n1", ActionReason.FAILED, None)]
    rig.reconcile()
    assert rig.provider.instances[node.instance_id].state is InstanceState.TERMINATED
    rig.sync()
    assert rig.node("n1").state is S.TERMINATED


def test_failed_node_without_instance_closes_after_grace(rig: Rig) -> None:
    record_intent(rig)
    rig.move("n1", S.FAILED)
    assert corrective(rig) == []  # nothing to terminate
    rig.sync()
    assert rig.node("n1").state is S.FAILED  # the launch may still surface: wait
    rig.clock.advance(rig.reconciler.config.vanish_grace.total_seconds())
    rig.sync()
    assert rig.node("n1").state is S.TERMINATED


def test_failed_node_adopts_a_late_instance_and_terminates_it(rig: Rig) -> None:
    node = record_intent(rig)
    rig.move("n1", S.FAILED)
    instance_id = cloud_launch(rig, node.id, node.request_id)
    rig.sync()
    assert rig.node("n1").instance_id == instance_id
    rig.reconcile()
    assert rig.provider.instances[instance_id].state is InstanceState.TERMINATED
    rig.sync()
    assert rig.node("n1").state is S.TERMINATED


def test_requested_node_relaunched_with_its_request_id(rig: Rig) -> None:
    node = record_intent(rig)
    after = rig.reconciler.config.relaunch_after.total_seconds()
    rig.clock.advance(after - 1)
    assert corrective(rig) == []
    rig.clock.advance(1)
    assert corrective(rig) == [("launch", node.id, node.request_id, ActionReason.RETRY_LAUNCH)]
    [action] = rig.reconciler.step(rig.now)
    assert action.offering.key == node.offering_key and action.offering.gpus == node.gpus
    rig.executor.run([action])
    assert rig.node("n1").state is S.LAUNCHING



def test_relaunch_after_transient_errors_backs_off_exponentially(store):
    """A launch that keeps failing transiently is re-issued at 15 s, 30 s, 60 s... of age."""
    from dataclasses import replace as _replace
    from datetime import timedelta

    from orchestrator.domain.plan import Launch
    from orchestrator.lifecycle import NodeEvent
    from tests.builders import T0, make_node, make_rig

    rig = make_rig(store)
    for index, (attempts, due_after) in enumerate(((0, 15), (1, 30), (3, 120))):
        node = _replace(make_node(f"n-backoff-{index}", state=NodeState.REQUESTED, state_since=T0,
                                  created_at=T0, request_id=f"r-backoff-{index}"),
                        launch_attempts=attempts)
        assert rig.store.add_node(node, NodeEvent(node.id, T0, None, NodeState.REQUESTED, "demand", {}))

        def relaunches(seconds: float, node=node) -> list[Launch]:
            return [a for a in rig.reconciler.step(T0 + timedelta(seconds=seconds))
                    if isinstance(a, Launch) and a.node_id == node.id]

        assert relaunches(due_after - 1) == []
        [again] = relaunches(due_after)
        assert again.request_id == node.request_id  # same idempotency token


# -- liveness on the controller's observation window (issue 13, finding 1) -------------------------


def _terminations(rig: Rig, at, observing_since=None) -> list[tuple]:
    return [(a.node_id, a.reason) for a in rig.reconciler.step(at, observing_since)
            if isinstance(a, Terminate)]


def test_silence_while_the_controller_was_away_is_not_the_nodes(rig: Rig) -> None:
    """A node heard last before the outage is not heartbeat-lost at the restart: its age counts
    from when this controller could hear it, plus the agent's documented retry allowance."""
    from orchestrator.reconciler import HEARD_WITHIN

    launched(rig, 1, S.BOOTING, S.JOINING, S.READY, last_heartbeat=rig.now)
    heartbeat = rig.policy.timeouts.heartbeat
    back = rig.now + 5 * heartbeat  # the controller was away five heartbeat timeouts
    # Judged on the records alone (the old rule), the node is lost at once.
    assert _terminations(rig, back) == [("n1", ActionReason.HEARTBEAT_LOST)]
    # Judged on the window, it is not, until a live agent would have been heard and then some.
    assert _terminations(rig, back, back) == []
    deadline = back + HEARD_WITHIN + heartbeat
    assert _terminations(rig, deadline - timedelta(seconds=1), back) == []
    assert _terminations(rig, deadline, back) == [("n1", ActionReason.HEARTBEAT_LOST)]
    # A heartbeat heard after the restart counts as usual.
    heard = back + HEARD_WITHIN + timedelta(seconds=5)
    rig.move("n1", last_heartbeat=heard)
    assert _terminations(rig, heard + heartbeat - timedelta(seconds=1), back) == []
    assert _terminations(rig, heard + heartbeat, back) == [("n1", ActionReason.HEARTBEAT_LOST)]


def test_state_timeouts_count_only_time_inside_the_window(rig: Rig) -> None:
    """A node booting when the controller went away is not boot-timed-out by the absence."""
    launched(rig, 1, S.BOOTING)
    boot = rig.policy.timeouts.boot
    back = rig.now + 2 * boot
    assert _terminations(rig, back) == [("n1", ActionReason.BOOT_TIMEOUT)]
    assert _terminations(rig, back + boot - timedelta(seconds=1), back) == []
    assert _terminations(rig, back + boot, back) == [("n1", ActionReason.BOOT_TIMEOUT)]
