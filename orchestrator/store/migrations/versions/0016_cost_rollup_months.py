"""Cost roll-up by month: ``cost_rollup_months``, the ledger's lines summed per UTC month and
project, user, provider, pool and policy, built here from the day roll-up an upgraded store
holds, so a quarter's report and a month budget read it at once.

Revision ID: 0016
Revises: 0015

Hand-written and frozen like 0001 (no import of the models). The backfill is one
``INSERT ... SELECT ... GROUP BY`` of ``cost_rollup_days`` (exactly the lines' sums since 0014;
the same as summing the lines, at a hundredth of the rows), in the migration's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEYS = ("project", "user", "provider", "pool", "policy")
_SUMS = ("cost_micros", "idle_micros", "onprem_micros", "onprem_equiv_micros", "gpu_us",
         "instance_us", "lines")


def upgrade() -> None:
    op.create_table(
        "cost_rollup_months",
        sa.Column("month", sa.String(7), nullable=False),
        *(sa.Column(k, sa.String(128), nullable=False) for k in _KEYS),
        *(sa.Column(s, sa.BigInteger(), nullable=False) for s in _SUMS),
        sa.PrimaryKeyConstraint("month", *_KEYS, name="pk_cost_rollup_months"),
    )
    keys = ", ".join(f'"{k}"' for k in _KEYS)
    sums = ", ".join(f'"{s}"' for s in _SUMS)
    summed = ", ".join(f'SUM("{s}")' for s in _SUMS)
    op.execute(f"INSERT INTO cost_rollup_months (month, {keys}, {sums}) "
               f"SELECT SUBSTR(day, 1, 7), {keys}, {summed} FROM cost_rollup_days "
               f"GROUP BY SUBSTR(day, 1, 7), {keys}")


def downgrade() -> None:
    op.drop_table("cost_rollup_months")
