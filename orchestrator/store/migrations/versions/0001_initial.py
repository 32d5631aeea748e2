"""Initial schema: nodes, node events, decisions, policy memory, capacity blocks, jobs, join audit.

Revision ID: 0001
Revises:

Hand-written and frozen: it must not import the models, which will move on while this revision
stays what it was. Times are ``DateTime(timezone=True)``; the models' ``UtcDateTime`` is the same
column type with a Python-side conversion.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _time(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "nodes",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("policy", sa.String(128), nullable=False),
        sa.Column("pool", sa.String(128), nullable=False),
        sa.Column("provider", sa.String(128), nullable=False),
        sa.Column("offering_key", sa.String(255), nullable=False),
        sa.Column("instance_type", sa.String(128), nullable=False),
        sa.Column("market", sa.String(16), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("price_usd_hour", sa.Float(), nullable=False),
        sa.Column("state", sa.String(32), nullable=False),
        _time("state_since"),
        _time("created_at"),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("instance_id", sa.String(255), nullable=True),
        sa.Column("project", sa.String(128), nullable=True),
        sa.Column("gpus_busy", sa.Integer(), server_default="0", nullable=False),
        sa.Column("running_jobs", sa.Integer(), server_default="0", nullable=False),
        _time("idle_since", nullable=True),
        _time("last_heartbeat", nullable=True),
        _time("drain_deadline", nullable=True),
        sa.Column("released", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("launch_attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("version", sa.Integer(), server_default="0", nullable=False),
        sa.Column("join_token_hash", sa.String(255), nullable=True),
        _time("join_token_expires_at", nullable=True),
        _time("join_token_used_at", nullable=True),
        sa.Column("credential_hash", sa.String(255), nullable=True),
        sa.Column("fence", sa.BigInteger(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_nodes"),
        sa.UniqueConstraint("request_id", name="uq_nodes_request_id"),
    )
    op.create_index("ix_nodes_policy", "nodes", ["policy"])
    op.create_index("ix_nodes_state", "nodes", ["state"])
    op.create_index("ix_nodes_instance_id", "nodes", ["instance_id"])

    op.create_table(
        "node_events",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(64), nullable=False),
        _time("at"),
        sa.Column("from_state", sa.String(32), nullable=True),
        sa.Column("to_state", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_node_events"),
    )
    op.create_index("ix_node_events_node_id", "node_events", ["node_id"])

    op.create_table(
        "decisions",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("policy", sa.String(128), nullable=False),
        _time("at"),
        sa.Column("rule", sa.String(32), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("record", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_decisions"),
    )
    op.create_index("ix_decisions_policy", "decisions", ["policy"])
    op.create_index("ix_decisions_at", "decisions", ["at"])

    op.create_table(
        "policy_memory",
        sa.Column("policy", sa.String(128), nullable=False),
        _time("trigger_since", nullable=True),
        _time("last_launch_at", nullable=True),
        _time("last_drain_at", nullable=True),
        sa.PrimaryKeyConstraint("policy", name="pk_policy_memory"),
    )

    op.create_table(
        "capacity_blocks",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("offering_key", sa.String(255), nullable=False),
        _time("until"),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        _time("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_capacity_blocks"),
    )
    op.create_index("ix_capacity_blocks_offering_key", "capacity_blocks", ["offering_key"])

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("pool", sa.String(128), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), server_default="0", nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("command", sa.Text(), nullable=True),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("placement", sa.String(16), nullable=True),
        sa.Column("node_id", sa.String(64), nullable=True),
        _time("submitted_at"),
        _time("started_at", nullable=True),
        _time("finished_at", nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("version", sa.Integer(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
    )
    op.create_index("ix_jobs_state_pool", "jobs", ["state", "pool"])
    op.create_index("ix_jobs_node_id", "jobs", ["node_id"])

    op.create_table(
        "join_attempts",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("node_id", sa.String(64), nullable=True),
        _time("at"),
        sa.Column("ok", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("remote", sa.String(255), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_join_attempts"),
    )
    op.create_index("ix_join_attempts_node_id", "join_attempts", ["node_id"])


def downgrade() -> None:
    op.drop_index("ix_join_attempts_node_id", table_name="join_attempts")
    op.drop_table("join_attempts")
    op.drop_index("ix_jobs_node_id", table_name="jobs")
    op.drop_index("ix_jobs_state_pool", table_name="jobs")
    op.drop_table("jobs")
    op.drop_index("ix_capacity_blocks_offering_key", table_name="capacity_blocks")
    op.drop_table("capacity_blocks")
    op.drop_table("policy_memory")
    op.drop_index("ix_decisions_at", table_name="decisions")
    op.drop_index("ix_decisions_policy", table_name="decisions")
    op.drop_table("decisions")
    op.drop_index("ix_node_events_node_id", table_name="node_events")
    op.drop_table("node_events")
    op.drop_index("ix_nodes_instance_id", table_name="nodes")
    op.drop_index("ix_nodes_state", table_name="nodes")
    op.drop_index("ix_nodes_policy", table_name="nodes")
    op.drop_table("nodes")
