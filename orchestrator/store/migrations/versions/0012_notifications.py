"""Notifications: one row per (target, subject, window, grade), claimed before it is sent.

Revision ID: 0012
Revises: 0011

Hand-written and frozen like 0001 (no import of the models). The unique constraint is the
deduplication of webhook notifications (a restart or a second beat claims nothing twice); the
(state, created_at) index serves the sender's scan for rows still pending after a restart.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "notifications",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("target", sa.String(128), nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("window", sa.String(128), nullable=False),
        sa.Column("grade", sa.String(128), nullable=False),
        sa.Column("policy", sa.String(128), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("sent_at", _TS, nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_notifications"),
        sa.UniqueConstraint("target", "subject", "window", "grade",
                            name="uq_notifications_target_subject_window_grade"),
    )
    op.create_index("ix_notifications_state_created_at", "notifications", ["state", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_notifications_state_created_at", table_name="notifications")
    op.drop_table("notifications")
