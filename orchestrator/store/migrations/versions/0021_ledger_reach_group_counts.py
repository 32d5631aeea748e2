"""The ledger reach's groups counted: ``ledger_reach_groups``, one row per group of nodes that
accrue alike (pool, project, price, start and end of unbilled time, billed, live) with its node
count, built here from the ``ledger_reach`` rows a store holds.

Revision ID: 0021
Revises: 0020

Hand-written and frozen like 0001 (no import of the models). Budgets read these counts instead of
grouping every node's reach row on each request; the store's writers keep them in the
transactions that write the reach (``orchestrator.store.reach_groups``). The backfill is the
``GROUP BY`` of the reach, rows that count nowhere (never launched and terminated) left out, each
keyed by its group's columns as compact JSON (the key the upkeep upserts on).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_GROUP = ("pool", "project", "price_usd_hour", "start_us", "billed", "ended_us", "live")


def upgrade() -> None:
    table = op.create_table(
        "ledger_reach_groups",
        sa.Column("group_key", sa.String(600), primary_key=True),
        sa.Column("pool", sa.String(128), nullable=False),
        sa.Column("project", sa.String(128), nullable=True),
        sa.Column("price_usd_hour", sa.Float(), nullable=False),
        sa.Column("start_us", sa.BigInteger(), nullable=True),
        sa.Column("billed", sa.Boolean(), nullable=False),
        sa.Column("ended_us", sa.BigInteger(), nullable=True),
        sa.Column("live", sa.Boolean(), nullable=False),
        sa.Column("nodes", sa.Integer(), nullable=False),
    )
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("LOCK TABLE ledger_reach IN EXCLUSIVE MODE")
    rows = []
    for pool, project, price, start, billed, ended, live, nodes in conn.exec_driver_sql(
            f"SELECT {', '.join(_GROUP)}, COUNT(*) FROM ledger_reach GROUP BY {', '.join(_GROUP)}"):
        group = (pool, project, float(price), None if start is None else int(start),
                 bool(billed), None if ended is None else int(ended), bool(live))
        if group[3] is None and not group[6]:
            continue  # never launched and terminated: counts nowhere
        rows.append({"group_key": json.dumps(group, separators=(",", ":")),
                     **dict(zip(_GROUP, group)), "nodes": int(nodes)})
    rows.sort(key=lambda row: row["group_key"])
    for i in range(0, len(rows), 1000):
        op.bulk_insert(table, rows[i:i + 1000])


def downgrade() -> None:
    op.drop_table("ledger_reach_groups")
