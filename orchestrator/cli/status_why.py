"""What `burst status` says about "why nothing launches": per policy its latest decision, the
limits and quotas in force and its budgets (spent, committed, limit, grade), and per pending job
what holds it back.

The figures come from where the planner and the API take them: the latest stored decision
(``Store.latest_decisions``), the policy's ``limits`` and ``projects[].max_burst_gpus``, and
:func:`orchestrator.costs.budgets.budget_statuses` (the same as ``GET /v1/budgets``).

A job's reason is read from its pool's latest decision: the limits and budgets it names in
``held_back_by`` that apply to the job's project (pool-wide ones, its own project's quota and
budgets; another project's quota or budget does not hold it); when none applies, the rule that
decided the tick (``sustaining``, ``cooldown``, ``covered``...), or ``launching`` when that tick
launched a node for the job's project.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.table import Table

from orchestrator.domain.plan import Decision, Rule

if TYPE_CHECKING:  # importing the store package costs the CLI's start-up its SQLAlchemy import
    from orchestrator.policy.models import Policy
    from orchestrator.store.records import JobRecord


def policy_overview(store: Any, policies: list[Policy], now: datetime
                    ) -> tuple[list[dict[str, Any]], dict[str, Decision]]:
    """One JSON-ready entry per policy, and each policy's latest decision (by policy name)."""
    from orchestrator.costs.budgets import budget_statuses

    latest = store.latest_decisions(p.name for p in policies)
    statuses = budget_statuses(store, policies, now)
    entries = []
    for policy in policies:
        limits = policy.limits
        decision = latest.get(policy.name)
        entries.append({
            "policy": policy.name,
            "pool": policy.pool.name,
            "decision": None if decision is None else {
                "id": decision.id, "rule": str(decision.rule), "summary": decision.summary,
                "at": decision.at.isoformat(), "last_seen_at": decision.last_seen.isoformat(),
                "repeats": decision.repeats, "held_back_by": list(decision.held_back_by),
            },
            "limits": {
                "min_nodes": limits.min_nodes, "max_nodes": limits.max_nodes,
                "max_concurrent_launches": limits.max_concurrent_launches,
                "max_hourly_spend_usd": (None if limits.max_hourly_spend_usd is None
                                         else format(limits.max_hourly_spend_usd, "f")),
                "max_burst_gpus": limits.max_burst_gpus,
            },
            "quotas": {p.name: p.max_burst_gpus for p in policy.projects
                       if p.max_burst_gpus is not None},
            "budgets": [s.as_json() for s in statuses if s.policy == policy.name],
        })
    return entries, latest


def job_reasons(jobs: Iterable[JobRecord], policies: list[Policy],
                latest: Mapping[str, Decision]) -> dict[str, dict[str, Any]]:
    """For each pending job, what holds it (see the module docstring), by job id."""
    by_pool: dict[str, Policy] = {}
    for policy in policies:
        by_pool.setdefault(policy.pool.name, policy)
    reasons: dict[str, dict[str, Any]] = {}
    for job in jobs:
        policy = by_pool.get(job.pool)
        decision = latest.get(policy.name) if policy is not None else None
        if policy is None or decision is None:
            reasons[job.id] = {"held_back_by": [], "rule": None, "decision": None,
                               "text": "no running policy watches its pool" if policy is None
                               else "no decision yet"}
            continue
        held = [label for label in decision.held_back_by if _applies(label, job.project, policy)]
        launched = any(a.startswith("launch ") and f" for {job.project} (" in a
                       for a in decision.actions)
        if held:
            text = ", ".join(held)
        elif launched and decision.rule in (Rule.SCALE_UP, Rule.PREWARM):
            text = "launching"
        else:
            text = str(decision.rule)
        reasons[job.id] = {"held_back_by": held, "rule": str(decision.rule),
                           "decision": decision.id, "text": text}
    return reasons


def _applies(label: str, project: str, policy: Policy) -> bool:
    """Whether a held-back label can hold a job of ``project``."""
    if label.startswith("projects["):
        return label.startswith(f"projects[{project}]")
    if label.startswith("budgets["):
        name = label[len("budgets["):].split("]", 1)[0]
        scoped = {b.name: b.project for b in policy.budgets}
        owner = scoped.get(name)
        return owner is None or owner == project
    return bool(label)


def overview_tables(entries: list[dict[str, Any]]) -> list[Table]:
    """The policies table (latest decision, limits, quotas) and, if any, the budgets table."""
    policies = Table(title="policies (why: burst explain DECISION)")
    for col in ("policy", "pool", "last decision", "limits in force"):
        policies.add_column(col, overflow="fold")
    budgets = Table(title="budgets")
    for col in ("policy", "budget", "project", "spent $", "committed $", "limit $", "used",
                "grade"):
        budgets.add_column(col, overflow="fold")
    for e in entries:
        d = e["decision"]
        if d is None:
            last = "none yet"
        else:
            seen = f" (x{d['repeats']}, last {d['last_seen_at'][11:19]})" if d["repeats"] > 1 else ""
            last = f"{d['rule']}: {d['summary']}{seen} [{d['id']}]"
        limits = e["limits"]
        shown = [f"max_nodes {limits['max_nodes']}",
                 f"max_concurrent_launches {limits['max_concurrent_launches']}"]
        if limits["min_nodes"]:
            shown.insert(0, f"min_nodes {limits['min_nodes']}")
        if limits["max_burst_gpus"] is not None:
            shown.append(f"max_burst_gpus {limits['max_burst_gpus']}")
        if limits["max_hourly_spend_usd"] is not None:
            shown.append(f"max_hourly_spend_usd {limits['max_hourly_spend_usd']}")
        shown += [f"projects[{name}].max_burst_gpus {q}" for name, q in e["quotas"].items()]
        policies.add_row(e["policy"], e["pool"], last,
                         ", ".join(shown))
        for b in e["budgets"]:
            used = "-" if b["used_fraction"] is None else f"{b['used_fraction']:.0%}"
            budgets.add_row(b["policy"], b["budget"], b["project"] or "(pool)",
                            _money(b["spent_usd"]), _money(b["committed_usd"]),
                            _money(b["limit_usd"]), used, b["grade"] or "-")
    return [policies, budgets] if budgets.row_count else [policies]


def _money(value: str | None) -> str:
    return "-" if value is None else f"{float(value):,.2f}"
