"""Burst waits: the ``burst_waits`` table, the on-prem start predicted per burst job and its
actual start on a burst node (the wait a burst avoided; ``burst report --roi``).

Revision ID: 0013
Revises: 0012

Hand-written and frozen like 0001 (no import of the models). Nothing to copy: decisions made
before it recorded no prediction, so jobs burst before it count as burst without one.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "burst_waits",
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("policy", sa.String(128), nullable=False),
        sa.Column("decision_id", sa.String(64), nullable=False),
        sa.Column("predicted_at", _TS, nullable=False),
        sa.Column("predicted_start", _TS, nullable=True),
        sa.Column("started_at", _TS, nullable=True),
        sa.Column("node_id", sa.String(64), nullable=True),
        sa.Column("project", sa.String(128), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("job_id", name="pk_burst_waits"),
    )
    op.create_index("ix_burst_waits_started_at", "burst_waits", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_burst_waits_started_at", table_name="burst_waits")
    op.drop_table("burst_waits")
