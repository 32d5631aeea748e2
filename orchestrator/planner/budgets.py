"""Budgets in the planner: windows, grades, commitments, and the check every launch must pass.

Pure arithmetic over the snapshot (no store, no clock), in Decimal so that a check at the limit
is exact. The rules, also in ``docs/budgets.md``:

* **Scope.** A budget covers the burst nodes of its policy's pool, all of them or only those
  launched for its ``project``, whichever policy launched them.
* **Window.** ``day``, ``week`` (from Monday) and ``month`` are UTC calendar windows; ``custom``
  windows are ``period`` long, back to back from ``starts``. :func:`window_bounds` gives the one
  holding ``now``.
* **Commitment.** A launch commits price x billed(overhead + expected runtime + idle tail), at
  least the provider's minimum billing (:func:`commitment_usd`); the idle tail is
  ``scale_down.idle_for`` + ``cooldowns.scale_down``, the longest a node a budget covers idles
  before it is drained. The expected runtime is the
  longest ``duration_s`` among the jobs the node is launched for (they run side by side), or
  ``budget_commitment.default_runtime`` for a job without one, for ``min_nodes`` nodes, and the
  time left of a pre-warm floor for pre-warm nodes.
* **Outstanding.** A live node still owes ``max(budget_commit_usd - accrued, 0)``, accrued being
  price x time since it was created (:func:`outstanding_usd`): a node that outlives its
  commitment owes nothing more here, its real cost shows up in the observed spend.
* **Used.** spent in the window (observed) + outstanding of the scope's live nodes + what this
  tick's launches committed so far. A launch is allowed only if used + its commitment <= limit
  (or <= a drain grade's share of it, when that is lower: a launch never takes its own budget
  into draining), and, with ``max_hourly_burn_usd``, if the scope's live nodes' hourly prices plus
  its own stay within it.
* **Grades.** The grade in force is the last one reached by used / limit (:func:`grade_in_force`):
  warn is recorded; spot-only keeps on-demand offerings out of the scope's launches;
  no-new-launches stops them; drain (strictly past its percent) also drains the scope's ready
  nodes. Each includes the milder ones.
"""

from __future__ import annotations

import calendar
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, Decimal
from functools import lru_cache
from typing import Any

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.offerings import Offering
from orchestrator.domain.plan import Launch
from orchestrator.domain.snapshot import BudgetSpend, BurstRun, Snapshot
from orchestrator.policy.models import (
    Budget,
    BudgetAction,
    BudgetGrade,
    BudgetWindow,
    Market,
    Policy,
)

MICRO = Decimal("0.000001")
_HOUR = Decimal(3600)
_ZERO = Decimal(0)


def usd(value: float | Decimal) -> Decimal:
    """A float amount as the Decimal it was written as (``repr`` round-trips it exactly)."""
    if isinstance(value, Decimal):
        return value
    return _usd_of_float(float(value))


@lru_cache(maxsize=4096)
def _usd_of_float(value: float) -> Decimal:
    # A site's nodes share a few prices: 10,000 live nodes convert a handful of floats.
    return Decimal(repr(value))


def budget_key(policy: str, budget: str) -> str:
    """How a budget is keyed in ``Snapshot.budget_spend`` and in decisions."""
    return f"{policy}/{budget}"


def window_bounds(budget: Budget, now: datetime) -> tuple[datetime, datetime]:
    """Start (inclusive) and end (exclusive) of the budget's window that holds ``now``, in UTC."""
    at = now.astimezone(UTC)
    if budget.window is BudgetWindow.CUSTOM:
        assert budget.starts is not None and budget.period is not None  # the model enforces it
        anchor = budget.starts.astimezone(UTC)
        index = (at - anchor) // budget.period  # floor: windows before ``starts`` count too
        start = anchor + index * budget.period
        return start, start + budget.period
    day = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if budget.window is BudgetWindow.DAY:
        return day, day + timedelta(days=1)
    if budget.window is BudgetWindow.WEEK:
        start = day - timedelta(days=day.weekday())
        return start, start + timedelta(days=7)
    start = day.replace(day=1)
    days = calendar.monthrange(start.year, start.month)[1]
    return start, start + timedelta(days=days)


def used_percent(used: Decimal, limit: Decimal) -> Decimal:
    """``used`` as a percent of ``limit``; a zero limit is at 0% until anything is used, then
    infinitely over."""
    if limit <= 0:
        return _ZERO if used <= 0 else Decimal("Infinity")
    return used * 100 / limit


