"""SQLAlchemy 2 models of the state store: the schema, portable across SQLite and PostgreSQL.

These models describe the schema; the migrations in ``migrations/versions`` create it. A test
checks that the two agree. Enumerations are stored as plain strings (not database enums) so that
adding a state needs no type migration on PostgreSQL.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Explicit constraint names: SQLite batch migrations can only alter constraints that have names,
# and the hand-written migration must produce exactly these.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only autoincrements a column declared exactly INTEGER PRIMARY KEY; PostgreSQL gets 64 bits
# because the append-only tables grow without bound.
BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

STR_ID = 64  # node, request, decision and job ids
STR_NAME = 128  # policy, pool, project, provider names
STR_KEY = 255  # offering keys, instance ids, hashes


class UtcDateTime(sa.types.TypeDecorator[datetime]):
    """A timestamp that only accepts tz-aware datetimes and always returns them in UTC.

    SQLite has no timezone type: values are stored as naive UTC text of fixed width, so string
    comparison in SQL orders them correctly. PostgreSQL stores ``timestamptz``; results are
    converted to UTC whatever the session's TimeZone is.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if not isinstance(value, datetime):
            raise TypeError(f"expected a datetime, got {type(value).__name__}")
        if value.tzinfo is None or value.utcoffset() is None:
            # A naive time is ambiguous; accepting it would silently shift times by the host offset.
            raise ValueError(f"naive datetime {value.isoformat()} given; pass a tz-aware UTC time")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: UtcDateTime(),
        dict[str, Any]: sa.JSON(),
    }


class NodeRow(Base):
    """One burst node: the fields of ``domain.Node`` plus its join secrets (hashes only)."""

    __tablename__ = "nodes"

    id: Mapped[str] = mapped_column(sa.String(STR_ID), primary_key=True)
    policy: Mapped[str] = mapped_column(sa.String(STR_NAME), index=True)
    pool: Mapped[str] = mapped_column(sa.String(STR_NAME))
    provider: Mapped[str] = mapped_column(sa.String(STR_NAME))
    offering_key: Mapped[str] = mapped_column(sa.String(STR_KEY))
    instance_type: Mapped[str] = mapped_column(sa.String(STR_NAME))
    market: Mapped[str] = mapped_column(sa.String(16))
    gpus: Mapped[int] = mapped_column(sa.Integer)
    price_usd_hour: Mapped[float] = mapped_column(sa.Float)
    state: Mapped[str] = mapped_column(sa.String(32), index=True)
    state_since: Mapped[datetime]
    created_at: Mapped[datetime]
    request_id: Mapped[str] = mapped_column(sa.String(STR_ID), unique=True)
    instance_id: Mapped[str | None] = mapped_column(sa.String(STR_KEY), index=True)
    project: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    gpus_busy: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    running_jobs: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    idle_since: Mapped[datetime | None]
    last_heartbeat: Mapped[datetime | None]
    drain_deadline: Mapped[datetime | None]
    released: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    launch_attempts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    version: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    join_token_hash: Mapped[str | None] = mapped_column(sa.String(STR_KEY))
    join_token_expires_at: Mapped[datetime | None]
    join_token_used_at: Mapped[datetime | None]
    credential_hash: Mapped[str | None] = mapped_column(sa.String(STR_KEY))
    # Reserved for leader fencing: a writer will stamp its lease epoch so a deposed leader's
    # late writes can be refused.
    fence: Mapped[int] = mapped_column(sa.BigInteger, default=0, server_default="0")
    # Budget committed when the node was launched (minimum billing plus the expected runtime of
    # the work it was launched for, USD): what budgets count until the ledger has accrued it.
    budget_commit_usd: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    # Measured GPU use (orchestrator.domain.utilisation): the mean utilisation of the node's
    # last reading (NULL: unknown) and since when its allocated GPUs sit under the policy's
    # utilisation.idle_below_percent (NULL: not low, or unknown).
    gpu_utilisation_percent: Mapped[float | None] = mapped_column(sa.Float)
    low_utilisation_since: Mapped[datetime | None]
    # The pending job ids its launch was for (a JSON list; NULL: none recorded): the built-in
    # queue's claim hands the node to them first (orchestrator.sources.builtin).
    launched_for: Mapped[list[str] | None] = mapped_column(sa.JSON)


