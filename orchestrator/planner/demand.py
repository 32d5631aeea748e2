"""Demand: which pending jobs on-prem and existing burst capacity will absorb, and what is left.

Jobs are considered in scheduling order (project priority, job priority, then oldest first). Each
is fitted first into free on-prem GPUs, then into free GPUs of ready burst nodes and the full GPUs
of nodes still booting (so a spike already being answered is not answered twice). What fits
nowhere is *unmet* demand, the only thing that may cause a launch.

On-prem, a job wider than one node needs that many whole nodes (multi-node training); a smaller
job takes GPUs of one node. On burst nodes a job takes GPUs of one node only where the fabric is
the built-in queue: that is all its dispatcher places (:mod:`orchestrator.sources.builtin`), so a
burst node counts as covering a job only if the job could really be started on it; a fabric that
spans nodes (Slurm, torch elastic) takes a wide job on whole free burst nodes. The fitting is first-fit over bins of free GPUs, which is what the built-in
queue's dispatcher and Slurm's backfill roughly do; it is an estimate for planning, not a schedule.

Speed (100k pending jobs): the queue is read as columns
(:class:`~orchestrator.domain.pending.PendingColumns`: what a queue source builds from its query,
or built once from a tuple of jobs); the scheduling order is one ``numpy.lexsort`` of them,
memoized on the identity of the pending sequence (:func:`ordered`); once nothing is free
anywhere, the rest of the order is unmet and is tallied on the columns (:meth:`Ordered.tail`),
not job by job. The ordered, unmet and burst-absorbed jobs are
:class:`~orchestrator.domain.pending.JobsView` s: positions, each Job made only when read.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter

import numpy as np

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node
from orchestrator.domain.pending import JobsView, PendingColumns, columns_of
from orchestrator.domain.snapshot import PoolQueue
from orchestrator.planner.admission import ANY_NODE, NodeAdmitter
from orchestrator.planner.census import Census, take_census
from orchestrator.planner.offerings import expected_hours
from orchestrator.planner.placement import spans_nodes
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


class OwnedBins:
    """Burst bins of one absorption under quotas alone: :class:`Bins`' best fit, or the best fit
    among the bins of some classes (whose node it is, :meth:`NodeAdmitter.node_class`), each
    found without asking bin by bin.

    Each bucket of free room is kept whole and per class, in the order bins entered it (a
    stamp each), so the bin :meth:`Bins.place_if` would find scanning a bucket from its end is
    the latest-stamped last bin of an allowed class. Absorption only fills bins, so a bin leaves
    a room for good: an entry is live while its bin's free room is that room (dead ones are
    dropped when they reach the end).
    """

    __slots__ = ("_buckets", "_by_class", "_classes", "_seq", "_stamp", "free", "node_size",
                 "total")

    def __init__(self, bins: Bins, classes: list[object]):
        self.free = list(bins.free)
        self.total = bins.total
        self.node_size = bins.node_size
        self._classes = classes
        self._buckets = [list(bucket) for bucket in bins._by_free]
        self._by_class: list[dict[object, list[int]]] = [{} for _ in self._buckets]
        self._stamp = [0] * len(self.free)
        seq = 0
        for room, bucket in enumerate(self._buckets):
            by_class = self._by_class[room]
            for index in bucket:
                seq += 1
                self._stamp[index] = seq
                by_class.setdefault(classes[index], []).append(index)
        self._seq = seq

    def _last(self, entries: list[int], room: int) -> int | None:
        free = self.free
        while entries and free[entries[-1]] != room:
            entries.pop()
        return entries[-1] if entries else None

    def place(self, gpus: int, allowed: tuple[object, ...] | None = None) -> int | None:
        """Place a one-node job on the bin :meth:`Bins.place` would pick (``allowed`` None), or
        :meth:`Bins.place_if` with ``ok(i)`` being ``classes[i] in allowed``; its index, or
        None."""
        if not 0 < gpus <= self.node_size or gpus > self.total:
            return None
        stamp = self._stamp
        for room in range(gpus, len(self._buckets)):
            if allowed is None:
                index = self._last(self._buckets[room], room)
            else:
                index = None
                by_class = self._by_class[room]
                for klass in allowed:
                    entries = by_class.get(klass)
                    found = self._last(entries, room) if entries else None
                    if found is not None and (index is None or stamp[found] > stamp[index]):
                        index = found
            if index is not None:
                left = room - gpus
                self.free[index] = left
                self.total -= gpus
                self._seq += 1
                stamp[index] = self._seq
                self._buckets[left].append(index)
                self._by_class[left].setdefault(self._classes[index], []).append(index)
                return index
        return None


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
        return dataclasses.replace(self, unmet=unmet, unmet_gpus=gpus_of(unmet),
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
        for project in first_projects(unmet, len(left)):
            order[project] = left[project]
        return dataclasses.replace(self, unmet=unmet, unmet_gpus=sum(order.values()),
                                   unmet_by_project=order, unmet_widths=+kept,
                                   unmet_hours=unmet_hours(unmet))


def scheduling_order(jobs: Sequence[Job], policy: Policy) -> list[Job]:
    """Higher project priority first, then higher job priority, then oldest, then id."""
    return list(ordered(jobs, policy).jobs)


class Ordered:
    """A queue's pending jobs in scheduling order, as positions into its columns.

    The order is one ``numpy.lexsort`` of the columns (:func:`_arrange`); ``jobs`` is a view
    that makes a Job only for a position read one by one (the jobs absorption places). What the
    record tallies of the jobs after a position (:meth:`tail`) is counted on the columns.
    """

    __slots__ = ("_starts", "_tails", "columns", "jobs", "order", "pending_gpus", "queue")

    def __init__(self, queue: Sequence[Job], columns: PendingColumns, order: np.ndarray,
                 starts: list[int]):
        self.queue = queue  # the pending sequence as the snapshot holds it (the memo's key)
        self.columns = columns
        self.order = order  # positions in ``columns``, in scheduling order
        self.jobs = JobsView(columns, order)
        self._starts = starts  # where each (project priority, job priority) class begins
        self._tails: dict[int, Tail] = {}
        self.pending_gpus = int(columns.gpus.sum())

    def gpus_in_order(self) -> Iterator[int]:
        """Each job's GPUs, in scheduling order."""
        return iter(self.columns.gpus[self.order].tolist())

    def tail(self, start: int) -> Tail:
        """What the record reads of the jobs from position ``start`` on (kept per ``start``)."""
        tail = self._tails.get(start)
        if tail is None:
            if len(self._tails) >= 8:
                self._tails.clear()
            tail = self._tails[start] = self._tail(start)
        return tail

    def _tail(self, start: int) -> Tail:
        columns = self.columns
        rest = self.order[start:]
        codes = columns.project[rest]
        gpus = columns.gpus[rest]
        # (project, width) pairs counted as one integer key each.
        span = int(gpus.max()) + 1 if len(gpus) else 1
        keys, counts = np.unique(codes * span + gpus, return_counts=True)
        names = columns.projects
        pairs = Counter({(names[k // span], k % span): c
                         for k, c in zip(keys.tolist(), counts.tolist())})
        # Projects in the order of their first job in the tail (the record keeps that order).
        present, first = np.unique(codes, return_index=True)
        projects = tuple(names[c] for c in present[np.argsort(first, kind="stable")].tolist())
        oldest = None
        if len(rest):  # the first earliest job of the tail (its own datetime)
            oldest = columns.job(int(rest[int(np.argmin(columns.submitted_us[rest]))])).submitted_at
        durations = columns.duration_s[rest]
        known = durations[~np.isnan(durations) & (durations != 0)]
        return Tail(pairs, projects, oldest, known)


@dataclass(frozen=True, slots=True)
class Tail:
    """The jobs of an :class:`Ordered` queue from one position on, as the record reads them."""

    pairs: Counter[tuple[str, int]]  # (project, GPUs) -> jobs
    projects: tuple[str, ...]  # in order of their first job
    oldest: datetime | None  # the first earliest submit time
    known_durations: np.ndarray  # the truthy durations, in order


_ORDER_MEMO: OrderedDict[tuple, Ordered] = OrderedDict()
_ORDER_MEMO_SIZE = 4
_ORDER_MEMO_LOCK = threading.Lock()  # the API and the loop may plan in two threads


def ordered(jobs: Sequence[Job], policy: Policy) -> Ordered:
    """The jobs in scheduling order; see :func:`scheduling_order`.

    A pure memo keyed on the identity of the pending sequence (a tuple of frozen jobs, or the
    columns a queue source built; the entry keeps it alive, so its id is not reused while cached)
    and on the value of the project priorities: the simulator hands the same tuple for as long as
    its queue does not change. A list is never memoized.
    """
    projects = policy.projects
    default = policy.default_project_priority
    if type(jobs) is not tuple and not isinstance(jobs, PendingColumns):
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


def _arrange(jobs: Sequence[Job], priorities: dict[str, int], default: int) -> Ordered:
    """One lexsort of the columns: (project priority, job priority) highest first, then submit
    time, then id (read only when two jobs share a submit time), then queue position."""
    columns = columns_of(jobs)
    n = len(columns)
    submitted = columns.submitted_us
    keys: list[np.ndarray] = [submitted]
    if n > 1 and len(np.unique(submitted)) < n:
        # Ties in submit time go by id (code point order, as str comparison), then position.
        ids = np.array(columns.ids)
        rank = np.empty(n, dtype=np.int64)
        rank[np.argsort(ids, kind="stable")] = np.arange(n)
        keys.insert(0, rank)
    starts = [0]
    classed = False
    if n and (priorities or default or columns.priority.any()):
        project_priority = np.array([priorities.get(p, default) for p in columns.projects],
                                    dtype=np.int64)[columns.project]
        level = columns.priority
        if (project_priority.min() != project_priority.max()
                or level.min() != level.max()):
            keys += [-level, -project_priority]
            classed = True
    order = np.lexsort(keys) if n else np.empty(0, dtype=np.int64)
    if classed:
        ranked_p, ranked_l = project_priority[order], level[order]
        change = (ranked_p[1:] != ranked_p[:-1]) | (ranked_l[1:] != ranked_l[:-1])
        starts += (np.flatnonzero(change) + 1).tolist()
    return Ordered(jobs, columns, order, starts)


def absorb(queue: PoolQueue | None, nodes: list[Node], policy: Policy,
           census: Census | None = None,
           admit: NodeAdmitter | None = None) -> Demand:
    """Fit the pool's pending jobs into on-prem, then burst capacity; see the module docstring.
    ``census``: the burst capacity as :func:`~orchestrator.planner.census.take_census` gathered
    it from ``nodes`` this tick (gathered here when not given). ``admit(job, node id)``: whether
    the dispatcher would start the job on that burst node (budgets,
    :mod:`orchestrator.planner.admission`); asked node by node, a yes commits the start."""
    if queue is None or not queue.pending:
        return Demand((), (), (), (), frozenset())
    order = ordered(queue.pending, policy)
    columns = order.columns
    job_at = columns.job
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
    burst_rows: list[int] = []
    unmet_rows: list[int] = []
    onprem_gpus = burst_gpus = 0
    busy: set[str] = set()
    owners = burst.owners
    burst_size = burst.node_size
    onprem_place, burst_place = onprem.place, burst.place
    spans = spans_nodes(policy)
    rows = order.order
    stop = len(rows)  # from here on nothing is free anywhere: the rest is all unmet
    if onprem.total or burst.total:
        rows_list = rows.tolist()
        refused: dict[tuple[int, int, float], int] = {}
        if admit is not None:  # what a verdict reads of a job besides its width, per row
            codes = columns.project.tolist()
            durations_key = np.nan_to_num(columns.duration_s, nan=-1.0).tolist()
            names = columns.projects
            admission = admit.admission
            # Quotas only, and no job spread over nodes (the one other placement on these
            # bins): the bins by whose node they are (the Bins are replaced after absorption).
            classes = (list(map(admit.node_class, owners)) if admit.quotas_only and not spans
                       else None)
            owned = OwnedBins(burst, classes) if classes is not None else None
        for index, gpus in enumerate(order.gpus_in_order()):
            if not onprem.total and not burst.total:
                stop = index
                break
            if onprem.total and onprem_place(gpus) is not None:
                onprem_absorbed.append(job_at(rows_list[index]))
                onprem_gpus += gpus
                continue
            # Burst nodes take a job only on one node (the built-in queue's dispatcher places no
            # job across nodes): a wider job is never absorbed there, so no node counts as
            # covering it.
            used = None
            if burst.total and gpus > burst_size and spans:
                # A fabric that spans nodes (Slurm, torch elastic) starts a wide job on whole
                # free nodes: those of its launch group while they boot.
                used = burst_place(gpus)
            elif burst.total and gpus <= burst_size:
                if admit is None:
                    used = burst_place(gpus)
                else:
                    row = rows_list[index]
                    # A (project, width, duration) refused on every bin stays refused while the
                    # bins only fill and no start loosened admission (NodeAdmitter.loosened):
                    # without this, each job of a project over its quota asked every node.
                    key = (codes[row], gpus, durations_key[row])
                    if classes is not None:
                        # Quotas only: a job within its quota is admitted on any bin (the
                        # plain best fit), one over it only on its project's nodes and nodes
                        # in flight; the chosen node's start is then taken as the dispatcher
                        # would (its verdict is a yes by construction).
                        project = names[codes[row]]
                        placed = None
                        if admission.over_quota(project, gpus):
                            if refused.get(key) != admit.loosened:
                                placed = owned.place(gpus, (ANY_NODE, project))
                                if placed is None:
                                    refused[key] = admit.loosened
                        else:
                            placed = owned.place(gpus)
                        if placed is not None:
                            used = [placed]
                            burst.total = owned.total  # the loop's stop reads it
                            admit(job_at(row), owners[placed])
                    elif refused.get(key) != admit.loosened:
                        job = job_at(row)
                        used = burst.place_if(gpus, lambda i, job=job: admit(job, owners[i]))
                        if used is None:
                            refused[key] = admit.loosened
            if used is not None:
                burst_rows.append(rows_list[index])
                burst_gpus += gpus
                for i in used:
                    if owners[i] is not None:
                        busy.add(owners[i])
                continue
            unmet_rows.append(rows_list[index])
    else:
        stop = 0
    # The unmet jobs: those that fitted nowhere before ``stop``, then all from ``stop`` on,
    # tallied by (project, width) on the columns (the jobs before ``stop``: read directly).
    unmet = columns.jobs(unmet_rows)
    burst_absorbed = columns.jobs(burst_rows)
    pairs = Counter(zip(map(_project, unmet), map(_gpus, unmet)))
    durations = np.array(list(filter(None, map(_duration, unmet))), dtype=np.float64)
    oldest = min(map(_submitted, burst_absorbed), default=None)
    head_oldest = min(map(_submitted, unmet), default=None)
    if head_oldest is not None and (oldest is None or head_oldest < oldest):
        oldest = head_oldest
    projects = dict.fromkeys(project for project, _ in pairs)
    unmet_index = np.array(unmet_rows, dtype=np.int64)
    if stop < len(rows):
        tail = order.tail(stop)
        pairs.update(tail.pairs)
        for project in tail.projects:
            projects.setdefault(project)
        durations = np.concatenate([durations, tail.known_durations])
        if tail.oldest is not None and (oldest is None or tail.oldest < oldest):
            oldest = tail.oldest
        unmet_index = np.concatenate([unmet_index, rows[stop:]])
    unmet_jobs = JobsView(columns, unmet_index)
    by_project = dict.fromkeys(projects, 0)
    widths: Counter[int] = Counter()
    for (project, gpus), count in pairs.items():
        by_project[project] += gpus * count
        widths[gpus] += count
    burst_jobs = JobsView(columns, np.array(burst_rows, dtype=np.int64))
    if admit is not None:
        # An unmet job was refused by (or does not fit) every node already there: scale-up packs
        # it onto this tick's new nodes only.
        burst = Bins([], node_size=burst.node_size)
    return Demand(order.jobs, tuple(onprem_absorbed), burst_jobs, unmet_jobs,
                  frozenset(busy), burst_jobs + unmet_jobs, order.pending_gpus,
                  sum(by_project.values()), oldest, burst, onprem_gpus, burst_gpus,
                  by_project, widths, _mean_hours(durations))


def _mean_hours(known: np.ndarray) -> float:
    """:func:`~.offerings.expected_hours` of truthy durations held in an array: the sum taken in
    order (``cumsum`` adds one by one, as ``sum`` does, so the figure is the same to the bit)."""
    if not len(known):
        return expected_hours([])
    return float(np.cumsum(known)[-1]) / len(known) / 3600.0


def unmet_hours(jobs: Sequence[Job]) -> float:
    """:func:`~.offerings.expected_hours` of ``jobs``, read from the columns of a view."""
    if isinstance(jobs, JobsView):
        durations = jobs.column("duration_s")
        return _mean_hours(durations[~np.isnan(durations) & (durations != 0)])
    return expected_hours(list(map(_duration, jobs)))


def first_projects(jobs: Sequence[Job], wanted: int | None = None) -> list[str]:
    """The projects of ``jobs`` in the order of their first job (reading no further than the
    first ``wanted`` distinct ones; from the columns of a view)."""
    if isinstance(jobs, JobsView):
        codes = jobs.column("project")
        present, first = np.unique(codes, return_index=True)
        names = jobs.columns.projects
        found = [names[c] for c in present[np.argsort(first, kind="stable")].tolist()]
        return found if wanted is None else found[:wanted]
    seen: dict[str, None] = {}
    for project in map(_project, jobs):
        if project not in seen:
            seen[project] = None
            if len(seen) == wanted:
                break
    return list(seen)


def gpus_by_project(jobs: Sequence[Job]) -> dict[str, int]:
    """GPUs of ``jobs`` per project, projects in the order of their first job."""
    if isinstance(jobs, JobsView):
        codes, gpus = jobs.column("project"), jobs.column("gpus")
        totals = np.bincount(codes, weights=gpus, minlength=len(jobs.columns.projects))
        return {p: int(totals[jobs.columns.projects.index(p)]) for p in first_projects(jobs)}
    per_project: dict[str, int] = {}
    pairs = Counter(zip(map(_project, jobs), map(_gpus, jobs)))
    for (project, width), count in pairs.items():
        per_project[project] = per_project.get(project, 0) + width * count
    return per_project


def gpus_of(jobs: Sequence[Job]) -> int:
    """Total GPUs of ``jobs`` (one sum over the column of a view)."""
    if isinstance(jobs, JobsView):
        return int(jobs.column("gpus").sum())
    return sum(map(_gpus, jobs))


_id = attrgetter("id")
_project = attrgetter("project")
_duration = attrgetter("duration_s")


_gpus = attrgetter("gpus")


def oldest_wait_s(jobs: tuple[Job, ...], now: datetime) -> float:
    if not jobs:
        return 0.0
    return max((now - min(j.submitted_at for j in jobs)).total_seconds(), 0.0)
