"""The ledger's reach per node: ``ledger_reach``, what the budgets' accrual needs of every node
the ledger is not final for, built here from the nodes, events, marks and lines a store holds.

Revision ID: 0019
Revises: 0018

Hand-written and frozen like 0001 (no import of the models). The backfill derives each row as
``orchestrator.store.accrual.derive`` does (and the upkeep keeps it from then on): the node's
first ``launching`` and ``terminated`` event times, its ``state_since`` when terminated, its mark,
and how far its lines reach past the mark, as integer microseconds since the epoch; its price in
whole micro-dollars an hour when it is whole (and at most 2e9). Nodes terminated with a mark at
or past their termination get no row: the ledger is final for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COLUMNS = ("launched_us", "ended_us", "terminated_us", "mark_us", "covered_us")


def _time(value: datetime | str | None) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, str):  # SQLite: naive UTC text
        return datetime.fromisoformat(value).replace(tzinfo=UTC)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _us(value: datetime | None) -> int | None:
    return None if value is None else (value - _EPOCH) // timedelta(microseconds=1)


def _price_micros(price: float) -> int | None:
    value = Decimal(str(price)) * 1_000_000
    if value < 0 or value != value.to_integral_value() or value > 2_000_000_000:
        return None
    return int(value)


def upgrade() -> None:
    table = op.create_table(
        "ledger_reach",
        sa.Column("node_id", sa.String(64), nullable=False),
        sa.Column("pool", sa.String(128), nullable=False),
        sa.Column("project", sa.String(128), nullable=True),
        sa.Column("price_usd_hour", sa.Float(), nullable=False),
        sa.Column("price_micros", sa.BigInteger(), nullable=True),
        *(sa.Column(name, sa.BigInteger(), nullable=True) for name in _COLUMNS),
        sa.PrimaryKeyConstraint("node_id", name="pk_ledger_reach"),
    )
    conn = op.get_bind()
    spans = {r[0]: (_time(r[1]), _time(r[2])) for r in conn.exec_driver_sql(
        "SELECT node_id, MIN(CASE WHEN to_state = 'launching' THEN at END), "
        "MIN(CASE WHEN to_state = 'terminated' THEN at END) FROM node_events GROUP BY node_id")}
    marks = {r[0]: _time(r[1]) for r in conn.exec_driver_sql(
        "SELECT subject, final_through FROM ledger_marks")}
    reaches = {r[0]: _time(r[1]) for r in conn.exec_driver_sql(
        "SELECT l.subject, MAX(l.period_end) FROM cost_lines l "
        "LEFT JOIN ledger_marks m ON m.subject = l.subject "
        "WHERE m.final_through IS NULL OR l.period_start >= m.final_through GROUP BY l.subject")}
    rows = []
    for node_id, pool, project, price, state, since in conn.exec_driver_sql(
            "SELECT id, pool, project, price_usd_hour, state, state_since FROM nodes"):
        mark, reach = marks.get(node_id), reaches.get(node_id)
        terminated = _time(since) if state == "terminated" else None
        if terminated is not None and mark is not None and mark >= terminated:
            continue
        covered = reach if mark is None else (mark if reach is None or reach < mark else reach)
        launched, ended = spans.get(node_id, (None, None))
        rows.append(dict(node_id=node_id, pool=pool, project=project, price_usd_hour=price,
                         price_micros=_price_micros(price), launched_us=_us(launched),
                         ended_us=_us(ended), terminated_us=_us(terminated), mark_us=_us(mark),
                         covered_us=_us(covered)))
    for i in range(0, len(rows), 1000):
        op.bulk_insert(table, rows[i:i + 1000])


def downgrade() -> None:
    op.drop_table("ledger_reach")
