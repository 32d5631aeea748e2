"""The node wait model's node space of a plan (:mod:`.wait_nodes`), from what is kept across
plans: each node's free GPUs over time as seconds from ``now``, read only for the nodes a plan
asks about.

The space's step times are seconds from ``now``, ``(end_us - now_us) / 1e6`` from each release's
exact end in microseconds (one correctly rounded division), and ``now`` moves between plans, so
no node's steps can be kept as they are. But a plan reads the steps of about ten nodes of 321
(full ITP): the others are asked only for what is kept here, per node and in microseconds, and
changed only for the nodes whose releases, free GPUs or size changed since the last plan (found
by identity: :mod:`.node_shape` shares the lists of unchanged nodes):

* each node's first release end (its second step, unless it ended already), and the nodes
  sorted by it: the order the one-node scan reads them in (:meth:`NodeSpace.earliest`);
* each widest node's instant of being entirely free from then on, and those nodes sorted by it
  (the wide job's sweep, made only when a wide job asks);
* the nodes with GPUs free now and how many.

Every time a plan compares is still the float the full build makes: the kept microseconds are
converted per plan with the same division (held as floats, exactly: every end and ``now`` lies
within 2**53 microseconds of the epoch, else the space is built in full), and a node's steps are
built by the full build's own code when first read (:func:`from_scratch` is that build;
``tests/unit/test_node_steps.py`` checks the kept space against it on random sequences of
pools). A node whose first release ended already (at or before ``now``) is read at once.

Pure: the answer is a function of the queue and ``now`` alone. Thread-safe as
:mod:`.node_shape`: the kept entry is replaced whole, never changed in place.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from dataclasses import dataclass
from itertools import compress, count
from operator import is_not, ne

import numpy as np

from orchestrator.domain.snapshot import PoolQueue
from orchestrator.planner.backfill import INF, NodeSpace
from orchestrator.planner.node_shape import Grouped, shape

_EXACT = 2 ** 53  # integers below this (in magnitude) are floats exactly
_NEG = -INF


@dataclass(frozen=True, slots=True)
class _Kept:
    per: tuple[int, ...]  # free GPUs per node, as read
    sizes: list[int]
    grouped: Grouped  # as node_shape answered (its lists: unchanged nodes share them)
    widest: int
    first: list[float]  # per node: its first release's end, µs (INF: none)
    first_arr: np.ndarray  # the same, float64
    order: list[int]  # the nodes by ``first``
    full: list[float]  # per widest node: from when (µs) it is entirely free (-INF: now; INF: never)
    opens: list[tuple[float, int]]  # (full, node) of those with one, sorted
    free_nodes: frozenset[int]  # the nodes with GPUs free (per)
    free_total: int


_last: list[_Kept | None] = [None]


def space(queue: PoolQueue, now_us: int) -> NodeSpace:
    """The node space of ``queue`` at ``now_us`` (µs since the epoch): what :func:`from_scratch`
    builds, with each node's steps read when first asked. Every release names its node."""
    sizes, grouped = shape(queue)
    kept = _kept(queue, sizes, grouped)
    if kept is None or not -_EXACT < now_us < _EXACT:
        return _build(queue.onprem.free_per_node, sizes, grouped, now_us)
    per = kept.per
    cache: dict[int, tuple[list[float], list[int]]] = {}

    def load(node: int) -> tuple[list[float], list[int]]:
        got = cache.get(node)
        if got is None:
            got = cache[node] = _node_steps(per[node], grouped[node], now_us)
        return got

    nexts = ((kept.first_arr - now_us) / 1e6).tolist()  # (as (end_us - now_us) / 1e6: exact)
    first = kept.first
    order = kept.order
    ended = bisect_right(order, now_us, key=first.__getitem__)  # first release at or before now
    free_total = kept.free_total
    if ended:
        free_nodes = set(kept.free_nodes)
        by_next = order[ended:]
        for node in order[:ended]:
            times, frees = load(node)
            free_total += frees[0] - per[node]
            if frees[0] > 0:
                free_nodes.add(node)
            nexts[node] = times[1] if len(times) > 1 else INF
            insort(by_next, node, key=nexts.__getitem__)
    else:
        free_nodes = set(kept.free_nodes)
        by_next = list(order)
    kept_opens = kept.opens

    def opens() -> list[tuple[float, int, float]]:
        made = [(0.0 if full <= now_us else (full - now_us) / 1e6, node, INF)
                for full, node in kept_opens]
        made.sort()  # (those free now all open at 0.0: by node)
        return made

    return NodeSpace.of_loader(sizes, load, free_nodes, free_total, nexts, by_next, opens)


def from_scratch(queue: PoolQueue, now_us: int) -> NodeSpace:
    """The node space built in full (every node's steps, from the releases): the reference."""
    sizes, grouped = shape(queue)
    return _build(queue.onprem.free_per_node, sizes, grouped, now_us)


