"""Demand: which pending jobs on-prem and existing burst capacity will absorb, and what is left.

Jobs are considered in scheduling order (project priority, job priority, then oldest first). Each
is fitted first into free on-prem GPUs, then into free GPUs of ready burst nodes and the full GPUs
of nodes still booting (so a spike already being answered is not answered twice). What fits
nowhere is *unmet* demand, the only thing that may cause a launch.

On-prem, a job wider than one node needs that many whole nodes (multi-node training); a smaller
job takes GPUs of one node. On burst nodes a job takes GPUs of one node only: that is all the
dispatcher places (:mod:`orchestrator.sources.builtin`), so a burst node counts as covering a job
only if the job could really be started on it. The fitting is first-fit over bins of free GPUs, which is what the built-in
queue's dispatcher and Slurm's backfill roughly do; it is an estimate for planning, not a schedule.

Speed (100k pending jobs): the scheduling order is worked out on positions into the pending tuple
and memoized on its identity (:func:`ordered`); once nothing is free anywhere, the rest of the
order is unmet and is tallied from the queue's columns (:meth:`Ordered.tail`), not job by job.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from itertools import accumulate
from operator import attrgetter, getitem, itemgetter

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node
from orchestrator.domain.snapshot import PoolQueue
from orchestrator.planner.census import Census, take_census
from orchestrator.planner.offerings import expected_hours
from orchestrator.policy.models import Policy

_submitted = attrgetter("submitted_at")
_priority = attrgetter("priority")


class Bins:
    """Free GPUs per node, indexed by how many GPUs are free, so placing a job is O(node size).

    A job goes to the bin with the *least* free room that fits it (best fit), which keeps whole
    nodes free for wide jobs. ``total`` lets a full set of bins stop the work early.
    """

    __slots__ = ("_by_free", "free", "node_size", "owners", "total")

    def __init__(self, free: list[int], owners: list[str | None] | None = None, node_size: int = 0):
        self.free = list(free)
        self.owners = list(owners) if owners else [None] * len(self.free)
        self.node_size = node_size or max(self.free, default=0)
        self.total = sum(self.free)
        top = max(self.free, default=0)
        self._by_free: list[list[int]] = [[] for _ in range(top + 1)]
        for index in range(len(self.free) - 1, -1, -1):  # pop() then yields the lowest index first
            self._by_free[self.free[index]].append(index)

    def add(self, gpus: int, owner: str | None = None) -> None:
        """Open one more bin (a node about to be launched) with ``gpus`` free."""
        while len(self._by_free) <= gpus:
            self._by_free.append([])
        self.free.append(gpus)
        self.owners.append(owner)
        self.node_size = max(self.node_size, gpus)
        self._by_free[gpus].append(len(self.free) - 1)
        self.total += gpus

    def place(self, gpus: int) -> list[int] | None:
        """Place a job; return the indexes of the bins used, or None if it does not fit."""
        if 0 < gpus <= self.node_size:
            # :meth:`peek`'s choice and :meth:`_move` written out: absorption places up to tens
            # of thousands of one-node jobs a tick, and the calls were half the cost.
            if gpus > self.total:
                return None
            by_free = self._by_free
            for room in range(gpus, len(by_free)):
                bucket = by_free[room]
                if bucket:
                    index = bucket.pop()  # the last bin of the least room that fits
                    self.total -= gpus
                    self.free[index] = room - gpus
                    by_free[room - gpus].append(index)
                    return [index]
            return None
        used = self.peek(gpus)
        if not used:
            return used
        by_free = self._by_free
        # Multi-node job: whole free nodes, each emptied.
        for index in used:
            by_free[self.free[index]].remove(index)
            self._move(index, 0)
        return used

    def place_if(self, gpus: int, ok: Callable[[int], bool]) -> list[int] | None:
        """Place a one-node job (``gpus`` <= ``node_size``) on the bin :meth:`place` would pick
        among those ``ok`` accepts (asked in that order; the first yes is used)."""
        if not 0 < gpus <= self.node_size or gpus > self.total:
            return None
        by_free = self._by_free
        for room in range(gpus, len(by_free)):
            bucket = by_free[room]
            for position in range(len(bucket) - 1, -1, -1):
                index = bucket[position]
                if ok(index):
                    del bucket[position]
                    self.total -= gpus
                    self.free[index] = room - gpus
                    by_free[room - gpus].append(index)
                    return [index]
        return None

    def peek(self, gpus: int) -> list[int] | None:
        """The bins :meth:`place` uses for a job of ``gpus``, without placing it: the bin with the least room
        that fits a one-node job, or ``ceil(gpus / node_size)`` whole free nodes, lowest first."""
        if gpus <= 0:
            return []
        if gpus > self.total:
            return None
        by_free = self._by_free
        if gpus <= self.node_size:
            for room in range(gpus, len(by_free)):
                if by_free[room]:
                    return [by_free[room][-1]]
            return None
        needed = -(-gpus // self.node_size)
        whole = [i for room in range(self.node_size, len(by_free)) for i in by_free[room]]
        if len(whole) < needed:
            return None
        return sorted(whole)[:needed]

    def copy(self) -> Bins:
        """An independent copy (to try a packing and keep it or not)."""
        other = Bins.__new__(Bins)
        other.free = list(self.free)
        other.owners = list(self.owners)
        other.node_size = self.node_size
        other.total = self.total
        other._by_free = [list(b) for b in self._by_free]
        return other

    def whole(self) -> int:
        """How many bins are whole free nodes (what a multi-node job can use)."""
        if not self.node_size:
            return 0
        return sum(len(b) for b in self._by_free[self.node_size:])

    def _move(self, index: int, room: int) -> None:
        self.total -= self.free[index] - room
        self.free[index] = room
        self._by_free[room].append(index)


@dataclass(frozen=True, slots=True)
class Demand:
    """The outcome of absorbing a pool's pending jobs into existing capacity (totals precomputed)."""

    ordered: tuple[Job, ...]  # every pending job, in scheduling order
    onprem_absorbed: tuple[Job, ...]
    burst_absorbed: tuple[Job, ...]
    unmet: tuple[Job, ...]  # fits nowhere: candidates for new nodes
    busy_nodes: frozenset[str]  # ready burst nodes that absorbed some pending job
    beyond_onprem: tuple[Job, ...] = ()  # jobs on-prem cannot start now (the trigger looks at these)
    pending_gpus: int = 0
    unmet_gpus: int = 0
    oldest_beyond: datetime | None = None  # submit time of the oldest job on-prem cannot start
    # Burst capacity left after absorbing (free GPUs of ready and booting nodes): scale-up packs
    # the unmet jobs onto it first, so a multi-node job can use whole nodes already there.
    burst: Bins | None = None
    # What the decision record and the pricing read of ``unmet``, tallied from the queue's
    # columns (:class:`Ordered`) instead of walking up to 100k jobs again; None: not tallied
    # (read ``unmet`` itself), as after the wait-aware split replaces ``unmet``.
    onprem_absorbed_gpus: int | None = None
    burst_absorbed_gpus: int | None = None
    unmet_by_project: dict[str, int] | None = None  # GPUs, projects in order of first unmet job
    unmet_widths: Counter[int] | None = None  # unmet jobs per width
    unmet_hours: float | None = None  # expected_hours of the unmet jobs' durations

    def oldest_wait_s(self, now: datetime) -> float:
        if self.oldest_beyond is None:
            return 0.0
        return max((now - self.oldest_beyond).total_seconds(), 0.0)

    def absorbed_onprem_gpus(self) -> int:
        """GPUs of the jobs absorbed on-prem (tallied, or counted when not)."""
        if self.onprem_absorbed_gpus is not None:
            return self.onprem_absorbed_gpus
        return sum(map(_gpus, self.onprem_absorbed))

    def absorbed_burst_gpus(self) -> int:
        """GPUs of the jobs absorbed on burst nodes (tallied, or counted when not)."""
        if self.burst_absorbed_gpus is not None:
            return self.burst_absorbed_gpus
        return sum(map(_gpus, self.burst_absorbed))

    def without_tallies(self, unmet: tuple[Job, ...]) -> Demand:
        """The same demand with another ``unmet`` (the wait-aware split's), its tallies dropped."""
        return dataclasses.replace(self, unmet=unmet, unmet_gpus=sum(map(_gpus, unmet)),
                                   unmet_by_project=None, unmet_widths=None, unmet_hours=None)

    def narrowed(self, unmet: tuple[Job, ...], removed: tuple[Job, ...]) -> Demand:
        """The same demand with ``unmet`` narrowed to a subsequence of it (the wait-aware split's
        due jobs), ``removed`` the rest. The integer tallies lose what ``removed`` held (a few
        jobs, where recounting would walk up to 100k); the result equals a recount. Where a
        project would be left with no GPUs (so whether it is still listed depends on jobs of no
        GPUs), and for the mean duration (a float sum), it counts again."""
        by_project, widths = self.unmet_by_project, self.unmet_widths
        if by_project is None or widths is None:
            return self.without_tallies(unmet)
        left = dict(by_project)
        kept = Counter(widths)
        for job in removed:
            left[job.project] -= job.gpus
            kept[job.gpus] -= 1
        if any(gpus <= 0 for gpus in left.values()):
            return self.without_tallies(unmet)
        order: dict[str, int] = {}  # projects in the order of their first job still unmet
        for project in map(_project, unmet):
            if project not in order:
                order[project] = left[project]
                if len(order) == len(left):
                    break
        return dataclasses.replace(self, unmet=unmet, unmet_gpus=sum(order.values()),
                                   unmet_by_project=order, unmet_widths=+kept,
                                   unmet_hours=expected_hours(list(map(_duration, unmet))))


