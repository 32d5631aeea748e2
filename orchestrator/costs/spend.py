"""Spend for budgets: what burst nodes cost in a window, never under-counted, and the burn rate.

:func:`spend` is the ledger's burst lines in the window plus the live accrual of every node the
roll-up has not reached yet (each node's captured price times the time between where its lines
stop and now, or its confirmed termination), so a budget check between two roll-ups still sees
every dollar. A node not rolled up at all also counts its billing minimum (one minute, the
default rule), so a node launched a second ago already counts what it will at least cost.

Pool and project filters select lines by their own pool and project (a shared node's usage lines
belong to the projects of its jobs); accrual, which has no jobs yet, goes to the project the node
was launched for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal

from orchestrator.costs.attribution import billed_micros, rate, usd_micros
from orchestrator.costs.ledger import DEFAULT_BILLING
from orchestrator.domain.costs import NO_PROJECT
from orchestrator.domain.snapshot import BudgetSpend
from orchestrator.planner.budgets import budget_key, window_bounds
from orchestrator.policy.models import Policy
from orchestrator.store import Store
from orchestrator.store.base import require_aware
from orchestrator.store.accrual import AccrualGroup, AccrualNode, epoch_us
from orchestrator.store.accrual_table import AccrualTable

_MICROS = Decimal(1_000_000)


def spend(store: Store, *, since: datetime, until: datetime, now: datetime,
          pool: str | None = None, project: str | None = None,
          accrual: list[AccrualNode] | None = None,
          lines: Mapping[tuple[str | None, str | None], int] | None = None) -> Decimal:
    """USD of burst (not on-prem) cost lines whose bucket starts in [since, until), filtered by
    ``pool`` and ``project``, plus the live accrual of nodes the roll-up has not caught up with
    (up to ``now``, inside the window). Exact to the micro-dollar. ``accrual``: every node's
    accrual as read once for several budgets (``store.ledger_accrual_nodes()``), filtered here;
    default: read for this pool and project. ``lines``: the window's burst micro-dollars per
    (pool, project) as :class:`WindowLines` reads them once for several budgets."""
    for name, moment in (("since", since), ("until", until), ("now", now)):
        require_aware(moment, name)
    if since >= until:
        raise ValueError(f"since ({since.isoformat()}) must be before until ({until.isoformat()})")
    if lines is None:
        total = store.ledger_cost_micros(since=since, until=until, pool=pool, project=project)
    else:
        total = _lines_of(lines, pool, project)
    if accrual is None:
        nodes = store.ledger_accrual_nodes(pool=pool, project=project)
    else:
        nodes = [n for n in accrual if (pool is None or n.pool == pool)
                 and (project is None or n.project == project)]
    total += sum(_accrued_micros(node, since, until, now) for node in nodes)
    return Decimal(total) / _MICROS


class WindowLines:
    """The ledger's burst micro-dollars per (pool, project) of each budget window, read once per
    window however many budgets share it (one grouped query over the roll-ups each)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._windows: dict[tuple[datetime, datetime], dict[tuple[str | None, str | None], int]] = {}

    def __call__(self, since: datetime, until: datetime
                 ) -> dict[tuple[str | None, str | None], int]:
        key = (since, until)
        if key not in self._windows:
            self._windows[key] = {
                (s.keys[0], s.keys[1]): s.cost_micros
                for s in self._store.cost_sums(["pool", "project"], since=since, until=until)}
        return self._windows[key]


