"""The Store: the repository of burst's durable state on SQLite or PostgreSQL.

Nodes change only by compare-and-set on their version, and every state change appends its event
in the same transaction, so the event log and the node rows never disagree and two writers racing
on one node cannot both win. Launch intents are idempotent on node id and request id. Time is
always passed in; no method reads the clock. Datetimes go in tz-aware and come back tz-aware UTC.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.plan import Decision
from orchestrator.domain.snapshot import CapacityBlock, PolicyMemory
from orchestrator.lifecycle import IllegalTransition, NodeEvent, can_transition
from orchestrator.policy.models import Market
from orchestrator.store import accrual
from orchestrator.store import tables as T
from orchestrator.store.accrual import Accrual
from orchestrator.store.base import require_aware
from orchestrator.store.bulk import BulkSubmit
from orchestrator.store.burstwaits import BurstWaits, record_predictions
from orchestrator.store.codec import (
    decision_fingerprint,
    decision_from_json,
    decision_to_json,
    to_jsonable,
)
from orchestrator.store.engine import default_sqlite_url
from orchestrator.store.fencing import Fencing
from orchestrator.store.jobqueue import JobQueue
from orchestrator.store.jobruns import JobRuns
from orchestrator.store.joins import JoinSecrets
from orchestrator.store.leases import Leases
from orchestrator.store.ledger import Ledger
from orchestrator.store.ledger_batch import LedgerBatch
from orchestrator.store.notices import Notices
from orchestrator.store.placement import PlacementGroups
from orchestrator.store.kept_jobs import KeptJobs
from orchestrator.store.pools import PoolControls
from orchestrator.store.presence import Presence
from orchestrator.store.queueread import QueueReads
from orchestrator.store.rawread import driver_rows
from orchestrator.store.slots import FabricSlots
from orchestrator.store.telemetry import Telemetry
from orchestrator.store.ticknodes import NODE_FIELDS, TickNodesRead, node_values
from orchestrator.store.tokens import ApiTokens
from orchestrator.store.usage import Utilisation
from orchestrator.store.usage_reads import UsageReads

# default_sqlite_url lives in engine.py, which env.py uses without the repository; it is
# re-exported here beside Store.
__all__ = ["NodeCount", "Store", "default_sqlite_url"]

# Fields update_node must not touch: state (and its clock) only move through save_transition,
# and the identity and version are the store's to manage.
_NOT_UPDATABLE = frozenset({"id", "version", "state", "state_since"})


def _node_values(node: Node) -> dict[str, Any]:
    values = {name: getattr(node, name) for name in NODE_FIELDS}
    values["state"] = NodeState(node.state).value
    values["market"] = Market(node.market).value
    values["launched_for"] = list(node.launched_for) or None
    return values


def _node_from_row(row: sa.Row[Any]) -> Node:
    m = row._mapping
    values = {name: m[name] for name in NODE_FIELDS}
    values["state"] = NodeState(values["state"])
    values["market"] = Market(values["market"])
    values["launched_for"] = tuple(values["launched_for"] or ())
    return Node(**values)


# Reading many nodes (Store.nodes): the driver's tuples in NODE_FIELDS order, converted by
# position (rawread: typed result processing cost more than the read at 10,000 nodes), as the
# tick's one read of the nodes does (orchestrator.store.ticknodes).
_node_fields = node_values


def _event_values(event: NodeEvent) -> dict[str, Any]:
    return {
        "node_id": event.node_id,
        "at": require_aware(event.at, "event.at"),
        "from_state": NodeState(event.from_state).value if event.from_state is not None else None,
        "to_state": NodeState(event.to_state).value,
        "reason": event.reason,
        "details": to_jsonable(event.details),
    }


def _event_from_row(row: sa.Row[Any]) -> NodeEvent:
    m = row._mapping
    return NodeEvent(
        node_id=m["node_id"],
        at=m["at"],
        from_state=NodeState(m["from_state"]) if m["from_state"] is not None else None,
        to_state=NodeState(m["to_state"]),
        reason=m["reason"],
        details=dict(m["details"] or {}),
    )


@dataclass(frozen=True, slots=True)
class NodeCount:
    """How many nodes (and GPUs) of a pool are in a state on an offering."""

    pool: str
    state: NodeState
    offering_key: str
    nodes: int
    gpus: int


_NODE_COLUMNS = [T.nodes.c[name] for name in NODE_FIELDS]
_DECISION_COLUMNS = [T.decisions.c.record, T.decisions.c.repeats, T.decisions.c.last_seen_at]


def _stored_record(decision: Decision) -> dict[str, Any]:
    # repeats and last seen live in their columns, which change; the record never does.
    record = decision_to_json(decision)
    del record["repeats"], record["last_seen_at"]
    return record


def _decision_from_row(row: sa.Row[Any]) -> Decision:
    # The record is the first tick's; how often and until when it was repeated are columns.
    decision = decision_from_json(row.record)
    if row.repeats <= 1:
        return decision
    return replace(decision, repeats=int(row.repeats), last_seen_at=row.last_seen_at)


class Store(BurstWaits, UsageReads, JoinSecrets, JobQueue, BulkSubmit, QueueReads, JobRuns,
            PoolControls, Ledger, LedgerBatch, Accrual, ApiTokens, Telemetry, FabricSlots, Leases,
            Presence, Utilisation, Notices, PlacementGroups, TickNodesRead, KeptJobs, Fencing):
    """burst's durable state. ``Store(url)`` connects; ``upgrade()`` creates or migrates it;
    ``fenced(scope, token)`` gives a view whose writes a newer leader's token refuses."""

    # -- nodes ---------------------------------------------------------------------------------

    def add_node(self, node: Node, event: NodeEvent) -> bool:
        """Record a new node with its first event; False (and nothing written) if its id or
        request id is already recorded, which makes a re-delivered launch intent harmless."""
        if event.node_id != node.id or event.to_state != node.state:
            raise ValueError(f"event {event.from_state}->{event.to_state} for {event.node_id} "
                             f"does not create node {node.id} in {node.state}")
        for name in ("state_since", "created_at"):
            require_aware(getattr(node, name), name)
        with self._write() as conn:
            # DO NOTHING on any unique key (id or request_id) rather than catching the error:
            # on PostgreSQL a failed statement would poison the transaction.
            inserted = conn.execute(
                self._insert(T.nodes).values(**_node_values(node)).on_conflict_do_nothing()
            ).rowcount == 1
            if inserted:
                conn.execute(sa.insert(T.node_events).values(**_event_values(event)))
                accrual.on_add(conn, self._insert, node, NodeState(event.to_state), event.at)
        return inserted

    def get_node(self, node_id: str) -> Node | None:
        return self._one_node(T.nodes.c.id == node_id)

    def node_by_request(self, request_id: str) -> Node | None:
        return self._one_node(T.nodes.c.request_id == request_id)

    def node_by_instance(self, instance_id: str) -> Node | None:
        """The node of a provider instance (the newest, should an id ever have been reused)."""
        return self._one_node(T.nodes.c.instance_id == instance_id)

    def nodes(
        self,
        policy: str | None = None,
        states: Iterable[NodeState] | None = None,
        include_terminated: bool = False,
        limit: int | None = None,
    ) -> list[Node]:
        """Nodes by creation order (the first ``limit`` of them, if given). Terminated nodes are
        left out unless ``include_terminated`` or ``states`` names TERMINATED explicitly."""
        return [Node(*values) for values in
                self.node_fields(policy, states, include_terminated, limit)]

    def node_fields(
        self,
        policy: str | None = None,
        states: Iterable[NodeState] | None = None,
        include_terminated: bool = False,
        limit: int | None = None,
    ) -> list[list[Any]]:
        """:meth:`nodes` as each node's field values in ``NODE_FIELDS`` order, not yet Nodes:
        for a reader that changes a few of them first and makes each Node once (observe sets
        what each node runs: a second frozen copy of 10,000 nodes cost more than reading them)."""
        c = T.nodes.c
        query = sa.select(*_NODE_COLUMNS).order_by(c.created_at, c.id)
        if policy is not None:
            query = query.where(c.policy == policy)
        if states is not None:
            wanted = {NodeState(s) for s in states}
            query = query.where(c.state.in_(sorted(s.value for s in wanted)))
        elif not include_terminated:
            query = query.where(c.state != NodeState.TERMINATED.value)
        if limit is not None:
            query = query.limit(int(limit))
        with self._read() as conn:
            return [_node_fields(r) for r in driver_rows(conn, query)]

    def node_counts_by_offering(self, include_terminated: bool = False) -> list[NodeCount]:
        """Nodes and their GPUs per (pool, state, offering), by SQL ``GROUP BY``: the figures
        ``burst status`` shows for every node while it lists only the first few."""
        c = T.nodes.c
        query = (sa.select(c.pool, c.state, c.offering_key, sa.func.count(), sa.func.sum(c.gpus))
                 .group_by(c.pool, c.state, c.offering_key)
                 .order_by(c.pool, c.state, c.offering_key))
        if not include_terminated:
            query = query.where(c.state != NodeState.TERMINATED.value)
        with self._read() as conn:
            return [NodeCount(pool, NodeState(state), offering, int(nodes), int(gpus or 0))
                    for pool, state, offering, nodes, gpus in conn.execute(query)]

    def save_transition(self, old: Node, new: Node, event: NodeEvent) -> bool:
        """Write ``new`` (from ``lifecycle.transition(old, ...)``) if the stored node is still at
        ``old.version``, appending ``event`` in the same transaction. False: someone else changed
        the node first; nothing was written."""
        if new.id != old.id or event.node_id != old.id:
            raise ValueError(f"transition of {old.id} given node {new.id} / event {event.node_id}")
        if new.version != old.version + 1:
            raise ValueError(f"node {old.id}: new version {new.version} must be {old.version + 1}")
        if event.from_state != old.state or event.to_state != new.state:
            raise ValueError(f"node {old.id}: event {event.from_state}->{event.to_state} does not "
                             f"match {old.state}->{new.state}")
        if not can_transition(old.state, new.state):
            raise IllegalTransition(f"node {old.id}: {old.state} -> {new.state} is not allowed")
        with self._write() as conn:
            return self._save_transition_in(conn, old, new, event)

    def _save_transition_in(self, conn: sa.Connection, old: Node, new: Node,
                            event: NodeEvent) -> bool:
        """:meth:`save_transition`'s writes inside the caller's transaction (checked by it)."""
        values = _node_values(new)
        del values["id"]
        c = T.nodes.c
        stmt = sa.update(T.nodes).where(c.id == old.id, c.version == old.version).values(**values)
        won = conn.execute(stmt).rowcount == 1
        if won:
            conn.execute(sa.insert(T.node_events).values(**_event_values(event)))
            accrual.on_event(conn, old.id, NodeState(event.to_state), event.at,
                             new.state_since)
        return won

    def _node_in(self, conn: sa.Connection, node_id: str) -> Node | None:
        """The node as the caller's transaction sees it."""
        row = conn.execute(sa.select(*_NODE_COLUMNS).where(T.nodes.c.id == node_id)).first()
        return _node_from_row(row) if row is not None else None

    def update_node(self, old: Node, **changes: Any) -> Node | None:
        """Compare-and-set non-state fields (heartbeat, busy GPUs, instance id...). Returns the
        new node, or None if the stored node is no longer at ``old.version``."""
        refused = _NOT_UPDATABLE & changes.keys()
        if refused:
            raise ValueError(f"update_node cannot change {sorted(refused)}: state changes go "
                             "through save_transition; id and version belong to the store")
        new = replace(old, **changes, version=old.version + 1)
        values = {k: v for k, v in _node_values(new).items() if k in changes}
        values["version"] = new.version
        c = T.nodes.c
        stmt = sa.update(T.nodes).where(c.id == old.id, c.version == old.version).values(**values)
        with self._write() as conn:
            won = conn.execute(stmt).rowcount == 1
        return new if won else None

    def events(self, node_id: str | None = None, limit: int = 1000) -> list[NodeEvent]:
        """The latest ``limit`` events (of one node, or all), oldest first."""
        c = T.node_events.c
        query = sa.select(T.node_events).order_by(c.id.desc()).limit(limit)
        if node_id is not None:
            query = query.where(c.node_id == node_id)
        with self._read() as conn:
            rows = list(conn.execute(query))
        return [_event_from_row(r) for r in reversed(rows)]

    def _one_node(self, where: sa.ColumnElement[bool]) -> Node | None:
        c = T.nodes.c
        query = sa.select(*_NODE_COLUMNS).where(where).order_by(c.created_at.desc()).limit(1)
        with self._read() as conn:
            row = conn.execute(query).first()
        return _node_from_row(row) if row is not None else None

    # -- decisions -----------------------------------------------------------------------------

    def add_decision(self, decision: Decision) -> str:
        """Record a decision and return the id of the stored decision that holds it.

        A decision equal to its policy's latest stored one (``Decision.same_as``) and newer than
        it is counted on that row (repeats + 1, last seen, last id) instead of adding a row, so a
        steady queue stores one row, not one per tick. Adding the same id again (a re-delivered
        tick) is a no-op, whether it was stored as a row or counted as a repeat."""
        at = require_aware(decision.at, "decision.at")
        fingerprint = decision_fingerprint(decision)
        c = T.decisions.c
        with self._write() as conn:
            seen = conn.execute(sa.select(c.id).where(
                sa.or_(c.id == decision.id, c.last_id == decision.id)).limit(1)).scalar()
            if seen is not None:
                return str(seen)
            record_predictions(conn, self._insert(T.burst_waits), decision)
            latest = conn.execute(
                sa.select(c.id, c.fingerprint, c.last_seen_at).where(c.policy == decision.policy)
                .order_by(c.last_seen_at.desc(), c.id.desc()).limit(1)).first()
            if latest is not None and latest.fingerprint == fingerprint and at > latest.last_seen_at:
                conn.execute(sa.update(T.decisions).where(c.id == latest.id).values(
                    repeats=c.repeats + 1, last_seen_at=at, last_id=decision.id))
                return str(latest.id)
            conn.execute(self._insert(T.decisions).values(
                id=decision.id, policy=decision.policy, at=at, rule=decision.rule.value,
                summary=decision.summary, record=_stored_record(decision), repeats=1,
                last_seen_at=at, last_id=decision.id, fingerprint=fingerprint,
            ).on_conflict_do_nothing(index_elements=["id"]))
        return decision.id

    def get_decision(self, decision_id: str) -> Decision | None:
        """The stored decision with this id, or the one that counted it as its latest repeat."""
        c = T.decisions.c
        query = (sa.select(*_DECISION_COLUMNS)
                 .where(sa.or_(c.id == decision_id, c.last_id == decision_id))
                 .order_by((c.id == decision_id).desc()).limit(1))
        with self._read() as conn:
            row = conn.execute(query).first()
        return _decision_from_row(row) if row is not None else None

    def decisions(self, policy: str | None = None, limit: int = 50) -> list[Decision]:
        """The latest decisions, newest (last seen) first."""
        c = T.decisions.c
        query = (sa.select(*_DECISION_COLUMNS)
                 .order_by(c.last_seen_at.desc(), c.id.desc()).limit(limit))
        if policy is not None:
            query = query.where(c.policy == policy)
        with self._read() as conn:
            return [_decision_from_row(r) for r in conn.execute(query)]

    def latest_decisions(self, policies: Iterable[str]) -> dict[str, Decision]:
        """Each named policy's latest decision (policies that never decided are left out)."""
        found: dict[str, Decision] = {}
        for name in policies:
            latest = self.decisions(policy=name, limit=1)
            if latest:
                found[name] = latest[0]
        return found

    def prune_decisions(self, before: datetime) -> int:
        """Delete decisions last seen before ``before`` (retention); returns how many rows went."""
        c = T.decisions.c
        with self._write() as conn:
            return int(conn.execute(sa.delete(T.decisions).where(
                c.last_seen_at < require_aware(before, "before"))).rowcount or 0)

    # -- planner memory ------------------------------------------------------------------------

    def load_memory(self) -> dict[str, PolicyMemory]:
        with self._read() as conn:
            rows = conn.execute(sa.select(T.policy_memory)).all()
        return {
            r.policy: PolicyMemory(
                trigger_since=r.trigger_since,
                last_launch_at=r.last_launch_at,
                last_drain_at=r.last_drain_at,
            )
            for r in rows
        }

    def save_memory(self, policy: str, memory: PolicyMemory) -> None:
        values = {
            "trigger_since": memory.trigger_since,
            "last_launch_at": memory.last_launch_at,
            "last_drain_at": memory.last_drain_at,
        }
        stmt = self._insert(T.policy_memory).values(policy=policy, **values)
        stmt = stmt.on_conflict_do_update(index_elements=["policy"], set_=values)
        with self._write() as conn:
            conn.execute(stmt)

    # -- capacity blocks -----------------------------------------------------------------------

    def add_capacity_block(self, block: CapacityBlock, now: datetime) -> None:
        """Exclude an offering until ``block.until``; blocks already expired at ``now`` are
        pruned in the same transaction so the table stays small."""
        c = T.capacity_blocks.c
        with self._write() as conn:
            conn.execute(sa.delete(T.capacity_blocks).where(c.until <= require_aware(now, "now")))
            conn.execute(sa.insert(T.capacity_blocks).values(
                offering_key=block.offering_key, until=require_aware(block.until, "until"),
                reason=block.reason, created_at=now,
            ))

    def capacity_blocks(self, now: datetime) -> list[CapacityBlock]:
        """Blocks in force at ``now``, one per offering (the one lasting longest)."""
        c = T.capacity_blocks.c
        query = (
            sa.select(c.offering_key, c.until, c.reason)
            .where(c.until > require_aware(now, "now"))
            .order_by(c.offering_key, c.until.desc(), c.id.desc())
        )
        latest: dict[str, CapacityBlock] = {}
        with self._read() as conn:
            for r in conn.execute(query):
                latest.setdefault(r.offering_key, CapacityBlock(r.offering_key, r.until, r.reason))
        return list(latest.values())