def scheduling_order(jobs: tuple[Job, ...] | list[Job], policy: Policy) -> list[Job]:
    """Higher project priority first, then higher job priority, then oldest, then id."""
    return list(ordered(jobs, policy).jobs)


class Ordered:
    """A queue's pending jobs in scheduling order, with the per-job columns absorption reads.

    The order is worked out on positions into the queue's tuple, reading each job's attributes
    once, in the queue's own order: at 100k jobs a pass over the jobs in scheduling order (spread
    over memory) cost several times a pass in queue order. What the record tallies of the jobs
    after a position (:meth:`tail`) is read from the columns.
    """

    __slots__ = ("_durations", "_gpus", "_order", "_pairs", "_projects", "_starts", "_submitted",
                 "_tails", "jobs", "pending_gpus", "queue")

    def __init__(self, queue: tuple[Job, ...] | list[Job], order: list[int], submitted: list,
                 gpus: list[int], projects: list[str] | None, starts: list[int]):
        self.queue = queue
        self._order = order  # positions in ``queue``, in scheduling order
        # itemgetter fetches them all in one C call (a map of __getitem__ cost 3x as much)
        self.jobs: tuple[Job, ...] = (itemgetter(*order)(queue) if len(order) > 1
                                      else tuple(queue[i] for i in order))
        self._starts = starts  # where each (project priority, job priority) class begins
        self._submitted = submitted  # columns in queue order
        self._gpus = gpus
        self._projects = projects
        self._durations: list[float | None] | None = None
        self._pairs: Counter[tuple[str, int]] | None = None
        self._tails: dict[int, Tail] = {}
        self.pending_gpus = sum(gpus)

    def gpus_in_order(self) -> Iterator[int]:
        """Each job's GPUs, in scheduling order."""
        return map(self._gpus.__getitem__, self._order)

    def tail(self, start: int) -> Tail:
        """What the record reads of the jobs from position ``start`` on (kept per ``start``)."""
        tail = self._tails.get(start)
        if tail is None:
            if len(self._tails) >= 8:
                self._tails.clear()
            tail = self._tails[start] = self._tail(start)
        return tail

    def _tail(self, start: int) -> Tail:
        if self._projects is None:
            self._projects = list(map(_project, self.queue))
        if self._durations is None:
            self._durations = list(map(_duration, self.queue))
        projects, gpus, order = self._projects, self._gpus, self._order
        rest = order[start:]
        if start < len(order) // 2:
            # The whole queue's (project, width) tally, less the head's (counted in C, queue
            # order; integer counts, so the difference is exact).
            if self._pairs is None:
                self._pairs = Counter(zip(projects, gpus))
            head = order[:start]
            pairs = self._pairs - Counter(zip(map(projects.__getitem__, head),
                                              map(gpus.__getitem__, head)))
        else:
            pairs = Counter(zip(map(projects.__getitem__, rest), map(gpus.__getitem__, rest)))
        # Projects in the order of their first job in the tail (the record keeps that order).
        wanted = len({project for project, _ in pairs})
        first: dict[str, None] = {}
        for project in map(projects.__getitem__, rest):
            if project not in first:
                first[project] = None
                if len(first) == wanted:
                    break
        # Each class is in age order: the tail's first earliest job heads one of its classes.
        heads = [start] + [b for b in self._starts if b > start]
        oldest = min(map(self._submitted.__getitem__, map(order.__getitem__, heads)))
        known = list(filter(None, map(self._durations.__getitem__, rest)))
        return Tail(pairs, tuple(first), oldest, known)