class NodeEventRow(Base):
    """An append-only record of one node state change."""

    __tablename__ = "node_events"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    node_id: Mapped[str] = mapped_column(sa.String(STR_ID), index=True)
    at: Mapped[datetime]
    from_state: Mapped[str | None] = mapped_column(sa.String(32))
    to_state: Mapped[str] = mapped_column(sa.String(32))
    reason: Mapped[str] = mapped_column(sa.Text)
    details: Mapped[dict[str, Any]]


class DecisionRow(Base):
    """One planner decision; ``record`` holds the whole Decision as JSON (see ``codec``).

    A row stands for ``repeats`` consecutive ticks of its policy that decided the same (equal
    ``fingerprint``): the first at ``at`` (whose record is kept), the newest at ``last_seen_at``
    with decision id ``last_id``. So a steady queue adds no row per tick."""

    __tablename__ = "decisions"
    __table_args__ = (sa.Index("ix_decisions_policy_last_seen_at", "policy", "last_seen_at"),)

    id: Mapped[str] = mapped_column(sa.String(STR_ID), primary_key=True)
    policy: Mapped[str] = mapped_column(sa.String(STR_NAME), index=True)
    at: Mapped[datetime] = mapped_column(index=True)
    rule: Mapped[str] = mapped_column(sa.String(32))
    summary: Mapped[str] = mapped_column(sa.Text)
    record: Mapped[dict[str, Any]]
    repeats: Mapped[int] = mapped_column(sa.Integer, default=1, server_default="1")
    last_seen_at: Mapped[datetime]
    last_id: Mapped[str | None] = mapped_column(sa.String(STR_ID), index=True)
    fingerprint: Mapped[str | None] = mapped_column(sa.String(64))


class PolicyMemoryRow(Base):
    """The planner's carried state for one policy (hysteresis and cooldown clocks)."""

    __tablename__ = "policy_memory"

    policy: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    trigger_since: Mapped[datetime | None]
    last_launch_at: Mapped[datetime | None]
    last_drain_at: Mapped[datetime | None]


class CapacityBlockRow(Base):
    """An offering excluded after a capacity error, until ``until``."""

    __tablename__ = "capacity_blocks"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    offering_key: Mapped[str] = mapped_column(sa.String(STR_KEY), index=True)
    until: Mapped[datetime]
    reason: Mapped[str] = mapped_column(sa.Text, default="", server_default="")
    created_at: Mapped[datetime]


