"""The world's pending queue as the planner reads it: columns selected from those of every job.

A queue source hands the planner its pending jobs as
:class:`~orchestrator.domain.pending.PendingColumns` (``docs/performance.md``). The simulator
knows every job of the trace up front, so it builds the columns of all of them once and, each time
the queue changed, selects the pending rows (:meth:`PendingColumns.select`: a few numpy gathers
and the projects and users renumbered in order of first use), instead of building columns from a
tuple of thousands of jobs at every plan (a Python pass per job and field, most of a plan's time
on Philly's queue). The selection equals, field for field, the columns built from the pending
jobs themselves, with the same Job objects behind its rows (``PendingColumns.job``).

A job whose record changed after the columns were built (a spot interruption's requeue reports
what is left to run) is reported by the world (:meth:`QueueColumns.changed`): the columns of
every job are built again at the next read (rare: once per requeue). The ids of every job are
ranked once (``PendingColumns.id_rank``), and so is every job by (submit time, id)
(``PendingColumns.time_rank``), so each queue is put in scheduling order by one sort of integers,
without reading a string or sorting its ties again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import numpy as np

from orchestrator.domain.jobs import Job
from orchestrator.domain.pending import ROW_FIELDS, PendingColumns
from orchestrator.planner.order import id_ranks, time_ranks
from orchestrator.sim.simjob import SimJob


class QueueColumns:
    """Columns of every job of a run, and the pending queue selected from them."""

    def __init__(self, pool: str, jobs: list[SimJob]):
        self.pool = pool
        self.jobs = jobs
        self._all: PendingColumns | None = None  # built at the first read (a baseline never reads)
        self._stale = True

    def changed(self) -> None:
        """Some job's record was replaced (the world's requeue): read them again."""
        self._stale = True

    def _build(self) -> PendingColumns:
        records = [job.domain for job in self.jobs]
        # As from_jobs builds them (from_rows transposes its rows into these columns), field by
        # field (no tuple per job held at once: 70k of them are megabytes) and without its list
        # of every row's Job: the selection is handed the pending jobs' own.
        columns = PendingColumns.from_fields(self.pool, {
            name: [getattr(j, name) for j in records] for name in ROW_FIELDS})
        if self._all is not None and self._all.id_rank is not None:
            columns.id_rank = self._all.id_rank  # (ids do not change)
        else:
            columns.id_rank = id_ranks(columns.ids)
        columns.time_rank = time_ranks(columns.submitted_us, columns.id_rank)
        self._all = columns
        self._stale = False
        return columns

    def pending(self, pending: dict[int, SimJob]) -> PendingColumns:
        """The columns of the ``pending`` jobs (by index, in queue order), as ``from_jobs`` of
        their records would build them (C-level passes only: thousands queue on Philly)."""
        if not pending:
            return PendingColumns.empty(self.pool)
        columns = self._all if not self._stale else self._build()
        rows = np.fromiter(pending.keys(), dtype=np.int64, count=len(pending))
        return columns.select(rows, jobs=_Records(self.jobs, rows))


class _Records(Sequence[Job]):
    """The records of some jobs of the run (``rows``, in that order), read when asked: a plan
    reads a few of thousands. A pending job's record is not replaced while it is pending (the
    world replaces one only when it requeues a running job, which then arrives again, and the
    queue is selected again), so what is read is what was pending when the queue was selected."""

    __slots__ = ("jobs", "rows")

    def __init__(self, jobs: list[SimJob], rows: np.ndarray):
        self.jobs = jobs
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> Job: ...
    @overload
    def __getitem__(self, index: slice) -> list[Job]: ...
    def __getitem__(self, index: int | slice) -> Job | list[Job]:
        if isinstance(index, slice):
            return [self.jobs[i].domain for i in self.rows[index].tolist()]
        return self.jobs[self.rows[index]].domain


__all__ = ["QueueColumns"]
