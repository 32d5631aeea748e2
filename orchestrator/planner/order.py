"""The scheduling order of a pool's pending jobs, on their columns, memoized per queue.

Higher project priority first, then higher job priority, then oldest, then id: one
``numpy.lexsort`` of the :class:`~orchestrator.domain.pending.PendingColumns`
(:func:`_arrange`), memoized on the identity of the pending sequence (:func:`ordered`). What the
absorption tallies of the unmet jobs is counted on the columns too (:mod:`.demand`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import numpy as np

from orchestrator.domain.jobs import Job
from orchestrator.domain.pending import JobsView, PendingColumns, columns_of
from orchestrator.policy.models import Policy


def scheduling_order(jobs: Sequence[Job], policy: Policy) -> list[Job]:
    """Higher project priority first, then higher job priority, then oldest, then id."""
    return list(ordered(jobs, policy).jobs)


class Ordered:
    """A queue's pending jobs in scheduling order, as positions into its columns.

    The order is one ``numpy.lexsort`` of the columns (:func:`_arrange`); ``jobs`` is a view
    that makes a Job only for a position read one by one (the jobs absorption places).
    """

    __slots__ = ("_starts", "columns", "jobs", "order", "pending_gpus", "queue")

    def __init__(self, queue: Sequence[Job], columns: PendingColumns, order: np.ndarray,
                 starts: list[int]):
        self.queue = queue  # the pending sequence as the snapshot holds it (the memo's key)
        self.columns = columns
        self.order = order  # positions in ``columns``, in scheduling order
        self.jobs = JobsView(columns, order)
        self._starts = starts  # where each (project priority, job priority) class begins
        self.pending_gpus = int(columns.gpus.sum())

    def gpus_in_order(self) -> Iterator[int]:
        """Each job's GPUs, in scheduling order."""
        return iter(self.columns.gpus[self.order].tolist())


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
    """The order: (project priority, job priority) highest first, then submit time, then id,
    then queue position.

    One ``numpy.sort`` of one integer per job (class, submit time and position packed, so every
    key is distinct and the position is the key modulo ``n``; a plain sort of integers is several
    times faster than a stable argsort or a ``lexsort`` of three keys), or a ``lexsort`` where the
    packed key would not fit in 63 bits. Jobs of one class and one submit time are then put in
    id order (code point order, as str comparison) among themselves: only those runs are read,
    a small share of a queue whose submit times are microseconds."""
    columns = columns_of(jobs)
    n = len(columns)
    submitted = columns.submitted_us
    starts = [0]
    if not n:
        return Ordered(jobs, columns, np.empty(0, dtype=np.int64), starts)
    classed = False
    klass = np.zeros(n, dtype=np.int64)
    classes = 1
    if priorities or default or columns.priority.any():
        project_priority = np.array([priorities.get(p, default) for p in columns.projects],
                                    dtype=np.int64)[columns.project]
        level = columns.priority
        if (project_priority.min() != project_priority.max()
                or level.min() != level.max()):
            classed = True
            # (project priority, job priority), highest first, as one code from 0.
            low_l, span_l = int(level.min()), int(level.max()) - int(level.min()) + 1
            top_p = int(project_priority.max())
            klass = (top_p - project_priority) * span_l + (span_l - 1 - (level - low_l))
            classes = int(klass.max()) + 1
    if columns.time_rank is not None:
        return _arrange_ranked(jobs, columns, klass, classes, classed)
    low, high = int(submitted.min()), int(submitted.max())
    span = high - low + 1
    if classes * span * n < 1 << 63:
        keys = np.sort((klass * span + (submitted - low)) * n + np.arange(n, dtype=np.int64))
        order = keys % n
        base = keys // n  # class and submit time
    else:
        order = np.lexsort([submitted, klass])
        base = None
    if base is None:
        same = (submitted[order][1:] == submitted[order][:-1]) & (
            klass[order][1:] == klass[order][:-1])
    else:
        same = base[1:] == base[:-1]
    if same.any():
        order = _by_id_in_ties(order, same, columns.ids, columns.id_rank)
    if classed:
        ranked = klass[order]
        starts += (np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist()
    return Ordered(jobs, columns, order, starts)


def _arrange_ranked(jobs: Sequence[Job], columns: PendingColumns, klass: np.ndarray,
                    classes: int, classed: bool) -> Ordered:
    """:func:`_arrange` where the columns carry each row's rank by (submit time, id): one sort of
    (class, rank, position) packed in one integer (or a stable ``lexsort``): equal ranks are equal
    times and ids, left in position order."""
    n = len(columns)
    rank = columns.time_rank
    low = int(rank.min())
    span = int(rank.max()) - low + 1
    if classes * span * n < 1 << 63:
        keys = np.sort((klass * span + (rank - low)) * n + np.arange(n, dtype=np.int64))
        order = keys % n
    else:
        order = np.lexsort([rank, klass])
    starts = [0]
    if classed:
        ranked = klass[order]
        starts += (np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist()
    return Ordered(jobs, columns, order, starts)


def time_ranks(submitted_us: np.ndarray, id_rank: np.ndarray) -> np.ndarray:
    """Each row's rank by (submit time, id rank), equal pairs equal ranks, from 0
    (``PendingColumns.time_rank``, for a source that knows every job up front)."""
    if not len(submitted_us):
        return np.empty(0, dtype=np.int64)
    return _dense_rank([np.asarray(submitted_us, dtype=np.int64),
                        np.asarray(id_rank, dtype=np.int64)])


def _by_id_in_ties(order: np.ndarray, same: np.ndarray, ids: tuple[str, ...],
                   ranks: np.ndarray | None = None) -> np.ndarray:
    """``order`` with each run of jobs of one class and submit time (``same[i]``: entry ``i + 1``
    ties with entry ``i``; each run in position order) put in id order, then position order.
    ``ranks``: the ids' ranks (:func:`id_ranks`) where the columns carry them."""
    tied = np.zeros(len(order), dtype=bool)
    tied[1:] |= same
    tied[:-1] |= same
    at = np.flatnonzero(tied)
    run = np.cumsum(np.concatenate([[True], ~same]))[at]  # the run each tied entry is in
    members = order[at]
    # The words of every id, read in queue order (a pass in memory order; picking the tied ids
    # one by one visits the strings at random and costs more where most of a queue ties).
    words = _id_words(ids) if ranks is None and 4 * len(members) >= len(ids) else None
    if ranks is not None:  # known already: their order is the ids'
        keys = [ranks[members]]
    elif words is not None:
        # The ids' bytes, 8 to a word, most significant first: the words' order is the ids'
        # (ASCII bytes are code points).
        keys = [word[members] for word in words]
    else:  # few ties, or not all ASCII: numpy's own string order (code points, as str's)
        keys = [np.array([ids[i] for i in members.tolist()])]
    rank = _dense_rank(keys)
    # A stable sort by (run, id): equal ids stay in position order, as ``members`` is within
    # each run (one sort of one integer key, about half a lexsort of two).
    order = order.copy()
    order[at] = members[np.argsort(run * (int(rank.max()) + 1) + rank, kind="stable")]
    return order


def id_ranks(ids: Sequence[str]) -> np.ndarray:
    """Each id's rank among ``ids`` in code point order (equal ids, equal ranks), as the tie
    order reads them (``PendingColumns.id_rank``: a source that knows every id up front ranks
    them once, and each queue's ties are then ordered without reading a string)."""
    ids = tuple(ids)
    if not ids:
        return np.empty(0, dtype=np.int64)
    words = _id_words(ids)
    return _dense_rank(words if words is not None else [np.array(ids)])


def _id_words(ids: tuple[str, ...]) -> list[np.ndarray] | None:
    """The ids as big-endian 64-bit words of their bytes, zero-padded to the longest (a numpy
    string array's padding: trailing NULs do not count, as in the string sort it replaces), or
    None when some id is not ASCII or holds a line break. One join and one gather per byte, not
    a string object per id."""
    joined = "\n".join(ids)
    data = joined.encode("utf-8")
    if len(data) != len(joined) or joined.count("\n") != len(ids) - 1:
        return None
    buffer = np.frombuffer(data, dtype=np.uint8)
    ends = np.concatenate([np.flatnonzero(buffer == 10), [len(buffer)]])  # each id's end
    starts = np.concatenate([[0], ends[:-1] + 1])
    lengths = ends - starts
    words = []
    last = len(buffer) - 1
    for first in range(0, max(int(lengths.max(initial=0)), 1), 8):
        word = np.zeros(len(ids), dtype=np.uint64)
        for k in range(first, first + 8):  # byte k of every id (0 past its end), in one gather
            byte = np.where(lengths > k, buffer[np.minimum(starts + k, last)], 0)
            word |= byte.astype(np.uint64) << np.uint64(8 * (first + 7 - k))
        words.append(word)
    return words


def _dense_rank(keys: list[np.ndarray]) -> np.ndarray:
    """Each entry's rank among the distinct values of ``keys`` (compared key by key, the first
    most significant), from 0."""
    if len(keys) == 1:
        return np.unique(keys[0], return_inverse=True)[1].reshape(-1).astype(np.int64)
    arranged = np.lexsort(keys[::-1])
    differs = np.zeros(len(arranged), dtype=bool)
    for key in keys:
        ranked = key[arranged]
        differs[1:] |= ranked[1:] != ranked[:-1]
    rank = np.empty(len(arranged), dtype=np.int64)
    rank[arranged] = np.cumsum(differs)
    return rank
