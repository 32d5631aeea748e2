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

A release is known by its identity: the kept answer holds the tuple it was read from, so every
object of that tuple is alive and no new object can share its ``id``. Thread-safe: the kept
answer is one immutable entry, read once and replaced whole.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass

from orchestrator.domain.pending import to_us
from orchestrator.domain.snapshot import OnPremRelease, PoolQueue

Grouped = list[list[tuple[int, int]]]  # per node: (expected end in µs since the epoch, GPUs)


@dataclass(frozen=True, slots=True)
class _Shape:
    per: tuple[int, ...]  # free GPUs per node, as read
    releases: tuple[OnPremRelease, ...]  # as read (kept alive: their ids stay theirs)
    ids: frozenset[int]  # id() of each release
    held: list[int]  # GPUs the releases hold per node
    sizes: list[int]
    grouped: Grouped


_last: list[_Shape | None] = [None]


def shape(queue: PoolQueue) -> tuple[list[int], Grouped]:
    """The nodes' sizes, and each node's releases as (expected end in µs since the epoch, GPUs),
    by end. Every release names its node (``node_space_problem`` is None)."""
    per = queue.onprem.free_per_node
    releases = queue.onprem_releases
    last = _last[0]
    if last is not None and last.per is per and last.releases is releases:
        return last.sizes, last.grouped
    if last is None or len(last.grouped) != len(per):
        made = _scratch(queue)
    else:
        made = _since(last, queue)
    _last[0] = made
    return made.sizes, made.grouped


def from_scratch(queue: PoolQueue) -> tuple[list[int], Grouped]:
    """What :func:`shape` answers, computed from the queue alone (the reference)."""
    made = _scratch(queue)
    return made.sizes, made.grouped


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
    return _Shape(per, releases, frozenset(map(id, releases)), held,
                  _sizes(queue, held), grouped)


def _since(last: _Shape, queue: PoolQueue) -> _Shape:
    per = queue.onprem.free_per_node
    releases = queue.onprem_releases
    ids = frozenset(map(id, releases))
    before = last.ids
    if len(ids) != len(releases) or len(before) != len(last.releases):
        return _scratch(queue)  # (one object reported twice: identity cannot tell them apart)
    gone = [r for r in last.releases if id(r) not in ids]
    came = [r for r in releases if id(r) not in before]
    grouped = list(last.grouped)
    held = list(last.held)
    copied: set[int] = set()
    for release, sign in [(r, -1) for r in gone] + [(r, 1) for r in came]:
        node = release.node
        if node not in copied:  # this answer's own list (the last one's is shared)
            grouped[node] = list(grouped[node])  # type: ignore[index]
            copied.add(node)  # type: ignore[arg-type]
        entry = (to_us(release.ends_at), release.gpus)
        if sign < 0:
            grouped[node].remove(entry)  # type: ignore[index]
        else:
            insort(grouped[node], entry)  # type: ignore[index]
        held[node] += sign * release.gpus  # type: ignore[index]
    return _Shape(per, releases, ids, held, _sizes(queue, held), grouped)


def _sizes(queue: PoolQueue, held: list[int]) -> list[int]:
    """Each node's GPUs: the pool's divided evenly where they divide (at least what is free and
    held there), else what is free and held there."""
    per = queue.onprem.free_per_node
    n = len(per)
    if queue.onprem.total_gpus % n == 0:
        even = queue.onprem.total_gpus // n
        return [max(even, f + h) for f, h in zip(per, held)]
    return [f + h for f, h in zip(per, held)]


__all__ = ["from_scratch", "shape"]
