"""Launch groups: a multi-node job's nodes launched together in one placement group, or not at all.

The executor hands every launch group of a plan (``Launch.group``: the nodes of one job, of one
offering) to :func:`launch_group`. Each step is recorded before and after its side effect:

1. every node's intent (``requested``) and the group's (``requested``, with its nodes);
2. the provider's placement group (``Provider.placement.create_group``, idempotent on the group
   id and tagged as ours), then ``active`` with its provider-side name; a provider without the
   capability launches the nodes without one;
3. each node's launch into the group, one after the other, with the node's own request id;
4. on any node that cannot be launched (capacity, quota, anything but a transient error) the whole
   group falls back together: the nodes not yet launched fail unlaunched, those launched are
   terminated (``group-fallback``), and the group is deleted (``deleting`` before the call,
   ``deleted`` after). The capacity error is reported so the loop re-plans within the tick (the
   offering is backed off: the next offering or zone is tried, or the job is held). No node of a
   group that fell back is left running.

:func:`sweep_groups` (called by the reconciler each pass) deletes a group once none of its nodes
is alive (the burst is over), finishes deletions a crash or an in-use refusal interrupted, and
collects groups at the provider carrying our cluster tag with no live record (leaked: e.g. a
crash between the provider's create and recording it), as leaked instances are collected.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.offerings import offering_from_key
from orchestrator.domain.placement import GroupRecord, GroupState, GroupTags
from orchestrator.domain.plan import ActionReason, Launch, Terminate
from orchestrator.domain.ports import CapacityError, Provider, ProviderError, TransientError
from orchestrator.domain.snapshot import CapacityBlock

if TYPE_CHECKING:
    from orchestrator.store import Store

# The executor (a layer above: it calls in here) and its report, passed in; typed loosely so this
# module does not import the executor back.
Executor = Any
ExecutionReport = Any

log = logging.getLogger(__name__)

def placement_of(provider: Provider | None) -> Any:
    """The provider's placement capability, or None."""
    return getattr(provider, "placement", None) if provider is not None else None


def record_group(executor: Executor, launches: list[Launch]) -> GroupRecord | None:
    """Record the intents of a launch group's nodes and of the group itself (no provider call).
    Returns the group's record, or None when every node was carried out before (a duplicate)."""
    nodes = [executor.record_launch(action) for action in launches]
    if all(n is None for n in nodes):
        return None
    first = launches[0]
    offering = first.offering
    now = executor.clock.now()
    record = GroupRecord(
        group_id=first.group or first.node_id, policy=first.policy, provider=offering.provider,
        region=offering.region, zone=offering.zone, offering_key=offering.key,
        size=len(launches), node_ids=tuple(a.node_id for a in launches),
        state=GroupState.REQUESTED, state_since=now, created_at=now)
    executor.store.add_group(record)  # a repeat finds it recorded: resume it
    return executor.store.get_group(record.group_id)


def launch_group(executor: Executor, launches: list[Launch], report: ExecutionReport) -> None:
    """Carry out one launch group (see the module docstring)."""
    record = record_group(executor, launches)
    if record is not None:
        launch_recorded_group(executor, record.group_id, report)


def launch_recorded_group(executor: Executor, group_id: str, report: ExecutionReport) -> None:
    """Create the group's placement group and launch its recorded nodes into it; on any node
    that cannot be had, fall back as a whole. Safe to run again (every call is idempotent)."""
    store = executor.store
    record = store.get_group(group_id)
    if record is None or record.state not in (GroupState.REQUESTED, GroupState.ACTIVE):
        return
    provider = executor.providers.get(record.provider)
    placement = placement_of(provider)
    name: str | None = record.name
    if placement is not None and record.state is GroupState.REQUESTED:
        policy = executor.policies.get(record.policy)
        tags = GroupTags(policy.cluster if policy else "burst", record.policy, record.group_id)
        offering = _offering(executor, record)
        try:
            group = placement.create_group(record.group_id, offering, record.size, tags)
        except ProviderError as exc:
            if isinstance(exc, TransientError):
                report.errors.append(f"{group_id}: transient: {exc}")
                return  # nothing launched; the reconciler re-issues the group's nodes
            _fall_back(executor, record, f"placement group: {exc.kind}: {exc}", report, exc)
            return
        moved = store.move_group(record, GroupState.ACTIVE, executor.clock.now(), name=group.name,
                                 reason="placement group created")
        if moved is None:
            return  # another writer moved it first
        record, name = moved, group.name
    elif placement is None:
        if record.state is GroupState.REQUESTED:
            record = store.move_group(record, GroupState.ACTIVE, executor.clock.now(),
                                      reason="provider places no groups: nodes launched "
                                      "together without one") or record
    for node_id in record.node_ids:
        node = store.get_node(node_id)
        if node is None or node.state is not NodeState.REQUESTED:
            continue
        before = len(report.capacity_errors)
        outcome = executor.launch_node(node, report, placement_group=name)
        if outcome is NodeState.REQUESTED:
            return  # transient: the rest waits for the retry, with the same request ids
        if outcome is not NodeState.LAUNCHING:
            cause = "capacity" if len(report.capacity_errors) > before else "launch failed"
            _fall_back(executor, record, f"node {node_id}: {cause}", report, None)
            return
    log.info("launch group %s: %d node(s) launched together in %s", group_id, record.size,
             name or "no placement group")


