"""The wait-aware rule on the on-prem nodes (``trigger.wait_model: nodes``), and which jobs to
burst (``trigger.displacement``).

The pooled rule (:mod:`.wait`) places unmet jobs on the on-prem GPUs as one pool; here they are
placed as the cluster will run them: node by node, with the backfill model the simulator's
``slurm`` on-prem scheduler and Slurm itself use (:class:`~orchestrator.planner.backfill.NodeSpace`:
each node's free GPUs over future time from the running jobs' expected ends; a job up to a node
wide on one node, best fit; a wider job on whole nodes). The node space is built from the
snapshot: ``OnPremState.free_per_node`` and each release's ``node``. Node sizes are the pool's
GPUs divided evenly among the nodes (or, where they do not divide, each node's free GPUs plus its
releases).

In scheduling order, each unmet job not yet past its deadline gets its earliest start in the
space. Started by its deadline: *deferred* (it stays queued; its GPUs are reserved there, as
Slurm reserves for every job it tests, so later jobs plan around it). Otherwise it is *late*
(burst at its deadline, :mod:`.wait`), except a job no burst node can hold (wider than the
widest offering, ``placement.one_node_per_job``): it will wait on-prem whatever the planner does,
so its reservation is held too and it stays due (the scale-up says why nothing launches for it).

**Displacement.** When a late job J could be burst only at a cost ``c(J)`` (its runtime on the
cheapest offering that holds it on one node), the deferred jobs ahead of it that are cheaper
(``c < c(J)``, in increasing cost: the short and narrow ones), predicted on-prem within
``lookahead``, are candidates: the fewest of the first ``max_displaced`` of them (while their
costs add up to less than ``c(J)``) whose removal from the space lets J start on-prem by its
deadline are *displaced*: burst now (due at once, so they leave the on-prem queue before the
GPUs free up), and J is deferred in their place. Only already-queued jobs are moved; no arrival
is assumed. A late job no burst node holds counts as infinitely dear (only displacement can
keep its SLO; its record's ``for_cloud_cost_usd`` is None). At most :data:`MAX_TRIES` late jobs
are tried per tick. Each displacement is recorded
(the displaced job, whom for, both predicted on-prem starts and both cloud costs).

**Until when the answer holds** (:attr:`NodeSplit.holds_s`; :mod:`.wait`). The node space is
built from fixed instants (the running jobs' expected ends), so on the same snapshot planned
``d`` seconds later it is the same space with its first ``d`` seconds cut off. Every earliest
start the split looked up that lies beyond ``d`` is then found again at the same instant (an
earlier window that fits would have been found first), so every reservation, verdict and
displacement is the same, while ``d`` stays under: each start looked up (a start at ``now``, or
the tick's on-prem starts held from ``now``, leave no room: 0), each simulated job's on-prem
bound, and for displacement the time until a deferred job beyond ``lookahead`` comes within it.

Pure: ``now`` is an argument; times inside are seconds from now.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter

from orchestrator.domain.jobs import Job
from orchestrator.domain.pending import to_us
from orchestrator.domain.snapshot import PoolQueue
from orchestrator.planner import node_steps
from orchestrator.planner.backfill import INF, Allocation, NodeSpace
from orchestrator.policy.models import Displacement

MAX_TRIES = 8  # late jobs tried for displacement per tick (each try rebuilds the space a few times)
RECORDED = 20  # displacements recorded per decision at most


@dataclass(slots=True)
class _Held:
    job: Job
    alloc: Allocation
    start: float
    length: float
    movable: bool  # a deferred job (a candidate for displacement)


@dataclass(slots=True)
class NodeSplit:
    """What the node model decided (indices into the jobs it was given)."""

    deferred: list[int] = field(default_factory=list)
    late: list[int] = field(default_factory=list)  # burst at their deadline
    displaced: list[int] = field(default_factory=list)  # burst now, for a dearer job
    stuck: list[int] = field(default_factory=list)  # late, but no burst node holds them
    records: list[dict] = field(default_factory=list)
    holds_s: float = INF  # how long (s) the same split stands (module docstring)


# The last answer of node_space_problem, with the two tuples it read: a plan asks it several
# times of one queue (the margin, the split, the record), and it walks every release.
_last_problem: list = [None, None, None]
_NODE = attrgetter("node")


def node_space_problem(queue: PoolQueue) -> str | None:
    """Why the snapshot cannot give a node space (None: it can)."""
    per = queue.onprem.free_per_node
    releases = queue.onprem_releases
    if _last_problem[0] is per and _last_problem[1] is releases:
        return _last_problem[2]
    problem = None
    if not per:
        problem = "the queue source reports no free GPUs per node"
    elif releases:
        try:  # (one C-level pass: a node None fails the comparison)
            unknown = max(map(_NODE, releases)) >= len(per)
        except TypeError:
            unknown = True
        if unknown:
            problem = "the queue source reports running jobs without their node"
    _last_problem[:] = [per, releases, problem]
    return problem


def _length(job: Job) -> float:
    return INF if job.duration_s is None else max(float(job.duration_s), 1.0)


class _Space:
    """Builds the node space of the snapshot (with the tick's on-prem starts) on demand: once,
    then a copy for each fresh space asked for (a displacement's tries)."""

    def __init__(self, queue: PoolQueue, absorbed: Sequence[Job], now: datetime):
        self.queue = queue
        self.now_us = to_us(now)
        self.absorbed = absorbed
        self._base: NodeSpace | None = None
        self.holds_s = INF  # the earliest start looked up, or bound met (module docstring)

    def bound(self, seconds: float) -> None:
        self.holds_s = min(self.holds_s, seconds)

    def fresh(self, held: Sequence[_Held] = ()) -> NodeSpace:
        base = self._base
        if base is None:  # the space, and where this tick's on-prem starts go
            base = self._base = self._build()
            for job in self.absorbed:
                alloc = base.fits_now(job.gpus, _length(job))
                if alloc is not None:
                    base.hold(alloc, 0.0, _length(job))
                    self.holds_s = 0.0  # held from now: moves with the clock
        space = base.copy()
        for h in held:
            space.hold(h.alloc, h.start, h.length)
        return space

    def _build(self) -> NodeSpace:
        """``NodeSpace(sizes, free, ends, 0.0)`` with each release's end in seconds from now
        (as ``(ends_at - now).total_seconds()``), from what is kept across plans: each node's
        steps are read when first asked (:mod:`.node_steps`)."""
        return node_steps.space(self.queue, self.now_us)


def split_on_nodes(jobs: Sequence[Job], deadlines: Sequence[float], absorbed: Sequence[Job],
                   queue: PoolQueue, now: datetime, burst_width: int | None,
                   displacement: Displacement | None,
                   cloud_cost: Callable[[Job], float | None]) -> NodeSplit:
    """Place ``jobs`` (in scheduling order; ``deadlines`` in seconds from now, all ahead) on the
    node space; see the module docstring. ``burst_width``: the widest job a burst node holds
    (None: any); ``cloud_cost``: a job's cost on its cheapest offering (None: no offering)."""
    builder = _Space(queue, absorbed, now)
    space = builder.fresh()
    out = NodeSplit()
    held: list[_Held] = []
    index_of: dict[int, int] = {}  # id(job) -> index in jobs
    tries = 0
    horizon = displacement.lookahead.total_seconds() if displacement is not None else INF
    for index, (job, deadline) in enumerate(zip(jobs, deadlines)):
        index_of[id(job)] = index
        length = _length(job)
        found = space.earliest(job.gpus, length)
        builder.bound(deadline if found is None else min(deadline, found[0]))
        if found is not None and found[0] <= deadline:
            space.hold(found[1], found[0], length)
            held.append(_Held(job, found[1], found[0], length, True))
            out.deferred.append(index)
            continue
        stuck = burst_width is not None and job.gpus > burst_width
        if displacement is not None and tries < MAX_TRIES and length < INF:
            # No burst node holds a stuck job: only displacement can keep its SLO (worth any
            # cheaper set of at most max_displaced jobs).
            cost = INF if stuck else cloud_cost(job)
            if cost is not None:
                tries += 1
                moved = _displace(builder, held, job, deadline, cost, displacement, horizon,
                                  cloud_cost)
                if moved is not None:
                    chosen, new_space, start, alloc = moved
                    space = new_space
                    gone = {id(h.job) for h in chosen}
                    held = [h for h in held if id(h.job) not in gone]
                    held.append(_Held(job, alloc, start, length, False))
                    for h in chosen:
                        position = index_of[id(h.job)]
                        out.deferred.remove(position)
                        out.displaced.append(position)
                        if len(out.records) < RECORDED:
                            out.records.append({
                                "job": h.job.id, "displaced_for": job.id,
                                "predicted_onprem_start_s": round(h.start, 1),
                                "cloud_cost_usd": round(cloud_cost(h.job) or 0.0, 2),
                                "for_predicted_onprem_start_s": round(start, 1),
                                "for_cloud_cost_usd": (None if cost == INF
                                                       else round(cost, 2))})
                    out.deferred.append(index)
                    continue
        if stuck:
            if found is not None:  # it will wait on-prem: later jobs plan around it
                space.hold(found[1], found[0], length)
                held.append(_Held(job, found[1], found[0], length, False))
            out.stuck.append(index)
            continue
        out.late.append(index)
    out.deferred.sort()
    out.displaced.sort()
    out.holds_s = builder.holds_s
    return out


def _displace(builder: _Space, held: list[_Held], job: Job, deadline: float, cost: float,
              config: Displacement, horizon: float, cloud_cost: Callable[[Job], float | None]
              ) -> tuple[list[_Held], NodeSpace, float, Allocation] | None:
    """The fewest cheapest deferred jobs whose removal starts ``job`` on-prem by ``deadline``,
    with the space without them, the job's start and allocation; None if there are none."""
    priced = []
    for h in held:
        if not h.movable:
            continue
        if h.start > horizon:
            builder.bound(h.start - horizon)  # comes within the lookahead then
            continue
        c = cloud_cost(h.job)
        if c is not None and c < cost:
            priced.append((c, h.start, h))
    if not priced:
        return None
    priced.sort(key=lambda item: (item[0], -item[1]))
    prefix: list[_Held] = []
    total = 0.0
    for c, _, h in priced[:config.max_displaced]:
        if cost < INF and total + c >= cost:
            break
        total += c
        prefix.append(h)
    if not prefix:
        return None
    length = _length(job)

    def attempt(m: int) -> tuple[NodeSpace, float, Allocation] | None:
        gone = {id(h.job) for h in prefix[:m]}
        space = builder.fresh([h for h in held if id(h.job) not in gone])
        found = space.earliest(job.gpus, length)
        if found is not None:
            builder.bound(found[0])
        if found is None or found[0] > deadline:
            return None
        return space, found[0], found[1]

    best = attempt(len(prefix))
    if best is None:
        return None
    best_m = len(prefix)
    lo, hi = 1, len(prefix) - 1  # the fewest that still work (fewer removed: more stays on-prem)
    while lo <= hi:
        mid = (lo + hi) // 2
        trial = attempt(mid)
        if trial is not None:
            best, best_m, hi = trial, mid, mid - 1
        else:
            lo = mid + 1
    space, start, alloc = best
    space.hold(alloc, start, length)
    return prefix[:best_m], space, start, alloc


def cheapest_cost(prices: Sequence[tuple[int, float]],
                  spanning: Sequence[tuple[int, float]] = (),
                  max_nodes: int | None = None) -> Callable[[Job], float | None]:
    """A job's cloud cost on the cheapest usable offering that holds it: ``prices`` are (GPUs per
    node, USD per hour) of the usable offerings, on one node each. Where the fabric spans nodes,
    ``spanning`` are the offerings a job wider than one of their nodes may take as a launch group
    of ``ceil(gpus / node GPUs)`` whole nodes (at most ``max_nodes``), priced as that many nodes:
    an 8-GPU job on two 4-GPU nodes costs two of them, not the 8-GPU node's price."""
    table = sorted(prices)
    groups = sorted(spanning)

    def cost(job: Job) -> float | None:
        if job.duration_s is None:
            return None
        best = math.inf
        for gpus, price in table:
            if gpus >= job.gpus and price < best:
                best = price
        for gpus, price in groups:
            if gpus >= job.gpus or gpus <= 0:
                continue
            count = -(-job.gpus // gpus)
            if (max_nodes is None or count <= max_nodes) and count * price < best:
                best = count * price
        return None if best == math.inf else best * float(job.duration_s) / 3600.0

    return cost


__all__ = ["MAX_TRIES", "NodeSplit", "cheapest_cost", "node_space_problem", "split_on_nodes"]
