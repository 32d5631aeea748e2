"""Scale-up: turn unmet demand into launches, within every limit, and say why.

The offering is chosen once per tick: the candidate with the lowest expected cost for *all* unmet
demand (nodes x price x billed hours), so the decision can show each alternative's cost. Nodes are
then granted project by project in priority order (ties: the project whose oldest job has waited
longest goes first), each project packing its own jobs, until a limit binds:

* per-project quota (``projects[].max_burst_gpus``), counted over the GPUs of nodes launched for
  the project that are still alive;
* pool limits: ``max_nodes`` (nodes in any state but terminated), ``max_concurrent_launches``
  (nodes not yet ready), ``max_hourly_spend_usd`` (sum of hourly prices of alive nodes),
  ``max_burst_gpus``;
* the offering's own ``max_nodes``; when it binds, the next-cheapest candidate takes the rest.

Every limit that held back a node is named in ``held_back_by``.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node
from orchestrator.domain.plan import OfferingOption
from orchestrator.planner.offerings import Candidate, expected_cost, expected_hours, nodes_needed
from orchestrator.policy.models import Policy


@dataclass(slots=True)
class Budget:
    """Room left under each pool limit; consumed as nodes are granted."""

    nodes: int
    launches: int
    spend_usd_hour: float | None
    gpus: int | None
    per_offering: dict[str, int | None] = field(default_factory=dict)

    def blocker(self, candidate: Candidate) -> str | None:
        o = candidate.offering
        if self.nodes <= 0:
            return "limits.max_nodes"
        if self.launches <= 0:
            return "limits.max_concurrent_launches"
        if self.spend_usd_hour is not None and o.price_usd_hour > self.spend_usd_hour + 1e-9:
            return "limits.max_hourly_spend_usd"
        if self.gpus is not None and o.gpus > self.gpus:
            return "limits.max_burst_gpus"
        room = self.per_offering.get(o.key)
        if room is not None and room <= 0:
            return f"offerings[{o.key}].max_nodes"
        return None

    def take(self, candidate: Candidate) -> None:
        o = candidate.offering
        self.nodes -= 1
        self.launches -= 1
        if self.spend_usd_hour is not None:
            self.spend_usd_hour -= o.price_usd_hour
        if self.gpus is not None:
            self.gpus -= o.gpus
        room = self.per_offering.get(o.key)
        if room is not None:
            self.per_offering[o.key] = room - 1


def pool_budget(policy: Policy, nodes: list[Node], candidates: list[Candidate]) -> Budget:
    alive = [n for n in nodes if n.state.counts_toward_limits]
    limits = policy.limits
    spend = None
    if limits.max_hourly_spend_usd is not None:
        spend = float(limits.max_hourly_spend_usd) - sum(n.price_usd_hour for n in alive)
    gpus = None if limits.max_burst_gpus is None else limits.max_burst_gpus - sum(n.gpus for n in alive)
    per_offering: dict[str, int | None] = {}
    for c in candidates:
        if c.max_nodes is not None:
            used = sum(1 for n in alive if n.offering_key == c.offering.key)
            per_offering[c.offering.key] = c.max_nodes - used
    return Budget(
        nodes=limits.max_nodes - len(alive),
        launches=limits.max_concurrent_launches - sum(1 for n in alive if n.state.in_flight),
        spend_usd_hour=spend,
        gpus=gpus,
        per_offering=per_offering,
    )


def price_options(unmet: tuple[Job, ...], candidates: list[Candidate]) -> list[OfferingOption]:
    """Each candidate's node count and expected cost for all unmet demand, cheapest first."""
    widths = Counter(j.gpus for j in unmet)
    hours = expected_hours([j.duration_s for j in unmet])
    options = []
    for c in candidates:
        n = nodes_needed(widths, c.offering.gpus)
        options.append(OfferingOption(c.offering.key, c.offering.gpus, c.offering.price_usd_hour,
                                      n, round(expected_cost(c.offering, n, hours), 4)))
    options.sort(key=lambda o: (o.expected_cost_usd, o.nodes, o.offering_key))
    return options


@dataclass(frozen=True, slots=True)
class Grant:
    """One node to launch, of ``candidate``, for ``project``."""

    candidate: Candidate
    project: str


def grant_nodes(
    policy: Policy,
    unmet: tuple[Job, ...],
    ranked: list[Candidate],
    budget: Budget,
    held_gpus: dict[str, int],
) -> tuple[list[Grant], list[str]]:
    """Grant nodes project by project in priority order; return grants and limits that bound."""
    by_project: dict[str, list[Job]] = defaultdict(list)
    for job in unmet:
        by_project[job.project].append(job)
    priorities = {p.name: p.priority for p in policy.projects}
    order = sorted(
        by_project,
        key=lambda p: (-priorities.get(p, policy.default_project_priority),
                       min(j.submitted_at for j in by_project[p]), p),
    )
    grants: list[Grant] = []
    held_back: list[str] = []
    for project in order:
        quota = policy.project_quota(project)
        remaining = Counter(j.gpus for j in by_project[project])
        for candidate in ranked:
            need = nodes_needed(remaining, candidate.offering.gpus)
            if need == 0:
                break
            granted = 0
            for _ in range(need):
                blocker = budget.blocker(candidate)
                if blocker is None and quota is not None:
                    if held_gpus.get(project, 0) + candidate.offering.gpus > quota:
                        blocker = f"projects[{project}].max_burst_gpus"
                if blocker is not None:
                    if blocker not in held_back:
                        held_back.append(blocker)
                    break
                budget.take(candidate)
                held_gpus[project] = held_gpus.get(project, 0) + candidate.offering.gpus
                grants.append(Grant(candidate, project))
                granted += 1
            if granted == need:
                remaining = Counter()
                break
            remaining = _shrink(remaining, granted * candidate.offering.gpus)
            if not _offering_bound(held_back, candidate):
                break  # a pool-wide limit or the quota bound: no other offering helps
    return grants, held_back


def _offering_bound(held_back: list[str], candidate: Candidate) -> bool:
    return bool(held_back) and held_back[-1] == f"offerings[{candidate.offering.key}].max_nodes"


def _shrink(widths: Counter[int], gpus_served: int) -> Counter[int]:
    """Drop served work, widest first (a partial grant serves the front of the project's queue)."""
    left = Counter(widths)
    for width in sorted(left, reverse=True):
        while left[width] and gpus_served >= width:
            left[width] -= 1
            gpus_served -= width
    return +left
