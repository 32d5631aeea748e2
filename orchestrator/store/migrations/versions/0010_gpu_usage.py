"""Measured GPU use: per-job aggregates, per-node-hour roll-ups, a node's last utilisation.

Revision ID: 0010
Revises: 0009

Hand-written and frozen like 0001 (no import of the models). Creates ``job_usage`` (one row per
job: GPU-seconds sampled, measured and used, a fixed histogram, peak memory, where it came from)
and ``node_usage_hours`` (one row per node and UTC hour), and adds to ``nodes`` the mean
utilisation of the last reading and since when its allocated GPUs are under the idle threshold.
Existing rows stay unknown (NULL), never 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def _zero(name: str) -> sa.Column:
    return sa.Column(name, sa.Float(), nullable=False, server_default="0")


def upgrade() -> None:
    op.create_table(
        "job_usage",
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("project", sa.String(128), nullable=True),
        sa.Column("node_id", sa.String(64), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("first_at", _TS, nullable=False),
        sa.Column("last_at", _TS, nullable=False),
        sa.Column("allocated_gpu_s", sa.Float(), nullable=True),
        _zero("sampled_gpu_s"),
        _zero("measured_gpu_s"),
        _zero("used_gpu_s"),
        sa.Column("histogram", sa.JSON(), nullable=True),
        sa.Column("peak_memory_mib", sa.Float(), nullable=True),
        sa.Column("memory_total_mib", sa.Float(), nullable=True),
        sa.Column("low_since", _TS, nullable=True),
        sa.PrimaryKeyConstraint("job_id", name="pk_job_usage"),
    )
    op.create_index("ix_job_usage_last_at", "job_usage", ["last_at"])
    op.create_table(
        "node_usage_hours",
        sa.Column("node_id", sa.String(64), nullable=False),
        sa.Column("hour", _TS, nullable=False),
        sa.Column("pool", sa.String(128), nullable=False),
        sa.Column("provider", sa.String(128), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        _zero("gpu_s"),
        _zero("allocated_gpu_s"),
        _zero("measured_gpu_s"),
        _zero("used_gpu_s"),
        sa.Column("histogram", sa.JSON(), nullable=True),
        sa.Column("peak_memory_mib", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("node_id", "hour", name="pk_node_usage_hours"),
    )
    op.create_index("ix_node_usage_hours_hour", "node_usage_hours", ["hour"])
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("gpu_utilisation_percent", sa.Float(), nullable=True))
        batch.add_column(sa.Column("low_utilisation_since", _TS, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("low_utilisation_since")
        batch.drop_column("gpu_utilisation_percent")
    op.drop_index("ix_node_usage_hours_hour", table_name="node_usage_hours")
    op.drop_table("node_usage_hours")
    op.drop_index("ix_job_usage_last_at", table_name="job_usage")
    op.drop_table("job_usage")