def grade_in_force(grades: Iterable[BudgetGrade], percent: Decimal) -> BudgetGrade | None:
    """The last grade ``percent`` has reached (grades are ascending), or None below them all."""
    found = None
    for grade in grades:
        at = Decimal(repr(grade.at_percent))
        reached = percent > at if grade.action is BudgetAction.DRAIN else percent >= at
        if reached:
            found = grade
    return found


def commitment_usd(policy: Policy, offering: Offering, runtime_s: float) -> Decimal:
    """What launching one node of ``offering`` for work of ``runtime_s`` commits (USD, rounded up
    to the micro-dollar): price x billed(overhead + runtime + idle tail), minimum billing included.
    The idle tail is ``idle_for`` plus ``cooldowns.scale_down``: the longest a node a budget covers
    idles before it is drained (see :mod:`.scaledown`)."""
    seconds = (policy.budget_commitment.overhead.total_seconds() + max(runtime_s, 0.0)
               + policy.scale_down.idle_for.total_seconds()
               + policy.cooldowns.scale_down.total_seconds())
    billed = offering.billing.billed_seconds(seconds)
    return (usd(offering.price_usd_hour) * usd(billed) / _HOUR).quantize(MICRO, ROUND_CEILING)


def job_runtime_s(policy: Policy, duration_s: float | None) -> float:
    """Expected runtime of a job: its ``duration_s``, or the policy's default when it has none."""
    if duration_s:
        return float(duration_s)
    return policy.budget_commitment.default_runtime.total_seconds()


def accrued_usd(node: Node, now: datetime) -> Decimal:
    """What a node has cost since it was created (price x time; a requested node nothing yet)."""
    if node.state is NodeState.REQUESTED:
        return _ZERO
    seconds = max((now - node.created_at).total_seconds(), 0.0)
    return usd(node.price_usd_hour) * usd(seconds) / _HOUR


def outstanding_usd(node: Node, now: datetime) -> Decimal:
    """What of a live node's commitment is not yet spent: ``max(commit - accrued, 0)``."""
    return outstanding_of(node.state, node.budget_commit_usd, node.price_usd_hour,
                          node.created_at, now)


def outstanding_of(state: NodeState, commit_usd: float, price_usd_hour: float,
                   created_at: datetime, now: datetime) -> Decimal:
    """:func:`outstanding_usd` of a node's few fields (what budget status reads of the store)."""
    if not state.counts_toward_limits:
        return _ZERO
    if price_usd_hour >= 0 and commit_usd <= 0:
        return _ZERO  # no commitment: max(commit - accrued, 0) with accrued >= 0
    if state is not NodeState.REQUESTED and price_usd_hour >= 0:
        age_s = (now - created_at).total_seconds()
        # Accrued well past the commitment in floats (a relative error of ~1e-15, far inside this
        # margin) is past it in Decimals too: nothing is outstanding. Most live nodes are.
        if price_usd_hour * age_s > commit_usd * 3600.0 * (1.0 + 1e-9) + 1e-6:
            return _ZERO
    accrued = _ZERO if state is NodeState.REQUESTED else usd(price_usd_hour) * usd(
        max((now - created_at).total_seconds(), 0.0)) / _HOUR
    return max(usd(commit_usd) - accrued, _ZERO)


def in_scope(budget: Budget, pool: str, node_pool: str, node_project: str | None) -> bool:
    """Whether a node of ``node_pool`` launched for ``node_project`` counts toward the budget."""
    return node_pool == pool and (budget.project is None or node_project == budget.project)


def run_usd(node: Node, gpus: int, runtime_s: float) -> Decimal:
    """A job's share of ``node`` for ``runtime_s``: price x gpus / node GPUs x runtime."""
    if node.gpus <= 0:
        return _ZERO
    share = usd(node.price_usd_hour) * Decimal(min(gpus, node.gpus)) / Decimal(node.gpus)
    return (share * usd(max(runtime_s, 0.0)) / _HOUR).quantize(MICRO, ROUND_CEILING)


def run_outstanding_usd(policy: Policy, run: BurstRun, node: Node, now: datetime) -> Decimal:
    """What a running job still owes of its share of ``node`` for the rest of its declared run."""
    runtime = job_runtime_s(policy, run.duration_s)
    left = runtime - max((now - run.started_at).total_seconds(), 0.0)
    return run_usd(node, run.gpus, left) if left > 0 else _ZERO


