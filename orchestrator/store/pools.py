"""Pool controls in the store: operators pause bursting for a pool and set pre-warm floors.

One ``pool_controls`` row per pool that an operator ever touched; a pool without a row is neither
paused nor pre-warmed. Every write is an upsert of one row, so repeating a command (a re-delivered
task, a retried CLI call) leaves the same state. Pausing a pool that is already paused keeps its
first ``paused_at`` (the reason is replaced). Times are passed in, never read from a clock.
(What nodes cost is the cost ledger's: :mod:`orchestrator.store.ledger`.)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection

from orchestrator.domain.snapshot import PoolControl
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware

MAX_REASON = 500  # characters of a pause reason kept


def _control_from_row(row: sa.Row[Any]) -> PoolControl:
    m = row._mapping
    return PoolControl(
        pool=m["pool"],
        paused=bool(m["paused"]),
        paused_reason=m["paused_reason"] or "",
        paused_at=m["paused_at"],
        prewarm_gpus=m["prewarm_gpus"],
        prewarm_until=m["prewarm_until"],
        updated_at=m["updated_at"],
    )


class PoolControls(StoreBase):
    """The pool-control methods of the Store."""

    def pause_pool(self, pool: str, reason: str, at: datetime) -> PoolControl:
        """Stop launches for ``pool`` (drains and terminations go on). Idempotent."""
        require_aware(at, "at")
        reason = (reason or "")[:MAX_REASON]
        c = T.pool_controls.c
        stmt = self._insert(T.pool_controls).values(
            pool=_pool(pool), paused=True, paused_reason=reason, paused_at=at, updated_at=at)
        stmt = stmt.on_conflict_do_update(index_elements=["pool"], set_={
            "paused": True,
            "paused_reason": stmt.excluded.paused_reason,
            # Already paused: keep since when.
            "paused_at": sa.case((c.paused == sa.true(), c.paused_at), else_=stmt.excluded.paused_at),
            "updated_at": stmt.excluded.updated_at,
        })
        return self._upsert(stmt, pool)

    def resume_pool(self, pool: str, at: datetime) -> PoolControl:
        """Let the planner launch for ``pool`` again. Idempotent."""
        require_aware(at, "at")
        values = {"paused": False, "paused_reason": "", "paused_at": None, "updated_at": at}
        stmt = self._insert(T.pool_controls).values(pool=_pool(pool), **values)
        return self._upsert(stmt.on_conflict_do_update(index_elements=["pool"], set_=values), pool)

    def set_prewarm(self, pool: str, gpus: int, until: datetime, at: datetime) -> PoolControl:
        """Keep at least ``gpus`` burst GPUs for ``pool`` until ``until`` (replaces any earlier
        pre-warm of the pool)."""
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ValueError(f"gpus must be a positive int, got {gpus!r}")
        require_aware(until, "until")
        require_aware(at, "at")
        values = {"prewarm_gpus": gpus, "prewarm_until": until, "updated_at": at}
        stmt = self._insert(T.pool_controls).values(pool=_pool(pool), **values)
        return self._upsert(stmt.on_conflict_do_update(index_elements=["pool"], set_=values), pool)

    def clear_prewarm(self, pool: str, at: datetime) -> PoolControl:
        """Forget the pool's pre-warm floor. Idempotent."""
        require_aware(at, "at")
        values = {"prewarm_gpus": None, "prewarm_until": None, "updated_at": at}
        stmt = self._insert(T.pool_controls).values(pool=_pool(pool), **values)
        return self._upsert(stmt.on_conflict_do_update(index_elements=["pool"], set_=values), pool)

    def pool_controls(self) -> dict[str, PoolControl]:
        """Every pool's stored controls (pools never touched have no entry)."""
        with self._read() as conn:
            rows = conn.execute(sa.select(T.pool_controls).order_by(T.pool_controls.c.pool)).all()
        return {r.pool: _control_from_row(r) for r in rows}

    def pool_control(self, pool: str) -> PoolControl:
        """The controls of ``pool``; the defaults (not paused, no pre-warm) if it has none."""
        with self._read() as conn:
            return _read_control(conn, pool)

    def _upsert(self, stmt: Any, pool: str) -> PoolControl:
        with self._write() as conn:
            conn.execute(stmt)
            return _read_control(conn, pool)


def _pool(pool: str) -> str:
    if not isinstance(pool, str) or not pool.strip():
        raise ValueError(f"pool must be a non-empty string, got {pool!r}")
    return pool


def _read_control(conn: Connection, pool: str) -> PoolControl:
    row = conn.execute(sa.select(T.pool_controls).where(T.pool_controls.c.pool == pool)).first()
    return _control_from_row(row) if row is not None else PoolControl(pool)


__all__ = ["PoolControls"]