class WindowSpend:
    """:func:`spend` of many budgets at one ``now``: the ledger's lines per (pool, project) of
    each window (:class:`WindowLines`, one read per window) and the accrual of the nodes the
    lines have not reached, per (pool, project) once per window, from the store's ledger reach
    read once in groups of nodes that accrue alike (``Store.budget_groups``, in whole
    microseconds): each group's micro-dollars worked out once, times its nodes. ``groups``:
    these instead (read once by the caller; or every node on its own, count 1, as tests
    compare: :meth:`AccrualGroup.of_node`); ``lines``: each
    window's lines per (pool, project) as read by the caller (``Store.budget_inputs``; a window
    not in it is read); ``table``: the groups' :class:`AccrualTable` as the store keeps it with
    them (``BudgetInputs.groups``, :func:`accrual_table`), else built here from ``groups``.
    Exact: the same integer micro-dollars as :func:`spend`, added in another order (each group's
    worked out by the table's columns, compared with :func:`_accrued_us` by its tests)."""

    def __init__(self, store: Store, now: datetime,
                 groups: list[AccrualGroup] | None = None,
                 lines: Mapping[tuple[datetime, datetime],
                                dict[tuple[str | None, str | None], int]] | None = None,
                 table: AccrualTable | None = None) -> None:
        self._lines = WindowLines(store)
        if lines:
            self._lines._windows.update(lines)
        if groups is None and table is None:  # the store's groups and their table, as kept
            kept = store.reach_group_set()
            groups, table = kept.accrual, kept.table(rate, DEFAULT_BILLING)
        self._groups = groups
        self._table = table
        self._now = require_aware(now, "now")
        self._now_us = epoch_us(now)
        self._accrued: dict[tuple[datetime, datetime],
                            dict[tuple[str, str | None], int]] = {}
        # Per window: its lines plus accrual summed per (pool, project) and per pool, so each
        # budget looks its scope up instead of walking every group.
        self._totals: dict[tuple[datetime, datetime], _Totals] = {}

    def accrued(self, since: datetime, until: datetime) -> dict[tuple[str, str | None], int]:
        """Micro-dollars accrued in [since, min(now, until)) per (pool, project) of the nodes."""
        key = (since, until)
        if key not in self._accrued:
            if self._table is None:
                self._table = accrual_table(self._groups or [])
            since_us, stop_us = epoch_us(since), min(epoch_us(until), self._now_us)
            self._accrued[key] = self._table.accrued(since_us, stop_us)
        return self._accrued[key]

    def __call__(self, *, since: datetime, until: datetime, pool: str | None = None,
                 project: str | None = None) -> Decimal:
        """USD spent by ``pool`` and ``project`` in [since, until), as :func:`spend` counts it."""
        if pool is None:  # every pool: walk the groups (no budget asks this)
            total = _lines_of(self._lines(since, until), pool, project)
            total += sum(v for (p, j), v in self.accrued(since, until).items()
                         if project is None or j == project)
            return Decimal(total) / _MICROS
        key = (since, until)
        totals = self._totals.get(key)
        if totals is None:
            totals = self._totals[key] = _Totals(self._lines(since, until),
                                                 self.accrued(since, until))
        return Decimal(totals.of(pool, project)) / _MICROS


class _Totals:
    """One window's lines and accrual summed per (pool, project) and per pool, with the filters
    of :func:`_lines_of` (a line of no project counts for ``NO_PROJECT``) and of the accrual (a
    node's project as it is)."""

    __slots__ = ("lines", "accrued", "lines_pool", "accrued_pool")

    def __init__(self, lines: Mapping[tuple[str | None, str | None], int],
                 accrued: Mapping[tuple[str, str | None], int]) -> None:
        self.lines, self.accrued = lines, accrued
        self.lines_pool: dict[str | None, int] = {}
        self.accrued_pool: dict[str | None, int] = {}
        for (p, _), v in lines.items():
            self.lines_pool[p] = self.lines_pool.get(p, 0) + v
        for (p, _), v in accrued.items():
            self.accrued_pool[p] = self.accrued_pool.get(p, 0) + v

    def of(self, pool: str, project: str | None) -> int:
        if project is None:
            return self.lines_pool.get(pool, 0) + self.accrued_pool.get(pool, 0)
        total = self.lines.get((pool, project), 0) + self.accrued.get((pool, project), 0)
        if project == NO_PROJECT:
            total += self.lines.get((pool, None), 0)
        return total


def _lines_of(lines: Mapping[tuple[str | None, str | None], int], pool: str | None,
              project: str | None) -> int:
    return sum(v for (p, j), v in lines.items() if (pool is None or p == pool)
               and (project is None or j == project or (project == NO_PROJECT and j is None)))


