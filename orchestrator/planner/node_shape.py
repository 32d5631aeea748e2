"""The on-prem nodes as the node wait model reads them: each node's size and its running jobs'
expected ends, grouped by node and in order (:mod:`.wait_nodes` builds its node space from
them).

A plan follows each job event, and between two plans the on-prem pool changes by a job or two
started or ended: the releases the snapshot reports are mostly the same objects. So the last
answer is kept with the tuple it was read from, and the next one is derived from it: the
releases that left are taken out of their nodes' lists, those that came are put in (only the
changed nodes' lists are new; the rest are shared, never changed in place), instead of every
release converted and every node sorted again. The answer equals that of :func:`from_scratch`
(``tests/unit/test_node_shape.py`` checks it on random sequences of pools).

Kept with it, for :mod:`.node_steps` (which reads a node's steps only when a plan asks about the
node), and changed only for the nodes whose releases, free GPUs or size changed: each node's
first release end and the nodes sorted by it, each widest node's instant of being entirely free
for good and those nodes sorted by it, and the nodes with GPUs free now (:class:`Kept`).

A release is known by its identity: the kept answer holds the tuple it was read from, so every
object of that tuple is alive and no new object can share its ``id``. What left and what came
are found position by position (:func:`diff`: a source reports its releases in a steady order,
so the two tuples are long C-level runs of the same objects between a few changes), or by
counts of identities where the positions are out of step. Thread-safe: the kept answer is one
immutable entry, read once and replaced whole.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from dataclasses import dataclass
from itertools import compress, count, islice
from operator import is_not, ne

import numpy as np

from orchestrator.domain.pending import to_us
from orchestrator.domain.snapshot import OnPremRelease, PoolQueue

Grouped = list[list[tuple[int, int]]]  # per node: (expected end in µs since the epoch, GPUs)

INF = float("inf")
_EXACT = 2 ** 53  # integers below this in magnitude are floats exactly
_DIFF_MAX = 64  # changes a positional diff finds before it counts identities instead
_DIFF_LOOK = 9  # how far it looks for the next release in common


@dataclass(frozen=True, slots=True)
class Kept:
    """What is kept per node beyond the releases, in µs since the epoch (as floats: exact, every
    end lies within 2**53 µs of the epoch, else ``exact`` is False and the rest is not kept)."""

    exact: bool
    widest: int  # the largest node size
    smallest: int  # the smallest
    widest_nodes: list[int]  # the nodes of the largest size, in order
    first: list[float]  # per node: its first release's end (INF: none)
    first_arr: np.ndarray  # the same, float64
    order: list[int]  # the nodes by ``first`` (ties in any order)
    full: list[float]  # per widest node: from when it is entirely free (-INF: now; INF: never)
    # The widest nodes that have a ``full``, sorted by (full, node): their ``full`` and the nodes
    opens_full: list[float]
    opens_node: list[int]
    free_nodes: frozenset[int]  # the nodes with GPUs free now (as read)
    free_total: int


@dataclass(frozen=True, slots=True)
class _Shape:
    per: tuple[int, ...]  # free GPUs per node, as read
    total: int  # the pool's GPUs, as read
    releases: tuple[OnPremRelease, ...]  # as read (kept alive: their ids stay theirs)
    held: list[int]  # GPUs the releases hold per node
    sizes: list[int]
    grouped: Grouped
    kept: Kept


_last: list[_Shape | None] = [None]


def shape(queue: PoolQueue) -> tuple[list[int], Grouped]:
    """The nodes' sizes, and each node's releases as (expected end in µs since the epoch, GPUs),
    by end. Every release names its node (``node_space_problem`` is None)."""
    made = _shape(queue)
    return made.sizes, made.grouped


def kept(queue: PoolQueue) -> tuple[list[int], Grouped, Kept]:
    """:func:`shape`, and what is kept with it (:class:`Kept`)."""
    made = _shape(queue)
    return made.sizes, made.grouped, made.kept


def _shape(queue: PoolQueue) -> _Shape:
    per = queue.onprem.free_per_node
    releases = queue.onprem_releases
    last = _last[0]
    if last is not None and last.per is per and last.releases is releases:
        return last
    if last is None or len(last.grouped) != len(per):
        made = _scratch(queue)
    else:
        made = _since(last, queue)
    _last[0] = made
    return made


def from_scratch(queue: PoolQueue) -> tuple[list[int], Grouped]:
    """What :func:`shape` answers, computed from the queue alone (the reference)."""
    made = _scratch(queue)
    return made.sizes, made.grouped


def kept_from_scratch(queue: PoolQueue) -> tuple[list[int], Grouped, Kept]:
    """What :func:`kept` answers, computed from the queue alone (the reference)."""
    made = _scratch(queue)
    return made.sizes, made.grouped, made.kept


def _scratch(queue: PoolQueue) -> _Shape:
    per = queue.onprem.free_per_node
    releases = queue.onprem_releases
    grouped: Grouped = [[] for _ in per]
    held = [0] * len(per)
    for release in releases:
        grouped[release.node].append((to_us(release.ends_at), release.gpus))  # type: ignore[index]
        held[release.node] += release.gpus  # type: ignore[index]
    for ends in grouped:
        ends.sort()
    sizes = _sizes(queue, held)
    return _Shape(per, queue.onprem.total_gpus, releases, held, sizes, grouped,
                  _kept_scratch(per, sizes, grouped))


def _since(last: _Shape, queue: PoolQueue) -> _Shape:
    per = queue.onprem.free_per_node
    releases = queue.onprem_releases
    gone, came = diff(last.releases, releases)
    grouped = list(last.grouped)
    held = list(last.held)
    changed: set[int] = set()  # the nodes whose lists are this answer's own (the last's shared)
    for release, sign in [(r, -1) for r in gone] + [(r, 1) for r in came]:
        node = release.node
        if node not in changed:
            grouped[node] = list(grouped[node])  # type: ignore[index]
            changed.add(node)  # type: ignore[arg-type]
        entry = (to_us(release.ends_at), release.gpus)
        if sign < 0:
            grouped[node].remove(entry)  # type: ignore[index]
        else:
            insort(grouped[node], entry)  # type: ignore[index]
        held[node] += sign * release.gpus  # type: ignore[index]
    if per is not last.per:
        changed.update(compress(count(), map(ne, per, last.per)))
    total = queue.onprem.total_gpus
    if total != last.total:
        sizes = _sizes(queue, held)
        changed.update(compress(count(), map(ne, sizes, last.sizes)))
        resized = True
    else:  # (a node's size moves only with its own free and held GPUs)
        sizes = list(last.sizes)
        resized = False
        for node in changed:
            size = _size(queue, per[node], held[node])
            if size != sizes[node]:
                sizes[node] = size
                resized = True
    if not last.kept.exact or (resized and max(sizes, default=0) != last.kept.widest):
        kept = _kept_scratch(per, sizes, grouped)
    else:
        kept = _kept_since(last.kept, per, sizes, grouped, changed, resized)
    return _Shape(per, total, releases, held, sizes, grouped, kept)


def diff(before: tuple[OnPremRelease, ...], after: tuple[OnPremRelease, ...]
          ) -> tuple[list[OnPremRelease], list[OnPremRelease]]:
    """The releases of ``before`` that left and those of ``after`` that came: an edit that
    makes ``after`` of ``before`` by identity, position by position (a source reports its
    releases in a steady order, new ones mostly last: C-level runs of the same objects between
    a few changes). Any such edit is right (``before`` less what left, plus what came, is
    ``after`` as a multiset, repeats included); a release that only moved is both."""
    gone: list[OnPremRelease] = []
    came: list[OnPremRelease] = []
    i = j = 0
    n, m = len(before), len(after)
    while True:
        k = next(compress(count(), map(is_not, islice(before, i, None), islice(after, j, None))),
                 None)
        if k is None:  # the same up to the end of the shorter: the rest of the longer differs
            k = min(n - i, m - j)
            gone.extend(before[i + k:])
            came.extend(after[j + k:])
            return gone, came
        i += k
        j += k
        for d in range(1, _DIFF_LOOK):  # the shortest run that left or came (a job's releases)
            if i + d < n and before[i + d] is after[j]:  # before[i:i + d] left
                gone.extend(before[i:i + d])
                i += d
                break
            if j + d < m and before[i] is after[j + d]:  # after[j:j + d] came
                came.extend(after[j:j + d])
                j += d
                break
        else:  # (both)
            gone.append(before[i])
            came.append(after[j])
            i += 1
            j += 1
        if len(gone) + len(came) > _DIFF_MAX:  # (out of step: by counts of identities)
            return _diff_by_ids(before, after)


def _diff_by_ids(before: tuple[OnPremRelease, ...], after: tuple[OnPremRelease, ...]
                 ) -> tuple[list[OnPremRelease], list[OnPremRelease]]:
    """:func:`diff` by counts of identities (every object of ``before`` is alive: no other can
    share its ``id``); a release reported more than once in either is counted per report."""
    return _unmatched(before, Counter(map(id, after))), _unmatched(after, Counter(map(id, before)))


def _unmatched(releases: tuple[OnPremRelease, ...], others: Counter) -> list[OnPremRelease]:
    out = []
    for release in releases:
        key = id(release)
        if others[key] > 0:
            others[key] -= 1
        else:
            out.append(release)
    return out


def _size(queue: PoolQueue, free: int, held: int) -> int:
    n = len(queue.onprem.free_per_node)
    total = queue.onprem.total_gpus
    return max(total // n, free + held) if total % n == 0 else free + held


def _sizes(queue: PoolQueue, held: list[int]) -> list[int]:
    """Each node's GPUs: the pool's divided evenly where they divide (at least what is free and
    held there), else what is free and held there."""
    per = queue.onprem.free_per_node
    n = len(per)
    if queue.onprem.total_gpus % n == 0:
        even = queue.onprem.total_gpus // n
        return [max(even, f + h) for f, h in zip(per, held)]
    return [f + h for f, h in zip(per, held)]


# -- what is kept for the node space (node_steps) -------------------------------------------------

def _exact(ends: list[tuple[int, int]]) -> bool:
    return not ends or (-_EXACT < ends[0][0] and ends[-1][0] < _EXACT)


def _first(ends: list[tuple[int, int]]) -> float:
    return float(ends[0][0]) if ends else INF


def _full(free: int, ends: list[tuple[int, int]], size: int) -> float:
    """From when (µs) a node of ``size`` GPUs is entirely free for good: -INF already, INF
    never (releases only add free GPUs, up to the size)."""
    level = free
    if level == size:
        return -INF
    for end_us, gpus in ends:
        level += gpus
        if level == size:
            return float(end_us)
    return INF


_INEXACT = Kept(False, 0, 0, [], [], np.zeros(0), [], [], [], [], frozenset(), 0)


def _kept_scratch(per: tuple[int, ...], sizes: list[int], grouped: Grouped) -> Kept:
    if not all(map(_exact, grouped)):
        return _INEXACT
    widest = max(sizes, default=0)
    first = list(map(_first, grouped))
    full = [_full(free, ends, size) if size == widest else INF
            for free, ends, size in zip(per, grouped, sizes)]
    order = sorted(range(len(per)), key=first.__getitem__)
    opens = sorted((f, node) for node, f in enumerate(full) if f < INF)
    return Kept(True, widest, min(sizes, default=0),
                list(compress(count(), map(widest.__eq__, sizes))), first,
                np.array(first, dtype=np.float64), order, full,
                [f for f, _ in opens], [node for _, node in opens],
                frozenset(compress(count(), map((0).__lt__, per))), sum(per))


def _kept_since(last: Kept, per: tuple[int, ...], sizes: list[int], grouped: Grouped,
                changed: set[int], resized: bool) -> Kept:
    if not changed:
        return last
    if not all(_exact(grouped[node]) for node in changed):
        return _INEXACT
    widest = last.widest
    first = list(last.first)
    first_arr = last.first_arr.copy()
    order = list(last.order)
    full = list(last.full)
    opens_full = list(last.opens_full)
    opens_node = list(last.opens_node)
    free_nodes = set(last.free_nodes)
    for node in changed:
        ends = grouped[node]
        was, now = first[node], _first(ends)
        if now != was:
            at = bisect_left(order, was, key=first.__getitem__)
            while order[at] != node:  # (past those with an equal first end)
                at += 1
            del order[at]
            first[node] = first_arr[node] = now
            insort(order, node, key=first.__getitem__)
        was = full[node]
        now = _full(per[node], ends, sizes[node]) if sizes[node] == widest else INF
        if now != was:
            if was < INF:
                at = bisect_left(opens_full, was)
                while opens_node[at] != node:
                    at += 1
                del opens_full[at]
                del opens_node[at]
            full[node] = now
            if now < INF:
                at = bisect_left(opens_full, now)
                while at < len(opens_full) and opens_full[at] == now and opens_node[at] < node:
                    at += 1
                opens_full.insert(at, now)
                opens_node.insert(at, node)
        if per[node] > 0:
            free_nodes.add(node)
        else:
            free_nodes.discard(node)
    smallest, widest_nodes = last.smallest, last.widest_nodes
    if resized:  # (the largest size is the same: else the kept entry is made afresh)
        smallest = min(sizes, default=0)
        widest_nodes = list(compress(count(), map(widest.__eq__, sizes)))
    return Kept(True, widest, smallest, widest_nodes, first, first_arr, order, full,
                opens_full, opens_node,
                frozenset(free_nodes),
                sum(per))


__all__ = ["Kept", "diff", "from_scratch", "kept", "kept_from_scratch", "shape"]
