"""The jobs each policy keeps for on-prem (``trigger.spare_room``): ``kept_onprem``, one row per
(policy, job id), which the built-in queue's claim reads so a burst node asking for work is not
handed a kept job it would be lengthened by beyond the job's share.

Revision ID: 0024
Revises: 0023

Hand-written and frozen like 0001 (no import of the models). Empty at first: the next plan of a
policy with ``spare_room`` writes its list.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "kept_onprem",
        sa.Column("policy", sa.String(128), primary_key=True),
        sa.Column("job_id", sa.String(64), primary_key=True),
    )


def downgrade() -> None:
    op.drop_table("kept_onprem")
