"""AWS placement groups: our AwsPlacement and real boto3 against moto (server mode) over HTTP.

A launch group's nodes go into one EC2 cluster placement group, tagged as ours, created
idempotently, deleted idempotently (refused while it holds instances), listed by our cluster tag;
the executor launches a group together and, when a node gets EC2's capacity error, falls back as
a whole: 0 stranded nodes.
"""

from __future__ import annotations

import uuid
import pytest

from orchestrator.domain.nodes import NodeState, OwnershipTags
from orchestrator.domain.placement import GroupState, GroupTags
from orchestrator.domain.plan import ActionReason, Launch
from orchestrator.domain.ports import InstanceState, LaunchRequest, TransientError
from orchestrator.executor import Executor
from orchestrator.groups import sweep_groups
from orchestrator.store import Store
from providers.aws import AwsProvider
from providers.aws.placement import group_name
from tests.builders import T0, make_policy, make_rig
from tests.contract.adapters.aws import aws_config
from tests.integration.test_aws_provider import P4D_SPOT, offering
from tests.providers_support import point_boto3_at, shared_moto
from tests.servers.moto_ec2 import TEST_REGION, MotoEC2Server

P5 = offering("p5.48xlarge", zone=f"{TEST_REGION}a", gpus=8)


@pytest.fixture(scope="module")
def server() -> MotoEC2Server:
    server = shared_moto()
    server.reset()
    return server


@pytest.fixture
def peer(server: MotoEC2Server, monkeypatch: pytest.MonkeyPatch):
    server.clear()
    server.faults.reset_counts()
    point_boto3_at(server, monkeypatch)
    yield server
    server.clear()


@pytest.fixture
def cluster() -> str:
    return f"aws-pg-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def provider(peer: MotoEC2Server) -> AwsProvider:
    return AwsProvider(aws_config(peer), regions={TEST_REGION}, catalog=[P5, P4D_SPOT])


def ec2_groups(peer: MotoEC2Server, name: str) -> list[dict]:
    reply = peer.client().describe_placement_groups(Filters=[{"Name": "group-name", "Values": [name]}])
    return [g for g in reply["PlacementGroups"] if g.get("State") != "deleted"]


def test_create_is_tagged_cluster_and_idempotent(provider, peer, cluster):
    tags = GroupTags(cluster, "pol", f"g-{uuid.uuid4().hex[:6]}")
    group = provider.placement.create_group(tags.group, P5, 2, tags)
    again = provider.placement.create_group(tags.group, P5, 2, tags)
    assert group.name == again.name == group_name(tags.group) and group.ownership == tags
    [raw] = ec2_groups(peer, group.name)
    assert raw["Strategy"] == "cluster"
    assert {t["Key"]: t["Value"] for t in raw["Tags"]}["burst:cluster"] == cluster
    assert peer.calls("CreatePlacementGroup") == 2  # the second answered Duplicate, read back
    assert [g.name for g in provider.placement.list_owned_groups(cluster)] == [group.name]
    provider.placement.delete_group(group)
    provider.placement.delete_group(group)  # already gone: returns normally
    assert ec2_groups(peer, group.name) == []
    assert provider.placement.list_owned_groups(cluster) == []


def test_nodes_launch_into_the_group_and_it_cannot_go_while_they_live(provider, peer, cluster):
    tags = GroupTags(cluster, "pol", f"g-{uuid.uuid4().hex[:6]}")
    group = provider.placement.create_group(tags.group, P5, 1, tags)
    rid = f"r-{uuid.uuid4().hex[:6]}"
    [instance] = provider.launch(LaunchRequest(rid, P5, OwnershipTags(cluster, "pol", "n1", rid),
                                               "", placement_group=group.name))
    assert peer.placement.members(group.name) == [instance.id]
    with pytest.raises(TransientError):  # EC2 refuses to delete a group holding an instance
        provider.placement.delete_group(group)
    provider.terminate([instance.id])
    provider.placement.delete_group(group)
    assert ec2_groups(peer, group.name) == []


