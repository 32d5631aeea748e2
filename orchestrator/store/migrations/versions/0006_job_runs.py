"""Job runs: the ``job_runs`` table, an append-only history of job runs on burst nodes.

Revision ID: 0006
Revises: 0005

Hand-written and frozen like 0001 (no import of the models). The upgrade also copies the run
each built-in job on a burst node already has in ``jobs`` (its latest one: earlier runs were
never kept), so the cost ledger, which now reads ``job_runs``, loses no usage it had.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "job_runs",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("run_key", sa.String(255), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("project", sa.String(128), nullable=False),
        sa.Column("node_id", sa.String(64), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("ended_at", _TS, nullable=True),
        sa.Column("outcome", sa.String(32), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_job_runs"),
        sa.UniqueConstraint("run_key", name="uq_job_runs_run_key"),
    )
    op.create_index("ix_job_runs_job_id", "job_runs", ["job_id"])
    op.create_index("ix_job_runs_node_id", "job_runs", ["node_id"])
    op.create_index("ix_job_runs_ended_at", "job_runs", ["ended_at"])

    # The latest run of every built-in job that started on a burst node, keyed as the store
    # keys it (builtin:<job>:<attempt>) so a running job's finish closes this very run.
    jobs = sa.table(
        "jobs", sa.column("id", sa.String), sa.column("project", sa.String),
        sa.column("node_id", sa.String), sa.column("gpus", sa.Integer),
        sa.column("started_at", _TS), sa.column("finished_at", _TS),
        sa.column("state", sa.String), sa.column("placement", sa.String),
        sa.column("attempts", sa.Integer))
    runs = sa.table(
        "job_runs", sa.column("run_key", sa.String), sa.column("job_id", sa.String),
        sa.column("project", sa.String), sa.column("node_id", sa.String),
        sa.column("gpus", sa.Integer), sa.column("started_at", _TS),
        sa.column("ended_at", _TS), sa.column("outcome", sa.String),
        sa.column("source", sa.String))
    j = jobs.c
    finished = j.state.in_(["done", "failed"])
    op.execute(sa.insert(runs).from_select(
        ["run_key", "job_id", "project", "node_id", "gpus", "started_at", "ended_at", "outcome",
         "source"],
        sa.select(
            sa.literal("builtin:", sa.String) + j.id + sa.literal(":", sa.String)
            + sa.cast(j.attempts, sa.String(20)),
            j.id, j.project, j.node_id, j.gpus, j.started_at,
            sa.case((finished, j.finished_at), else_=sa.null()),
            sa.case((finished, j.state), else_=sa.null()),
            sa.literal("builtin", sa.String),
        ).where(j.placement == "burst", j.node_id.is_not(None), j.started_at.is_not(None))))


def downgrade() -> None:
    op.drop_index("ix_job_runs_ended_at", table_name="job_runs")
    op.drop_index("ix_job_runs_node_id", table_name="job_runs")
    op.drop_index("ix_job_runs_job_id", table_name="job_runs")
    op.drop_table("job_runs")
