"""The state store: burst's durable state (nodes, node events, decisions, planner memory,
capacity blocks, the built-in queue and its job runs, join secrets, the cost ledger) on SQLite by
default or PostgreSQL by URL, with Alembic migrations.
"""

from orchestrator.store.engine import default_sqlite_url
from orchestrator.store.fencing import StaleLeaderError
from orchestrator.store.migrate import downgrade, upgrade
from orchestrator.store.records import JobRecord
from orchestrator.store.repo import Store

__all__ = [
    "JobRecord", "StaleLeaderError", "Store", "default_sqlite_url", "downgrade", "upgrade",
]
