"""Slurm's backfill scheduler as a pure model of the on-prem cluster, on its real node shapes.

One module, two users: the simulator's on-prem scheduler (:mod:`orchestrator.sim.world`) starts
what a pass says starts now, and the planner's wait prediction can read the starts a pass plans.
Both therefore schedule the same way, and ``bench/slurm_backfill.py`` checks this model against a
real ``slurmctld`` running ``sched/backfill`` (``docs/simulator.md``, "Checked against Slurm").

A *pass* (Slurm's ``_attempt_backfill``) walks the pending jobs in scheduling order (priority,
then submit order), at most :attr:`BackfillConfig.max_job_test` of them (``bf_max_job_test``):

* the job's earliest start is looked up in the :class:`NodeSpace`: each node's free GPUs over
  future time, from the running jobs' expected ends (their time limits) less what this pass has
  already started or reserved;
* a job whose earliest start is now starts now, on the node with the least free room that holds
  it for its whole time limit (best fit, lowest index on ties: the rule of
  :mod:`orchestrator.sim.pool`);
* any other job gets a *reservation* at its earliest start while fewer than
  :attr:`BackfillConfig.reservations` jobs hold one (Slurm reserves for every job it tests; EASY
  backfill reserves for the first only), so a later job starts now only where it delays none.

A job no wider than a node runs on one node; a wider job takes ``ceil(gpus / node size)`` whole
nodes (all of their GPUs), as ``--nodes=K --gres=gpu:SIZE`` does. A job wider than the cluster
can never start and is skipped. Slurm's main scheduler (strict priority order, stopping at the
first job that does not fit) is :func:`fifo_pass`; Slurm runs it on every job event and the
backfill pass every ``bf_interval``.

Times are plain seconds on the caller's clock. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import compress, count
from operator import itemgetter

import numpy as np

Allocation = tuple[tuple[int, int], ...]  # ((node index, GPUs used), ...), as orchestrator.sim.pool

INF = math.inf
_FIRST = itemgetter(0)


@dataclass(frozen=True, slots=True)
class BackfillConfig:
    """The knobs of Slurm's backfill that change who starts when (``SchedulerParameters``)."""

    max_job_test: int = 500  # bf_max_job_test: pending jobs a pass examines
    reservations: int = 500  # how many blocked jobs a pass reserves for (Slurm: all it tests)

    def __post_init__(self) -> None:
        if self.max_job_test < 1 or self.reservations < 0:
            raise ValueError("max_job_test must be >= 1 and reservations >= 0")


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A pending job as the scheduler sees it: who it is, its GPUs and its time limit."""

    key: Hashable
    gpus: int
    limit_s: float  # the time limit the scheduler plans with (inf: none)


@dataclass(slots=True)
class PassResult:
    """What one pass decided: jobs that start now (with their allocation) and planned starts."""

    started: list[tuple[Hashable, Allocation]] = field(default_factory=list)
    planned: dict[Hashable, float] = field(default_factory=dict)  # reserved job -> start (s)
    tested: int = 0


class NodeSpace:
    """Free GPUs of every node over future time: per node a step function ``times``/``frees``
    (``frees[k]`` GPUs are free from ``times[k]`` until ``times[k + 1]``), starting at ``now``."""

    __slots__ = (
        "_by_next",
        "_dirty",
        "_load",
        "_next",
        "_smallest",
        "_opens",
        "_own",
        "_whole",
        "_widest",
        "free_nodes",
        "free_total",
        "frees",
        "node_size",
        "now",
        "sizes",
        "times",
    )

    def __init__(self, sizes: Sequence[int], free_now: Sequence[int],
                 ends: Iterable[tuple[int, float, int]], now: float):
        """``ends``: (node, expected end, GPUs) of the work running now; an end at or before
        ``now`` frees its GPUs at once."""
        self.sizes = list(sizes)
        self.now = now
        self.node_size = max(self.sizes, default=0)
        per_node: list[list[tuple[float, int]]] = [[] for _ in self.sizes]
        for node, end, gpus in ends:
            per_node[node].append((end, gpus))
        self.times: list[list[float]] = []
        self.frees: list[list[int]] = []
        for node, releases in enumerate(per_node):
            times = [now]
            frees = [free_now[node]]
            for end, gpus in sorted(releases):
                if end <= times[-1]:
                    frees[-1] += gpus
                else:
                    times.append(end)
                    frees.append(frees[-1] + gpus)
            self.times.append(times)
            self.frees.append(frees)
        self._settle()

    @classmethod
    def of_steps(cls, sizes: Sequence[int], times: list[list[float]], frees: list[list[int]],
                 now: float, whole: list[list[tuple[float, float]] | None] | None = None,
                 opens: list[tuple[float, int, float]] | None = None) -> NodeSpace:
        """The space whose step functions are given (each node's ``times`` from ``now`` on,
        strictly increasing, and ``frees``), taken over as they are: what ``__init__`` builds
        from the running jobs' ends, built by a caller that keeps them grouped by node.
        ``whole``: each node's windows of being entirely free, where the caller knows them
        (None: unknown, found when read); ``opens``: those of the nodes of the widest size as
        (opens, node, closes), sorted, where the caller knows them (a node's are read from its
        steps when a hold first changes it)."""
        space = cls.__new__(cls)
        space.sizes = list(sizes)
        space.now = now
        space.node_size = max(space.sizes, default=0)
        space.times = times
        space.frees = frees
        space._settle()
        if whole is not None:
            space._whole = whole
        space._opens = opens
        return space

    @classmethod
    def of_loader(cls, sizes: list[int], load: Callable[[int], tuple[list[float], list[int]]],
                  free_nodes: set[int], free_total: int, nexts: list[float],
                  by_next: list[int], opens: Callable[[], list[tuple[float, int, float]]],
                  now: float = 0.0, widest: list[int] | None = None,
                  smallest: int | None = None) -> NodeSpace:
        """The space whose nodes' step lists are read from ``load(node)`` (``times``, ``frees``,
        as ``of_steps`` takes them; shared: never changed in place) when first asked, for a
        caller that knows the rest without them: the nodes with GPUs free now and how many,
        each node's second step (``nexts``: INF for none) and the nodes by it (``by_next``,
        sorted, ties in any order), and the widest nodes' windows of being entirely free
        (``opens()``: a fresh sorted list as ``of_steps`` takes it, made when a wide job asks).
        A plan reads the steps of a few nodes of hundreds. ``sizes`` is not copied; ``widest``
        (the nodes of the largest size, in order) and ``smallest`` (the smallest size) where the
        caller knows them."""
        space = cls.__new__(cls)
        n = len(sizes)
        space.sizes = sizes
        space.now = now
        if widest is None or smallest is None:
            space.node_size = max(sizes, default=0)
            widest = list(compress(count(), map(space.node_size.__eq__, sizes)))
            smallest = min(sizes, default=0)
        else:
            space.node_size = sizes[widest[0]] if widest else 0
        space._smallest = smallest
        space.times = [None] * n  # type: ignore[list-item]  (read from load when first asked)
        space.frees = [None] * n  # type: ignore[list-item]
        space._load = load
        space.free_total = free_total
        space.free_nodes = free_nodes
        space._whole = [None] * n
        space._widest = widest
        space._opens = opens  # type: ignore[assignment]  (made at the first sweep)
        space._dirty = set()
        space._own = [False] * n  # (the loaded lists are shared)
        space._next = nexts
        space._by_next = by_next
        return space

    def steps(self, node: int) -> tuple[list[float], list[int]]:
        """Node ``node``'s step lists (``times``, ``frees``), read where not yet."""
        times = self.times[node]
        if times is None:
            times, frees = self._load(node)  # type: ignore[misc]
            self.times[node] = times
            self.frees[node] = frees
            return times, frees
        return times, self.frees[node]

    def _settle(self) -> None:
        # (C-level passes: a plan builds a space of every on-prem node)
        self._load = None  # (every node's steps are here)
        self._smallest = min(self.sizes, default=0)
        now_free = list(map(_FIRST, self.frees))
        self.free_total = sum(now_free)  # GPUs free now, across nodes
        self.free_nodes = set(compress(count(), map((0).__lt__, now_free)))  # (fits_now reads)
        # Per node of the widest size, its windows of being entirely free (opens, closes), kept
        # until a hold changes the node (what a wide job's sweep reads); and those nodes.
        self._whole: list[list[tuple[float, float]] | None] = [None] * len(self.sizes)
        self._widest = list(compress(count(), map(self.node_size.__eq__, self.sizes)))
        # Every widest node's windows as (opens, node, closes), sorted, once a wide job asked
        # (None before; from ``of_loader``, the function that makes the base space's, taken as
        # kept from the start: holds mark their nodes): a sweep reads them in order and stops
        # at the first start, which is
        # nearly always among the first few, so keeping them sorted (the nodes a hold changed,
        # ``_dirty``, re-sorted in at the next sweep) is what spares sorting them per job.
        # While it is kept, ``_whole[node]`` is what it holds of a node a hold changed since
        # (read just before), or None for one no hold changed (its steps tell).
        self._opens: list[tuple[float, int, float]] | None = None
        self._dirty: set[int] = set()
        # Whether each node's step lists are this space's own (False: shared with a copy, and
        # copied by the first hold on the node).
        self._own = [True] * len(self.sizes)
        # Each node's second step (``_next``: its first after now; INF: none) and the nodes by
        # it, sorted (``_by_next``), once a one-node job asked: a node with too few GPUs free now
        # cannot start one before its second step, so the scan stops at the first past the best
        # start found. Kept through holds; None before.
        self._next: list[float] | None = None
        self._by_next: list[int] | None = None

    def copy(self) -> NodeSpace:
        """An independent copy (what holds on either change is its own). The nodes' step lists
        are shared until a hold changes one (copy on write): a copy costs two lists of lists."""
        new = NodeSpace.__new__(NodeSpace)
        new.sizes = self.sizes
        new._load = self._load
        new.now = self.now
        new.node_size = self.node_size
        new._smallest = self._smallest
        new.times = list(self.times)
        new.frees = list(self.frees)
        new.free_total = self.free_total
        new.free_nodes = set(self.free_nodes)
        new._whole = list(self._whole)
        new._widest = self._widest
        opens = self._opens
        new._opens = opens if opens is None or callable(opens) else list(opens)
        new._dirty = set(self._dirty)
        self._nodes_by_next_step()  # (made once, before the copies take it along)
        new._next = list(self._next)  # type: ignore[arg-type]
        new._by_next = list(self._by_next)  # type: ignore[arg-type]
        new._own = [False] * len(self.sizes)
        self._own = [False] * len(self.sizes)
        return new

    # -- queries -----------------------------------------------------------------------------

    def free_now(self, node: int) -> int:
        return self.steps(node)[1][0]

    def earliest(self, gpus: int, limit_s: float) -> tuple[float, Allocation] | None:
        """The earliest start of a job and where; None if it can never fit.

        The node whose first window (:func:`earliest_window`) starts first, then with the least
        free room at that start, then the lowest index. Each node's steps are read only up to
        the best start found so far (a later window cannot win): on a busy cluster most nodes
        are left after a step or two."""
        if gpus > self.node_size:
            return self._earliest_whole(gpus, limit_s)
        best_start, best_room, best_node = INF, 0, -1
        all_times, all_frees, sizes = self.times, self.frees, self.sizes
        sized = self._smallest < gpus  # (some node is too small for it)
        # The nodes with enough GPUs free now (few on a busy cluster), from their first step;
        # then the others by their second step, until it is past the best start found. The
        # best by (start, room, node), whatever the order they are read in.
        load = self._load is not None
        for node in self.free_nodes:
            if load and all_times[node] is None:
                self.steps(node)
            if all_frees[node][0] < gpus or (sized and sizes[node] < gpus):
                continue
            found = _first_window(all_times[node], all_frees[node], 0, gpus, limit_s,
                                  best_start)
            if found is not None and (found[0], found[1], node) < (best_start, best_room,
                                                                    best_node if best_node >= 0
                                                                    else len(sizes)):
                best_start, best_room, best_node = found[0], found[1], node
        after = self._nodes_by_next_step()
        for node in self._by_next:  # type: ignore[union-attr]
            if after[node] > best_start:
                break
            frees = all_frees[node]
            if frees is None:
                frees = self.steps(node)[1]
            if frees[0] >= gpus or (sized and sizes[node] < gpus):
                continue
            found = _first_window(all_times[node], frees, 1, gpus, limit_s, best_start)
            if found is not None and (found[0], found[1], node) < (best_start, best_room,
                                                                    best_node if best_node >= 0
                                                                    else len(sizes)):
                best_start, best_room, best_node = found[0], found[1], node
        if best_node < 0:
            return None
        return best_start, ((best_node, gpus),)

    def _nodes_by_next_step(self) -> list[float]:
        """Each node's second step (``_next``), with ``_by_next`` made where it is not yet."""
        if self._by_next is None:
            after = [times[1] if len(times) > 1 else INF for times in self.times]
            self._next = after
            # (one C-level sort of the floats: ties in any order, the scan compares fully)
            self._by_next = np.argsort(np.array(after, dtype=np.float64)).tolist()
        return self._next  # type: ignore[return-value]

    def _move_next(self, node: int, after: float) -> None:
        """Node ``node``'s second step is now ``after``: its place in ``_by_next`` follows."""
        nexts, by_next = self._next, self._by_next
        before = nexts[node]  # type: ignore[index]
        if after == before:
            return
        at = bisect_left(by_next, before, key=nexts.__getitem__)  # type: ignore[arg-type,union-attr]
        while by_next[at] != node:  # type: ignore[index]  (past those with an equal step)
            at += 1
        del by_next[at]  # type: ignore[union-attr]
        nexts[node] = after  # type: ignore[index]
        insort(by_next, node, key=nexts.__getitem__)  # type: ignore[arg-type,union-attr]

    def fits_now(self, gpus: int, limit_s: float) -> Allocation | None:
        """Where a job would start now (None if nowhere), without changing anything: the
        lowest-index whole nodes for a wide job, else the node with the least free room."""
        if gpus > self.free_total:
            return None
        end = self.now + limit_s
        if self._load is not None:
            for node in self.free_nodes:
                if self.times[node] is None:
                    self.steps(node)
        if gpus > self.node_size:
            size = self.node_size
            need = math.ceil(gpus / size)
            whole = sorted(i for i in self.free_nodes
                           if self.frees[i][0] == size == self.sizes[i]
                           and _holds(self.times[i], self.frees[i], 0, size, end))
            return tuple((i, size) for i in whole[:need]) if len(whole) >= need else None
        best: tuple[int, int] | None = None
        for node in self.free_nodes:
            frees = self.frees[node]
            room = frees[0]
            if room < gpus or (best is not None and (room, node) >= best):
                continue
            if _holds(self.times[node], frees, 0, gpus, end):
                best = (room, node)
        return None if best is None else ((best[1], gpus),)

    def _earliest_whole(self, gpus: int, limit_s: float) -> tuple[float, Allocation] | None:
        """Whole nodes: the first time enough nodes are all free for the whole limit (a sweep
        over each node's windows of being entirely free, in order of opening: at one instant,
        windows open in node order before any closes; the first ``need`` open win)."""
        size = self.node_size
        need = math.ceil(gpus / size)
        if len(self._widest) < need:
            return None
        opens = self._windows()
        live: list[tuple[float, int]] = []  # (latest start that ends in time, node): open now
        for when, node, closes in opens:
            last = closes - limit_s  # the latest start that still ends by ``closes``
            if not last >= when:  # (too short; also NaN: an endless job in an endless window)
                continue
            while live and live[0][0] < when:  # closed before this opens
                heappop(live)
            heappush(live, (last, node))
            if len(live) >= need:  # (== need: one opens at a time)
                return when, tuple((i, self.sizes[i]) for i in sorted(n for _, n in live))
        return None

    def _windows(self) -> list[tuple[float, int, float]]:
        """Every widest node's windows of being entirely free, sorted (``_opens``), brought up
        to date with the holds since the last sweep."""
        whole, size = self._whole, self.node_size
        opens = self._opens
        if opens is None:
            opens = []
            for node in self._widest:
                windows = whole[node]
                if windows is None:
                    times, frees = self.steps(node)
                    windows = whole[node] = _whole_windows(times, frees, size)
                opens.extend([(o, node, c) for o, c in windows])
            opens.sort()
            self._opens = opens
            self._dirty.clear()
            return opens
        if callable(opens):  # (of_loader: the base space's, made now; the holds since marked)
            opens = self._opens = opens()
        if self._dirty:
            for node in self._dirty:
                if self.sizes[node] != size:
                    continue
                for o, c in whole[node] or ():  # (an entry is unique: one window per instant)
                    del opens[bisect_left(opens, (o, node, c))]
                windows = whole[node] = _whole_windows(self.times[node], self.frees[node], size)
                for o, c in windows:
                    insort(opens, (o, node, c))
            self._dirty.clear()
        return opens

    # -- changes -----------------------------------------------------------------------------

    def hold(self, allocation: Allocation, start: float, limit_s: float) -> None:
        """Take the allocation's GPUs from ``start`` for ``limit_s`` (a start or a reservation)."""
        end = start + limit_s
        for node, gpus in allocation:
            if self.times[node] is None:
                self.steps(node)
            if self._opens is None:
                self._whole[node] = None
            elif node not in self._dirty:  # (its windows leave the sorted ones at the next sweep)
                if self._whole[node] is None and self.sizes[node] == self.node_size:
                    # What the sorted windows hold of it, read before the hold changes it.
                    self._whole[node] = _whole_windows(self.times[node], self.frees[node],
                                                       self.node_size)
                self._dirty.add(node)
            if not self._own[node]:  # shared with a copy: this space's own lists first
                self.times[node] = list(self.times[node])
                self.frees[node] = list(self.frees[node])
                self._own[node] = True
            times, frees = self.times[node], self.frees[node]
            a = split_step(times, frees, start)
            b = split_step(times, frees, end) if end < INF else len(times)
            if a == 0:
                self.free_total -= gpus
                if frees[0] <= 0:
                    self.free_nodes.discard(node)
            for k in range(a, b):
                frees[k] -= gpus
            if self._by_next is not None:
                self._move_next(node, times[1] if len(times) > 1 else INF)