def _live_figures(policy: Policy, live: list[Node], now: datetime
                  ) -> tuple[dict[str | None, list[Decimal]], dict[str | None, list[Decimal]]]:
    """Each live node's outstanding commitment and hourly price (``live``: the pool's live nodes,
    in snapshot order), listed per project a budget of ``policy`` is for, and under None for
    the pool's budgets (every node), each in snapshot order: a budget sums its list, the same
    additions in the same order as summing over its scope (Decimal sums of inexact quotients
    depend on the order), with each node's figures worked out once, not once per budget."""
    projects = {b.project for b in policy.budgets}
    owed: dict[str | None, list[Decimal]] = {project: [] for project in projects}
    burn: dict[str | None, list[Decimal]] = {project: [] for project in projects}
    whole = None in projects
    for node in live:
        if not whole and node.project not in projects:
            continue  # in no budget's scope
        figures = outstanding_usd(node, now), usd(node.price_usd_hour)
        if whole:
            owed[None].append(figures[0])
            burn[None].append(figures[1])
        if node.project is not None and node.project in projects:
            owed[node.project].append(figures[0])
            burn[node.project].append(figures[1])
    return owed, burn


def foreign_outstanding(policy: Policy, runs: tuple[BurstRun, ...], nodes: dict[str, Node],
                        now: datetime) -> dict[str, Decimal]:
    """Per project: what its jobs running on nodes launched for another project (or none) still
    owe for their declared runs. (On a node of its own project the node's commitment pays.)"""
    out: dict[str, Decimal] = {}
    for run in runs:
        node = nodes.get(run.node_id)
        if node is None or node.pool != policy.pool.name or node.project == run.project:
            continue
        owed = run_outstanding_usd(policy, run, node, now)
        if owed:
            out[run.project] = out.get(run.project, _ZERO) + owed
    return out


@dataclass(slots=True)
class BudgetState:
    """One budget during one tick: what is spent and committed, and what launches took so far."""

    key: str
    budget: Budget
    pool: str
    window_start: datetime
    window_end: datetime
    limit: Decimal
    spent: Decimal
    outstanding: Decimal  # of live nodes in scope
    burn: Decimal  # hourly prices of live nodes in scope, this tick's launches included
    observed: bool  # spend was in the snapshot for this window
    tick: Decimal = _ZERO  # commitments of this tick's launches (earlier policies' included)
    # What the scope's jobs running on nodes outside its scope still owe for their declared runs
    # (a project's work on another project's node is its spend).
    runs: Decimal = _ZERO

    @property
    def name(self) -> str:
        return self.budget.name

    @property
    def used(self) -> Decimal:
        return self.spent + self.outstanding + self.runs + self.tick

    @property
    def percent(self) -> Decimal:
        return used_percent(self.used, self.limit)

    def fits(self, extra: Decimal) -> bool:
        """Whether ``extra`` more commitment keeps ``used`` within the limit, and out of a drain
        grade set below it (a launch never takes its own budget into draining)."""
        used = self.used + extra
        if used > self.limit:
            return False
        grade = grade_in_force(self.budget.grades, used_percent(used, self.limit))
        return grade is None or grade.action is not BudgetAction.DRAIN

    @property
    def grade(self) -> BudgetGrade | None:
        return grade_in_force(self.budget.grades, self.percent)

    @property
    def action(self) -> BudgetAction | None:
        grade = self.grade
        return grade.action if grade is not None else None

    def applies_to(self, project: str | None) -> bool:
        return self.budget.project is None or self.budget.project == project

    def as_input(self) -> dict[str, Any]:
        """The decision's record of this budget."""
        percent = self.percent
        return {
            "project": self.budget.project,
            "window": [_iso(self.window_start), _iso(self.window_end)],
            "limit_usd": _money(self.limit),
            "spent_usd": _money(self.spent),
            "spend_observed": self.observed,
            "committed_usd": _money(self.outstanding),
            "committed_this_tick_usd": _money(self.tick),
            "committed_runs_usd": _money(self.runs),
            "remaining_usd": _money(self.limit - self.used),
            "used_percent": None if percent.is_infinite() else round(float(percent), 2),
            "grade": str(self.action) if self.action is not None else None,
            "burn_usd_hour": _money(self.burn),
            "max_hourly_burn_usd": (None if self.budget.max_hourly_burn_usd is None
                                    else _money(self.budget.max_hourly_burn_usd)),
        }


