"""Cost roll-ups: ``cost_rollup_hours`` and ``cost_rollup_days``, the ledger's lines summed per
hour bucket (and per UTC day) and project, user, provider, pool and policy, built here from the
lines already in ``cost_lines`` so an upgraded store reports from them at once.

Revision ID: 0014
Revises: 0013

Hand-written and frozen like 0001 (no import of the models). The backfill is one
``INSERT ... SELECT ... GROUP BY`` per table, in the migration's transaction: the roll-ups are
exactly the lines as they stand (``orchestrator.store.rollups`` keeps them so from then on).
A line of no project or user is keyed "" (a NULL could not be part of the primary key).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)
_KEYS = ("project", "user", "provider", "pool", "policy")
_SUMS = ("cost_micros", "idle_micros", "onprem_micros", "onprem_equiv_micros", "gpu_us",
         "instance_us", "lines")
# The sums of one group of lines, as orchestrator.store.rollups computes them per line.
_SELECT_SUMS = """
    SUM(CASE WHEN kind <> 'onprem' THEN cost_micros ELSE 0 END),
    SUM(CASE WHEN kind = 'idle' THEN cost_micros ELSE 0 END),
    SUM(CASE WHEN kind = 'onprem' THEN cost_micros ELSE 0 END),
    SUM(onprem_equiv_micros),
    SUM(CASE WHEN kind <> 'onprem' THEN CAST(ROUND(gpu_seconds * 1000000) AS BIGINT) ELSE 0 END),
    SUM(CAST(ROUND(instance_seconds * 1000000) AS BIGINT)),
    COUNT(*)"""
_SELECT_KEYS = ('COALESCE(project, \'\'), COALESCE("user", \'\'), provider, pool, policy')


def _columns() -> list[sa.Column]:
    return [*(sa.Column(k, sa.String(128), nullable=False) for k in _KEYS),
            *(sa.Column(s, sa.BigInteger(), nullable=False) for s in _SUMS)]


def upgrade() -> None:
    op.create_table(
        "cost_rollup_hours",
        sa.Column("period_start", _TS, nullable=False),
        sa.Column("day", sa.String(10), nullable=False),
        *_columns(),
        sa.PrimaryKeyConstraint("period_start", *_KEYS, name="pk_cost_rollup_hours"),
    )
    op.create_table(
        "cost_rollup_days",
        sa.Column("day", sa.String(10), nullable=False),
        *_columns(),
        sa.PrimaryKeyConstraint("day", *_KEYS, name="pk_cost_rollup_days"),
    )
    op.create_index("ix_cost_rollup_days_project_report", "cost_rollup_days",
                    ["project", "day", *_SUMS])
    columns = ", ".join(f'"{c}"' for c in (*_KEYS, *_SUMS))
    op.execute(f"INSERT INTO cost_rollup_hours (period_start, day, {columns}) "
               f"SELECT period_start, MIN(day), {_SELECT_KEYS}, {_SELECT_SUMS} FROM cost_lines "
               f"GROUP BY period_start, {_SELECT_KEYS}")
    op.execute(f"INSERT INTO cost_rollup_days (day, {columns}) "
               f"SELECT day, {_SELECT_KEYS}, {_SELECT_SUMS} FROM cost_lines "
               f"GROUP BY day, {_SELECT_KEYS}")


def downgrade() -> None:
    op.drop_index("ix_cost_rollup_days_project_report", table_name="cost_rollup_days")
    op.drop_table("cost_rollup_days")
    op.drop_table("cost_rollup_hours")