def _first_window(times: list[float], frees: list[int], k: int, gpus: int, limit_s: float,
                  bound: float) -> tuple[float, int] | None:
    """One node's first window for a job from step ``k`` on, as (start, free GPUs there), if
    it starts by ``bound`` (None otherwise: read no further)."""
    n = len(times)
    while k < n:
        start = times[k]
        if start > bound:
            return None
        room = frees[k]
        if room < gpus:
            k += 1
            continue
        end = start + limit_s
        j = k + 1
        while j < n and times[j] < end:
            if frees[j] < gpus:
                break
            j += 1
        else:
            return start, room
        k = j + 1
    return None


def _whole_windows(times: list[float], frees: list[int], size: int
                   ) -> list[tuple[float, float]]:
    """The windows (opens, closes) in which a node of ``size`` GPUs is entirely free (runs of
    steps found by ``list.index``, C-level: most nodes have one run, at the end)."""
    windows = []
    n = len(frees)
    k = 0
    while True:
        try:
            k = frees.index(size, k)
        except ValueError:
            return windows
        j = k + 1
        while j < n and frees[j] == size:
            j += 1
        windows.append((times[k], times[j] if j < n else INF))
        if j >= n:
            return windows
        k = j + 1


def _step(times: list[float], t: float) -> int:
    """The index of the step holding time ``t`` (``t >= times[0]``)."""
    return bisect_right(times, t) - 1