def _money(value: Decimal) -> float:
    return float(value.quantize(MICRO))


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(slots=True)
class BudgetBook:
    """The budgets of one policy during one tick: which launches they allow, and what they took."""

    states: list[BudgetState] = field(default_factory=list)

    @classmethod
    def build(cls, policy: Policy, snapshot: Snapshot, now: datetime,
              earlier: Iterable[Launch] = ()) -> BudgetBook:
        """The policy's budgets at ``now``. ``earlier`` are launches other policies planned this
        tick: they commit against budgets of the same pool too."""
        pool = policy.pool.name
        earlier = list(earlier)
        live = [n for n in snapshot.nodes if n.state.counts_toward_limits and n.pool == pool]
        foreign = (foreign_outstanding(policy, snapshot.burst_runs, {n.id: n for n in live}, now)
                   if snapshot.burst_runs else {})
        owed, burn = _live_figures(policy, live, now)
        states = []
        for budget in policy.budgets:
            key = budget_key(policy.name, budget.name)
            start, end = window_bounds(budget, now)
            seen = snapshot.budget_spend.get(key)
            observed = seen is not None and _same_window(seen, start)
            spent = usd(seen.spent_usd) if observed and seen is not None else _ZERO
            mine = [lc for lc in earlier if in_scope(budget, pool, lc.pool, lc.project)]
            states.append(BudgetState(
                key=key, budget=budget, pool=pool, window_start=start, window_end=end,
                limit=budget.limit_usd, spent=spent,
                outstanding=sum(owed.get(budget.project, ()), _ZERO),
                burn=sum(burn.get(budget.project, ()), _ZERO)
                + sum((usd(lc.offering.price_usd_hour) for lc in mine), _ZERO),
                observed=observed,
                tick=sum((usd(lc.budget_commit_usd) for lc in mine), _ZERO),
                runs=(foreign.get(budget.project, _ZERO) if budget.project is not None
                      else _ZERO),
            ))
        return cls(states)

    def copy(self) -> BudgetBook:
        return BudgetBook([replace(s) for s in self.states])

    def assign(self, other: BudgetBook) -> None:
        """Take ``other``'s state (a copy that was planned with and kept)."""
        self.states[:] = other.states

    def scope(self, project: str | None) -> list[BudgetState]:
        """The budgets a node launched for ``project`` counts toward (pool budgets always)."""
        return [s for s in self.states if s.applies_to(project)]

    def blocker(self, project: str | None, offering: Offering, commit: Decimal,
                count: int = 1) -> str | None:
        """The budget that stops ``count`` nodes of ``offering`` committing ``commit`` each, if
        any."""
        price = usd(offering.price_usd_hour)
        for state in self.scope(project):
            action = state.action
            name = f"budgets[{state.name}]"
            if action is not None and action.severity >= BudgetAction.NO_NEW_LAUNCHES.severity:
                return name
            if action is BudgetAction.SPOT_ONLY and offering.market is not Market.SPOT:
                return name
            if not state.fits(commit * count):
                return name
            cap = state.budget.max_hourly_burn_usd
            if cap is not None and state.burn + price * count > cap:
                return f"{name}.max_hourly_burn_usd"
        return None

    def take(self, project: str | None, offering: Offering, commit: Decimal) -> None:
        price = usd(offering.price_usd_hour)
        for state in self.scope(project):
            state.tick += commit
            state.burn += price

    def extend_blocker(self, extras: dict[str | None, Decimal]) -> str | None:
        """The budget that cannot cover more commitment (``extras`` by project) of nodes granted
        this tick, if any."""
        for state in self.states:
            extra = sum((e for p, e in extras.items() if state.applies_to(p)), _ZERO)
            if extra and not state.fits(extra):
                return f"budgets[{state.name}]"
        return None

    def extend(self, project: str | None, extra: Decimal) -> None:
        for state in self.scope(project):
            state.tick += extra

    def covers(self, node: Node) -> bool:
        """Whether any of the budgets counts ``node``."""
        return any(in_scope(s.budget, s.pool, node.pool, node.project) for s in self.states)

    def pool_names(self) -> set[str]:
        """``budgets[...]`` names of the pool-wide budgets (for telling pool limits apart)."""
        return {f"budgets[{s.name}]" for s in self.states if s.budget.project is None}

    def draining(self) -> list[BudgetState]:
        """Budgets whose drain grade is in force (spend and commitments past it), and budgets
        past their limit whatever their grades: a budget is a cap even with ``grades: []``
        (only work running past its declared duration takes it there; draining bounds that by
        ``drain_grace``)."""
        return [s for s in self.states
                if s.action is BudgetAction.DRAIN or s.used > s.limit]

    def inputs(self) -> dict[str, dict[str, Any]]:
        return {s.name: s.as_input() for s in self.states}

    def notes(self) -> list[str]:
        """One phrase per budget with a grade in force, for the decision summary."""
        out = []
        for s in self.states:
            if s.action is not None:
                percent = s.percent
                shown = "no limit left" if percent.is_infinite() else f"{float(percent):.1f}%"
                out.append(f"budget {s.name} at {shown} ({s.action})")
        return out


def _same_window(seen: BudgetSpend, start: datetime) -> bool:
    # Spend observed for another window (an older snapshot, a window that just rolled over) does
    # not count in this one. Spend given without a window is taken as this window's.
    return seen.window_start is None or seen.window_start == start
