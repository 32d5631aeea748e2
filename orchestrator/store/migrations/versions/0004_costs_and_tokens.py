"""Money and tenants: the cost ledger (``cost_lines``, ``ledger_marks``), API tokens
(``api_tokens``), tick timing (``tick_stats``) and each node's budget commitment.

Revision ID: 0004
Revises: 0003

Hand-written and frozen like 0001 (no import of the models).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("budget_commit_usd", sa.Float(), server_default="0",
                                   nullable=False))
    op.create_table(
        "cost_lines",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("line_key", sa.String(255), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("node_id", sa.String(64), nullable=True),
        sa.Column("period_start", _TS, nullable=False),
        sa.Column("period_end", _TS, nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("policy", sa.String(128), nullable=False),
        sa.Column("pool", sa.String(128), nullable=False),
        sa.Column("provider", sa.String(128), nullable=False),
        sa.Column("region", sa.String(128), nullable=False),
        sa.Column("instance_type", sa.String(128), nullable=False),
        sa.Column("market", sa.String(16), nullable=False),
        sa.Column("price_usd_hour", sa.Float(), nullable=False),
        sa.Column("instance_seconds", sa.Float(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("cost_micros", sa.BigInteger(), nullable=False),
        sa.Column("onprem_equiv_micros", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("final", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("rolled_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_cost_lines"),
        sa.UniqueConstraint("line_key", name="uq_cost_lines_line_key"),
    )
    op.create_index("ix_cost_lines_subject_period_start", "cost_lines", ["subject", "period_start"])
    op.create_index("ix_cost_lines_period_start_kind_cost_micros", "cost_lines",
                    ["period_start", "kind", "cost_micros"])
    op.create_index("ix_cost_lines_project_report", "cost_lines",
                    ["project", "day", "kind", "cost_micros", "onprem_equiv_micros", "gpu_seconds",
                     "instance_seconds", "period_start"])
    op.create_index("ix_cost_lines_pool_period_start_kind_cost_micros", "cost_lines",
                    ["pool", "period_start", "kind", "cost_micros"])
    op.create_table(
        "ledger_marks",
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("final_through", _TS, nullable=False),
        sa.Column("updated_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("subject", name="pk_ledger_marks"),
    )
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("token_hash", sa.String(255), nullable=False),
        sa.Column("role", sa.String(32), nullable=False),
        sa.Column("projects", sa.JSON(), nullable=False),
        sa.Column("description", sa.Text(), server_default="", nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=True),
        sa.Column("revoked_at", _TS, nullable=True),
        sa.Column("last_used_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
        sa.UniqueConstraint("token_hash", name="uq_api_tokens_token_hash"),
    )
    op.create_table(
        "tick_stats",
        sa.Column("policy", sa.String(128), nullable=False),
        sa.Column("last_at", _TS, nullable=False),
        sa.Column("last_duration_s", sa.Float(), nullable=False),
        sa.Column("ticks", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("total_duration_s", sa.Float(), server_default="0", nullable=False),
        sa.PrimaryKeyConstraint("policy", name="pk_tick_stats"),
    )


def downgrade() -> None:
    op.drop_table("tick_stats")
    op.drop_table("api_tokens")
    op.drop_table("ledger_marks")
    op.drop_index("ix_cost_lines_pool_period_start_kind_cost_micros", table_name="cost_lines")
    op.drop_index("ix_cost_lines_project_report", table_name="cost_lines")
    op.drop_index("ix_cost_lines_period_start_kind_cost_micros", table_name="cost_lines")
    op.drop_index("ix_cost_lines_subject_period_start", table_name="cost_lines")
    op.drop_table("cost_lines")
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("budget_commit_usd")