@dataclass(frozen=True, slots=True)
class Tail:
    """The jobs of an :class:`Ordered` queue from one position on, as the record reads them."""

    pairs: Counter[tuple[str, int]]  # (project, GPUs) -> jobs
    projects: tuple[str, ...]  # in order of their first job
    oldest: datetime | None  # the first earliest submit time
    known_durations: list[float]  # the truthy durations, in order


_ORDER_MEMO: OrderedDict[tuple, Ordered] = OrderedDict()
_ORDER_MEMO_SIZE = 4
_ORDER_MEMO_LOCK = threading.Lock()  # the API and the loop may plan in two threads


def ordered(jobs: tuple[Job, ...] | list[Job], policy: Policy) -> Ordered:
    """The jobs in scheduling order; see :func:`scheduling_order`.

    A pure memo keyed on the identity of the pending tuple (immutable, of frozen jobs; the entry
    keeps it alive, so its id is not reused while cached) and on the value of the project
    priorities: the simulator hands the same tuple for as long as its queue does not change, and
    the order of a 100k queue is the planner's largest cost. A list is never memoized.
    """
    projects = policy.projects
    default = policy.default_project_priority
    if type(jobs) is not tuple:
        return _arrange(jobs, {p.name: p.priority for p in projects}, default)
    key = (id(jobs), tuple((p.name, p.priority) for p in projects), default)
    with _ORDER_MEMO_LOCK:
        entry = _ORDER_MEMO.get(key)
        if entry is not None and entry.queue is jobs:
            _ORDER_MEMO.move_to_end(key)
            return entry
    entry = _arrange(jobs, {p.name: p.priority for p in projects}, default)
    with _ORDER_MEMO_LOCK:
        _ORDER_MEMO[key] = entry
        if len(_ORDER_MEMO) > _ORDER_MEMO_SIZE:
            _ORDER_MEMO.popitem(last=False)
    return entry


