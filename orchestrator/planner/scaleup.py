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
* the offering's own ``max_nodes``; when it binds, the next-cheapest candidate takes the rest;
* budgets (:mod:`.budgets`): a launch must fit the commitment it makes, the hourly burn cap and the
  grade in force of every budget of its scope;
* placement (:mod:`.placement`): a job wider than one node gets ``ceil(gpus / node_gpus)`` nodes
  of one candidate at once, or none (a launch group); where the fabric cannot span nodes (the
  built-in queue) it is not launched for (``placement.one_node_per_job``): its nodes would bill
  while nothing could start it. A group bigger than ``max_nodes`` is held
  (``placement.wider_than_max_nodes``); candidates without the interconnect
  ``multi_node_requires`` asks for are passed over (``multi_node_requires``).

Between projects of equal priority, when a pool-wide limit binds, nodes are shared by max-min
fairness (see :func:`grant_nodes`). Every limit that held back a node is named in
``held_back_by``.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from decimal import Decimal
from operator import attrgetter

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.planner.budgets import BudgetBook, commitment_usd, job_runtime_s
from orchestrator.planner.demand import Bins
from orchestrator.planner.offerings import (
    Candidate,
)
from orchestrator.planner.placement import (
    MULTI_NODE,
    NO_INTERCONNECT,
    WIDER_THAN_LIMIT,
    nodes_for,
    spans_nodes,
)
from orchestrator.policy.models import Policy

_IN_FLIGHT = frozenset(s for s in NodeState if s.in_flight)
_GPUS = attrgetter("gpus")
_DURATION = attrgetter("duration_s")


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
        room = self.per_offering.get(candidate.key)
        if room is not None and room <= 0:
            return f"offerings[{candidate.key}].max_nodes"
        return None

    def clone(self) -> Budget:
        return replace(self, per_offering=dict(self.per_offering))

    def assign(self, other: Budget) -> None:
        """Take ``other``'s room (a clone that was planned with and kept)."""
        for f in fields(self):
            setattr(self, f.name, getattr(other, f.name))

    def take(self, candidate: Candidate) -> None:
        o = candidate.offering
        self.nodes -= 1
        self.launches -= 1
        if self.spend_usd_hour is not None:
            self.spend_usd_hour -= o.price_usd_hour
        if self.gpus is not None:
            self.gpus -= o.gpus
        room = self.per_offering.get(candidate.key)
        if room is not None:
            self.per_offering[candidate.key] = room - 1


def pool_budget(policy: Policy, nodes: list[Node], candidates: list[Candidate]) -> Budget:
    terminated = NodeState.TERMINATED
    alive = [n for n in nodes if n.state is not terminated]
    limits = policy.limits
    spend = None
    if limits.max_hourly_spend_usd is not None:
        spend = float(limits.max_hourly_spend_usd) - sum(n.price_usd_hour for n in alive)
    gpus = None if limits.max_burst_gpus is None else limits.max_burst_gpus - sum(n.gpus for n in alive)
    per_offering: dict[str, int | None] = {}
    if any(c.max_nodes is not None for c in candidates):
        by_offering = Counter(n.offering_key for n in alive)
        for c in candidates:
            if c.max_nodes is not None:
                per_offering[c.key] = c.max_nodes - by_offering[c.key]
    return Budget(
        nodes=limits.max_nodes - len(alive),
        launches=limits.max_concurrent_launches - sum(1 for n in alive if n.state in _IN_FLIGHT),
        spend_usd_hour=spend,
        gpus=gpus,
        per_offering=per_offering,
    )


@dataclass(frozen=True, slots=True)
class Grant:
    """One node to launch, of ``candidate``, for ``project``; it commits ``commit_usd`` of budget
    for ``runtime_s`` of work (the jobs in ``jobs``, which run on it side by side)."""

    candidate: Candidate
    project: str
    runtime_s: float = 0.0
    commit_usd: Decimal = Decimal(0)
    jobs: tuple[str, ...] = ()
    # Launch group: index of the group's first grant (this tick) and its node count; -1: alone.
    group: int = -1
    group_size: int = 1
    users: frozenset[str | None] = frozenset()  # the users of ``jobs`` (None: a job of no user)

    @property
    def user(self) -> str | None:
        """The one user of all its jobs, if there is one (the ``burst:user`` tag)."""
        return next(iter(self.users)) if len(self.users) == 1 else None


