"""Demand: which pending jobs on-prem and existing burst capacity will absorb, and what is left.

Jobs are considered in scheduling order (project priority, job priority, then oldest first). Each
is fitted first into free on-prem GPUs, then into free GPUs of ready burst nodes and the full GPUs
of nodes still booting (so a spike already being answered is not answered twice). What fits
nowhere is *unmet* demand, the only thing that may cause a launch.

On-prem, a job wider than one node needs that many whole nodes (multi-node training); a smaller
job takes GPUs of one node. On burst nodes a job takes GPUs of one node only where the fabric is
the built-in queue: that is all its dispatcher places (:mod:`orchestrator.sources.builtin`), so a
burst node counts as covering a job only if the job could really be started on it; a fabric that
spans nodes (Slurm, torch elastic) takes a wide job on whole free burst nodes. The fitting is first-fit over bins of free GPUs, which is what the built-in
queue's dispatcher and Slurm's backfill roughly do; it is an estimate for planning, not a schedule.

Speed (100k pending jobs): the queue is read as columns
(:class:`~orchestrator.domain.pending.PendingColumns`: what a queue source builds from its query,
or built once from a tuple of jobs); the scheduling order is one ``numpy.lexsort`` of them,
memoized on the identity of the pending sequence (:func:`ordered`, :mod:`.order`); once nothing
is free anywhere, the rest of the order is unmet; under quotas alone the loop is
:mod:`.quota_absorb`'s (quota headroom per project code, the columns turned into lists chunk by
chunk), and once only projects' own nodes are left to projects over their quotas, the rest is
placed per project (:mod:`.quota_cut`). The unmet jobs are tallied on the columns (:func:`_tally`), not job by job.
The ordered, unmet and burst-absorbed jobs are :class:`~orchestrator.domain.pending.JobsView` s:
positions, each Job made only when read. The bins: :mod:`.bins`.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter

import numpy as np

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node
from orchestrator.domain.pending import JobsView, PendingColumns
from orchestrator.domain.snapshot import PoolQueue
from orchestrator.planner.admission import NodeAdmitter
from orchestrator.planner.bins import Bins
from orchestrator.planner.census import Census, take_census
from orchestrator.planner.offerings import expected_hours
from orchestrator.planner.order import (  # noqa: F401  (_ORDER_MEMO: the benches clear it)
    _ORDER_MEMO,
    Ordered,
    ordered,
    scheduling_order,
)
from orchestrator.planner.placement import spans_nodes
from orchestrator.planner.quota_absorb import absorb_quotas
from orchestrator.planner.quota_cut import OwnPlacement
from orchestrator.policy.models import Policy

@dataclass(frozen=True, slots=True)
class Demand:
    """The outcome of absorbing a pool's pending jobs into existing capacity (totals precomputed)."""

    ordered: tuple[Job, ...]  # every pending job, in scheduling order
    onprem_absorbed: tuple[Job, ...]
    burst_absorbed: tuple[Job, ...]
    unmet: tuple[Job, ...]  # fits nowhere: candidates for new nodes
    busy_nodes: frozenset[str]  # ready burst nodes that absorbed some pending job
    beyond_onprem: tuple[Job, ...] = ()  # jobs on-prem cannot start now (the trigger looks at these)
    pending_gpus: int = 0
    unmet_gpus: int = 0
    oldest_beyond: datetime | None = None  # submit time of the oldest job on-prem cannot start
    # Burst capacity left after absorbing (free GPUs of ready and booting nodes): scale-up packs
    # the unmet jobs onto it first, so a multi-node job can use whole nodes already there.
    burst: Bins | None = None
    # What the decision record and the pricing read of ``unmet``, tallied from the queue's
    # columns (:class:`Ordered`) instead of walking up to 100k jobs again; None: not tallied
    # (read ``unmet`` itself), as after the wait-aware split replaces ``unmet``.
    onprem_absorbed_gpus: int | None = None
    burst_absorbed_gpus: int | None = None
    unmet_by_project: dict[str, int] | None = None  # GPUs, projects in order of first unmet job
    unmet_widths: Counter[int] | None = None  # unmet jobs per width
    unmet_hours: float | None = None  # expected_hours of the unmet jobs' durations

    def oldest_wait_s(self, now: datetime) -> float:
        if self.oldest_beyond is None:
            return 0.0
        return max((now - self.oldest_beyond).total_seconds(), 0.0)

    def absorbed_onprem_gpus(self) -> int:
        """GPUs of the jobs absorbed on-prem (tallied, or counted when not)."""
        if self.onprem_absorbed_gpus is not None:
            return self.onprem_absorbed_gpus
        return sum(map(_gpus, self.onprem_absorbed))

    def absorbed_burst_gpus(self) -> int:
        """GPUs of the jobs absorbed on burst nodes (tallied, or counted when not)."""
        if self.burst_absorbed_gpus is not None:
            return self.burst_absorbed_gpus
        return sum(map(_gpus, self.burst_absorbed))

    def without_tallies(self, unmet: tuple[Job, ...]) -> Demand:
        """The same demand with another ``unmet`` (the wait-aware split's), its tallies dropped."""
        return dataclasses.replace(self, unmet=unmet, unmet_gpus=gpus_of(unmet),
                                   unmet_by_project=None, unmet_widths=None, unmet_hours=None)

    def narrowed(self, unmet: tuple[Job, ...], removed: tuple[Job, ...]) -> Demand:
        """The same demand with ``unmet`` narrowed to a subsequence of it (the wait-aware split's
        due jobs), ``removed`` the rest. The integer tallies lose what ``removed`` held (a few
        jobs, where recounting would walk up to 100k); the result equals a recount. Where a
        project would be left with no GPUs (so whether it is still listed depends on jobs of no
        GPUs), and for the mean duration (a float sum), it counts again."""
        by_project, widths = self.unmet_by_project, self.unmet_widths
        if by_project is None or widths is None:
            return self.without_tallies(unmet)
        left = dict(by_project)
        kept = Counter(widths)
        if isinstance(removed, JobsView):  # on the columns: no Job made for each removed job
            codes, gpus = removed.column("project"), removed.column("gpus")
            names = removed.columns.projects
            present = np.bincount(codes, minlength=len(names))
            totals = np.bincount(codes, weights=gpus, minlength=len(names))
            for code in np.flatnonzero(present).tolist():
                left[names[code]] -= int(totals[code])
            for width, count in zip(*(a.tolist() for a in np.unique(gpus, return_counts=True))):
                kept[width] -= count
        else:
            for job in removed:
                left[job.project] -= job.gpus
                kept[job.gpus] -= 1
        if any(gpus <= 0 for gpus in left.values()):
            return self.without_tallies(unmet)
        order: dict[str, int] = {}  # projects in the order of their first job still unmet
        for project in first_projects(unmet, len(left)):
            order[project] = left[project]
        return dataclasses.replace(self, unmet=unmet, unmet_gpus=sum(order.values()),
                                   unmet_by_project=order, unmet_widths=+kept,
                                   unmet_hours=unmet_hours(unmet))


