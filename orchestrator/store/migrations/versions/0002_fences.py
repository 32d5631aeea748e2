"""Leader fencing: the ``fences`` table, one row per scope with the highest token that wrote.

Revision ID: 0002
Revises: 0001

Hand-written and frozen like 0001 (no import of the models).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fences",
        sa.Column("scope", sa.Text(), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("scope", name="pk_fences"),
    )


def downgrade() -> None:
    op.drop_table("fences")
