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