def split_step(times: list[float], frees: list[int], t: float) -> int:
    """Make ``t`` a step boundary of the step profile ``times``/``frees`` (free GPUs from each
    time on; ``t >= times[0]``); its index. Shared with the planner's pooled forecast."""
    k = _step(times, t)
    if times[k] == t:
        return k
    times.insert(k + 1, t)
    frees.insert(k + 1, frees[k])
    return k + 1


def _holds(times: list[float], frees: list[int], k: int, gpus: int, end: float) -> bool:
    """Whether ``gpus`` stay free from step ``k`` until ``end``."""
    n = len(times)
    j = k
    while j < n and times[j] < end:
        if frees[j] < gpus:
            return False
        j += 1
    return True


def earliest_window(times: list[float], frees: list[int], gpus: int,
                    limit_s: float) -> float | None:
    """The first step start from which ``gpus`` stay free for ``limit_s`` (one node's profile, or
    the pooled one of :mod:`orchestrator.planner.forecast`), or None."""
    found = _first_window(times, frees, 0, gpus, limit_s, INF)
    return None if found is None else found[0]


def fifo_pass(space: NodeSpace, jobs: Iterable[PendingJob]) -> list[tuple[Hashable, Allocation]]:
    """Slurm's main scheduler: start jobs in order until the first that cannot start now."""
    started = []
    for job in jobs:
        alloc = space.fits_now(job.gpus, job.limit_s)
        if alloc is None:
            if job.gpus > sum(space.sizes):
                continue  # can never run here: it holds nobody back
            break
        space.hold(alloc, space.now, job.limit_s)
        started.append((job.key, alloc))
    return started


def backfill_pass(space: NodeSpace, jobs: Iterable[PendingJob], config: BackfillConfig,
                  plan_all: bool = False) -> PassResult:
    """One backfill pass (module docstring). ``plan_all``: plan the start of every tested job
    (the planner's prediction); otherwise the pass stops once no GPU is free now, since then
    nothing more can start in it."""
    result = PassResult()
    now = space.now
    reserved = 0
    total = sum(space.sizes)
    for job in jobs:
        if result.tested >= config.max_job_test:
            break
        if not plan_all and space.free_total <= 0:
            break
        result.tested += 1
        if job.gpus > total:
            continue
        alloc = space.fits_now(job.gpus, job.limit_s)
        if alloc is not None:
            space.hold(alloc, now, job.limit_s)
            result.started.append((job.key, alloc))
            continue
        if reserved >= config.reservations and not plan_all:
            continue
        found = space.earliest(job.gpus, job.limit_s)
        if found is None:
            continue
        start, alloc = found
        result.planned[job.key] = start
        if reserved < config.reservations:
            reserved += 1
            space.hold(alloc, start, job.limit_s)
    return result