def test_delete_of_a_group_in_use_is_transient(provider, peer, cluster):
    tags = GroupTags(cluster, "pol", f"g-{uuid.uuid4().hex[:6]}")
    group = provider.placement.create_group(tags.group, P5, 1, tags)
    peer.inject("DeletePlacementGroup", 400, "InvalidPlacementGroup.InUse",
                "The placement group is in use", times=1)
    with pytest.raises(TransientError):
        provider.placement.delete_group(group)
    provider.placement.delete_group(group)
    assert ec2_groups(peer, group.name) == []


# -- the executor's launch group against EC2 --------------------------------------------------


def _executor(store: Store, provider: AwsProvider, cluster: str):
    """The executor of a test rig (real store, built-in fabric) launching through ``provider``."""
    rig = make_rig(store, policy=make_policy(cluster=cluster))
    executor = Executor(store, {"aws": provider}, rig.fabric, rig.clock, rig.tokens,
                        {rig.policy.name: rig.policy}, rig.executor.config)
    return executor, rig.policy, rig.clock


def _group(policy, size: int, tag: str) -> list[Launch]:
    return [Launch(policy.name, policy.pool.name, f"{tag}-n{i}", f"{tag}-r{i}", P5,
                   ActionReason.DEMAND, group=f"{tag}-g", group_size=size, jobs=("j",))
            for i in range(size)]


def test_a_group_launches_together_and_is_deleted_when_its_nodes_are_gone(store, provider, peer,
                                                                          cluster):
    executor, policy, clock = _executor(store, provider, cluster)
    tag = uuid.uuid4().hex[:6]
    report = executor.run(_group(policy, 3, tag))
    assert sorted(report.launched) == [f"{tag}-n{i}" for i in range(3)]
    record = store.get_group(f"{tag}-g")
    assert record.state is GroupState.ACTIVE and record.name == group_name(f"{tag}-g")
    instances = provider.list_owned(cluster)
    assert len(instances) == 3
    assert sorted(peer.placement.members(record.name)) == sorted(i.id for i in instances)
    # the burst ends: nodes terminated and confirmed; the sweep deletes the group
    for node in store.nodes(policy.name):
        executor.run([_terminate(node.id)])
    for node in store.nodes(policy.name):
        _confirm_gone(store, node, clock)
    assert sweep_groups(store, {"aws": provider}, {cluster}, clock.now()) == [f"{tag}-g"]
    assert store.get_group(f"{tag}-g").state is GroupState.DELETED
    assert ec2_groups(peer, record.name) == []


def test_capacity_error_on_a_node_falls_back_with_no_stranded_node(store, provider, peer,
                                                                   cluster):
    executor, policy, clock = _executor(store, provider, cluster)
    tag = uuid.uuid4().hex[:6]
    # EC2 gives the first two nodes, then has no capacity left in the group's zone
    peer.inject("RunInstances", 500, "InsufficientInstanceCapacity",
                "We currently do not have sufficient p5.48xlarge capacity", times=1, after=2)
    report = executor.run(_group(policy, 4, tag))
    assert report.capacity_errors == [P5.key]
    assert peer.calls("RunInstances") == 3  # the 4th node was never asked for
    running = [i for i in provider.list_owned(cluster)
               if i.state not in (InstanceState.TERMINATED, InstanceState.STOPPING)]
    assert running == []  # 0 stranded nodes
    states = {n.id: n.state for n in store.nodes(policy.name, include_terminated=True)}
    assert states == {f"{tag}-n0": NodeState.TERMINATING, f"{tag}-n1": NodeState.TERMINATING,
                      f"{tag}-n2": NodeState.TERMINATED, f"{tag}-n3": NodeState.TERMINATED}
    assert store.get_group(f"{tag}-g").state in (GroupState.DELETING, GroupState.DELETED)
    assert [b.offering_key for b in store.capacity_blocks(clock.now())] == [P5.key]
    # once EC2 confirms the terminations, the sweep finishes the group's deletion
    for node in store.nodes(policy.name):
        _confirm_gone(store, node, clock)
    sweep_groups(store, {"aws": provider}, {cluster}, clock.now())
    assert store.get_group(f"{tag}-g").state is GroupState.DELETED
    assert ec2_groups(peer, group_name(f"{tag}-g")) == []


