"""Users: who submitted each job, on jobs, job runs and cost lines; a subject on API tokens.

Revision ID: 0009
Revises: 0008

Hand-written and frozen like 0001 (no import of the models). Adds a nullable ``user`` to
``jobs``, ``job_runs`` and ``cost_lines`` and a nullable ``subject`` to ``api_tokens``. Existing
rows get NULL, which means "not known": they were written before burst recorded users, and no
user is made up for them (the next roll-up of a still-open bucket writes its lines with the user
of its jobs). ``job_runs.project`` and ``cost_lines.project`` become nullable: a job of no project
(a Slurm job with neither account nor QOS) is recorded with project NULL, its own bucket, instead
of under its user's name. An index on ``cost_lines`` (user, day) serves reports by user.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME = sa.String(128)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("user", _NAME, nullable=True))
    with op.batch_alter_table("job_runs") as batch:
        batch.add_column(sa.Column("user", _NAME, nullable=True))
        batch.alter_column("project", existing_type=_NAME, nullable=True)
    with op.batch_alter_table("cost_lines") as batch:
        batch.add_column(sa.Column("user", _NAME, nullable=True))
        batch.alter_column("project", existing_type=_NAME, nullable=True)
        batch.create_index("ix_cost_lines_user_day", ["user", "day"])
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("subject", _NAME, nullable=True))


def downgrade() -> None:
    # Rows of no project cannot go back to a NOT NULL column as they are: they take the ledger's
    # "-" (no project), which is what the schema before this revision had for lines of no owner.
    for table in ("job_runs", "cost_lines"):
        t = sa.table(table, sa.column("project", _NAME))
        op.execute(sa.update(t).where(t.c.project.is_(None)).values(project="-"))
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("subject")
    with op.batch_alter_table("cost_lines") as batch:
        batch.drop_index("ix_cost_lines_user_day")
        batch.alter_column("project", existing_type=_NAME, nullable=False)
        batch.drop_column("user")
    with op.batch_alter_table("job_runs") as batch:
        batch.alter_column("project", existing_type=_NAME, nullable=False)
        batch.drop_column("user")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("user")
