"""The version of the ledger reach's kept groups: one counter row, moved by every write of them.

Budgets read the reach's groups (:mod:`orchestrator.store.reach_groups`) on every request; at a
running site's 1,500 groups reading and parsing them was most of a request. A store keeps the
groups it parsed (``Accrual.budget_inputs``) with the version it read them at, and reads only
this one row on a request to know whether they are still current (how and why that is safe:
:mod:`orchestrator.store.versions`).

``ledger_reach_version`` (migration 0022) holds one row (``id`` 1). Every write of
``ledger_reach_groups`` adds one to its ``version`` in the same transaction (:func:`bump`, called
by :func:`reach_groups._apply <orchestrator.store.reach_groups>` after its upsert and delete, the
transaction's last statements, and by the groups' rebuild).
"""

from __future__ import annotations

from sqlalchemy import Connection

from orchestrator.store.versions import VersionCounter

REACH = VersionCounter("ledger_reach_version")
ledger_reach_version = REACH.table


def bump(conn: Connection) -> None:
    """Move the version in ``conn``'s transaction (a write of the groups)."""
    REACH.bump(conn)


def read(conn: Connection) -> int | None:
    """The version as ``conn``'s transaction sees it; None when the row is missing."""
    return REACH.read(conn)


__all__ = ["REACH", "bump", "ledger_reach_version", "read"]
