"""The reach groups' version: ``ledger_reach_version``, one row whose counter every write of
``ledger_reach_groups`` moves in its own transaction, so a reader that keeps the groups it read
can tell with one read of one row whether they are still current.

Revision ID: 0022
Revises: 0021

Hand-written and frozen like 0001 (no import of the models). The row starts at version 1; the
store's writers of the groups (``orchestrator.store.reach_groups``, through
``orchestrator.store.reach_version``) add one to it as their transaction's last statement.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    table = op.create_table(
        "ledger_reach_version",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
    )
    op.bulk_insert(table, [{"id": 1, "version": 1}])


def downgrade() -> None:
    op.drop_table("ledger_reach_version")
