"""The cost roll-ups' version: ``cost_rollup_version``, one row whose counter every transaction
that changes ``cost_rollup_hours``/``_days``/``_months`` moves, so a reader that keeps window sums
it read can tell with one read of one row whether they are still current.

Revision ID: 0023
Revises: 0022

Hand-written and frozen like 0001 (no import of the models). The row starts at version 1; the
store's writers of the roll-ups (``orchestrator.store.rollups``, through
``orchestrator.store.rollup_version``) add one to it among their transaction's last statements.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "cost_rollup_version",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
    )
    op.bulk_insert(table, [{"id": 1, "version": 1}])


def downgrade() -> None:
    op.drop_table("cost_rollup_version")
