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
what is left to run) is noticed by identity of its record: the columns of every job are built
again then (rare: once per requeue).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from orchestrator.domain.jobs import Job
from orchestrator.domain.pending import PendingColumns
from orchestrator.sim.simjob import SimJob


class QueueColumns:
    """Columns of every job of a run, and the pending queue selected from them."""

    def __init__(self, pool: str, jobs: list[SimJob]):
        self.pool = pool
        self.jobs = jobs
        self._records: list[Job] = []
        self._all: PendingColumns | None = None  # built at the first read (a baseline never reads)

    def _build(self) -> PendingColumns:
        records = self._records = [job.domain for job in self.jobs]
        # As from_jobs builds them, without its map of every row to its Job: the selection is
        # handed the pending jobs' own (fewer kept alive over a run of 70k jobs).
        self._all = PendingColumns.from_rows(self.pool, [
            (j.id, j.project, j.gpus, j.priority, j.submitted_at, j.duration_s, j.checkpoint_s,
             j.user, j.dataset_gb) for j in records])
        return self._all

    def pending(self, jobs: Iterable[SimJob]) -> PendingColumns:
        """The columns of ``jobs`` (pending, in queue order), as ``from_jobs`` of their records
        would build them."""
        jobs = list(jobs)
        if not jobs:
            return PendingColumns.empty(self.pool)
        columns = self._all
        records = self._records
        if columns is None or any(records[job.index] is not job.domain for job in jobs):
            columns = self._build()
        rows = np.fromiter((job.index for job in jobs), dtype=np.int64, count=len(jobs))
        return columns.select(rows, jobs=[job.domain for job in jobs])


__all__ = ["QueueColumns"]