def _fall_back(executor: Executor, record: GroupRecord, why: str, report: ExecutionReport,
               exc: ProviderError | None) -> None:
    """The whole group goes: unlaunched nodes fail, launched ones are terminated, the placement
    group is deleted. A capacity error backs the offering off and asks for a re-plan."""
    store = executor.store
    now = executor.clock.now()
    if isinstance(exc, CapacityError):
        store.add_capacity_block(CapacityBlock(record.offering_key,
                                               now + executor.config.capacity_backoff,
                                               f"{exc.code or 'capacity'}: {exc}"), now)
        report.capacity_errors.append(record.offering_key)
    elif exc is not None:
        report.errors.append(f"{record.group_id}: {exc.kind}: {exc}")
    log.warning("launch group %s falls back as a whole: %s", record.group_id, why)
    for node_id in record.node_ids:
        node = store.get_node(node_id)
        if node is None:
            continue
        if node.state is NodeState.REQUESTED:
            executor.fail_unlaunched(node, f"launch group {record.group_id} fell back: {why}")
        elif node.state is not NodeState.TERMINATED:
            executor.run([Terminate(node_id, ActionReason.GROUP_FALLBACK)])
    delete_group(executor.store, executor.providers, record, executor.clock.now(),
                 f"launch group fell back: {why}")


def delete_group(store: Store, providers: Mapping[str, Provider], record: GroupRecord, now: Any,
                 why: str) -> bool:
    """Record the deletion, ask the provider, record it done; False when the provider refused
    for now (instances still leaving the group): the next sweep tries again."""
    if record.state is not GroupState.DELETING:
        moved = store.move_group(record, GroupState.DELETING, now, reason=why)
        if moved is None:
            return False
        record = moved
    placement = placement_of(providers.get(record.provider))
    if placement is not None and record.name is not None:
        try:
            placement.delete_group(record.as_group())
        except ProviderError as exc:
            log.info("placement group %s not deleted yet: %s", record.group_id, exc)
            return False
    return store.move_group(record, GroupState.DELETED, now, reason=why) is not None


def sweep_groups(store: Store, providers: Mapping[str, Provider], clusters: set[str],
                 now: Any) -> list[str]:
    """Delete groups whose nodes are all gone, finish interrupted deletions, collect leaked ones
    (see the module docstring); returns the group ids deleted or collected."""
    done: list[str] = []
    live = store.groups((GroupState.REQUESTED, GroupState.ACTIVE, GroupState.DELETING))
    for record in live:
        if record.state is GroupState.DELETING:
            if delete_group(store, providers, record, now, record.reason or "burst over"):
                done.append(record.group_id)
            continue
        nodes = [store.get_node(n) for n in record.node_ids]
        if all(n is None or n.state is NodeState.TERMINATED for n in nodes):
            if delete_group(store, providers, record, now, "every node of the group is gone"):
                done.append(record.group_id)
    # Listed first, records read after: a group's record is written before its create call, so
    # one listed here without a live record read afterwards is not ours to keep (leaked).
    listed = []
    for name, provider in providers.items():
        placement = placement_of(provider)
        if placement is None:
            continue
        for cluster in sorted(clusters):
            try:
                listed += [(name, placement, g) for g in placement.list_owned_groups(cluster)]
            except ProviderError as exc:
                log.warning("provider %s: cannot list placement groups: %s", name, exc)
    recorded = {g.group_id: g for g in store.groups()} if listed else {}
    for name, placement, group in listed:
        tags = group.ownership
        record = recorded.get(tags.group) if tags else None
        if record is not None and record.state is not GroupState.DELETED:
            continue
        try:
            placement.delete_group(group)
        except ProviderError as exc:
            log.info("leaked placement group %s not deleted yet: %s", group.name, exc)
            continue
        done.append(group.name)
        log.warning("collected leaked placement group %s at %s", group.name, name)
    return done


def _offering(executor: Executor, record: GroupRecord):
    node = executor.store.get_node(record.node_ids[0])
    return offering_from_key(record.offering_key, node.gpus if node else 1,
                             node.price_usd_hour if node else 0.0)