class JobRow(Base):
    """A job of the built-in queue."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(sa.String(STR_ID), primary_key=True)
    project: Mapped[str] = mapped_column(sa.String(STR_NAME))
    # Who submitted it; NULL: not known (queued before burst recorded users).
    user: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    pool: Mapped[str] = mapped_column(sa.String(STR_NAME))
    gpus: Mapped[int] = mapped_column(sa.Integer)
    priority: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    duration_s: Mapped[float | None] = mapped_column(sa.Float)
    command: Mapped[str | None] = mapped_column(sa.Text)
    state: Mapped[str] = mapped_column(sa.String(32))
    placement: Mapped[str | None] = mapped_column(sa.String(16))
    node_id: Mapped[str | None] = mapped_column(sa.String(STR_ID), index=True)
    submitted_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    exit_code: Mapped[int | None] = mapped_column(sa.Integer)
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    version: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")


# The tick reads every pending job once, in service order (orchestrator.store.queueread): the
# index serves the filter and the order (priority highest first, then submission, then id), so
# no read sorts the queue. Migration 0018.
sa.Index("ix_jobs_pending_order", JobRow.state, JobRow.priority.desc(), JobRow.submitted_at,
         JobRow.id)


# Budget status reads the live nodes that may still owe part of their launch commitment
# (orchestrator.store.accrual.nodes_committing) from this index alone. Migration 0020.
sa.Index("ix_nodes_commitments", NodeRow.budget_commit_usd, NodeRow.state, NodeRow.created_at,
         NodeRow.price_usd_hour, NodeRow.pool, NodeRow.project)


class JobRunRow(Base):
    """An append-only history of job runs on burst nodes: one row per run of a job on a node,
    opened when it starts and closed (``ended_at``, ``outcome``) when it finishes, is handed back
    or loses its node. Built-in jobs write it with their own state change; Slurm jobs as the
    Slurm source observes them. ``run_key`` makes each run unique, so a retried or re-observed
    start opens it once: ``builtin:<job>:<attempt>``, ``slurm:<scope>:<job>:<node>:<start>``.
    The cost ledger reads job usage from here (a requeued job keeps its earlier runs)."""

    __tablename__ = "job_runs"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    run_key: Mapped[str] = mapped_column(sa.String(STR_KEY), unique=True)
    job_id: Mapped[str] = mapped_column(sa.String(STR_ID), index=True)
    # NULL project: a job of no project (Slurm: neither account nor QOS); NULL user: not known
    # (a run recorded before burst kept users, or a queue that does not say).
    project: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    user: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    node_id: Mapped[str] = mapped_column(sa.String(STR_ID), index=True)
    gpus: Mapped[int] = mapped_column(sa.Integer)
    started_at: Mapped[datetime]
    ended_at: Mapped[datetime | None] = mapped_column(index=True)
    outcome: Mapped[str | None] = mapped_column(sa.String(32))
    source: Mapped[str] = mapped_column(sa.String(16))


class BurstWaitRow(Base):
    """The wait a burst avoided, per job: the on-prem start the planner predicted when it
    launched burst nodes for the job (``predicted_start``; NULL: the model never starts it
    on-prem), written with that decision, and the job's first start on a burst node
    (``started_at``, with its node, project and GPUs), written with that run. A newer prediction
    replaces an older one until the job starts; after that the row is final (see
    ``store.burstwaits``)."""

    __tablename__ = "burst_waits"

    job_id: Mapped[str] = mapped_column(sa.String(STR_ID), primary_key=True)
    policy: Mapped[str] = mapped_column(sa.String(STR_NAME))
    decision_id: Mapped[str] = mapped_column(sa.String(STR_ID))
    predicted_at: Mapped[datetime]
    predicted_start: Mapped[datetime | None]
    started_at: Mapped[datetime | None] = mapped_column(index=True)
    node_id: Mapped[str | None] = mapped_column(sa.String(STR_ID))
    project: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    gpus: Mapped[int | None] = mapped_column(sa.Integer)


class PlacementGroupRow(Base):
    """A placement group burst creates for a launch group (a multi-node job's nodes): its intent
    before the provider call, its state after; ``node_ids`` the nodes launched into it (JSON
    list). See ``store.placement``."""

    __tablename__ = "placement_groups"

    group_id: Mapped[str] = mapped_column(sa.String(STR_ID), primary_key=True)
    policy: Mapped[str] = mapped_column(sa.String(STR_NAME))
    provider: Mapped[str] = mapped_column(sa.String(STR_NAME))
    region: Mapped[str] = mapped_column(sa.String(STR_NAME))
    zone: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    offering_key: Mapped[str] = mapped_column(sa.String(STR_KEY))
    size: Mapped[int] = mapped_column(sa.Integer)
    node_ids: Mapped[list[str]] = mapped_column(sa.JSON)
    state: Mapped[str] = mapped_column(sa.String(16), index=True)
    state_since: Mapped[datetime]
    created_at: Mapped[datetime]
    name: Mapped[str | None] = mapped_column(sa.String(STR_KEY))
    reason: Mapped[str] = mapped_column(sa.Text, default="", server_default="")


class JoinAttemptRow(Base):
    """Audit log of node-agent registration attempts, successful or not."""

    __tablename__ = "join_attempts"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    node_id: Mapped[str | None] = mapped_column(sa.String(STR_ID), index=True)
    at: Mapped[datetime]
    ok: Mapped[bool] = mapped_column(sa.Boolean)
    reason: Mapped[str] = mapped_column(sa.Text)
    remote: Mapped[str | None] = mapped_column(sa.String(STR_KEY))


class FenceRow(Base):
    """The highest leader token that has written in a scope (see ``fencing``)."""

    __tablename__ = "fences"

    scope: Mapped[str] = mapped_column(sa.Text, primary_key=True)
    token: Mapped[int] = mapped_column(sa.BigInteger)
    updated_at: Mapped[datetime]


class PoolControlRow(Base):
    """Operator controls of one pool: bursting paused (and why, since when) and a pre-warm floor
    of burst GPUs kept until ``prewarm_until`` (see ``pools``)."""

    __tablename__ = "pool_controls"

    pool: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    paused: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    paused_reason: Mapped[str] = mapped_column(sa.Text, default="", server_default="")
    paused_at: Mapped[datetime | None]
    prewarm_gpus: Mapped[int | None] = mapped_column(sa.Integer)
    prewarm_until: Mapped[datetime | None]
    updated_at: Mapped[datetime]


class CostLineRow(Base):
    """One line of the cost ledger: what one node (or on-prem work) cost in one hour bucket, and
    for whom. ``cost_micros`` is integer micro-dollars so sums over any grouping are exact;
    ``kind`` is usage (a job's GPU-second share), idle (unused GPU-seconds of the node), minimum
    (what the billing rule adds: minimum and rounding) or onprem (amortised on-prem cost of work).
    Lines of a bucket still open are provisional (``final`` false) and rewritten by the next
    roll-up; ``line_key`` makes each line unique so a roll-up that runs twice writes it once."""

    __tablename__ = "cost_lines"
    __table_args__ = (
        # The roll-up reads and rewrites one subject's open buckets; spend() finds how far a
        # node's lines reach.
        sa.Index("ix_cost_lines_subject_period_start", "subject", "period_start"),
        # Budgets sum a window's cost each tick, for everything, a project or a pool; reports
        # group by project (and day) most. These indexes cover those queries: index-only scans,
        # and reports by project stream in index order with no sort (docs/performance.md).
        sa.Index("ix_cost_lines_period_start_kind_cost_micros", "period_start", "kind",
                 "cost_micros"),
        sa.Index("ix_cost_lines_project_report", "project", "day", "kind", "cost_micros",
                 "onprem_equiv_micros", "gpu_seconds", "instance_seconds", "period_start"),
        sa.Index("ix_cost_lines_pool_period_start_kind_cost_micros", "pool", "period_start", "kind",
                 "cost_micros"),
        # Reports filtered or grouped by user.
        sa.Index("ix_cost_lines_user_day", "user", "day"),
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    line_key: Mapped[str] = mapped_column(sa.String(STR_KEY), unique=True)
    # What the line belongs to for the roll-up: the node id, or ``onprem:<pool>``.
    subject: Mapped[str] = mapped_column(sa.String(STR_KEY))
    node_id: Mapped[str | None] = mapped_column(sa.String(STR_ID))
    period_start: Mapped[datetime]
    period_end: Mapped[datetime]
    day: Mapped[str] = mapped_column(sa.String(10))  # UTC date of period_start, YYYY-MM-DD
    kind: Mapped[str] = mapped_column(sa.String(16))
    # NULL project: usage or on-prem work of a job of no project (idle and minimum lines of a node
    # launched for no project say "-"); NULL user: a line of no job, a job whose user is not known,
    # or a line rolled up before burst kept users.
    project: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    user: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    job_id: Mapped[str | None] = mapped_column(sa.String(STR_ID))
    policy: Mapped[str] = mapped_column(sa.String(STR_NAME))
    pool: Mapped[str] = mapped_column(sa.String(STR_NAME))
    provider: Mapped[str] = mapped_column(sa.String(STR_NAME))
    region: Mapped[str] = mapped_column(sa.String(STR_NAME))
    instance_type: Mapped[str] = mapped_column(sa.String(STR_NAME))
    market: Mapped[str] = mapped_column(sa.String(16))
    price_usd_hour: Mapped[float] = mapped_column(sa.Float)
    instance_seconds: Mapped[float] = mapped_column(sa.Float)
    gpu_seconds: Mapped[float] = mapped_column(sa.Float)
    cost_micros: Mapped[int] = mapped_column(sa.BigInteger)
    onprem_equiv_micros: Mapped[int] = mapped_column(sa.BigInteger, default=0, server_default="0")
    final: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    rolled_at: Mapped[datetime]


class _CostRollupColumns:
    """What both cost roll-ups keep per bucket and group (``orchestrator.store.rollups``): the
    group's keys (project and user: "" for a line of none, so the key can be unique) and the
    sums of its lines, money in integer micro-dollars, seconds in integer micro-seconds (sums
    that add and subtract exactly, whatever the order)."""

    project: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    user: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    provider: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    pool: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    policy: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    cost_micros: Mapped[int] = mapped_column(sa.BigInteger)  # burst lines: usage, idle, minimum
    idle_micros: Mapped[int] = mapped_column(sa.BigInteger)
    onprem_micros: Mapped[int] = mapped_column(sa.BigInteger)
    onprem_equiv_micros: Mapped[int] = mapped_column(sa.BigInteger)
    gpu_us: Mapped[int] = mapped_column(sa.BigInteger)  # GPU-seconds of burst lines, x 1e6
    instance_us: Mapped[int] = mapped_column(sa.BigInteger)
    lines: Mapped[int] = mapped_column(sa.BigInteger)  # 0: every line of the group is gone


class CostHourRow(_CostRollupColumns, Base):
    """The cost lines of one hour bucket summed per project, user, provider, pool and policy."""

    __tablename__ = "cost_rollup_hours"

    period_start: Mapped[datetime] = mapped_column(primary_key=True)
    day: Mapped[str] = mapped_column(sa.String(10))  # UTC date of period_start


class CostDayRow(_CostRollupColumns, Base):
    """The cost lines of one UTC day summed per project, user, provider, pool and policy."""

    __tablename__ = "cost_rollup_days"
    __table_args__ = (
        # Reports by project (the most asked, and budgets of a project) read only this index, in
        # its order: no table access and no sort (without it SQLite sorts the window's rows).
        sa.Index("ix_cost_rollup_days_project_report", "project", "day", "cost_micros",
                 "idle_micros", "onprem_micros", "onprem_equiv_micros", "gpu_us", "instance_us",
                 "lines"),
    )

    day: Mapped[str] = mapped_column(sa.String(10), primary_key=True)


class CostMonthRow(_CostRollupColumns, Base):
    """The cost lines of one UTC month summed per project, user, provider, pool and policy: a
    quarter's report, or a month budget, reads a few hundred of these instead of its days."""

    __tablename__ = "cost_rollup_months"

    month: Mapped[str] = mapped_column(sa.String(7), primary_key=True)  # YYYY-MM


class LedgerMarkRow(Base):
    """How far the ledger is final for one node (or ``onprem:<pool>``): buckets before
    ``final_through`` are never recomputed."""

    __tablename__ = "ledger_marks"

    subject: Mapped[str] = mapped_column(sa.String(STR_KEY), primary_key=True)
    final_through: Mapped[datetime]
    updated_at: Mapped[datetime]


class ApiTokenRow(Base):
    """A bearer token of the HTTP API, stored only as a hash, scoped to a role and projects."""

    __tablename__ = "api_tokens"

    id: Mapped[str] = mapped_column(sa.String(STR_ID), primary_key=True)
    token_hash: Mapped[str] = mapped_column(sa.String(STR_KEY), unique=True)
    role: Mapped[str] = mapped_column(sa.String(32))
    projects: Mapped[dict[str, Any]]  # {"projects": [...]}: the projects a scoped role may see
    # The identity the token acts as (a user name): the user of the jobs it submits. NULL: none
    # (tokens created before subjects existed, or service tokens).
    subject: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    description: Mapped[str] = mapped_column(sa.Text, default="", server_default="")
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked_at: Mapped[datetime | None]
    last_used_at: Mapped[datetime | None]


class TickStatRow(Base):
    """Tick timing per policy, for the metrics endpoint (written by whoever runs the tick)."""

    __tablename__ = "tick_stats"

    policy: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    last_at: Mapped[datetime]
    last_duration_s: Mapped[float] = mapped_column(sa.Float)
    ticks: Mapped[int] = mapped_column(sa.BigInteger, default=0, server_default="0")
    total_duration_s: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")


class NotificationRow(Base):
    """One notification to one target (``target`` ``-``: the record of the event itself, kept
    whether or not any target listens). Unique per (target, subject, window, grade): claiming the
    row is what makes a notification go out once, whatever restarts or duplicate beats do. The
    webhook URL is never stored: it is read from the environment or a file at send time."""

    __tablename__ = "notifications"
    __table_args__ = (
        sa.UniqueConstraint("target", "subject", "window", "grade"),
        sa.Index("ix_notifications_state_created_at", "state", "created_at"),
    )

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    target: Mapped[str] = mapped_column(sa.String(STR_NAME))
    event: Mapped[str] = mapped_column(sa.String(32))
    subject: Mapped[str] = mapped_column(sa.String(STR_KEY))
    window: Mapped[str] = mapped_column(sa.String(STR_NAME))
    grade: Mapped[str] = mapped_column(sa.String(STR_NAME))
    policy: Mapped[str] = mapped_column(sa.String(STR_NAME))
    title: Mapped[str] = mapped_column(sa.Text)
    text: Mapped[str] = mapped_column(sa.Text)
    details: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    state: Mapped[str] = mapped_column(sa.String(16))  # pending, sent, failed, recorded
    attempts: Mapped[int] = mapped_column(sa.Integer, default=0, server_default="0")
    last_error: Mapped[str | None] = mapped_column(sa.Text)
    sent_at: Mapped[datetime | None]


class FabricMemberRow(Base):
    """A Slurm node name a burst node holds in the fabric (see ``slots``): a pre-declared FUTURE
    slot (kept, ``node_id`` NULL while free) or a dynamic node (deleted when released). The
    unique ``node_id`` makes a burst node hold at most one name."""

    __tablename__ = "fabric_members"

    scope: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    kind: Mapped[str] = mapped_column(sa.String(16))
    node_id: Mapped[str | None] = mapped_column(sa.String(STR_ID), unique=True)
    claimed_at: Mapped[datetime | None]

class KeptOnPremRow(Base):
    """A job a policy keeps for on-prem (``trigger.spare_room``; see ``kept_jobs``)."""

    __tablename__ = "kept_onprem"

    policy: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    job_id: Mapped[str] = mapped_column(sa.String(STR_ID), primary_key=True)


class LeaseRow(Base):
    """Who controls a scope (``reconcile``, ``policy:<name>``) and until when (see ``leases``).

    ``token`` grows with every new tenure and is the fencing token of the holder's writes;
    ``acquired_at`` is the start of the tenure (what the holder could have observed since);
    ``host``/``pid`` name a process-bound holder so a contender on that host can tell it is dead.
    A released lease keeps its row (empty ``holder``) so the next tenure's token still grows."""

    __tablename__ = "leases"

    scope: Mapped[str] = mapped_column(sa.String(STR_NAME), primary_key=True)
    holder: Mapped[str] = mapped_column(sa.String(STR_KEY))
    token: Mapped[int] = mapped_column(sa.BigInteger)
    acquired_at: Mapped[datetime]
    renewed_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    host: Mapped[str | None] = mapped_column(sa.String(STR_KEY))
    pid: Mapped[int | None] = mapped_column(sa.Integer)


class PresenceRow(Base):
    """One API process's presence window: up from ``started_at``, last seen at ``seen_at``.

    Agents can only be heard while an API is up, so the liveness rules count a node's silence
    from the start of the current window (see ``presence``)."""

    __tablename__ = "presence"

    id: Mapped[str] = mapped_column(sa.String(STR_KEY), primary_key=True)
    started_at: Mapped[datetime]
    seen_at: Mapped[datetime] = mapped_column(index=True)


class JobUsageRow(Base):
    """Measured GPU use of one job, folded from every reading of its GPUs (never the readings
    themselves): GPU-seconds sampled, measured (a utilisation was read) and used (weighted by
    it), a fixed histogram of measured GPU-seconds over 0-100 % for the median, peak memory.
    ``source`` says where it came from (agent readings, or Slurm accounting for on-prem jobs);
    ``low_since`` when the job's GPUs went under the idle threshold (NULL: not low/unknown).
    Allocated GPU-seconds are the job's runs (``job_runs``); see ``store.usage``."""

    __tablename__ = "job_usage"

    job_id: Mapped[str] = mapped_column(sa.String(STR_ID), primary_key=True)
    project: Mapped[str | None] = mapped_column(sa.String(STR_NAME))
    node_id: Mapped[str | None] = mapped_column(sa.String(STR_ID))
    source: Mapped[str] = mapped_column(sa.String(16))
    first_at: Mapped[datetime]
    last_at: Mapped[datetime] = mapped_column(index=True)
    allocated_gpu_s: Mapped[float | None] = mapped_column(sa.Float)  # sacct: elapsed x GPUs
    sampled_gpu_s: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    measured_gpu_s: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    used_gpu_s: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    histogram: Mapped[list[float] | None] = mapped_column(sa.JSON)
    peak_memory_mib: Mapped[float | None] = mapped_column(sa.Float)
    memory_total_mib: Mapped[float | None] = mapped_column(sa.Float)
    low_since: Mapped[datetime | None]


class NodeUsageHourRow(Base):
    """Measured GPU use of one burst node in one clock hour (UTC): the per-node-hour roll-up.
    ``gpu_s`` are the node's GPU-seconds sampled, ``allocated_gpu_s`` those held by a job,
    ``measured_gpu_s``/``used_gpu_s``/``histogram`` as for jobs, over all its GPUs."""

    __tablename__ = "node_usage_hours"

    node_id: Mapped[str] = mapped_column(sa.String(STR_ID), primary_key=True)
    hour: Mapped[datetime] = mapped_column(primary_key=True, index=True)
    pool: Mapped[str] = mapped_column(sa.String(STR_NAME))
    provider: Mapped[str] = mapped_column(sa.String(STR_NAME))
    gpus: Mapped[int] = mapped_column(sa.Integer)
    gpu_s: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    allocated_gpu_s: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    measured_gpu_s: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    used_gpu_s: Mapped[float] = mapped_column(sa.Float, default=0.0, server_default="0")
    histogram: Mapped[list[float] | None] = mapped_column(sa.JSON)
    peak_memory_mib: Mapped[float | None] = mapped_column(sa.Float)


# Core handles for the repository, which issues compare-and-set statements rather than using the
# unit of work (a flush cannot express "UPDATE ... WHERE version = :old").
nodes: sa.Table = NodeRow.__table__  # type: ignore[assignment]
node_events: sa.Table = NodeEventRow.__table__  # type: ignore[assignment]
decisions: sa.Table = DecisionRow.__table__  # type: ignore[assignment]
policy_memory: sa.Table = PolicyMemoryRow.__table__  # type: ignore[assignment]
capacity_blocks: sa.Table = CapacityBlockRow.__table__  # type: ignore[assignment]
jobs: sa.Table = JobRow.__table__  # type: ignore[assignment]
job_runs: sa.Table = JobRunRow.__table__  # type: ignore[assignment]
burst_waits: sa.Table = BurstWaitRow.__table__  # type: ignore[assignment]
placement_groups: sa.Table = PlacementGroupRow.__table__  # type: ignore[assignment]
join_attempts: sa.Table = JoinAttemptRow.__table__  # type: ignore[assignment]
fences: sa.Table = FenceRow.__table__  # type: ignore[assignment]
pool_controls: sa.Table = PoolControlRow.__table__  # type: ignore[assignment]
cost_lines: sa.Table = CostLineRow.__table__  # type: ignore[assignment]
ledger_marks: sa.Table = LedgerMarkRow.__table__  # type: ignore[assignment]
cost_rollup_hours: sa.Table = CostHourRow.__table__  # type: ignore[assignment]
cost_rollup_days: sa.Table = CostDayRow.__table__  # type: ignore[assignment]
cost_rollup_months: sa.Table = CostMonthRow.__table__  # type: ignore[assignment]
api_tokens: sa.Table = ApiTokenRow.__table__  # type: ignore[assignment]
tick_stats: sa.Table = TickStatRow.__table__  # type: ignore[assignment]
fabric_members: sa.Table = FabricMemberRow.__table__  # type: ignore[assignment]
leases: sa.Table = LeaseRow.__table__  # type: ignore[assignment]
kept_onprem: sa.Table = KeptOnPremRow.__table__  # type: ignore[assignment]
presence: sa.Table = PresenceRow.__table__  # type: ignore[assignment]
job_usage: sa.Table = JobUsageRow.__table__  # type: ignore[assignment]
node_usage_hours: sa.Table = NodeUsageHourRow.__table__  # type: ignore[assignment]
notifications: sa.Table = NotificationRow.__table__  # type: ignore[assignment]
