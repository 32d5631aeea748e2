"""Nodes record the jobs they were launched for: ``nodes.launched_for`` (a JSON list of job ids,
NULL for none), which the built-in queue's claim hands a ready node to first.

Revision ID: 0017
Revises: 0016

Hand-written and frozen like 0001 (no import of the models). Nothing to copy: a node launched
before it records no jobs (NULL), and its claim takes the oldest pending job that fits, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("launched_for", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("launched_for")