def test_a_leaked_group_is_collected_by_its_tags(store, provider, peer, cluster):
    tags = GroupTags(cluster, "pol", f"leak-{uuid.uuid4().hex[:6]}")
    group = provider.placement.create_group(tags.group, P5, 2, tags)  # no record of it
    assert sweep_groups(store, {"aws": provider}, {cluster}, T0) == [group.name]
    assert ec2_groups(peer, group.name) == []


def _terminate(node_id: str):
    from orchestrator.domain.plan import Terminate

    return Terminate(node_id, ActionReason.IDLE)


def _confirm_gone(store: Store, node, clock) -> None:
    from orchestrator.lifecycle import transition

    current = store.get_node(node.id)
    if current.state is NodeState.TERMINATING:
        new, event = transition(current, NodeState.TERMINATED, at=clock.now(), reason="gone")
        store.save_transition(current, new, event)


def test_a_group_delivered_twice_launches_nothing_twice(store, provider, peer, cluster):
    executor, policy, _ = _executor(store, provider, cluster)
    tag = uuid.uuid4().hex[:6]
    executor.run(_group(policy, 2, tag))
    executor.run(_group(policy, 2, tag))  # a duplicate delivery of the same plan
    assert len(provider.list_owned(cluster)) == 2
    assert peer.calls("CreatePlacementGroup") == 1


def test_a_crash_after_the_groups_create_is_resumed_into_the_same_group(store, provider, peer,
                                                                       cluster):
    executor, policy, _ = _executor(store, provider, cluster)
    tag = uuid.uuid4().hex[:6]
    launches = _group(policy, 2, tag)
    # the controller died after EC2 created the group, before the outcome was recorded
    from orchestrator.groups import record_group

    record = record_group(executor, launches)
    provider.placement.create_group(record.group_id, P5, 2, GroupTags(cluster, policy.name,
                                                                      record.group_id))
    assert store.get_group(record.group_id).state is GroupState.REQUESTED
    report = executor.launch_group_recorded(record.group_id)  # the next controller resumes it
    assert sorted(report.launched) == [a.node_id for a in launches]
    assert len(ec2_groups(peer, group_name(record.group_id))) == 1
    assert sorted(peer.placement.members(group_name(record.group_id))) == sorted(
        i.id for i in provider.list_owned(cluster))


def test_a_transient_error_then_capacity_on_the_retry_still_falls_back_whole(store, provider,
                                                                            peer, cluster):
    executor, policy, _ = _executor(store, provider, cluster)
    tag = uuid.uuid4().hex[:6]
    launches = _group(policy, 3, tag)
    peer.inject("RunInstances", 503, "RequestLimitExceeded", "Request limit exceeded.", after=1)
    report = executor.run(launches)
    assert report.launched == [f"{tag}-n0"]  # n1 hit throttling: n1 and n2 wait, requested
    waiting = {n.id for n in store.nodes(policy.name) if n.state is NodeState.REQUESTED}
    assert waiting == {f"{tag}-n1", f"{tag}-n2"}
    # the reconciler re-issues n1 (a plain Launch, same request id); EC2 is out of capacity now
    peer.inject("RunInstances", 500, "InsufficientInstanceCapacity", "no capacity")
    again = executor.run([Launch(policy.name, policy.pool.name, f"{tag}-n1", f"{tag}-r1", P5,
                                 ActionReason.RETRY_LAUNCH)])
    assert again.capacity_errors == [P5.key]
    running = [i for i in provider.list_owned(cluster)
               if i.state not in (InstanceState.TERMINATED, InstanceState.STOPPING)]
    assert running == []  # 0 stranded nodes: n0 went with its group
    assert store.get_group(f"{tag}-g").state in (GroupState.DELETING, GroupState.DELETED)