def grant_nodes(
    policy: Policy,
    unmet: tuple[Job, ...],
    ranked: list[Candidate],
    budget: Budget,
    held_gpus: dict[str, int],
    bins: Bins | None = None,
    books: BudgetBook | None = None,
    rank_for: Callable[[Job], list[Candidate]] | None = None,
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
    next candidate, and so does a budget (``books``: its commitment does not fit, its grade keeps
    on-demand out or stops launches, its hourly burn is reached), since a cheaper node or a
    shorter job may still fit. A job packed onto a node granted earlier this tick stretches that
    node's commitment to its own runtime, if the node's budgets cover the difference; if not it
    is held back by them.

    Fair share: when a pool-wide limit (or pool budget) binds and two or more projects of equal
    priority are waiting, the grants are planned again in fair order: within each priority the
    next job served is the one of the project holding the fewest burst GPUs per unit of weight
    (``held_gpus`` plus this tick's grants, divided by ``projects[].weight``), ties to the job
    first in scheduling order (max-min fairness by water-filling). Jobs of one project keep their
    scheduling order. When nothing pool-wide binds, every job is granted in scheduling order and
    the packing agrees with ``absorb`` as above.

    ``rank_for`` (``spot.by_expected_cost``, :mod:`.spot`): each job's own ranking of the
    candidates. Jobs are then granted group by group of equal ranking (groups in the order of
    their first job, scheduling order within), each group as above with its own ranking.
    """
    bins = bins if bins is not None else Bins([])
    rivals = _equal_priority_rivals(unmet, policy)
    first = _Pass(policy, ranked, budget, held_gpus, bins, books)
    # With rivals, the first pass gives up as soon as a pool-wide limit binds: fair order decides.
    first.run(unmet, fair=False, stop_if_pool_limited=rivals, rank_for=rank_for)
    chosen = first
    if rivals and first.pool_limited() and not first.settled:
        second = _Pass(policy, ranked, budget, held_gpus, bins, books)
        second.run(unmet, fair=True, rank_for=rank_for)
        chosen = second
    budget.assign(chosen.budget)
    held_gpus.clear()
    held_gpus.update(chosen.held)
    if books is not None and chosen.books is not None:
        books.assign(chosen.books)
    return chosen.grants, chosen.held_back


def _equal_priority_rivals(jobs: tuple[Job, ...], policy: Policy) -> bool:
    """Whether two projects of equal priority have unmet work (fair share has something to do)."""
    priorities = {p.name: p.priority for p in policy.projects}
    default = policy.default_project_priority
    first: dict[int, str] = {}
    for job in jobs:
        seen = first.setdefault(priorities.get(job.project, default), job.project)
        if seen != job.project:
            return True
    return False


class _Pass:
    """One planning of the grants, on copies of the limits' state (kept or thrown away)."""

    def __init__(self, policy: Policy, ranked: list[Candidate], budget: Budget,
                 held: dict[str, int], bins: Bins, books: BudgetBook | None):
        self.policy = policy
        self.ranked = ranked
        self.budget = budget.clone()
        self.held = dict(held)
        self.bins = bins.copy()
        self.books = books.copy() if books is not None else None
        self.grants: list[Grant] = []
        self.held_back: list[str] = []
        self.granted_bin: dict[int, int] = {}  # bin index -> index in grants (this tick's nodes)
        self.pool_budgets = books.pool_names() if books is not None else set()
        self.full = False  # no node more in the pool: order no longer decides any grant
        self.spans = spans_nodes(policy)
        self.settled = False  # the outcome is final: no other order can grant anything

    def hold(self, blocker: str) -> None:
        if blocker not in self.held_back:
            self.held_back.append(blocker)

    def pool_limited(self) -> bool:
        """Whether a pool-wide limit or a pool budget held something back."""
        return any(self._pool_wide(b) for b in self.held_back)

    def _pool_wide(self, blocker: str) -> bool:
        return blocker.startswith("limits.") or blocker.split(".")[0] in self.pool_budgets

    def run(self, unmet: tuple[Job, ...], fair: bool, stop_if_pool_limited: bool = False,
            rank_for: Callable[[Job], list[Candidate]] | None = None) -> None:
        if rank_for is None:
            # read lazily: a bound pool stops after a few of up to 100k jobs
            self._run(unmet, self.ranked, fair, stop_if_pool_limited)
            return
        groups: dict[tuple[str, ...], tuple[list[Candidate], list[Job]]] = {}
        for job in unmet:
            ranking = rank_for(job)
            groups.setdefault(tuple(c.key for c in ranking), (ranking, []))[1].append(job)
        for ranking, jobs in groups.values():
            if not self._run(jobs, ranking, fair, stop_if_pool_limited):
                return

    def _run(self, left: Sequence[Job], ranked: list[Candidate], fair: bool,
             stop_if_pool_limited: bool) -> bool:
        """Grant nodes for ``left`` from ``ranked``; False when the pass is over (settled, or to
        be thrown away for the fair one)."""
        # The packing continues from the burst capacity absorb left (``bins``): unmet jobs go on
        # nodes already there or granted this tick, each on one node.
        bins = self.bins
        for candidate in ranked:
            size = candidate.offering.gpus
            bins.node_size = bins.node_size or size
            offering_limit = f"offerings[{candidate.key}].max_nodes"
            carried: list[Job] = []  # jobs this offering could not take: next candidate's turn
            pool_bound = self.full = False
            for job in (self._fair_order(left) if fair else left):
                # One node per job: the dispatcher places no job across burst nodes.
                where = bins.peek(job.gpus) if job.gpus <= bins.node_size else None
                if where is not None:
                    self._pack(job, where)  # on a node already there or granted this tick
                    continue
                if pool_bound:
                    continue
                count = 1
                if job.gpus > size:
                    count = self._group_size(job, candidate)
                    if count == 0:
                        carried.append(job)  # this offering cannot hold it: the next's turn
                        continue
                # The limits first: the commitment (Decimal arithmetic) is worked out only for a
                # job they let through, since a bound pool can turn down thousands of jobs a tick.
                blocker = _blocker(self.budget, candidate, count)
                quota = self.policy.project_quota(job.project)
                if (blocker is None and quota is not None
                        and self.held.get(job.project, 0) + count * size > quota):
                    blocker = f"projects[{job.project}].max_burst_gpus"
                if blocker is None:
                    runtime = job_runtime_s(self.policy, job.duration_s)
                    commit = commitment_usd(self.policy, candidate.offering, runtime)
                    if self.books is not None:
                        blocker = self.books.blocker(job.project, candidate.offering, commit, count)
                if blocker is not None:
                    self.hold(blocker)
                    if blocker == offering_limit or blocker.startswith("budgets["):
                        carried.append(job)
                    elif not blocker.startswith("projects[") and count == 1:
                        # not one more node in the pool: no other offering helps
                        pool_bound = self.full = True
                        if not self.grants:
                            # Nothing granted and nothing can be: whatever the order, this is
                            # the outcome (what is left would only pack onto nodes already there).
                            self.settled = True
                            return False
                    if stop_if_pool_limited and self._pool_wide(blocker):
                        return False  # this pass is thrown away: the fair one decides
                    continue
                if count > 1:
                    self._grant_group(job, candidate, count, runtime, commit)
                    continue
                self.budget.take(candidate)
                if self.books is not None:
                    self.books.take(job.project, candidate.offering, commit)
                bins.add(size)
                self.granted_bin[len(bins.free) - 1] = len(self.grants)
                self.grants.append(Grant(candidate, job.project, runtime, commit))
                self.held[job.project] = self.held.get(job.project, 0) + size
                self._attach(job, bins.place(job.gpus) or [])  # fits now (nodes of one size)
            if pool_bound or not carried:
                break
            left = carried
        else:
            widest = max((c.offering.gpus for c in ranked), default=0)
            if not self.spans and any(job.gpus > widest for job in left):
                # The fabric starts a job on one node: a job wider than every offering's node is
                # not launched for, its nodes would bill while nothing can start it.
                self.hold(MULTI_NODE)
        return True

    def _group_size(self, job: Job, candidate: Candidate) -> int:
        """Nodes of ``candidate`` a job wider than one of its nodes takes as one launch group;
        0 when it cannot have them from this candidate (the hold names why)."""
        if not self.spans:
            return 0
        need = self.policy.multi_node_requires
        if not need.met_by(candidate.offering.interconnect):
            self.hold(NO_INTERCONNECT)
            return 0
        count = nodes_for(job.gpus, candidate.offering.gpus)
        cap = candidate.max_nodes
        if count > self.policy.limits.max_nodes or (cap is not None and count > cap):
            self.hold(WIDER_THAN_LIMIT)  # never partly launched: not even once room is made
            return 0
        return count

    def _grant_group(self, job: Job, candidate: Candidate, count: int, runtime: float,
                     commit: Decimal) -> None:
        """``count`` nodes of ``candidate`` for one multi-node job: granted together (the limits
        let all of them through), each whole node taken by the job."""
        first = len(self.grants)
        for _ in range(count):
            self.budget.take(candidate)
            if self.books is not None:
                self.books.take(job.project, candidate.offering, commit)
            self.bins.add(0)  # a whole node the job fills: nothing else packs onto it
            self.granted_bin[len(self.bins.free) - 1] = len(self.grants)
            self.grants.append(Grant(candidate, job.project, runtime, commit, (job.id,),
                                     group=first, group_size=count,
                                     users=frozenset((job.user,))))
        self.held[job.project] = self.held.get(job.project, 0) + count * candidate.offering.gpus

    def _pack(self, job: Job, where: list[int]) -> None:
        """Place ``job`` on the bins ``where`` (peeked); nodes granted this tick stretch their
        commitment to its runtime, or the job is held back by the budget that cannot pay it."""
        runtime = job_runtime_s(self.policy, job.duration_s)
        stretch: list[tuple[int, Decimal]] = []
        for index in where:
            g = self.granted_bin.get(index)
            if g is not None and self.grants[g].runtime_s < runtime:
                grant = self.grants[g]
                longer = commitment_usd(self.policy, grant.candidate.offering, runtime)
                extra = longer - grant.commit_usd
                stretch.append((g, extra))
        if stretch and self.books is not None:
            extras: dict[str | None, Decimal] = {}
            for g, extra in stretch:
                project = self.grants[g].project
                extras[project] = extras.get(project, Decimal(0)) + extra
            blocker = self.books.extend_blocker(extras)
            if blocker is not None:
                self.hold(blocker)
                return  # not placed: the node granted this tick is not committed for it
        for g, extra in stretch:
            grant = self.grants[g]
            if self.books is not None:
                self.books.extend(grant.project, extra)
            self.grants[g] = replace(grant, runtime_s=runtime, commit_usd=grant.commit_usd + extra)
        self._attach(job, self.bins.place(job.gpus) or [])

    def _attach(self, job: Job, used: list[int]) -> None:
        for index in used:
            g = self.granted_bin.get(index)
            if g is not None:
                grant = self.grants[g]
                self.grants[g] = replace(grant, jobs=grant.jobs + (job.id,),
                                         users=grant.users | {job.user})

    def _fair_order(self, jobs: list[Job]) -> Iterator[Job]:
        """``jobs`` (in scheduling order) by priority, and within a priority by water-filling:
        next comes the job of the project with the fewest GPUs held per weight (read live, as
        grants are made), ties to the job first in scheduling order.

        Jobs are read lazily, by one cursor filling a queue per project as far as needed: the
        limit usually binds after a few hundred jobs, and 100k pending jobs should not all be
        sorted into queues for that.
        """
        priorities = {p.name: p.priority for p in self.policy.projects}
        default = self.policy.default_project_priority
        weights = {p.name: p.weight for p in self.policy.projects}
        held = self.held
        classes: dict[int, set[str]] = {}
        for priority, project in {(priorities.get(j.project, default), j.project) for j in jobs}:
            classes.setdefault(priority, set()).add(project)
        queues: dict[str, deque[int]] = {p: deque() for ps in classes.values() for p in ps}
        cursor = 0
        served: set[int] = set()

        def head(project: str) -> int | None:
            """Index of the project's next job, reading on as far as needed."""
            nonlocal cursor
            queue = queues[project]
            while not queue and cursor < len(jobs):
                queues[jobs[cursor].project].append(cursor)
                cursor += 1
            return queue[0] if queue else None

        def share(project: str) -> float:
            return held.get(project, 0) / weights.get(project, 1.0)

        for priority in sorted(classes, reverse=True):
            heap = []
            for project in classes[priority]:
                first = head(project)
                if first is not None:
                    heap.append((share(project), first, project))
            heapq.heapify(heap)
            while heap:
                if self.full:
                    # Once the pool is full only packing onto nodes already there is left: the
                    # rest goes in scheduling order (higher priorities were all served already).
                    yield from (job for i, job in enumerate(jobs) if i not in served)
                    return
                _, index, project = heapq.heappop(heap)
                queues[project].popleft()
                served.add(index)
                yield jobs[index]  # the caller may grant it nodes: the project's share changes
                following = head(project)
                if following is not None:
                    heapq.heappush(heap, (share(project), following, project))


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
