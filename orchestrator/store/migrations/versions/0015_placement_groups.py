"""Placement groups: the ``placement_groups`` table, one row per provider placement group burst
creates for a multi-node job's launch group (intent before the create call, state after).

Revision ID: 0015
Revises: 0014

Hand-written and frozen like 0001 (no import of the models). Nothing to copy: no group existed
before it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "placement_groups",
        sa.Column("group_id", sa.String(64), nullable=False),
        sa.Column("policy", sa.String(128), nullable=False),
        sa.Column("provider", sa.String(128), nullable=False),
        sa.Column("region", sa.String(128), nullable=False),
        sa.Column("zone", sa.String(128), nullable=True),
        sa.Column("offering_key", sa.String(255), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("node_ids", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("state_since", _TS, nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("name", sa.String(255), nullable=True),
        sa.Column("reason", sa.Text(), server_default="", nullable=False),
        sa.PrimaryKeyConstraint("group_id", name="pk_placement_groups"),
    )
    op.create_index("ix_placement_groups_state", "placement_groups", ["state"])


def downgrade() -> None:
    op.drop_index("ix_placement_groups_state", table_name="placement_groups")
    op.drop_table("placement_groups")
