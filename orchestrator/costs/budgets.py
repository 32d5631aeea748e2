"""Budget status: where each budget of the policies stands now, for ``GET /v1/budgets`` and the CLI.

The same figures the planner decides with (:mod:`orchestrator.planner.budgets`), read from the
store instead of a snapshot: spend in the window from the cost ledger (:func:`~.spend.spend`,
never under-counted), what live nodes have committed and not yet spent, the burn rate, and the
grade in force. ``forecast_usd`` is spend plus the current burn for the rest of the window: what
the window ends at if nothing changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from orchestrator.costs.attribution import rate
from orchestrator.costs.ledger import DEFAULT_BILLING
from orchestrator.costs.spend import WindowSpend
from orchestrator.planner.budgets import (
    MICRO,
    grade_in_force,
    outstanding_of,
    used_percent,
    window_bounds,
)
from orchestrator.policy.models import Policy
from orchestrator.store import Store

if TYPE_CHECKING:
    from orchestrator.store.accrual_table import ReachGroupSet

_HOUR_S = Decimal(3600)


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """One budget of one policy at one instant."""

    policy: str
    budget: str
    project: str | None  # None: the whole pool
    pool: str
    window_start: datetime
    window_end: datetime
    limit_usd: Decimal
    spent_usd: Decimal  # in the window so far
    committed_usd: Decimal  # committed by live nodes at launch and not yet spent
    remaining_usd: Decimal  # limit - spent - committed (negative when over)
    burn_usd_hour: Decimal  # hourly prices of the scope's live nodes
    max_hourly_burn_usd: Decimal | None
    forecast_usd: Decimal  # spent + burn x the time left in the window
    used_fraction: float  # (spent + committed) / limit; inf for a zero limit once used
    grade: str | None  # the action of the grade in force (warn, spot-only, ...), or None

    @property
    def key(self) -> str:
        return f"{self.policy}/{self.budget}"

    def as_json(self) -> dict[str, Any]:
        """JSON-ready form: money as strings of exact decimals, times ISO 8601 UTC."""
        def money(value: Decimal | None) -> str | None:
            return None if value is None else format(value.quantize(MICRO), "f")

        return {
            "policy": self.policy,
            "budget": self.budget,
            "project": self.project,
            "pool": self.pool,
            "window_start": _iso(self.window_start),
            "window_end": _iso(self.window_end),
            "limit_usd": money(self.limit_usd),
            "spent_usd": money(self.spent_usd),
            "committed_usd": money(self.committed_usd),
            "remaining_usd": money(self.remaining_usd),
            "burn_usd_hour": money(self.burn_usd_hour),
            "max_hourly_burn_usd": money(self.max_hourly_burn_usd),
            "forecast_usd": money(self.forecast_usd),
            "used_fraction": (None if self.used_fraction == float("inf")
                              else round(self.used_fraction, 6)),
            "grade": self.grade,
        }


def budget_statuses(store: Store, policies: Iterable[Policy], now: datetime) -> list[BudgetStatus]:
    """Status of every budget of ``policies`` at ``now``, in policy then budget order."""
    policies = list(policies)
    if not any(p.budgets for p in policies):
        return []
    # Read once for every budget, in one read transaction, each summed per (pool, project) once
    # so a budget looks up a few groups: the ledger reach's kept group counts (a few rows: the
    # accrual of the nodes the ledger has not caught up with and the live nodes' prices), the
    # nodes that may still owe part of their commitment (young ones only) and the lines of each
    # window (one grouped roll-up read per window). No read of a row per live node.
    windows = {(policy.name, budget.name): window_bounds(budget, now)
               for policy in policies for budget in policy.budgets}
    read = store.budget_inputs(now, windows.values())  # one read transaction
    # The groups' accrual as columns, built once per version of the groups and kept with them.
    spent_in = WindowSpend(store, now, read.accrual, read.lines,
                           table=read.groups.table(rate, DEFAULT_BILLING))
    # The live nodes' burn per (pool, project) and per pool, kept with the groups (it changes
    # only when they do).
    burns, pool_burns = read.groups.derived("budget_burns", _burns)
    commits: dict[tuple[str, str | None], Decimal] = {}
    for node in read.commits:
        group = (node.pool, node.project)
        commits[group] = commits.get(group, Decimal(0)) + outstanding_of(
            node.state, node.budget_commit_usd, node.price_usd_hour, node.created_at, now)
    # Each pool's commitments summed once, over its groups in their order (the order a budget's
    # scope summed them in, so the Decimals are the same to the last digit): a pool-wide budget
    # reads its pool's, a project budget its one group's.
    pool_commits: dict[str, Decimal] = {}
    for g in sorted(commits, key=_group_order):
        pool_commits[g[0]] = pool_commits.get(g[0], Decimal(0)) + commits[g]
    out = []
    for policy in policies:
        pool = policy.pool.name
        for budget in policy.budgets:
            start, end = windows[(policy.name, budget.name)]
            spent = spent_in(since=start, until=end, pool=pool, project=budget.project)
            if budget.project is None:  # (the budget's scope: in_scope)
                burn = pool_burns.get(pool, Decimal(0))
                committed = pool_commits.get(pool, Decimal(0))
            else:
                group = (pool, budget.project)
                burn = Decimal(0) + burns.get(group, Decimal(0))
                committed = Decimal(0) + commits.get(group, Decimal(0))
            used = spent + committed
            left_s = max(Decimal(str((end - max(now, start)).total_seconds())), Decimal(0))
            percent = used_percent(used, budget.limit_usd)
            grade = grade_in_force(budget.grades, percent)
            out.append(BudgetStatus(
                policy=policy.name, budget=budget.name, project=budget.project, pool=pool,
                window_start=start, window_end=end, limit_usd=budget.limit_usd,
                spent_usd=spent, committed_usd=committed.quantize(MICRO),
                remaining_usd=(budget.limit_usd - used).quantize(MICRO),
                burn_usd_hour=burn, max_hourly_burn_usd=budget.max_hourly_burn_usd,
                forecast_usd=(spent + burn * left_s / _HOUR_S).quantize(MICRO),
                used_fraction=float(percent / 100),
                grade=str(grade.action) if grade is not None else None,
            ))
    return out


def _group_order(group: tuple[str, str | None]) -> tuple[str, bool, str]:
    return group[0], group[1] is None, group[1] or ""


def _burns(groups: ReachGroupSet) -> tuple[dict[tuple[str, str | None], Decimal],
                                           dict[str, Decimal]]:
    """The live nodes' hourly prices summed per (pool, project), and per pool over its
    (pool, project)s in :func:`_group_order`."""
    burns: dict[tuple[str, str | None], Decimal] = {}
    for pool, project, price, count in groups.live:
        group = (pool, project)
        burns[group] = burns.get(group, Decimal(0)) + Decimal(str(price)) * count
    pools: dict[str, Decimal] = {}
    for group in sorted(burns, key=_group_order):
        pools[group[0]] = pools.get(group[0], Decimal(0)) + burns[group]
    return burns, pools


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


__all__ = ["BudgetStatus", "budget_statuses"]