def absorb(queue: PoolQueue | None, nodes: list[Node], policy: Policy,
           census: Census | None = None,
           admit: NodeAdmitter | None = None) -> Demand:
    """Fit the pool's pending jobs into on-prem, then burst capacity; see the module docstring.
    ``census``: the burst capacity as :func:`~orchestrator.planner.census.take_census` gathered
    it from ``nodes`` this tick (gathered here when not given). ``admit(job, node id)``: whether
    the dispatcher would start the job on that burst node (budgets,
    :mod:`orchestrator.planner.admission`); asked node by node, a yes commits the start."""
    if queue is None or not queue.pending:
        return Demand((), (), (), (), frozenset())
    order = ordered(queue.pending, policy)
    columns = order.columns
    job_at = columns.job
    onprem_free = list(queue.onprem.free_per_node) or (
        [queue.onprem.free_gpus] if queue.onprem.free_gpus else []
    )
    onprem = Bins(onprem_free, node_size=policy.pool.onprem.gpus_per_node)
    if census is None:
        census = take_census(nodes, policy, None)
    # Free GPUs of ready nodes, all GPUs of nodes in flight. The node size is that of the nodes,
    # not of their largest free remainder: with only half-busy 8-GPU nodes, a 6-GPU job must not
    # count as a "multi-node" job spread over two 4-GPU remainders (it fits on neither node).
    burst = Bins(census.burst_free, census.burst_owners, node_size=census.burst_node_size)

    onprem_absorbed: list[Job] = []
    burst_rows: list[int] = []
    unmet_rows: list[int] = []
    onprem_gpus = burst_gpus = 0
    busy: set[str] = set()
    owners = burst.owners
    burst_size = burst.node_size
    onprem_place, burst_place = onprem.place, burst.place
    spans = spans_nodes(policy)
    wide_check = admit is not None and getattr(admit, "checks_wide", False)
    rows = order.order
    stop = len(rows)  # from here on nothing is free anywhere: the rest is all unmet
    own: OwnPlacement | None = None  # the quota cut's placements from ``stop`` on
    if (onprem.total or burst.total) and admit is not None and admit.quotas_only and not spans:
        # Quotas only, and no job spread over nodes (the one other placement on these bins):
        # the bins by whose node they are (the Bins are replaced after absorption).
        quota_only = absorb_quotas(order, onprem, burst, admit)
        stop, own, busy = quota_only.stop, quota_only.own, quota_only.busy
        onprem_absorbed, burst_rows, unmet_rows = (quota_only.onprem, quota_only.burst_rows,
                                                   quota_only.unmet_rows)
        onprem_gpus, burst_gpus = quota_only.onprem_gpus, quota_only.burst_gpus
    elif onprem.total or burst.total:
        rows_list = rows.tolist()
        refused: dict[tuple[int, int, float], int] = {}
        if admit is not None:  # what a verdict reads of a job besides its width, per row
            codes = columns.project.tolist()
            durations_key = np.nan_to_num(columns.duration_s, nan=-1.0).tolist()
        for index, gpus in enumerate(order.gpus_in_order()):
            if not onprem.total and not burst.total:
                stop = index
                break
            if onprem.total and onprem_place(gpus) is not None:
                onprem_absorbed.append(job_at(rows_list[index]))
                onprem_gpus += gpus
                continue
            # Burst nodes take a job only on one node (the built-in queue's dispatcher places no
            # job across nodes): a wider job is never absorbed there, so no node counts as
            # covering it.
            used = None
            if burst.total and gpus > burst_size and spans:
                # A fabric that spans nodes (Slurm, torch elastic) starts a wide job on whole
                # free nodes: those of its launch group while they boot. (An admitter that asks
                # to, trigger.spare_room's, is asked about each of them.)
                if wide_check:
                    job = job_at(rows_list[index])
                    peeked = burst.peek(gpus)
                    if peeked and all(admit(job, owners[i]) for i in peeked):  # type: ignore[misc]
                        used = burst_place(gpus)
                else:
                    used = burst_place(gpus)
            elif burst.total and gpus <= burst_size:
                if admit is None:
                    used = burst_place(gpus)
                else:
                    row = rows_list[index]
                    # A (project, width, duration) refused on every bin stays refused while the
                    # bins only fill and no start loosened admission (NodeAdmitter.loosened):
                    # without this, each job of a project over its quota asked every node.
                    key = (codes[row], gpus, durations_key[row])
                    if refused.get(key) != admit.loosened:
                        job = job_at(row)
                        used = burst.place_if(gpus, lambda i, job=job: admit(job, owners[i]))
                        if used is None:
                            refused[key] = admit.loosened
            if used is not None:
                burst_rows.append(rows_list[index])
                burst_gpus += gpus
                for i in used:
                    if owners[i] is not None:
                        busy.add(owners[i])
                continue
            unmet_rows.append(rows_list[index])
    else:
        stop = 0
    # The unmet jobs: those that fitted nowhere before ``stop``, then all from ``stop`` on (less
    # what the quota cut placed), tallied on the columns.
    rest = rows[stop:]
    burst_index = np.array(burst_rows, dtype=np.int64)
    if own is not None and len(own.positions):
        left = np.ones(len(rest), dtype=bool)
        left[own.positions] = False
        burst_index = np.concatenate([burst_index, rest[own.positions]])
        rest = rest[left]
        burst_gpus += own.gpus
        busy.update(owners[i] for i in own.bins if owners[i] is not None)
    unmet_index = np.concatenate([np.array(unmet_rows, dtype=np.int64), rest])
    tally = _tally(columns, burst_index, unmet_index)
    unmet_jobs = JobsView(columns, unmet_index)
    burst_jobs = JobsView(columns, burst_index)
    if admit is not None:
        # An unmet job was refused by (or does not fit) every node already there: scale-up packs
        # it onto this tick's new nodes only.
        burst = Bins([], node_size=burst.node_size)
    return Demand(order.jobs, tuple(onprem_absorbed), burst_jobs, unmet_jobs,
                  frozenset(busy), burst_jobs + unmet_jobs, order.pending_gpus,
                  sum(tally.by_project.values()), tally.oldest, burst, onprem_gpus, burst_gpus,
                  tally.by_project, tally.widths, _mean_hours(tally.known_durations))


