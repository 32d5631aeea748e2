"""Decision repeats: a tick that decides what the previous one did bumps a count, not a row.

Revision ID: 0008
Revises: 0007

Hand-written and frozen like 0001 (no import of the models). Adds to ``decisions``:
``repeats`` (ticks the row stands for, 1 for every existing row), ``last_seen_at`` (the newest of
them; existing rows get their own ``at``), ``last_id`` (the id of that newest tick's decision, so
a re-delivered tick is still a no-op and ``explain`` finds it) and ``fingerprint`` (what "the
same decision" compares; NULL for existing rows, which so never absorb a later tick), and an
index on (policy, last_seen_at) for "the latest decision of a policy" and retention.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.add_column(sa.Column("repeats", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("last_seen_at", _TS, nullable=True))
        batch.add_column(sa.Column("last_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("fingerprint", sa.String(64), nullable=True))
    decisions = sa.table("decisions", sa.column("at", _TS), sa.column("last_seen_at", _TS))
    op.execute(sa.update(decisions).values(last_seen_at=decisions.c.at))
    with op.batch_alter_table("decisions") as batch:
        batch.alter_column("last_seen_at", existing_type=_TS, nullable=False)
        batch.create_index("ix_decisions_policy_last_seen_at", ["policy", "last_seen_at"])
        batch.create_index("ix_decisions_last_id", ["last_id"])


def downgrade() -> None:
    with op.batch_alter_table("decisions") as batch:
        batch.drop_index("ix_decisions_last_id")
        batch.drop_index("ix_decisions_policy_last_seen_at")
        batch.drop_column("fingerprint")
        batch.drop_column("last_id")
        batch.drop_column("last_seen_at")
        batch.drop_column("repeats")
