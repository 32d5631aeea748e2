"""Pool controls: the ``pool_controls`` table, one row per pool an operator paused or pre-warmed.

Revision ID: 0003
Revises: 0002

Hand-written and frozen like 0001 (no import of the models).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "pool_controls",
        sa.Column("pool", sa.String(128), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.Column("paused_reason", sa.Text(), server_default="", nullable=False),
        sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("prewarm_gpus", sa.Integer(), nullable=True),
        sa.Column("prewarm_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("pool", name="pk_pool_controls"),
    )


def downgrade() -> None:
    op.drop_table("pool_controls")