def accrual_table(groups: list[AccrualGroup]) -> AccrualTable:
    """``groups`` as an :class:`AccrualTable` that accrues as :func:`_accrued_us` does (this
    module's price fraction and billing rule)."""
    return AccrualTable(groups, rate, DEFAULT_BILLING)


def _accrued_micros(node: AccrualNode, since: datetime, until: datetime, now: datetime) -> int:
    """What ``node`` cost in the window past where its lines reach (up to ``now``)."""
    return _accrued_us(node.price_usd_hour, epoch_us(node.launched),
                       None if node.ended is None else epoch_us(node.ended),
                       None if node.covered_through is None else epoch_us(node.covered_through),
                       epoch_us(since), min(epoch_us(until), epoch_us(now)))


def _accrued_us(price: float, launched_us: int, ended_us: int | None, covered_us: int | None,
                since_us: int, stop_us: int) -> int:
    """Micro-dollars a node accrued in [since_us, stop_us) past where its lines reach
    (``covered_us``; None: from its launch, billed at least the provider's minimum), all in
    whole microseconds since the epoch: exact, as the datetimes' differences are."""
    end = stop_us if ended_us is None or ended_us > stop_us else ended_us
    start = max(launched_us if covered_us is None else covered_us, since_us)
    if end <= start:
        return 0
    span = end - start
    if covered_us is None and start == launched_us:
        span = billed_micros(DEFAULT_BILLING, span)  # never rolled up: its minimum too
    return usd_micros(rate(price), span)


def burn_rate_usd_hour(store: Store, *, pool: str | None = None, project: str | None = None
                       ) -> Decimal:
    """USD per hour of the nodes not yet terminated (each at its price captured at launch), of
    ``pool`` and launched for ``project`` when given."""
    prices = store.live_node_prices(pool=pool, project=project)
    return sum((Decimal(str(p)) for p in prices), Decimal(0))


def budget_spend(store: Store, policies: Iterable[Policy], now: datetime,
                 prices: Mapping[tuple[str, str | None], list[float]] | None = None
                 ) -> dict[str, BudgetSpend]:
    """Spend of every budget of ``policies`` in its window at ``now``, from the cost ledger (what
    ``Snapshot.budget_spend`` carries; the built-in queue's dispatcher reads it too).
    ``prices``: the live nodes' prices per (pool, project) as a tick read them already
    (``TickNodes.live_prices_by_group``); else they are read here.

    A failure to read the ledger is not hidden: a budget without observed spend would let
    the planner launch as if nothing had been spent.
    """
    out: dict[str, BudgetSpend] = {}
    policies = list(policies)
    if not any(p.budgets for p in policies):
        return out
    # Read once for every budget: the accrual of the nodes the ledger has not caught up with,
    # the lines of each window, and the live nodes' prices (a read per budget scanned every
    # node once per budget).
    spent_in = WindowSpend(store, now)
    burns = burn_by_group(store.live_node_prices_by_group() if prices is None else prices)
    for policy in policies:
        pool = policy.pool.name
        for budget in policy.budgets:
            start, end = window_bounds(budget, now)
            spent = spent_in(since=start, until=end, pool=pool, project=budget.project)
            burn = sum((v for (p, j), v in burns.items()
                        if p == pool and (budget.project is None or j == budget.project)),
                       Decimal(0))
            out[budget_key(policy.name, budget.name)] = BudgetSpend(
                spent_usd=spent, burn_usd_hour=burn, window_start=start, window_end=end)
    return out


def burn_by_group(prices: Mapping[tuple[str, str | None], list[float]]
                  ) -> dict[tuple[str, str | None], Decimal]:
    """USD per hour per (pool, project) of the live nodes' prices as
    ``Store.live_node_prices_by_group`` reads them (each price as :func:`burn_rate_usd_hour`
    adds it)."""
    # Exact whatever the order: each distinct price once, times how many nodes have it.
    return {group: sum((Decimal(str(p)) * n for p, n in Counter(ps).items()), Decimal(0))
            for group, ps in prices.items()}


__all__ = ["WindowLines", "WindowSpend", "accrual_table", "budget_spend", "burn_by_group",
           "burn_rate_usd_hour", "spend"]