def _arrange(jobs: tuple[Job, ...] | list[Job], priorities: dict[str, int], default: int
             ) -> Ordered:
    """Sort positions by age, then stably by (project priority, job priority), highest first."""
    n = len(jobs)
    submitted = list(map(_submitted, jobs))
    # Sorted by id, then stably by submit time, is the (submitted_at, id) order with one-attribute
    # keys (a tuple key compares each pair of times twice); without equal submit times the id
    # sort is not needed (and a queue already in submit order then sorts in linear time).
    if len(set(submitted)) == n:
        order = sorted(range(n), key=submitted.__getitem__)
    else:
        ids = list(map(_id, jobs))
        order = sorted(range(n), key=ids.__getitem__)
        order.sort(key=submitted.__getitem__)
    priority = list(map(_priority, jobs))
    projects = None
    starts = [0]
    if priorities or default or any(priority):
        # Each job's (project priority, job priority) class as its rank among all such classes
        # (highest first), looked up in C; a stable sort by rank is the stable split into classes.
        projects = list(map(_project, jobs))
        levels = set(priority)
        table = {project: {level: (priorities.get(project, default), level) for level in levels}
                 for project in set(projects)}
        classes = sorted({c for row in table.values() for c in row.values()}, reverse=True)
        if len(classes) > 1:
            rank = {c: i for i, c in enumerate(classes)}
            for row in table.values():
                for level, c in row.items():
                    row[level] = rank[c]
            ranks = list(map(getitem, map(table.__getitem__, projects), priority))
            order.sort(key=ranks.__getitem__)
            sizes = Counter(ranks)
            starts = list(accumulate((sizes[r] for r in sorted(sizes)), initial=0))[:-1]
    return Ordered(jobs, order, submitted, list(map(_gpus, jobs)), projects, starts)


_id = attrgetter("id")
_project = attrgetter("project")
_duration = attrgetter("duration_s")


