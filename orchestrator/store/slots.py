"""Fabric members in the store: which Slurm node name each burst node holds.

A Slurm fabric gives every burst node a node name: a pre-declared ``State=FUTURE`` slot of
slurm.conf (``burst-[1-4]``), or a dynamic node (``slurmd -Z``) named after the burst node. Slots
are rows seeded once per scope and claimed by compare-and-set (``UPDATE ... WHERE node_id IS
NULL``): two registrations racing for the last slot cannot both win, on SQLite or PostgreSQL. A
unique ``node_id`` means a node holds at most one name, so a repeated claim returns the same one.
Releasing a slot clears its ``node_id``; releasing a dynamic member deletes its row.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

SLOT = "slot"
DYNAMIC = "dynamic"
CLOUD = "cloud"  # a State=CLOUD node of slurm.conf, bound by a power-save resume
_CLAIM_RETRIES = 16


@dataclass(frozen=True, slots=True)
class FabricMember:
    """A name in a fabric, and the burst node holding it (None: a free slot)."""

    scope: str
    name: str
    kind: str
    node_id: str | None
    claimed_at: datetime | None


def _member(row: sa.Row[Any]) -> FabricMember:
    m = row._mapping
    return FabricMember(m["scope"], m["name"], m["kind"], m["node_id"], m["claimed_at"])


def _slot_order(name: str) -> tuple[int, str]:
    # burst-2 before burst-10: shortest first, then by text.
    return (len(name), name)


class FabricSlots(StoreBase):
    """Fabric-member methods of the Store."""

    def seed_fabric_slots(self, scope: str, names: list[str]) -> int:
        """Make sure every slot name exists in ``scope`` (free unless claimed). Returns how many
        were added; existing rows, claimed or not, are left alone."""
        added = 0
        with self._write() as conn:
            for name in names:
                stmt = self._insert(T.fabric_members).values(
                    scope=scope, name=name, kind=SLOT, node_id=None, claimed_at=None
                ).on_conflict_do_nothing(index_elements=["scope", "name"])
                added += conn.execute(stmt).rowcount
        return added

    def claim_fabric_slot(self, scope: str, node_id: str, at: datetime) -> FabricMember | None:
        """Give ``node_id`` a free slot of ``scope`` (the lowest-numbered); the one it already
        holds if any; None when every slot is taken."""
        require_aware(at, "at")
        c = T.fabric_members.c
        for _ in range(_CLAIM_RETRIES):
            held = self.fabric_member(node_id)
            if held is not None:
                return held
            with self._read() as conn:
                free = sorted(
                    (r.name for r in conn.execute(
                        sa.select(c.name).where(c.scope == scope, c.kind == SLOT,
                                                c.node_id.is_(None)))),
                    key=_slot_order)
            if not free:
                return None
            try:
                with self._write() as conn:
                    won = conn.execute(
                        sa.update(T.fabric_members)
                        .where(c.scope == scope, c.name == free[0], c.node_id.is_(None))
                        .values(node_id=node_id, claimed_at=at)
                    ).rowcount == 1
            except sa.exc.IntegrityError:
                continue  # the same node claimed another slot at the same moment: read it back
            if won:
                return FabricMember(scope, free[0], SLOT, node_id, at)
        return self.fabric_member(node_id)

    def add_fabric_member(self, scope: str, name: str, node_id: str, at: datetime,
                          kind: str = DYNAMIC) -> FabricMember:
        """Record a dynamic (or power-save ``CLOUD``) member; idempotent for the same node.
        ValueError if the name or the node is already taken by another."""
        require_aware(at, "at")
        held = self.fabric_member(node_id)
        if held is not None:
            if (held.scope, held.name) != (scope, name):
                raise ValueError(f"node {node_id} already holds {held.scope}/{held.name}")
            return held
        try:
            with self._write() as conn:
                conn.execute(sa.insert(T.fabric_members).values(
                    scope=scope, name=name, kind=kind, node_id=node_id, claimed_at=at))
        except sa.exc.IntegrityError:
            held = self.fabric_member(node_id)
            if held is not None and (held.scope, held.name) == (scope, name):
                return held
            raise ValueError(f"{scope}/{name} is already held by another node") from None
        return FabricMember(scope, name, kind, node_id, at)

    def fabric_member(self, node_id: str) -> FabricMember | None:
        """The name ``node_id`` holds, if any."""
        with self._read() as conn:
            row = conn.execute(
                sa.select(T.fabric_members).where(T.fabric_members.c.node_id == node_id)).first()
        return None if row is None else _member(row)

    def fabric_members(self, scope: str | None = None) -> list[FabricMember]:
        """Every member (free slots included), by scope and slot order."""
        query = sa.select(T.fabric_members)
        if scope is not None:
            query = query.where(T.fabric_members.c.scope == scope)
        with self._read() as conn:
            members = [_member(r) for r in conn.execute(query)]
        return sorted(members, key=lambda m: (m.scope, _slot_order(m.name)))

    def release_fabric_member(self, node_id: str) -> FabricMember | None:
        """Give the node's name back: a slot becomes free, a dynamic member is deleted. Returns
        what was released (None if the node held nothing). Idempotent."""
        held = self.fabric_member(node_id)
        if held is None:
            return None
        c = T.fabric_members.c
        with self._write() as conn:
            where = sa.and_(c.scope == held.scope, c.name == held.name, c.node_id == node_id)
            if held.kind == SLOT:
                conn.execute(sa.update(T.fabric_members).where(where)
                             .values(node_id=None, claimed_at=None))
            else:
                conn.execute(sa.delete(T.fabric_members).where(where))
        return held
