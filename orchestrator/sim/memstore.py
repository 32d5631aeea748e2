"""An in-memory stand-in for the store, holding what the executor writes during a simulation.

The simulator drives the production :class:`~orchestrator.executor.Executor` (intent before every
provider call, outcome after, capacity errors into the negative-capacity cache, failures through
the lifecycle gate). The executor needs a store; a SQL store would make a 69k-job replay take
hours, so this class keeps the same records in dictionaries with the same semantics: node writes
are compare-and-set on the version, transitions are checked against the lifecycle table, a
duplicate launch intent is refused, decisions are counted by rule (a replay makes tens of
thousands; the last few are kept for inspection).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from orchestrator.domain.evolve import evolve
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.placement import GroupRecord, GroupState
from orchestrator.domain.plan import Decision
from orchestrator.domain.snapshot import CapacityBlock, PolicyMemory
from orchestrator.lifecycle import IllegalTransition, NodeEvent, can_transition

_NOT_UPDATABLE = frozenset({"id", "state", "state_since", "version"})


class SimStore:
    """The executor-facing part of the store, in memory (see the module docstring)."""

    def __init__(self, keep_decisions: int = 20):
        self._nodes: dict[str, Node] = {}
        self._live: dict[str, Node] = {}  # not terminated, in creation order
        self._by_request: dict[str, str] = {}
        self._memory: dict[str, PolicyMemory] = {}
        self._blocks: list[CapacityBlock] = []
        self.decisions: deque[Decision] = deque(maxlen=keep_decisions)
        self.rules: Counter[str] = Counter()
        self.held_back: Counter[str] = Counter()  # limit -> decisions it held launches back in
        self.event_count = 0  # node events written (the sim keeps only each node's first)
        self._created: dict[str, NodeEvent] = {}  # node id -> the event that created it
        self.terminated_log: list[str] = []
        # Per job id, the on-prem starts the planner predicted when it launched for the job
        # (decision time, predicted start or None), oldest first: see orchestrator.sim.roi.
        self.predictions: dict[str, list[tuple[datetime, datetime | None]]] = {}  # node ids in the order they were terminated
        self.version = 0  # bumped on every node change (lets the snapshot cache its node tuple)
        self._live_tuple: tuple[Node, ...] | None = ()
        self._groups: dict[str, GroupRecord] = {}  # launch groups (orchestrator.groups)
        self._group_of: dict[str, str] = {}  # node id -> its group id

    # -- nodes -----------------------------------------------------------------------------------

    def add_node(self, node: Node, event: NodeEvent) -> bool:
        if event.node_id != node.id or event.to_state != node.state:
            raise ValueError(f"event {event.from_state}->{event.to_state} does not create node "
                             f"{node.id} in {node.state}")
        if node.id in self._nodes or node.request_id in self._by_request:
            return False
        self._nodes[node.id] = node
        self._by_request[node.request_id] = node.id
        self._put(node)
        self._created[node.id] = event
        self.event_count += 1
        return True

    def get_node(self, node_id: str) -> Node | None:
        return self._nodes.get(node_id)

    def node_by_request(self, request_id: str) -> Node | None:
        node_id = self._by_request.get(request_id)
        return self._nodes.get(node_id) if node_id is not None else None

    def nodes(self, include_terminated: bool = False) -> list[Node]:
        return list(self._nodes.values() if include_terminated else self._live.values())

    def live_nodes(self) -> tuple[Node, ...]:
        """Nodes not terminated, in creation order (cached between changes)."""
        if self._live_tuple is None:
            self._live_tuple = tuple(self._live.values())
        return self._live_tuple

    def save_transition(self, old: Node, new: Node, event: NodeEvent) -> bool:
        if new.id != old.id or event.node_id != old.id or new.version != old.version + 1:
            raise ValueError(f"transition of {old.id}: node/event/version do not match")
        if event.from_state != old.state or event.to_state != new.state:
            raise ValueError(f"node {old.id}: event {event.from_state}->{event.to_state} does not "
                             f"match {old.state}->{new.state}")
        if not can_transition(old.state, new.state):
            raise IllegalTransition(f"node {old.id}: {old.state} -> {new.state} is not allowed")
        current = self._nodes.get(old.id)
        if current is None or current.version != old.version:
            return False
        self._put(new)
        self.event_count += 1
        return True

    def update_node(self, old: Node, **changes: Any) -> Node | None:
        refused = _NOT_UPDATABLE & changes.keys()
        if refused:
            raise ValueError(f"update_node cannot change {sorted(refused)}")
        current = self._nodes.get(old.id)
        if current is None or current.version != old.version:
            return None
        new = evolve(current, **changes, version=current.version + 1)
        self._put(new)
        return new

    def events(self, node_id: str, limit: int = 50) -> list[NodeEvent]:
        """A node's events, newest first, as the store answers: here only the one that created it
        (its launch intent, whose details the executor reads back), as the sim keeps no history."""
        created = self._created.get(node_id)
        return [created][:limit] if created is not None else []

    def set_usage(self, node_id: str, **changes: Any) -> Node:
        """Fold the fabric's view of a node (GPUs busy, jobs, idle since, released) into its
        record, as :mod:`orchestrator.observe` folds it into each snapshot's copy."""
        new = evolve(self._nodes[node_id], **changes)
        self._put(new)
        return new

    def set_join_token(self, node_id: str, token_hash: str, expires_at: datetime) -> bool:
        return node_id in self._nodes  # no agent registers in a simulation

    # -- decisions, memory, capacity blocks ------------------------------------------------------

    def add_decision(self, decision: Decision) -> None:
        self.decisions.append(decision)
        self.rules[str(decision.rule)] += 1
        for limit in decision.held_back_by:
            self.held_back[limit] += 1
        starts = (decision.inputs.get("burst_wait") or {}).get("predicted_onprem_start_s")
        for job_id, offset in (starts or {}).items():
            predicted = None if offset is None else decision.at + timedelta(seconds=offset)
            self.predictions.setdefault(job_id, []).append((decision.at, predicted))

    def count_decision(self, rule: str, held_back: tuple[str, ...] = ()) -> None:
        """A decision the simulator knows without planning (a skipped idle tick,
        :mod:`orchestrator.sim.idletick`, or one before a plan's ``holds_until``): counted by
        rule and by the limits that held launches back, no record kept."""
        self.rules[rule] += 1
        for limit in held_back:
            self.held_back[limit] += 1

    def load_memory(self) -> dict[str, PolicyMemory]:
        return dict(self._memory)

    def save_memory(self, policy: str, memory: PolicyMemory) -> None:
        self._memory[policy] = memory

    def add_capacity_block(self, block: CapacityBlock, now: datetime) -> None:
        self._blocks = [b for b in self._blocks if b.until > now]
        self._blocks.append(block)

    def capacity_blocks(self, now: datetime) -> list[CapacityBlock]:
        latest: dict[str, CapacityBlock] = {}
        for block in self._blocks:
            if block.until > now and (block.offering_key not in latest
                                      or block.until > latest[block.offering_key].until):
                latest[block.offering_key] = block
        return [latest[k] for k in sorted(latest)]

    def has_blocks(self, now: datetime) -> bool:
        return any(b.until > now for b in self._blocks)

    # -- internals -------------------------------------------------------------------------------

    # -- launch groups (the same semantics as store.placement) ----------------------------------

    def add_group(self, record: GroupRecord) -> bool:
        if record.group_id in self._groups:
            return False
        self._groups[record.group_id] = record
        self._group_of.update((n, record.group_id) for n in record.node_ids)
        return True

    def get_group(self, group_id: str) -> GroupRecord | None:
        return self._groups.get(group_id)

    def groups(self, states: Any = None) -> list[GroupRecord]:
        wanted = None if states is None else set(states)
        return [g for g in self._groups.values() if wanted is None or g.state in wanted]

    def group_of_node(self, node_id: str) -> GroupRecord | None:
        group = self._groups.get(self._group_of.get(node_id, ""))
        alive = (GroupState.REQUESTED, GroupState.ACTIVE)
        return group if group is not None and group.state in alive else None

    def move_group(self, record: GroupRecord, state: GroupState, at: datetime, *,
                   name: str | None = None, reason: str = "") -> GroupRecord | None:
        current = self._groups.get(record.group_id)
        if current is None or current.state is not record.state:
            return None
        moved = replace(current, state=state, state_since=at, reason=reason,
                        name=name if name is not None else current.name)
        self._groups[record.group_id] = moved
        return moved

    def _put(self, node: Node) -> None:
        self._nodes[node.id] = node
        if node.state is NodeState.TERMINATED:
            if self._live.pop(node.id, None) is not None:
                self.terminated_log.append(node.id)
                # Only the launch reads the creating event (the intent's user): a replay's
                # thousands of ended nodes would hold theirs to the end.
                self._created.pop(node.id, None)
        else:
            self._live[node.id] = node
        self._live_tuple = None
        self.version += 1
