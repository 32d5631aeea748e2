"""Placement groups in the store: one row per provider placement group of a launch group.

The executor writes the intent (``requested``, with the group's nodes) before it asks the
provider to create the group, ``active`` (with the provider-side name) after, ``deleting`` before
the delete call and ``deleted`` once the provider's answer (or the reconciler's observation) says
it is gone. State changes are compare-and-set on the state read, so two writers racing on one
group cannot both move it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from orchestrator.domain.placement import GroupRecord, GroupState
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

_g = T.placement_groups.c


class PlacementGroups(StoreBase):
    """Placement-group methods of the Store."""

    def add_group(self, record: GroupRecord) -> bool:
        """Record a group's intent; False (nothing written) when its id is recorded already."""
        values = _values(record)
        with self._write() as conn:
            result = conn.execute(self._insert(T.placement_groups).values(**values)
                                  .on_conflict_do_nothing(index_elements=["group_id"]))
            return bool(result.rowcount)

    def get_group(self, group_id: str) -> GroupRecord | None:
        with self._read() as conn:
            row = conn.execute(sa.select(T.placement_groups).where(_g.group_id == group_id)).first()
        return _record(row) if row is not None else None

    def groups(self, states: Iterable[GroupState] | None = None) -> list[GroupRecord]:
        """Groups in ``states`` (None: all), oldest first."""
        query = sa.select(T.placement_groups).order_by(_g.created_at, _g.group_id)
        if states is not None:
            query = query.where(_g.state.in_([str(s) for s in states]))
        with self._read() as conn:
            return [_record(r) for r in conn.execute(query)]

    def group_of_node(self, node_id: str) -> GroupRecord | None:
        """The live group ``node_id`` was launched into, if any (groups are few: read them)."""
        alive = (GroupState.REQUESTED, GroupState.ACTIVE)
        return next((g for g in self.groups(alive) if node_id in g.node_ids), None)

    def move_group(self, record: GroupRecord, state: GroupState, at: datetime, *,
                   name: str | None = None, reason: str = "") -> GroupRecord | None:
        """Move the group from ``record.state`` to ``state`` (compare-and-set on the state);
        the updated record, or None when another writer moved it first."""
        values: dict[str, Any] = {"state": str(state), "state_since": require_aware(at, "at"),
                                  "reason": reason}
        if name is not None:
            values["name"] = name
        with self._write() as conn:
            result = conn.execute(sa.update(T.placement_groups)
                                  .where(_g.group_id == record.group_id,
                                         _g.state == str(record.state)).values(**values))
        if not result.rowcount:
            return None
        return self.get_group(record.group_id)


def _values(record: GroupRecord) -> dict[str, Any]:
    return {"group_id": record.group_id, "policy": record.policy, "provider": record.provider,
            "region": record.region, "zone": record.zone, "offering_key": record.offering_key,
            "size": record.size, "node_ids": list(record.node_ids), "state": str(record.state),
            "state_since": require_aware(record.state_since, "state_since"),
            "created_at": require_aware(record.created_at, "created_at"), "name": record.name,
            "reason": record.reason}


def _record(row: Any) -> GroupRecord:
    return GroupRecord(
        group_id=row.group_id, policy=row.policy, provider=row.provider, region=row.region,
        zone=row.zone, offering_key=row.offering_key, size=row.size,
        node_ids=tuple(row.node_ids or ()), state=GroupState(row.state),
        state_since=row.state_since, created_at=row.created_at, name=row.name,
        reason=row.reason or "")
