"""Scale-up: turn unmet demand into launches, within every limit, and say why.

The offering is chosen once per tick: the candidate with the lowest expected cost for *all* unmet
demand (nodes x price x billed hours), so the decision can show each alternative's cost. Nodes are
then granted job by job in scheduling order (project priority, job priority, oldest first),
packing the jobs onto the granted nodes exactly as :func:`orchestrator.planner.demand.absorb` will
pack them onto those nodes while they boot, until a limit binds:

* per-project quota (``projects[].max_burst_gpus``), counted over the GPUs of nodes launched for
  the project that are still alive;
* pool limits: ``max_nodes`` (nodes in any state but terminated), ``max_concurrent_launches``
  (nodes not yet ready), ``max_hourly_spend_usd`` (sum of hourly prices of alive nodes),
  ``max_burst_gpus``;
* the offering's own ``max_nodes``; when it binds, the next-cheapest candidate takes the rest.

Every limit that held back a node is named in ``held_back_by``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node
from orchestrator.domain.plan import OfferingOption
from orchestrator.planner.demand import Bins
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
    bins: Bins | None = None,
) -> tuple[list[Grant], list[str]]:
    """Grant nodes for the unmet jobs; return the grants and the limits that bound.

    ``unmet`` comes in scheduling order (project priority, job priority, age), so higher-priority
    work gets nodes first when a limit binds. Nodes are sized by packing the jobs with the same
    :class:`~orchestrator.planner.demand.Bins`, in the same order, that
    :func:`~orchestrator.planner.demand.absorb` uses next tick to fit pending jobs onto the granted
    nodes (then booting): so the next tick finds the spike absorbed and does not launch for it
    again. (Sizing each project with the FFD histogram of ``nodes_needed`` while absorbing in
    scheduling order answered one spike twice whenever the two packings disagreed, e.g. jobs of
    3, 3, 5, 5 GPUs on 8-GPU nodes: 2 nodes, then 1 more. ``nodes_needed`` still prices options.)

    A job that needs a new node takes it from the cheapest candidate unless a limit binds: a
    project quota holds back that project's jobs only; a pool-wide limit stops all launching
    (a multi-node job it stops is skipped); the offering's own ``max_nodes`` passes the job to the
    next candidate.
    """
    grants: list[Grant] = []
    held_back: list[str] = []

    def hold(blocker: str) -> None:
        if blocker not in held_back:
            held_back.append(blocker)

    # The packing continues from the burst capacity absorb left (``bins``): unmet jobs go on
    # granted nodes, and a multi-node job also on whole nodes already there.
    bins = bins if bins is not None else Bins([])
    left = list(unmet)
    for candidate in ranked:
        size = candidate.offering.gpus
        bins.node_size = bins.node_size or size
        offering_limit = f"offerings[{candidate.offering.key}].max_nodes"
        carried: list[Job] = []  # jobs this offering's max_nodes kept out: next candidate's turn
        pool_bound = False
        for job in left:
            if bins.place(job.gpus) is not None:
                continue  # fits on a node already there or granted this tick
            if pool_bound:
                continue
            if job.gpus <= bins.node_size:
                if job.gpus > size:
                    carried.append(job)  # a one-node job this offering's nodes cannot hold
                    continue
                count = 1
            else:
                count = -(-job.gpus // bins.node_size) - bins.whole()
            # A multi-node job gets all its missing nodes at once or none: a part of them would
            # run nothing, idle and be drained, or be launched again next tick (the nodes in
            # flight cannot hold the job), a flap; a limit smaller than its need holds it back.
            blocker = _blocker(budget, candidate, count)
            quota = policy.project_quota(job.project)
            if blocker is None and quota is not None and held_gpus.get(job.project, 0) + count * size > quota:
                blocker = f"projects[{job.project}].max_burst_gpus"
            if blocker is not None:
                hold(blocker)
                if blocker == offering_limit:
                    carried.append(job)
                elif not blocker.startswith("projects[") and count == 1:
                    pool_bound = True  # not one more node in the pool: no other offering helps
                continue  # (a multi-node job that does not fit is skipped, as in a backfill)
            for _ in range(count):
                budget.take(candidate)
                grants.append(Grant(candidate, job.project))
                bins.add(size)
            held_gpus[job.project] = held_gpus.get(job.project, 0) + count * size
            bins.place(job.gpus)  # fits now (nodes of one size; mixed sizes are an estimate)
        if pool_bound or not carried:
            break
        left = carried
    return grants, held_back


def _blocker(budget: Budget, candidate: Candidate, count: int) -> str | None:
    """The limit that stops ``count`` more nodes of ``candidate``, if any (budget unchanged)."""
    if count == 1:
        return budget.blocker(candidate)
    trial = replace(budget, per_offering=dict(budget.per_offering))
    for _ in range(count):
        blocker = trial.blocker(candidate)
        if blocker is not None:
            return blocker
        trial.take(candidate)
    return None