@dataclass(frozen=True, slots=True)
class _Tally:
    """What the record and the pricing read of the unmet jobs, counted on the columns."""

    by_project: dict[str, int]  # GPUs, projects in order of their first unmet job
    widths: Counter[int]  # unmet jobs per width
    oldest: datetime | None  # the first earliest submit time of the burst-absorbed, then unmet
    known_durations: np.ndarray  # the unmet jobs' truthy durations, in order


def _tally(columns: PendingColumns, burst_index: np.ndarray, unmet_index: np.ndarray) -> _Tally:
    codes = columns.project[unmet_index]
    gpus = columns.gpus[unmet_index]
    by_project: dict[str, int] = {}
    widths: Counter[int] = Counter()
    if len(unmet_index):
        low = min(int(gpus.min()), 0)  # widths offset to 0 (a width is never negative, but)
        span = int(gpus.max()) - low + 1
        counts = np.bincount(codes * span + (gpus - low),
                             minlength=len(columns.projects) * span).reshape(-1, span)
        scale = np.arange(low, low + span, dtype=np.int64)
        totals = counts @ scale
        present = int(np.count_nonzero(counts.sum(axis=1)))
        names = columns.projects
        by_project = {names[c]: int(totals[c]) for c in first_seen(codes, present)}
        widths = Counter({int(w): int(n) for w, n in zip(scale.tolist(), counts.sum(axis=0).tolist())
                          if n})
    durations = columns.duration_s[unmet_index]
    known = durations[~np.isnan(durations) & (durations != 0)]
    oldest = None
    both = np.concatenate([burst_index, unmet_index])
    if len(both):  # the first earliest (its own datetime: burst-absorbed first, then unmet)
        oldest = columns.job(int(both[int(np.argmin(columns.submitted_us[both]))])).submitted_at
    return _Tally(by_project, widths, oldest, known)


