"""The queue's one read per tick: jobs indexed on (state, pool, submitted_at).

Revision ID: 0011
Revises: 0010

Hand-written and frozen like 0001 (no import of the models). The tick reads the pending jobs
(state, then by pool and age) once (``orchestrator.store.queueread``); the index on (state, pool)
it replaces is the prefix of the new one, so no query loses its index.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index("ix_jobs_state_pool_submitted_at", "jobs", ["state", "pool", "submitted_at"])
    op.drop_index("ix_jobs_state_pool", table_name="jobs")


def downgrade() -> None:
    op.create_index("ix_jobs_state_pool", "jobs", ["state", "pool"])
    op.drop_index("ix_jobs_state_pool_submitted_at", table_name="jobs")