def _node_steps(free: int, ends: list[tuple[int, int]], now_us: int
                ) -> tuple[list[float], list[int]]:
    """One node's steps from its free GPUs and releases (by end): each end in seconds from now
    as ``(ends_at - now).total_seconds()`` (both divide the exact microseconds by 10**6 with one
    correct rounding); ends at or before now, or at the previous step's instant, merge."""
    times = [0.0]
    frees = [free]
    level = free  # free GPUs after the releases so far
    last = 0.0  # the last step's time
    for end_us, gpus in ends:
        end = (end_us - now_us) / 1e6
        level += gpus
        if end <= last:  # (ended already, or at the previous end: one step)
            frees[-1] = level
        else:
            times.append(end)
            frees.append(level)
            last = end
    return times, frees


def _build(per: tuple[int, ...], sizes: list[int], grouped: Grouped, now_us: int) -> NodeSpace:
    all_times: list[list[float]] = []
    all_frees: list[list[int]] = []
    # The widest nodes' windows of being entirely free, sorted: releases only add free GPUs,
    # up to the node's size, so a node is entirely free from its first step at its size on,
    # for good.
    opens: list[tuple[float, int, float]] = []
    widest = max(sizes, default=0)
    for node, free, ends, size in zip(count(), per, grouped, sizes):
        times, frees = _node_steps(free, ends, now_us)
        all_times.append(times)
        all_frees.append(frees)
        if frees[-1] == size == widest:
            opens.append((times[frees.index(size)], node, INF))
    opens.sort()
    return NodeSpace.of_steps(sizes, all_times, all_frees, 0.0, opens=opens)


def _first(ends: list[tuple[int, int]]) -> float:
    return ends[0][0] if ends else INF


def _full(free: int, ends: list[tuple[int, int]], size: int) -> float:
    """From when (µs) a node of ``size`` GPUs is entirely free for good: -INF already, INF
    never (releases only add free GPUs, up to the size)."""
    level = free
    if level == size:
        return _NEG
    for end_us, gpus in ends:
        level += gpus
        if level == size:
            return end_us
    return INF


def _kept(queue: PoolQueue, sizes: list[int], grouped: Grouped) -> _Kept | None:
    """The kept entry of this queue (derived from the last one where it can be); None where
    an end lies too far from the epoch to be held as a float exactly."""
    per = queue.onprem.free_per_node
    last = _last[0]
    if last is not None and last.per is per and last.grouped is grouped and last.sizes == sizes:
        return last
    widest = max(sizes, default=0)
    if last is None or len(last.per) != len(per) or last.widest != widest:
        made = _scratch(per, sizes, grouped, widest)
    else:
        made = _since(last, per, sizes, grouped)
    _last[0] = made
    return made


def _exact(ends: list[tuple[int, int]]) -> bool:
    return not ends or (-_EXACT < ends[0][0] and ends[-1][0] < _EXACT)


def _scratch(per: tuple[int, ...], sizes: list[int], grouped: Grouped, widest: int
             ) -> _Kept | None:
    if not all(map(_exact, grouped)):
        return None
    first = [float(_first(ends)) for ends in grouped]
    full = [float(_full(free, ends, size)) if size == widest else INF
            for free, ends, size in zip(per, grouped, sizes)]
    order = sorted(range(len(per)), key=first.__getitem__)
    opens = sorted((f, node) for node, f in enumerate(full) if f < INF)
    free_nodes = frozenset(compress(count(), map((0).__lt__, per)))
    return _Kept(per, sizes, grouped, widest, first, np.array(first, dtype=np.float64), order,
                 full, opens, free_nodes, sum(per))


def _since(last: _Kept, per: tuple[int, ...], sizes: list[int], grouped: Grouped
           ) -> _Kept | None:
    changed = set(compress(count(), map(is_not, grouped, last.grouped)))
    changed.update(compress(count(), map(ne, per, last.per)))
    changed.update(compress(count(), map(ne, sizes, last.sizes)))
    if not all(_exact(grouped[node]) for node in changed):
        return None
    widest = last.widest
    first = list(last.first)
    first_arr = last.first_arr.copy()
    order = list(last.order)
    full = list(last.full)
    opens = list(last.opens)
    free_nodes = set(last.free_nodes)
    for node in changed:
        ends = grouped[node]
        was, now = first[node], float(_first(ends))
        if now != was:
            at = bisect_left(order, was, key=first.__getitem__)
            while order[at] != node:  # (past those with an equal first end)
                at += 1
            del order[at]
            first[node] = first_arr[node] = now
            insort(order, node, key=first.__getitem__)
        was = full[node]
        now = float(_full(per[node], ends, sizes[node])) if sizes[node] == widest else INF
        if now != was:
            if was < INF:
                del opens[bisect_left(opens, (was, node))]
            full[node] = now
            if now < INF:
                insort(opens, (now, node))
        if per[node] > 0:
            free_nodes.add(node)
        else:
            free_nodes.discard(node)
    return _Kept(per, sizes, grouped, widest, first, first_arr, order, full, opens,
                 frozenset(free_nodes), sum(per))


__all__ = ["from_scratch", "space"]
