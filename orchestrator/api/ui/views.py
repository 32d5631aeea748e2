"""What each dashboard page shows, gathered from the store with the same code and the same
scoping as the ``/v1`` routes (so a page and the API agree to the cent).

Scoping (docs/dashboard.md): a project token sees the nodes, jobs, budgets and spend of its
projects only; rows of no project (nodes kept for ``min_nodes``, pool-wide budgets) and decisions
(pool-level) are the admin's only, as in the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from orchestrator.api.usage_metrics import job_flagged, node_flagged
from orchestrator.api.v1 import JobOut, NodeOut, iso
from orchestrator.costs.budgets import BudgetStatus, budget_statuses
from orchestrator.costs.report import CostQuery, CostReport, GroupKey, cost_report
from orchestrator.costs.spend import spend
from orchestrator.domain.jobs import JobState, Placement
from orchestrator.store.tokens import ApiToken, Role
from orchestrator.wiring import Runtime

CHART_POINTS = 12  # actual spend is sampled at this many instants of the window


def scope_of(token: ApiToken) -> frozenset[str] | None:
    return token.scope


@dataclass(frozen=True)
class PoolRow:
    pool: str
    policy: str
    onprem_nodes: int
    onprem_gpus: int
    onprem_busy_gpus: int
    burst_nodes: int
    burst_gpus: int


@dataclass(frozen=True)
class NodeRow:
    node: NodeOut
    region: str
    utilisation: str  # GPUs allocated to running jobs of the node's GPUs, as a percentage

    @property
    def measured(self) -> str:
        """Measured GPU utilisation (issue 15's agent readings), as ``burst status`` shows it."""
        percent = self.node.gpu_utilisation_percent
        if percent is None:
            return "unknown"
        return f"{percent:.0f}%" + (" (low)" if self.node.low_utilisation else "")


@dataclass
class Fleet:
    at: str
    pools: list[PoolRow]
    nodes: list[NodeRow]
    by_place: list[tuple[str, str, str, int]]  # provider, region, state, nodes


def fleet(rt: Runtime, token: ApiToken) -> Fleet:
    now = rt.clock.now()
    scope = scope_of(token)
    busy = rt.store.gpus_busy_by_node()
    nodes = [n for n in rt.store.nodes() if scope is None or n.project in scope]
    rows = []
    places: dict[tuple[str, str, str], int] = {}
    for node in nodes:
        out = NodeOut.of(node, now, busy.get(node.id, 0), node_flagged(rt, node, now))
        parts = node.offering_key.split("/")  # provider/region/zone/type/market
        region = parts[1] if len(parts) == 5 else "-"
        share = f"{100 * out.gpus_busy / out.gpus:.0f}%" if out.gpus else "-"
        rows.append(NodeRow(out, region, share))
        key = (node.provider, region, str(node.state))
        places[key] = places.get(key, 0) + 1
    running = rt.store.jobs(states=[JobState.RUNNING])
    pools = []
    for policy in rt.policies.values():
        name = policy.pool.name
        onprem_busy = sum(j.gpus for j in running
                          if j.pool == name and j.placement is Placement.ONPREM)
        mine = [r for r in rows if r.node.pool == name]
        pools.append(PoolRow(name, policy.name, policy.pool.onprem.nodes,
                             policy.pool.onprem.total_gpus,
                             onprem_busy if scope is None else 0,
                             len(mine), sum(r.node.gpus for r in mine)))
    return Fleet(iso(now) or "", pools, rows,
                 [(p, r, s, n) for (p, r, s), n in sorted(places.items())])


@dataclass
class QueueView:
    at: str
    summary: list[dict[str, Any]]  # per pool and project
    jobs: list[JobOut]
    held_back: list[tuple[str, str, list[str]]]  # policy, summary, held back by (admin only)


def queue(rt: Runtime, token: ApiToken) -> QueueView:
    now = rt.clock.now()
    scope = scope_of(token)
    jobs = [j for j in rt.store.jobs(states=[JobState.PENDING, JobState.RUNNING])
            if scope is None or j.project in scope]
    # Measured GPU use of running jobs, as GET /v1/queue reports it.
    uses = {u.job_id: u for u in rt.store.job_utilisation(
        [j.id for j in jobs if j.state is JobState.RUNNING])}
    policy_of = {n.id: n.policy for n in rt.store.nodes()} if uses else {}
    outs = [JobOut.of(j, now, uses.get(j.id), j.state is JobState.RUNNING and job_flagged(
        rt, uses.get(j.id), policy_of.get(j.node_id or ""), now)) for j in jobs]
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for job in outs:
        group = groups.setdefault((job.pool, job.project), {
            "pool": job.pool, "project": job.project, "pending_jobs": 0, "pending_gpus": 0,
            "running_jobs": 0, "running_gpus": 0, "oldest_wait_s": 0.0})
        if job.state is JobState.PENDING:
            group["pending_jobs"] += 1
            group["pending_gpus"] += job.gpus
            group["oldest_wait_s"] = max(group["oldest_wait_s"], job.wait_s)
        else:
            group["running_jobs"] += 1
            group["running_gpus"] += job.gpus
    held = []
    if token.role is Role.ADMIN:
        for name, decision in sorted(rt.store.latest_decisions(list(rt.policies)).items()):
            held.append((name, decision.summary, list(decision.held_back_by)))
    return QueueView(iso(now) or "", [groups[k] for k in sorted(groups)], outs, held)


@dataclass
class BudgetView:
    status: BudgetStatus
    doc: dict[str, Any]  # as GET /v1/budgets serves it
    actual: list[tuple[datetime, Decimal]]  # cumulative spend at sample instants up to now
    bands: list[tuple[float, str]] = field(default_factory=list)  # (at_percent, action)


def budgets(rt: Runtime, token: ApiToken) -> tuple[str, list[BudgetView]]:
    now = rt.clock.now()
    scope = scope_of(token)
    statuses = [s for s in budget_statuses(rt.store, list(rt.policies.values()), now)
                if scope is None or s.project in scope]
    views = []
    for status in statuses:
        start = status.window_start
        end = min(now, status.window_end)
        points: list[tuple[datetime, Decimal]] = [(start, Decimal(0))]
        if end > start:
            step = (end - start) / CHART_POINTS
            for i in range(1, CHART_POINTS):
                moment = start + step * i
                points.append((moment, spend(rt.store, since=start, until=moment, now=moment,
                                             pool=status.pool, project=status.project)))
            points.append((end, status.spent_usd))
        policy = rt.policies[status.policy]
        budget = next(b for b in policy.budgets if b.name == status.budget)
        views.append(BudgetView(status, status.as_json(), points,
                                [(g.at_percent, str(g.action)) for g in budget.grades]))
    return iso(now) or "", views


SPEND_GROUPINGS = {"project": (GroupKey.DAY, GroupKey.PROJECT),
                   "provider": (GroupKey.DAY, GroupKey.PROVIDER)}


def spend_report(rt: Runtime, token: ApiToken, by: str, days: int) -> CostReport:
    """What ``GET /v1/costs?group_by=day,<by>&from=<days>d`` answers for this token."""
    now = rt.clock.now()
    return cost_report(rt.store, CostQuery(since=now - timedelta(days=days), until=now,
                                           group_by=SPEND_GROUPINGS[by], projects=scope_of(token)))


__all__ = ["BudgetView", "Fleet", "QueueView", "SPEND_GROUPINGS", "budgets", "fleet", "queue",
           "spend_report"]
