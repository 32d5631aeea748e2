"""Fabric members: the ``fabric_members`` table, the Slurm node names burst nodes hold.

Revision ID: 0005
Revises: 0004

Hand-written and frozen like 0001 (no import of the models).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "fabric_members",
        sa.Column("scope", sa.String(128), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("node_id", sa.String(64), nullable=True),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("scope", "name", name="pk_fabric_members"),
        sa.UniqueConstraint("node_id", name="uq_fabric_members_node_id"),
    )


def downgrade() -> None:
    op.drop_table("fabric_members")
