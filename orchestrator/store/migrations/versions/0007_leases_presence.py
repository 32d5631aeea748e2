"""Controller leases and API presence: the ``leases`` and ``presence`` tables.

Revision ID: 0007
Revises: 0006

Hand-written and frozen like 0001 (no import of the models).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "leases",
        sa.Column("scope", sa.String(128), nullable=False),
        sa.Column("holder", sa.String(255), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("acquired_at", _TS, nullable=False),
        sa.Column("renewed_at", _TS, nullable=False),
        sa.Column("expires_at", _TS, nullable=False),
        sa.Column("host", sa.String(255), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("scope", name="pk_leases"),
    )
    op.create_table(
        "presence",
        sa.Column("id", sa.String(255), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("seen_at", _TS, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_presence"),
    )
    op.create_index("ix_presence_seen_at", "presence", ["seen_at"])


def downgrade() -> None:
    op.drop_index("ix_presence_seen_at", table_name="presence")
    op.drop_table("presence")
    op.drop_table("leases")
