"""Observed budget spend in a simulation: what the cost ledger would report to the planner.

Spend follows the work, as the cost ledger books it: a project's jobs on another project's node are
its spend, the node's idle time its owner's.

In production :mod:`orchestrator.observe` fills ``Snapshot.budget_spend`` from the cost ledger:
for each budget of the policy, what its scope (the pool, or one project of it) has spent in the
budget's window at ``now`` (nodes cost their hourly price from creation until terminated, nodes
still running accrued up to now) and the scope's burn rate. The simulator has no ledger; this
meter computes the same figures from the nodes the executor recorded, incrementally: nodes that
ended are summed once per window, nodes alive are accrued at each tick.
"""

from __future__ import annotations

from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.snapshot import BudgetSpend
from orchestrator.planner.budgets import budget_key, in_scope, window_bounds
from orchestrator.policy.models import Policy
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.world import at

MICRO = Decimal("0.000001")


def _cost(node: Node, start: datetime, now: datetime) -> float:
    """USD a node cost between ``start`` and ``now`` (price x overlap of its life with them)."""
    if node.instance_id is None:
        return 0.0  # never launched: it cost nothing
    end = node.state_since if node.state is NodeState.TERMINATED else now
    begin = max(node.created_at, start)
    seconds = (min(end, now) - begin).total_seconds()
    return node.price_usd_hour * seconds / 3600.0 if seconds > 0 else 0.0


def _run_cost(run: list, node: Node, start: datetime, now: datetime) -> float:
    """USD of one run's share of its node (GPUs / node GPUs) between ``start`` and ``now``."""
    begin = max(at(run[3]), start)
    end = min(at(run[4]), now) if run[4] is not None else now
    seconds = (end - begin).total_seconds()
    if seconds <= 0 or node.gpus <= 0:
        return 0.0
    return node.price_usd_hour * min(run[2], node.gpus) / node.gpus * seconds / 3600.0


class SpendMeter:
    """``Snapshot.budget_spend`` for one policy, from a :class:`SimStore` (and, for spend by work,
    the world's runs on burst nodes)."""

    def __init__(self, policy: Policy, store: SimStore, world=None):
        self.policy = policy
        self.store = store
        self.world = world
        self._window: dict[str, datetime] = {}  # budget key -> start of the window summed
        self._closed: dict[str, float] = {}  # spend in that window of nodes already terminated
        self._seen = 0  # how much of the store's termination log is summed

    def observe(self, now: datetime) -> dict[str, BudgetSpend]:
        budgets = getattr(self.policy, "budgets", ())
        if not budgets:
            return {}
        pool = self.policy.pool.name
        ended = self.store.terminated_log
        fresh = [self.store.get_node(i) for i in ended[self._seen:]]
        self._seen = len(ended)
        live = self.store.live_nodes()
        out: dict[str, BudgetSpend] = {}
        for budget in budgets:
            key = budget_key(self.policy.name, budget.name)
            start, end = window_bounds(budget, now)
            if self._window.get(key) != start:
                self._window[key] = start  # a new window: sum every node that ended in it
                done = [self.store.get_node(i) for i in ended]
                self._closed[key] = sum(_cost(n, start, now) for n in done
                                        if in_scope(budget, pool, n.pool, n.project))
            else:
                self._closed[key] += sum(_cost(n, start, now) for n in fresh
                                         if in_scope(budget, pool, n.pool, n.project))
            spent = self._closed[key] + self._by_work(budget.project, start, now)
            burn = 0.0
            for node in live:
                if in_scope(budget, pool, node.pool, node.project):
                    spent += _cost(node, start, now)
                    if node.instance_id is not None:
                        burn += node.price_usd_hour
            spent = max(spent, 0.0)
            out[key] = BudgetSpend(
                spent_usd=Decimal(repr(spent)).quantize(MICRO, ROUND_HALF_EVEN),
                burn_usd_hour=Decimal(repr(burn)).quantize(MICRO, ROUND_HALF_EVEN),
                window_start=start, window_end=end)
        return out

    def _by_work(self, project: str | None, start: datetime, now: datetime) -> float:
        """For a project's budget: its jobs' share of other projects' nodes, less other projects'
        jobs' share of its nodes (the ledger books usage to the job's project, idle to the node's
        owner). A pool budget counts whole nodes: nothing to move."""
        if project is None or self.world is None:
            return 0.0
        moved = 0.0
        get = self.store.get_node
        for run in self.world.burst_runs:
            node = get(run[1])
            if node is None or node.project == run[0] or (run[0] != project
                                                          and node.project != project):
                continue
            cost = _run_cost(run, node, start, now)
            moved += cost if run[0] == project else -cost
        return moved
