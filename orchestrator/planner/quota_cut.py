"""The cut of absorption under quotas: once every bin left is a project's own, the rest of the
queue is placed per project on the columns, not job by job.

Under quotas alone (:class:`~orchestrator.planner.bins.OwnedBins`), a job within its project's
quota may take any bin and one over it only its project's nodes and nodes in flight. Suppose, at
some position of the scheduling order,

* no node in flight has a free GPU left (those admit every job),
* on-prem can place none of the widths still queued (its bins only fill), and
* every project with jobs still queued is over its quota even for the narrowest of them.

Then every later job can only go to a ready node of its own project, and such a start changes
no project's held GPUs (a quota counts only work on foreign nodes), so every project stays over
its quota and nothing ever loosens: each project's remaining jobs meet only its own bins, in
scheduling order, whatever the other projects do. :func:`place_own` places them so, project by
project, reading only the jobs narrower than the narrowest refused so far (a job refused stays
refused for every job at least as wide, the bins only filling), and stops a project once its bins
are full. The rest is unmet, without a Job or a quota check made for it.

This is exactly what the job-by-job loop decides (``tests/unit/test_quota_cut.py``, hypothesis:
the same jobs on the same nodes as absorption with the cut switched off).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.planner.admission import ANY_NODE, Admission
from orchestrator.planner.bins import Bins, OwnedBins


def _width_counts(codes: np.ndarray, gpus: np.ndarray, projects: int) -> np.ndarray:
    """Jobs per (project code, width): a ``projects`` x (widest + 1) array."""
    span = int(gpus.max()) + 1
    return np.bincount(codes * span + gpus, minlength=projects * span).reshape(projects, span)


def own_bins_only(owned: OwnedBins, onprem: Bins, admission: Admission,
                  codes: np.ndarray, gpus: np.ndarray, names: tuple) -> bool:
    """Whether the jobs ``codes``/``gpus`` (project codes into ``names`` and widths of the rest
    of the queue, in order) can each only go to its own project's ready nodes; see the module
    docstring. The cheap conditions are read first."""
    if owned.class_free.get(ANY_NODE, 0) or not len(gpus) or int(gpus.min()) < 0:
        return False
    counts = _width_counts(codes, gpus, len(names))
    widths = np.flatnonzero(counts.sum(axis=0))
    if onprem.total and any(onprem.peek(int(w)) is not None for w in widths):
        return False
    for code in np.flatnonzero(counts.sum(axis=1)).tolist():
        narrowest = int(np.flatnonzero(counts[code])[0])
        if not admission.over_quota(names[code], narrowest):
            return False
    return True


@dataclass(frozen=True, slots=True)
class OwnPlacement:
    """What :func:`place_own` placed: positions (into the rest of the queue, ascending), the bin
    each took, and their GPUs."""

    positions: np.ndarray
    bins: list[int]
    gpus: int


def place_own(owned: OwnedBins, codes: np.ndarray, gpus: np.ndarray,
              names: tuple) -> OwnPlacement:
    """Place the jobs ``codes``/``gpus`` (the rest of the queue, in order) each on its own
    project's bins, as the job-by-job loop would once :func:`own_bins_only` holds."""
    placed: list[tuple[int, int]] = []  # (position, bin)
    total = 0
    if not len(gpus):
        return OwnPlacement(np.empty(0, dtype=np.int64), [], 0)
    # The rest grouped by project, each group in queue order (a stable sort of small codes).
    small = codes.astype(np.uint16) if len(names) < 1 << 16 else codes
    grouped = np.argsort(small, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(names)))])
    free = owned.class_free
    for code, project in enumerate(names):
        if free.get(project, 0) <= 0 or bounds[code] == bounds[code + 1]:
            continue  # no bin of its own left: all its remaining jobs are unmet
        where = grouped[bounds[code]:bounds[code + 1]]
        widths = gpus[where]
        # Best fit on the project's own bins alone (no node in flight has room left), as
        # ``owned.place(width, (ANY_NODE, project))`` picks: the last live bin of the smallest
        # room that fits, moved to its new room; on a copy of its rooms, adopted after.
        rooms = owned.class_rooms(project)
        top = len(rooms)
        taken: list[tuple[int, int]] = []
        room_left = free[project]
        limit = owned.node_size + 1  # the narrowest width refused so far
        start, chunk = 0, 64
        while start < len(widths) and room_left > 0 and limit > 1:
            window = widths[start:start + chunk]
            for hit in np.flatnonzero((window < limit) & (window > 0)).tolist():
                width = int(window[hit])
                if width >= limit:
                    continue
                at = None
                if width <= room_left:
                    for room in range(width, top):
                        entries = rooms[room]
                        if entries:
                            at = entries.pop()
                            rooms[room - width].append(at)
                            break
                if at is None:
                    limit = width  # no bin of room >= width: every wider job is refused too
                    continue
                taken.append((at, width))
                placed.append((int(where[start + hit]), at))
                total += width
                room_left -= width
                if room_left <= 0:
                    break
            start += len(window)
            chunk *= 2
        owned.settle(project, rooms, taken)
    placed.sort()
    return OwnPlacement(np.array([p for p, _ in placed], dtype=np.int64),
                        [b for _, b in placed], total)
