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

from bisect import bisect_right, insort
from itertools import count, repeat

import numpy as np

from orchestrator.domain.snapshot import PoolQueue
from orchestrator.planner import node_shape
from orchestrator.planner.backfill import INF, NodeSpace
from orchestrator.planner.node_shape import Grouped

_EXACT = 2 ** 53  # integers below this (in magnitude) are floats exactly


def space(queue: PoolQueue, now_us: int) -> NodeSpace:
    """The node space of ``queue`` at ``now_us`` (µs since the epoch): what :func:`from_scratch`
    builds, with each node's steps read when first asked. Every release names its node."""
    sizes, grouped, kept = node_shape.kept(queue)
    per = queue.onprem.free_per_node
    if not kept.exact or not -_EXACT < now_us < _EXACT:
        return _build(per, sizes, grouped, now_us)
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
    free_nodes = set(kept.free_nodes)
    by_next = order[ended:]
    for node in order[:ended]:  # (read now: what ended adds to its free GPUs, its next step)
        times, frees = load(node)
        free_total += frees[0] - per[node]
        if frees[0] > 0:
            free_nodes.add(node)
        nexts[node] = times[1] if len(times) > 1 else INF
        insort(by_next, node, key=nexts.__getitem__)
    opens_full, opens_node = kept.opens_full, kept.opens_node

    def opens() -> list[tuple[float, int, float]]:
        # Those entirely free at or before now open at 0.0 (by node); the others in order.
        free = bisect_right(opens_full, now_us)
        made = [(0.0, node, INF) for node in sorted(opens_node[:free])]
        fulls = np.array(opens_full[free:], dtype=np.float64)
        at = (fulls - now_us) / 1e6  # (as (end_us - now_us) / 1e6: exact)
        made += zip(at.tolist(), opens_node[free:], repeat(INF))
        if ((at[1:] == at[:-1]) & (fulls[1:] != fulls[:-1])).any():
            made.sort()  # (two instants a float cannot tell apart: by node)
        return made

    return NodeSpace.of_loader(sizes, load, free_nodes, free_total, nexts, by_next, opens,
                               widest=kept.widest_nodes, smallest=kept.smallest)


def from_scratch(queue: PoolQueue, now_us: int) -> NodeSpace:
    """The node space built in full (every node's steps, from the releases): the reference."""
    sizes, grouped = node_shape.shape(queue)
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


__all__ = ["from_scratch", "space"]