def first_seen(values: np.ndarray, distinct: int) -> list[int]:
    """The first ``distinct`` distinct ``values`` in order of first appearance: read from the
    first thousand entries where they all appear there (a queue's projects mostly do, so 100k
    entries are not all read), else found by each value's first position."""
    seen = dict.fromkeys(values[:1024].tolist())
    n = len(values)
    if len(seen) >= distinct or n <= 1024:
        return list(seen)[:distinct]
    if n and int(values.min()) >= 0 and int(values.max()) < 4 * n + 4096:
        # Codes (a queue's projects), some first seen late: each one's first position by one
        # unbuffered minimum over all, instead of turning chunk after chunk into lists.
        first = np.full(int(values.max()) + 1, n, dtype=np.int64)
        np.minimum.at(first, values, np.arange(n, dtype=np.int64))
        present = np.flatnonzero(first < n)
        return present[np.argsort(first[present], kind="stable")][:distinct].tolist()
    start, size = 1024, 2048
    while len(seen) < distinct and start < n:
        seen.update(dict.fromkeys(values[start:start + size].tolist()))
        start += size
        size *= 2
    return list(seen)[:distinct]


def _mean_hours(known: np.ndarray) -> float:
    """:func:`~.offerings.expected_hours` of truthy durations held in an array: the sum taken in
    order (``cumsum`` adds one by one, as ``sum`` does, so the figure is the same to the bit)."""
    if not len(known):
        return expected_hours([])
    return float(np.cumsum(known)[-1]) / len(known) / 3600.0


def unmet_hours(jobs: Sequence[Job]) -> float:
    """:func:`~.offerings.expected_hours` of ``jobs``, read from the columns of a view."""
    if isinstance(jobs, JobsView):
        durations = jobs.column("duration_s")
        return _mean_hours(durations[~np.isnan(durations) & (durations != 0)])
    return expected_hours(list(map(_duration, jobs)))


def first_projects(jobs: Sequence[Job], wanted: int | None = None) -> list[str]:
    """The projects of ``jobs`` in the order of their first job (reading no further than the
    first ``wanted`` distinct ones; from the columns of a view)."""
    if isinstance(jobs, JobsView):
        codes = jobs.column("project")
        present, first = np.unique(codes, return_index=True)
        names = jobs.columns.projects
        found = [names[c] for c in present[np.argsort(first, kind="stable")].tolist()]
        return found if wanted is None else found[:wanted]
    seen: dict[str, None] = {}
    for project in map(_project, jobs):
        if project not in seen:
            seen[project] = None
            if len(seen) == wanted:
                break
    return list(seen)


def gpus_by_project(jobs: Sequence[Job]) -> dict[str, int]:
    """GPUs of ``jobs`` per project, projects in the order of their first job."""
    if isinstance(jobs, JobsView):
        codes, gpus = jobs.column("project"), jobs.column("gpus")
        totals = np.bincount(codes, weights=gpus, minlength=len(jobs.columns.projects))
        return {p: int(totals[jobs.columns.projects.index(p)]) for p in first_projects(jobs)}
    per_project: dict[str, int] = {}
    pairs = Counter(zip(map(_project, jobs), map(_gpus, jobs)))
    for (project, width), count in pairs.items():
        per_project[project] = per_project.get(project, 0) + width * count
    return per_project


def gpus_of(jobs: Sequence[Job]) -> int:
    """Total GPUs of ``jobs`` (one sum over the column of a view)."""
    if isinstance(jobs, JobsView):
        return int(jobs.column("gpus").sum())
    return sum(map(_gpus, jobs))


_id = attrgetter("id")
_project = attrgetter("project")
_duration = attrgetter("duration_s")


_gpus = attrgetter("gpus")


def oldest_wait_s(jobs: tuple[Job, ...], now: datetime) -> float:
    if not jobs:
        return 0.0
    return max((now - min(j.submitted_at for j in jobs)).total_seconds(), 0.0)
