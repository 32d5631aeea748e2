"""The executor against a real store (SQLite and PostgreSQL), a recording FakeProvider, the built-in
queue and fabric, and a fixed clock: intent before each call, outcome after, errors by kind.

Crash safety lives here too: a launch interrupted at each of its steps, then finished or undone by
the reconciler and a re-delivered action, ends with exactly one instance per node record.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest

from orchestrator.domain import ActionReason, Drain, NodeState, OwnershipTags, Terminate
from orchestrator.domain.jobs import JobState, Placement
from orchestrator.domain.ports import (
    AuthError,
    InstanceState,
    InvalidRequest,
    QuotaError,
    TransientError,
)
from orchestrator.fabric.bootstrap import Bootstrap
from orchestrator.fabric.tokens import token_hash
from orchestrator.store import Store
from tests.builders import CONTROLLER_URL, Rig, make_policy, make_rig, offering_of

S = NodeState
PROVIDER = "aws"


@pytest.fixture
def rig(store: Store) -> Rig:
    return make_rig(store)


class Crash(BaseException):
    """The controller process dies here (not an error anything catches)."""


def transient() -> TransientError:
    return TransientError("throttled", provider=PROVIDER, code="RequestLimitExceeded")


# -- launch ----------------------------------------------------------------------------------------

def test_launch_records_intent_then_outcome(rig: Rig) -> None:
    action = rig.launch_action(1)
    report = rig.executor.run([action])

    node = rig.node("n1")
    assert node.state is S.LAUNCHING
    [instance] = rig.provider.alive()
    assert node.instance_id == instance.id and node.launch_attempts == 1
    assert rig.transitions("n1") == [(None, "requested"), ("requested", "launching")]
    assert report.launched == ["n1"] and not report.errors

    # the request id is the provider's idempotency token, and the instance carries ownership tags
    [request] = rig.provider.calls_of("launch")
    assert request.request_id == action.request_id == node.request_id
    assert request.tags == OwnershipTags("burst", rig.policy.name, "n1", action.request_id)
    assert instance.tags == request.tags.as_dict()
    assert request.offering == offering_of(rig.policy)

    # the node boots with a bootstrap the agent can read, holding a join token for this node
    boot = Bootstrap.parse(request.user_data)
    token, _, _ = rig.tokens.issue("n1", action.request_id, node.created_at)
    assert (boot.node_id, boot.join_token, boot.controller_url) == ("n1", token, CONTROLLER_URL)
    assert (boot.cluster, boot.policy, boot.gpus) == ("burst", rig.policy.name, 8)
    assert rig.store.consume_join_token("n1", token_hash(token), rig.now) == "ok"
    other, _, _ = rig.tokens.issue("n2", action.request_id, node.created_at)
    assert rig.store.consume_join_token("n1", token_hash(other), rig.now) == "wrong-token"


def test_the_bootstrap_carries_the_checkpoint_location_of_the_nodes_project(store: Store) -> None:
    storage = {"datasets": [{"uri": "nfs://fs/d", "size_gb": 1}], "checkpoints": "s3://ckpt/pool"}
    policy = make_policy(pool={"name": "gpu", "onprem": {"nodes": 0, "gpus_per_node": 8},
                               "storage": storage},
                         projects=[{"name": "research", "storage": {
                             "checkpoints": "gs://research-ckpt/runs"}}])
    rig = make_rig(store, policy=policy)
    rig.executor.run([rig.launch_action(1), rig.launch_action(2, project="vision")])
    boots = {r.request_id: Bootstrap.parse(r.user_data) for r in rig.provider.calls_of("launch")}
    assert boots["r-n1"].checkpoint_uri == "gs://research-ckpt/runs"
    assert boots["r-n2"].checkpoint_uri == "s3://ckpt/pool"  # no storage of its own: the pool's
    bare = make_rig(store, policy=make_policy(name="bare"))
    bare.executor.run([bare.launch_action(3)])
    [request] = bare.provider.calls_of("launch")
    assert Bootstrap.parse(request.user_data).checkpoint_uri == ""


def test_launches_carry_the_cost_tags_of_project_user_and_policy(store: Store) -> None:
    from dataclasses import replace

    rig = make_rig(store, policy=make_policy(tags={"team": "ml", "cost-center": "cc-42"}))
    # In one process (burst run): the action's user goes straight to the provider.
    rig.executor.run([replace(rig.launch_action(1), user="ada")])
    # As the Celery control plane does it: the intent is recorded by the planner's task and
    # the provider called by another, which reads the user back from the recorded intent.
    assert rig.executor.record_launch(replace(rig.launch_action(2, project="vision"), user="bob"))
    rig.executor.launch_recorded("n2")
    rig.executor.run([rig.launch_action(3, project=None)])  # min-nodes: no project, no user
    sent = {r.request_id: dict(r.cost_tags) for r in rig.provider.calls_of("launch")}
    policy_tags = {"team": "ml", "cost-center": "cc-42"}
    assert sent == {
        "r-n1": {**policy_tags, "burst:project": "research", "burst:user": "ada"},
        "r-n2": {**policy_tags, "burst:project": "vision", "burst:user": "bob"},
        "r-n3": policy_tags,
    }


def test_same_launch_twice_launches_once(rig: Rig) -> None:
    action = rig.launch_action(1)
    rig.executor.run([action])
    rig.clock.advance(5)
    second = rig.executor.run([action])
    assert second.launched == []
    assert len(rig.store.nodes()) == 1
    assert len(rig.provider.instances) == 1
    assert len(rig.provider.calls_of("launch")) == 1  # "already done": not even asked again
    assert rig.transitions("n1") == [(None, "requested"), ("requested", "launching")]


def test_duplicate_delivery_to_two_executors(rig: Rig, store: Store) -> None:
    other = make_rig(store, clock=rig.clock)
    other.provider = rig.provider
    other.executor.providers = {PROVIDER: rig.provider}
    action = rig.launch_action(1)
    rig.executor.run([action])
    other.executor.run([action])
    assert len(rig.provider.instances) == 1 and len(store.nodes()) == 1


def test_capacity_error_blocks_the_offering(rig: Rig) -> None:
    key = offering_of(rig.policy).key
    rig.provider.capacity_keys.add(key)
    report = rig.executor.run([rig.launch_action(1)])

    assert report.capacity_errors == [key] and report.launched == []
    assert rig.node("n1").state is S.TERMINATED and rig.store.nodes() == []
    assert rig.transitions("n1") == [(None, "requested"), ("requested", "failed"),
                                     ("failed", "terminated")]
    [block] = rig.store.capacity_blocks(rig.now)
    assert block.offering_key == key
    assert block.until == rig.now + rig.executor.config.capacity_backoff
    assert "InsufficientInstanceCapacity" in block.reason
    assert rig.provider.alive() == []


def test_transient_error_keeps_the_intent_and_the_reconciler_retries_it(rig: Rig) -> None:
    rig.provider.inject("launch", transient())
    action = rig.launch_action(1)
    report = rig.executor.run([action])
    assert rig.node("n1").state is S.REQUESTED
    assert any("transient" in e for e in report.errors)
    assert rig.provider.instances == {}

    rig.clock.advance(5)  # before relaunch_after: nothing yet
    assert rig.reconcile().launched == []
    rig.clock.advance(15)  # 20 s: the transient error doubled the wait before re-issuing to 30 s
    assert [a for a in rig.reconciler.step(rig.now) if type(a).__name__ == "Launch"] == []
    rig.clock.advance(10)
    retry = rig.reconciler.step(rig.now)
    assert [(type(a).__name__, a.node_id, a.request_id, a.reason) for a in retry] == [
        ("Launch", "n1", action.request_id, ActionReason.RETRY_LAUNCH)]
    assert rig.executor.run(retry).launched == ["n1"]
    assert rig.node("n1").state is S.LAUNCHING
    assert [r.request_id for r in rig.provider.calls_of("launch")] == [action.request_id] * 2
    # and once more, as a re-delivered retry: still one instance
    rig.executor.run(retry)
    assert len(rig.provider.instances) == 1


def test_transient_error_after_the_launch_took_effect_is_adopted(rig: Rig) -> None:
    rig.provider.lose_response("launch", transient())
    rig.executor.run([rig.launch_action(1)])
    assert rig.node("n1").state is S.REQUESTED
    [instance] = rig.provider.alive()
    rig.sync()
    node = rig.node("n1")
    assert node.state is S.LAUNCHING and node.instance_id == instance.id
    assert len(rig.provider.calls_of("launch")) == 1


@pytest.mark.parametrize("error", [
    AuthError("bad credentials", provider=PROVIDER, code="AuthFailure"),
    InvalidRequest("bad AMI", provider=PROVIDER, code="InvalidAMIID.Malformed"),
], ids=["auth", "invalid"])
def test_auth_or_invalid_error_disables_the_provider(rig: Rig, error) -> None:
    rig.provider.inject("launch", error)
    report = rig.executor.run([rig.launch_action(1)])
    assert PROVIDER in rig.executor.disabled and error.kind in rig.executor.disabled[PROVIDER]
    assert report.errors and report.launched == []
    assert rig.transitions("n1") == [(None, "requested"), ("requested", "failed"),
                                     ("failed", "terminated")]

    later = rig.executor.run([rig.launch_action(2)])
    assert len(rig.provider.calls_of("launch")) == 1  # refused without calling the provider
    assert later.launched == [] and later.errors
    assert rig.store.nodes(include_terminated=True)[-1].state is S.TERMINATED
    assert rig.provider.instances == {}


def test_quota_error_fails_the_node_and_backs_off_the_offering(rig: Rig) -> None:
    rig.provider.inject("launch", QuotaError("vCPU limit", provider=PROVIDER, code="VcpuLimitExceeded"))
    report = rig.executor.run([rig.launch_action(1)])
    assert report.capacity_errors == [] and report.errors
    assert rig.transitions("n1")[-1] == ("failed", "terminated")
    [block] = rig.store.capacity_blocks(rig.now)
    assert block.until == rig.now + rig.executor.config.quota_backoff
    assert PROVIDER not in rig.executor.disabled  # quota is not a reason to stop the provider


def test_unknown_provider_fails_the_node(rig: Rig) -> None:
    rig.executor.providers = {}
    report = rig.executor.run([rig.launch_action(1)])
    assert report.errors and rig.transitions("n1")[-1] == ("failed", "terminated")


# -- drain and terminate -------------------------------------------------------------------------

def ready_node(rig: Rig, n: int = 1):
    rig.executor.run([rig.launch_action(n)])
    return rig.move(f"n{n}", S.BOOTING, S.JOINING, S.READY, last_heartbeat=rig.now)


def test_drain_records_draining_with_the_deadline(rig: Rig) -> None:
    ready_node(rig)
    deadline = rig.now + timedelta(minutes=15)
    report = rig.executor.run([Drain("n1", ActionReason.IDLE, deadline)])
    node = rig.node("n1")
    assert node.state is S.DRAINING and node.drain_deadline == deadline
    assert report.drained == ["n1"]
    again = rig.executor.run([Drain("n1", ActionReason.IDLE, deadline + timedelta(minutes=1))])
    assert again.drained == [] and rig.node("n1").drain_deadline == deadline
    assert rig.provider.calls_of("terminate") == []


@pytest.mark.parametrize("gone", ["listed-terminated", "no-longer-listed"])
def test_terminate_then_provider_confirms(rig: Rig, gone: str) -> None:
    node = ready_node(rig)
    rig.executor.run([Drain("n1", ActionReason.IDLE, rig.now + timedelta(minutes=15))])
    report = rig.executor.run([Terminate("n1", ActionReason.DRAINED)])
    assert rig.node("n1").state is S.TERMINATING and report.terminated == ["n1"]
    assert rig.provider.calls_of("terminate") == [[node.instance_id]]
    assert rig.provider.instances[node.instance_id].state is InstanceState.TERMINATED

    if gone == "no-longer-listed":
        rig.provider.forget_terminated()
    rig.clock.advance(10)
    rig.sync()
    assert rig.store.nodes() == []
    assert rig.transitions("n1")[-2:] == [("draining", "terminating"), ("terminating", "terminated")]
    # a repeat of the terminate does nothing
    rig.executor.run([Terminate("n1", ActionReason.DRAINED)])
    assert len(rig.provider.calls_of("terminate")) == 1


def test_terminate_requeues_running_jobs(rig: Rig) -> None:
    ready_node(rig)
    job = rig.store.submit_job("research", "gpu", 4, 0, 600, "train.py", rig.now)
    started = rig.store.start_job(job, placement=Placement.BURST, node_id="n1", at=rig.now)
    assert started is not None
    rig.executor.run([Terminate("n1", ActionReason.HEARTBEAT_LOST)])
    assert rig.transitions("n1")[-2:] == [("ready", "failed"), ("failed", "terminating")]
    back = rig.store.get_job(job.id)
    assert back.state is JobState.PENDING and back.node_id is None
    assert back.attempts == 1  # kept: it ran once


def test_terminate_of_a_node_never_launched(rig: Rig) -> None:
    rig.provider.inject("launch", transient())
    rig.executor.run([rig.launch_action(1)])
    rig.executor.run([Terminate("n1", ActionReason.LAUNCH_TIMEOUT)])
    assert rig.node("n1").state is S.FAILED
    assert rig.provider.calls_of("terminate") == []


def test_terminate_of_a_leak_by_instance_id(rig: Rig) -> None:
    rig.executor.run([rig.launch_action(1)])
    [instance] = rig.provider.alive()
    report = rig.executor.run([Terminate(None, ActionReason.LEAKED, instance_id=instance.id,
                                         provider=PROVIDER)])
    assert report.terminated == [instance.id]
    assert rig.provider.calls_of("terminate") == [[instance.id]]


def test_failure_reason_passes_through_failed(rig: Rig) -> None:
    rig.executor.run([rig.launch_action(1)])  # launching
    rig.executor.run([Terminate("n1", ActionReason.BOOT_TIMEOUT)])
    assert rig.transitions("n1")[-2:] == [("launching", "failed"), ("failed", "terminating")]


def heartbeats_after_reads(rig: Rig, monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """An agent's heartbeat lands just after each of the executor's next ``times`` reads of a
    node: the stored version moves on, the state does not (as under a live agent)."""
    beats: list[int] = []
    read = rig.store.get_node

    def get_node(node_id: str):
        node = read(node_id)
        if node is not None and len(beats) < times:
            assert rig.store.update_node(node, last_heartbeat=rig.now) is not None
            beats.append(node.version)
        return node

    monkeypatch.setattr(rig.store, "get_node", get_node)
    return beats


@pytest.mark.parametrize("beats", [1, 3])
def test_a_heartbeat_between_read_and_write_does_not_lose_a_drain_or_a_terminate(
        rig: Rig, monkeypatch: pytest.MonkeyPatch, beats: int) -> None:
    # The Celery duplicate-delivery run found a terminate that answered "not terminated" and
    # was never retried: its compare-and-set had lost to the draining node's heartbeat.
    node = ready_node(rig)
    seen = heartbeats_after_reads(rig, monkeypatch, beats)
    report = rig.executor.run([Drain("n1", ActionReason.IDLE, rig.now + timedelta(minutes=15))])
    assert len(seen) == beats and report.drained == ["n1"] and rig.node("n1").state is S.DRAINING

    seen = heartbeats_after_reads(rig, monkeypatch, beats)
    report = rig.executor.run([Terminate("n1", ActionReason.DRAINED)])
    assert len(seen) == beats and report.terminated == ["n1"] and not report.errors
    assert rig.node("n1").state is S.TERMINATING
    assert rig.provider.calls_of("terminate") == [[node.instance_id]]
    # one event per edge: the lost attempts wrote nothing
    assert rig.transitions("n1")[-2:] == [("ready", "draining"), ("draining", "terminating")]


def test_a_node_that_never_stops_changing_is_left_as_it_was(
        rig: Rig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # An earlier test may have set the root logger above WARNING (a CLI run's setup_logging).
    caplog.set_level(logging.WARNING, logger="orchestrator.executor")
    ready_node(rig)
    heartbeats_after_reads(rig, monkeypatch, 1000)
    report = rig.executor.run([Terminate("n1", ActionReason.DRAINED)])
    assert report.terminated == [] and rig.provider.calls_of("terminate") == []
    assert rig.node("n1").state is S.READY
    assert "terminate not recorded" in caplog.text


# -- crash safety --------------------------------------------------------------------------------

def assert_one_instance_per_node(rig: Rig) -> None:
    """The invariant: every live node record has exactly its one instance, and every instance
    that exists belongs to a live node record."""
    live = {n.id: n for n in rig.store.nodes()}
    alive = rig.provider.alive()
    by_node: dict[str, list[str]] = {}
    for instance in alive:
        owner = instance.tags.get("burst:node-id")
        assert owner in live, f"instance {instance.id} of {owner} has no live node record"
        by_node.setdefault(owner, []).append(instance.id)
    for node_id, ids in by_node.items():
        assert len(ids) == 1, f"node {node_id} has instances {ids}"
        node = live[node_id]
        # a requested node may not have adopted its instance yet (listing lag), but never
        # points at another one
        assert node.instance_id == ids[0] or (node.state is S.REQUESTED and node.instance_id is None)
    for node in live.values():
        if node.state not in (S.REQUESTED, S.FAILED, S.TERMINATING):
            assert node.instance_id in by_node.get(node.id, []), node


def crash_before_add_node(rig: Rig) -> None:
    """The process died before anything was written or called."""


def crash_after_add_node(rig: Rig) -> None:
    rig.provider.inject("launch", Crash())
    with pytest.raises(Crash):
        rig.executor.run([rig.launch_action(1)])


def crash_after_provider_launch(rig: Rig) -> None:
    rig.provider.lose_response("launch", Crash())
    with pytest.raises(Crash):
        rig.executor.run([rig.launch_action(1)])


def crash_after_recording_launching(rig: Rig) -> None:
    rig.executor.run([rig.launch_action(1)])


CRASHES = [crash_before_add_node, crash_after_add_node, crash_after_provider_launch,
           crash_after_recording_launching]


@pytest.mark.parametrize("crash", CRASHES, ids=[c.__name__ for c in CRASHES])
@pytest.mark.parametrize("redeliver", [True, False], ids=["redelivered", "not-redelivered"])
def test_a_crash_at_any_step_of_a_launch_heals(rig: Rig, store: Store, crash, redeliver: bool) -> None:
    crash(rig)
    # a new process: same store and cloud, fresh executor and reconciler (no memory of the crash)
    healed = make_rig(store, clock=rig.clock)
    healed.provider = rig.provider
    healed.executor.providers = {PROVIDER: rig.provider}
    if redeliver:  # the task queue delivers the interrupted launch again
        healed.executor.run([healed.launch_action(1)])
    for _ in range(6):
        healed.clock.advance(20)
        healed.provider.run_all()
        healed.reconcile()
        assert_one_instance_per_node(healed)
    assert len(rig.provider.calls_of("launch")) <= 3
    nodes = store.nodes()
    if crash is crash_before_add_node and not redeliver:
        assert nodes == [] and rig.provider.instances == {}
    else:
        [node] = nodes
        assert node.state is S.BOOTING  # launched, running, waiting for its agent
        assert len(rig.provider.instances) == 1


def test_crash_after_launch_with_a_lagging_listing(rig: Rig, store: Store) -> None:
    """The instance exists but is not listed yet: the reconciler re-issues the launch with the
    same request id (the provider answers "accepted, not visible yet") and adopts it once listed."""
    rig.provider.lose_response("launch", Crash())
    with pytest.raises(Crash):
        rig.executor.run([rig.launch_action(1)])
    [instance] = rig.provider.alive()
    rig.provider.vanish(instance.id)
    healed = make_rig(store, clock=rig.clock)
    healed.provider = rig.provider
    healed.executor.providers = {PROVIDER: rig.provider}
    for tick in range(6):
        if tick == 3:
            rig.provider.hidden.clear()  # the listing catches up
        healed.clock.advance(20)
        healed.provider.run_all()
        healed.reconcile()
        assert_one_instance_per_node(healed)
    assert len(rig.provider.calls_of("launch")) >= 2  # it was re-issued while invisible...
    assert len(rig.provider.instances) == 1  # ...and created nothing twice
    assert healed.node("n1").state is S.BOOTING and healed.node("n1").instance_id == instance.id
