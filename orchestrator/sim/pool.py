"""A set of GPU nodes that jobs are placed on and released from (on-prem, or ready burst nodes).

Placement follows the rule the planner's absorption (:mod:`orchestrator.planner.demand`) and the
built-in queue use, so what the planner predicts is what the simulated cluster does:

* a job no wider than the largest node goes on **one** node: the one with the least free room
  that fits it (best fit, lowest index on ties), which keeps whole nodes free for wide jobs;
* a wider job (multi-node training) needs **whole free nodes**, largest first, until their GPUs
  cover it (on an on-prem pool of equal nodes: ``ceil(gpus / gpus_per_node)`` nodes).

Free GPUs are indexed by how many are free, so a placement costs O(node size), not O(nodes).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator

Allocation = tuple[tuple[int, int], ...]  # ((node index, GPUs used), ...)


class GpuPool:
    """Nodes (by integer index) with free GPUs; see the module docstring."""

    __slots__ = ("size", "free", "_by_free", "free_total", "total", "max_size", "_whole",
                 "whole_gpus", "version", "_one")

    def __init__(self) -> None:
        self.size: dict[int, int] = {}
        self.free: dict[int, int] = {}
        self._by_free: list[list[int]] = [[]]  # free GPUs -> sorted node indexes
        self._whole: list[tuple[int, int]] = []  # (-size, index) of nodes with nothing running
        self.free_total = 0
        self.total = 0
        self.max_size = 0
        self.whole_gpus = 0
        self.version = 0  # bumped on every change (lets callers cache derived views)
        # One-node allocations, made once per (node, GPUs): every job keeps its allocation for
        # the run, and 70k of them, each its own pair of tuples, were 6 MiB of the full ITP run.
        self._one: dict[tuple[int, int], Allocation] = {}

    @classmethod
    def uniform(cls, nodes: int, gpus_per_node: int) -> GpuPool:
        pool = cls()
        for index in range(nodes):
            pool.add_node(index, gpus_per_node)
        return pool

    def __len__(self) -> int:
        return len(self.size)

    def add_node(self, index: int, gpus: int) -> None:
        if index in self.size:
            raise ValueError(f"node {index} is already in the pool")
        self.size[index] = gpus
        self.free[index] = gpus
        while len(self._by_free) <= gpus:
            self._by_free.append([])
        insort(self._by_free[gpus], index)
        insort(self._whole, (-gpus, index))
        self.free_total += gpus
        self.total += gpus
        self.whole_gpus += gpus
        self.max_size = max(self.max_size, gpus)
        self.version += 1

    def remove_node(self, index: int) -> None:
        """Take a node out (it drains or goes away); jobs on it keep running elsewhere's books."""
        gpus = self.size.pop(index)
        free = self.free.pop(index)
        self._drop(self._by_free[free], index)
        if free == gpus:
            self._drop(self._whole, (-gpus, index))
            self.whole_gpus -= gpus
        self.free_total -= free
        self.total -= gpus
        if gpus == self.max_size:
            self.max_size = max(self.size.values(), default=0)
        self.version += 1

    def fits(self, gpus: int) -> bool:
        if gpus > self.free_total:
            return False
        if gpus > self.max_size:
            return gpus <= self.whole_gpus
        by_free = self._by_free
        for room in range(gpus, len(by_free)):
            if by_free[room]:
                return True
        return False

    def with_room(self, gpus: int) -> Iterator[int]:
        """The nodes with at least ``gpus`` free, best fit first (least free, then lowest
        index)."""
        by_free = self._by_free
        for room in range(max(gpus, 1), len(by_free)):
            yield from by_free[room]

    def place(self, gpus: int, avoid: frozenset[int] = frozenset()) -> Allocation | None:
        """Place a job of ``gpus``, on no node in ``avoid``; the allocation, or None if it does
        not fit now."""
        allocation = self.find(gpus, avoid)
        if allocation is not None:
            self.take(allocation)
        return allocation

    def take(self, allocation: Allocation) -> None:
        """Apply an allocation :meth:`find` returned (nothing has changed in between)."""
        for index, used in allocation:
            self._take(index, used)

    def find(self, gpus: int, avoid: frozenset[int] = frozenset(),
             ok: Callable[[int], bool] | None = None) -> Allocation | None:
        """Where :meth:`place` would put a job of ``gpus`` (nodes in ``avoid`` excluded), without
        placing it; None if it does not fit now. ``ok``: for a one-node job, also only a node it
        accepts (asked in best-fit order)."""
        if gpus > self.free_total:
            return None
        if gpus > self.max_size:
            if gpus > self.whole_gpus:
                return None
            chosen: list[tuple[int, int]] = []
            covered = 0
            for neg_size, index in self._whole:
                if index in avoid:
                    continue
                chosen.append((index, -neg_size))
                covered -= neg_size
                if covered >= gpus:
                    # The last node may be only partly used by the job; all of it is taken
                    # (whole nodes).
                    return tuple(chosen)
            return None
        by_free = self._by_free
        for room in range(gpus, len(by_free)):
            for index in by_free[room]:
                if index not in avoid and (ok is None or ok(index)):
                    key = (index, gpus)
                    alloc = self._one.get(key)
                    if alloc is None:
                        alloc = self._one[key] = (key,)
                    return alloc
                # (``avoid`` holds a few reserved nodes: this inner scan is short)
        return None

    def release(self, allocation: Allocation) -> None:
        """Give a finished job's GPUs back (nodes no longer in the pool are skipped)."""
        for index, used in allocation:
            if index not in self.free:
                continue
            self._move(index, self.free[index] + used)

    def free_per_node(self) -> tuple[int, ...]:
        """Free GPUs node by node, in the order nodes were added (index order for on-prem)."""
        return tuple(self.free.values())

    # -- internals ---------------------------------------------------------------------------

    def _take(self, index: int, gpus: int) -> None:
        self._move(index, self.free[index] - gpus)

    def _move(self, index: int, free: int) -> None:
        old = self.free[index]
        size = self.size[index]
        self._drop(self._by_free[old], index)
        insort(self._by_free[free], index)
        if old == size:
            self._drop(self._whole, (-size, index))
            self.whole_gpus -= size
        if free == size:
            insort(self._whole, (-size, index))
            self.whole_gpus += size
        self.free[index] = free
        self.free_total += free - old
        self.version += 1

    @staticmethod
    def _drop(items: list, value) -> None:
        position = bisect_left(items, value)
        if position == len(items) or items[position] != value:
            raise KeyError(value)
        del items[position]