def absorb(queue: PoolQueue | None, nodes: list[Node], policy: Policy,
           census: Census | None = None,
           admit: Callable[[Job, str], bool] | None = None) -> Demand:
    """Fit the pool's pending jobs into on-prem, then burst capacity; see the module docstring.
    ``census``: the burst capacity as :func:`~orchestrator.planner.census.take_census` gathered
    it from ``nodes`` this tick (gathered here when not given). ``admit(job, node id)``: whether
    the dispatcher would start the job on that burst node (budgets,
    :mod:`orchestrator.planner.admission`); asked node by node, a yes commits the start."""
    if queue is None or not queue.pending:
        return Demand((), (), (), (), frozenset())
    order = ordered(queue.pending, policy)
    jobs = order.jobs
    onprem_free = list(queue.onprem.free_per_node) or (
        [queue.onprem.free_gpus] if queue.onprem.free_gpus else []
    )
    onprem = Bins(onprem_free, node_size=policy.pool.onprem.gpus_per_node)
    if census is None:
        census = take_census(nodes, policy, None)
    # Free GPUs of ready nodes, all GPUs of nodes in flight. The node size is that of the nodes,
    # not of their largest free remainder: with only half-busy 8-GPU nodes, a 6-GPU job must not
    # count as a "multi-node" job spread over two 4-GPU remainders (it fits on neither node).
    burst = Bins(census.burst_free, census.burst_owners, node_size=census.burst_node_size)

    onprem_absorbed: list[Job] = []
    burst_absorbed: list[Job] = []
    unmet: list[Job] = []
    onprem_gpus = burst_gpus = 0
    busy: set[str] = set()
    owners = burst.owners
    burst_size = burst.node_size
    onprem_place, burst_place = onprem.place, burst.place
    stop = len(jobs)  # from here on nothing is free anywhere: the rest is all unmet
    for index, gpus in enumerate(order.gpus_in_order()):
        if not onprem.total and not burst.total:
            stop = index
            break
        if onprem.total and onprem_place(gpus) is not None:
            onprem_absorbed.append(jobs[index])
            onprem_gpus += gpus
            continue
        # Burst nodes take a job only on one node (the built-in queue's dispatcher places no job
        # across nodes): a wider job is never absorbed there, so no node counts as covering it.
        used = None
        if burst.total and gpus <= burst_size:
            if admit is None:
                used = burst_place(gpus)
            else:
                job = jobs[index]
                used = burst.place_if(gpus, lambda i, job=job: admit(job, owners[i]))
        if used is not None:
            burst_absorbed.append(jobs[index])
            burst_gpus += gpus
            for i in used:
                if owners[i] is not None:
                    busy.add(owners[i])
            continue
        unmet.append(jobs[index])
    # The unmet jobs: those that fitted nowhere before ``stop``, then all from ``stop`` on,
    # tallied by (project, width) from the columns (the jobs before ``stop``: read directly).
    pairs = Counter(zip(map(_project, unmet), map(_gpus, unmet)))
    durations = list(map(_duration, unmet))
    oldest = min(map(_submitted, burst_absorbed), default=None)
    head_oldest = min(map(_submitted, unmet), default=None)
    if head_oldest is not None and (oldest is None or head_oldest < oldest):
        oldest = head_oldest
    projects = dict.fromkeys(project for project, _ in pairs)
    if stop < len(jobs):
        tail = order.tail(stop)
        pairs.update(tail.pairs)
        for project in tail.projects:
            projects.setdefault(project)
        durations.extend(tail.known_durations)
        if tail.oldest is not None and (oldest is None or tail.oldest < oldest):
            oldest = tail.oldest
        unmet_jobs = tuple(unmet) + jobs[stop:]
    else:
        unmet_jobs = tuple(unmet)
    by_project = dict.fromkeys(projects, 0)
    widths: Counter[int] = Counter()
    for (project, gpus), count in pairs.items():
        by_project[project] += gpus * count
        widths[gpus] += count
    burst_jobs = tuple(burst_absorbed)
    if admit is not None:
        # An unmet job was refused by (or does not fit) every node already there: scale-up packs
        # it onto this tick's new nodes only.
        burst = Bins([], node_size=burst.node_size)
    return Demand(jobs, tuple(onprem_absorbed), burst_jobs, unmet_jobs,
                  frozenset(busy), burst_jobs + unmet_jobs, order.pending_gpus,
                  sum(by_project.values()), oldest, burst, onprem_gpus, burst_gpus,
                  by_project, widths, expected_hours(durations))


_gpus = attrgetter("gpus")


def oldest_wait_s(jobs: tuple[Job, ...], now: datetime) -> float:
    if not jobs:
        return 0.0
    return max((now - min(j.submitted_at for j in jobs)).total_seconds(), 0.0)
