"""Aggregates the metrics endpoint reads at scrape time, and the tick timing it reports.

``record_tick`` is called by whoever runs a tick (the embedded loop, the Celery tick, an operator's
evaluate): one upserted ``tick_stats`` row per policy with the last duration, the count and the
running total. The other methods are read-only: node counts, launches, failures and spend rates
are GROUP BY queries returning a few rows however many nodes exist; the queue metrics read the
pending jobs' pool, GPUs and submit time (a wait's mean needs each one).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa

from orchestrator.domain.jobs import JobState
from orchestrator.domain.nodes import NodeState
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware


@dataclass(frozen=True, slots=True)
class TickStat:
    policy: str
    last_at: datetime
    last_duration_s: float
    ticks: int
    total_duration_s: float


@dataclass(frozen=True, slots=True)
class PendingJob:
    """The part of a pending job the queue metrics need."""

    pool: str
    project: str
    gpus: int
    submitted_at: datetime


# The states whose first entry the lifecycle latency histograms measure between.
LIFECYCLE_MARK_STATES = (NodeState.LAUNCHING, NodeState.READY, NodeState.DRAINING,
                         NodeState.TERMINATING, NodeState.TERMINATED)


@dataclass(frozen=True, slots=True)
class LifecycleMarks:
    """When one node first entered each of :data:`LIFECYCLE_MARK_STATES` (absent: not yet)."""

    provider: str
    offering: str
    entered: dict[NodeState, datetime]


class Telemetry(StoreBase):
    """Tick timing and metric aggregates of the Store."""

    def record_tick(self, policy: str, at: datetime, duration_s: float) -> None:
        """Add one tick of ``policy`` that ended at ``at`` and took ``duration_s`` seconds."""
        require_aware(at, "at")
        if not isinstance(policy, str) or not policy:
            raise ValueError(f"policy must be a non-empty string, got {policy!r}")
        duration = max(float(duration_s), 0.0)
        c = T.tick_stats.c
        stmt = self._insert(T.tick_stats).values(
            policy=policy, last_at=at, last_duration_s=duration, ticks=1, total_duration_s=duration)
        stmt = stmt.on_conflict_do_update(index_elements=["policy"], set_={
            "last_at": stmt.excluded.last_at,
            "last_duration_s": stmt.excluded.last_duration_s,
            "ticks": c.ticks + 1,
            "total_duration_s": c.total_duration_s + stmt.excluded.total_duration_s,
        })
        with self._write() as conn:
            conn.execute(stmt)

    def tick_stats(self) -> list[TickStat]:
        with self._read() as conn:
            rows = conn.execute(sa.select(T.tick_stats).order_by(T.tick_stats.c.policy)).all()
        return [TickStat(r.policy, r.last_at, r.last_duration_s, r.ticks, r.total_duration_s)
                for r in rows]

    def node_counts(self) -> dict[tuple[str, str, str], int]:
        """(state, provider, pool) -> nodes, terminated ones included."""
        c = T.nodes.c
        query = sa.select(c.state, c.provider, c.pool, sa.func.count()).group_by(
            c.state, c.provider, c.pool)
        with self._read() as conn:
            return {(s, p, pool): n for s, p, pool, n in conn.execute(query)}

    def live_spend_by_pool(self) -> dict[str, float]:
        """Pool -> summed hourly price of its nodes not yet confirmed terminated (USD/h)."""
        c = T.nodes.c
        query = (sa.select(c.pool, sa.func.sum(c.price_usd_hour))
                 .where(c.state != NodeState.TERMINATED.value).group_by(c.pool))
        with self._read() as conn:
            return {pool: float(total or 0.0) for pool, total in conn.execute(query)}

    def transition_counts(
        self, to_states: Iterable[NodeState]
    ) -> list[tuple[str, str, str, str, int]]:
        """(to_state, provider, pool, reason, count) of node events into ``to_states``."""
        e, n = T.node_events.c, T.nodes.c
        query = (
            sa.select(e.to_state, n.provider, n.pool, e.reason, sa.func.count())
            .select_from(T.node_events.join(T.nodes, n.id == e.node_id))
            .where(e.to_state.in_(sorted(NodeState(s).value for s in to_states)))
            .group_by(e.to_state, n.provider, n.pool, e.reason)
        )
        with self._read() as conn:
            return [(s, p, pool, r, k) for s, p, pool, r, k in conn.execute(query)]

    def pending_jobs(self) -> list[PendingJob]:
        """Every pending job of the built-in queue (only the columns metrics need)."""
        c = T.jobs.c
        query = sa.select(c.pool, c.project, c.gpus, c.submitted_at).where(
            c.state == JobState.PENDING.value)
        with self._read() as conn:
            return [PendingJob(*r) for r in conn.execute(query)]

    def lifecycle_marks(self) -> list[LifecycleMarks]:
        """Per node: its provider and offering and when it first entered each lifecycle state
        the latency histograms measure (one row per node, from the append-only events)."""
        e, n = T.node_events.c, T.nodes.c
        watched = sorted(s.value for s in LIFECYCLE_MARK_STATES)
        query = (
            sa.select(n.id, n.provider, n.offering_key, e.to_state, sa.func.min(e.at))
            .select_from(T.node_events.join(T.nodes, n.id == e.node_id))
            .where(e.to_state.in_(watched))
            .group_by(n.id, n.provider, n.offering_key, e.to_state)
        )
        marks: dict[str, LifecycleMarks] = {}
        with self._read() as conn:
            for node_id, provider, offering, state, at in conn.execute(query):
                mark = marks.setdefault(node_id, LifecycleMarks(provider, offering, {}))
                mark.entered[NodeState(state)] = at
        return list(marks.values())

    def launch_failure_counts(self) -> list[tuple[str, str, str, int]]:
        """(provider, offering, reason, count) of nodes that failed before they booted: launches
        the provider refused, or that never came up."""
        e, n = T.node_events.c, T.nodes.c
        early = [NodeState.REQUESTED.value, NodeState.LAUNCHING.value, NodeState.BOOTING.value]
        query = (
            sa.select(n.provider, n.offering_key, e.reason, sa.func.count())
            .select_from(T.node_events.join(T.nodes, n.id == e.node_id))
            .where(e.to_state == NodeState.FAILED.value, e.from_state.in_(early))
            .group_by(n.provider, n.offering_key, e.reason)
        )
        with self._read() as conn:
            return [(p, o, r, k) for p, o, r, k in conn.execute(query)]

    def launch_failures_since(self, since: datetime) -> list[tuple[str, str, str, int]]:
        """(policy, provider, offering, count) of nodes that failed before they booted at or
        after ``since``."""
        require_aware(since, "since")
        e, n = T.node_events.c, T.nodes.c
        early = [NodeState.REQUESTED.value, NodeState.LAUNCHING.value, NodeState.BOOTING.value]
        query = (
            sa.select(n.policy, n.provider, n.offering_key, sa.func.count())
            .select_from(T.node_events.join(T.nodes, n.id == e.node_id))
            .where(e.to_state == NodeState.FAILED.value, e.from_state.in_(early), e.at >= since)
            .group_by(n.policy, n.provider, n.offering_key)
        )
        with self._read() as conn:
            return [(p, pr, o, int(k)) for p, pr, o, k in conn.execute(query)]

    def leader_tenures(self) -> dict[str, int]:
        """Scope -> the highest leader token it has seen (store leases of the embedded loop,
        fences of the Celery leaders): it grows by one with every new leader."""
        out: dict[str, int] = {}
        with self._read() as conn:
            for table in (T.leases, T.fences):
                for scope, token in conn.execute(sa.select(table.c.scope, table.c.token)):
                    out[scope] = max(out.get(scope, 0), int(token))
        return out

    def schema_revision(self) -> str | None:
        """The migration the database is at (None: never migrated); raises if unreachable."""
        from orchestrator.store.migrate import current_revision

        with self._read() as conn:
            return current_revision(conn)


__all__ = ["LIFECYCLE_MARK_STATES", "LifecycleMarks", "PendingJob", "TickStat", "Telemetry"]
