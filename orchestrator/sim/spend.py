"""Observed budget spend in a simulation: what the cost ledger would report to the planner.

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

MICRO = Decimal("0.000001")


def _cost(node: Node, start: datetime, now: datetime) -> float:
    """USD a node cost between ``start`` and ``now`` (price x overlap of its life with them)."""
    if node.instance_id is None:
        return 0.0  # never launched: it cost nothing
    end = node.state_since if node.state is NodeState.TERMINATED else now
    begin = max(node.created_at, start)
    seconds = (min(end, now) - begin).total_seconds()
    return node.price_usd_hour * seconds / 3600.0 if seconds > 0 else 0.0


class SpendMeter:
    """``Snapshot.budget_spend`` for one policy, from a :class:`SimStore`."""

    def __init__(self, policy: Policy, store: SimStore):
        self.policy = policy
        self.store = store
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
            spent = self._closed[key]
            burn = 0.0
            for node in live:
                if in_scope(budget, pool, node.pool, node.project):
                    spent += _cost(node, start, now)
                    if node.instance_id is not None:
                        burn += node.price_usd_hour
            out[key] = BudgetSpend(
                spent_usd=Decimal(repr(spent)).quantize(MICRO, ROUND_HALF_EVEN),
                burn_usd_hour=Decimal(repr(burn)).quantize(MICRO, ROUND_HALF_EVEN),
                window_start=start, window_end=end)
        return out
