"""GCP placement groups: our GcpGroups and the real google-cloud-compute client against the local
Compute REST server (its resourcePolicies part: tests/servers/fake_gce_policies.py).

A launch group's VMs name one compact placement resource policy (COLLOCATED, vmCount = nodes),
created idempotently with our tags in its description, deleted idempotently (refused while a VM
uses it), listed by our cluster; the executor launches a group together and, when a VM's insert
fails for lack of capacity, falls back as a whole: 0 stranded nodes.
"""

from __future__ import annotations

import uuid

import pytest

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.placement import GroupState, GroupTags
from orchestrator.domain.plan import ActionReason, Launch, Terminate
from orchestrator.domain.ports import InstanceState, TransientError
from orchestrator.executor import Executor
from orchestrator.groups import sweep_groups
from orchestrator.lifecycle import transition
from providers.gcp.groups import policy_name
from tests.builders import make_policy, make_rig
from tests.integration.test_gcp_provider import (  # noqa: F401 - fixtures
    PROJECT,
    ZONE_A,
    gce,
    key_file,
    local_only,
    make_provider,
    offering,
    provider,
    request,
    server,
)

A2 = offering("a2-highgpu-8g", gpus=8)
REGION = "us-central1"


def _tags(cluster: str = "alpha") -> GroupTags:
    return GroupTags(cluster, "train", f"train-g{uuid.uuid4().hex[:8]}")


def test_create_is_compact_tagged_and_idempotent(gce, provider):
    tags = _tags()
    group = provider.placement.create_group(tags.group, A2, 3, tags)
    again = provider.placement.create_group(tags.group, A2, 3, tags)
    assert group.name == again.name == policy_name(tags.group) and group.ownership == tags
    [stored] = gce.resource_policies(REGION)
    assert stored["groupPlacementPolicy"] == {"collocation": "COLLOCATED", "vmCount": 3}
    assert len(gce.calls_to("compute.resourcePolicies.insert")) == 2
    assert [g.name for g in provider.placement.list_owned_groups("alpha")] == [group.name]
    assert provider.placement.list_owned_groups("beta") == []
    provider.placement.delete_group(group)
    provider.placement.delete_group(group)  # already gone: returns normally
    assert gce.resource_policies() == []


def test_a_vm_names_the_policy_and_it_cannot_go_while_the_vm_lives(gce, provider):
    tags = _tags()
    group = provider.placement.create_group(tags.group, A2, 1, tags)
    req = request(A2)
    req = type(req)(req.request_id, req.offering, req.tags, req.user_data,
                    placement_group=group.name)
    [instance] = provider.launch(req)
    [body] = [c.body for c in gce.calls_to("compute.instances.insert")]
    assert body["resourcePolicies"] == [
        f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/{group.name}"]
    with pytest.raises(TransientError):
        provider.placement.delete_group(group)
    provider.terminate([instance.id])
    for _ in range(5):
        provider.describe([instance.id])  # the delete completes after a few reads
    provider.placement.delete_group(group)
    assert gce.resource_policies() == []


def _executor(store, provider, cluster: str):
    rig = make_rig(store, policy=make_policy(cluster=cluster))
    executor = Executor(store, {"gcp": provider}, rig.fabric, rig.clock, rig.tokens,
                        {rig.policy.name: rig.policy}, rig.executor.config)
    return executor, rig.policy, rig.clock


def _group(policy, size: int, tag: str) -> list[Launch]:
    return [Launch(policy.name, policy.pool.name, f"{tag}-n{i}", f"{tag}-r{i}", A2,
                   ActionReason.DEMAND, group=f"{tag}-g", group_size=size, jobs=("j",))
            for i in range(size)]


def test_capacity_error_on_a_vm_falls_back_with_no_stranded_node(gce, provider, store):
    executor, policy, clock = _executor(store, provider, "alpha")
    tag = f"t{uuid.uuid4().hex[:6]}"
    launches = _group(policy, 3, tag)
    # the zone gives the first VM, then runs out (ZONE_RESOURCE_POOL_EXHAUSTED on the 2nd insert)
    gce.inject("capacity", after=1)
    report = executor.run(launches)
    assert report.capacity_errors == [A2.key]
    assert len(gce.calls_to("compute.instances.insert")) == 2  # the 3rd VM was never asked for
    alive = [i for i in provider.list_owned("alpha")
             if i.state not in (InstanceState.TERMINATED, InstanceState.STOPPING)]
    assert alive == []  # 0 stranded nodes
    states = {n.id: n.state for n in store.nodes(policy.name, include_terminated=True)}
    assert states[f"{tag}-n0"] is NodeState.TERMINATING
    assert states[f"{tag}-n1"] is states[f"{tag}-n2"] is NodeState.TERMINATED
    record = store.get_group(f"{tag}-g")
    assert record.state in (GroupState.DELETING, GroupState.DELETED)
    # the VM's delete completes; the sweep then deletes the policy and records it
    for _ in range(5):
        provider.list_owned("alpha")
    node = store.get_node(f"{tag}-n0")
    done, event = transition(node, NodeState.TERMINATED, at=clock.now(), reason="gone")
    store.save_transition(node, done, event)
    sweep_groups(store, {"gcp": provider}, {"alpha"}, clock.now())
    assert store.get_group(f"{tag}-g").state is GroupState.DELETED
    assert gce.resource_policies() == []


def test_a_group_launches_together_then_a_leaked_policy_is_collected(gce, provider, store):
    executor, policy, clock = _executor(store, provider, "alpha")
    tag = f"t{uuid.uuid4().hex[:6]}"
    report = executor.run(_group(policy, 2, tag))
    assert sorted(report.launched) == [f"{tag}-n0", f"{tag}-n1"]
    record = store.get_group(f"{tag}-g")
    assert record.state is GroupState.ACTIVE and record.name == policy_name(f"{tag}-g")
    bodies = [c.body for c in gce.calls_to("compute.instances.insert")]
    assert {tuple(b["resourcePolicies"]) for b in bodies} == {
        (f"projects/{PROJECT}/regions/{REGION}/resourcePolicies/{record.name}",)}
    assert {b["machineType"].split("/")[1] for b in bodies} == {ZONE_A}  # one zone
    # a policy of ours with no record (a lost database, say) is collected by the sweep
    leak = _tags()
    provider.placement.create_group(leak.group, A2, 2, leak)
    assert policy_name(leak.group) in sweep_groups(store, {"gcp": provider}, {"alpha"},
                                                   clock.now())
    assert [p["name"] for p in gce.resource_policies()] == [record.name]
    executor.run([Terminate(n, ActionReason.IDLE) for n in record.node_ids])
