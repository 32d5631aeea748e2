"""The clairvoyant reference: knows every arrival and duration in advance.

Pinned definition (``docs/simulator.md``): walk the jobs in submit order, keeping an on-prem
schedule of the jobs kept on-prem; a job stays on-prem if its start in that schedule is within the
SLO, otherwise it runs in the cloud with zero boot delay, billed per GPU-second at the cheapest
fitting offering's per-GPU price.

The on-prem schedule is a profile of GPUs in use over time, on a grid of ``resolution_s``
(60 s): a kept job starts at the earliest grid time (its submit time if it fits at once) from
which the profile has room for its GPUs for its whole duration, and is added to the profile. The
profile pools the on-prem GPUs (no node fragmentation), which, with zero boot delay and no idle
cloud time, makes this a near-limit reference for what any policy can reach, not a proof of
optimality: a smarter choice of which jobs to keep could do better still.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from orchestrator.sim.traces import TraceJob

RESOLUTION_S = 60


@dataclass(frozen=True, slots=True)
class Placement:
    """Where the clairvoyant put one job, and its wait."""

    cloud: bool
    wait_s: float


def clairvoyant(jobs: tuple[TraceJob, ...], onprem_gpus: int, slo_s: float,
                resolution_s: int = RESOLUTION_S) -> list[Placement]:
    """Placements of ``jobs`` (in submit order, as given) for an on-prem pool of ``onprem_gpus``."""
    if not jobs:
        return []
    res = float(resolution_s)
    end = max(j.submit_s + slo_s + j.duration_s for j in jobs)
    used = np.zeros(int(end // res) + 3, dtype=np.int32)
    placements: list[Placement] = []
    for job in jobs:
        room = onprem_gpus - job.gpus
        if room < 0:
            placements.append(Placement(True, 0.0))  # wider than the whole pool
            continue

        def try_at(slot: int, stop: int, job: TraceJob = job, room: int = room) -> int | None:
            window = used[slot:stop]
            over = np.flatnonzero(window > room)
            if over.size == 0:
                window += job.gpus
                return None
            return int(over[-1]) + 1  # the job can start no earlier than after the last overrun

        placements.append(_earliest(job, slo_s, res, try_at))
    return placements


def _earliest(job: TraceJob, slo_s: float, res: float,
              try_at: Callable[[int, int], int | None]) -> Placement:
    """Walk the grid slots from the job's submit time to its SLO: ``try_at(slot, stop)`` books
    the job over ``[slot, stop)`` and returns None, or says how many slots on to look next."""
    first = int(job.submit_s // res)
    last = int((job.submit_s + slo_s) // res)
    slot = first
    while slot <= last:
        start = job.submit_s if slot == first else slot * res
        stop = int(math.ceil((start + max(job.duration_s, 1e-9)) / res))
        skip = try_at(slot, stop)
        if skip is None:
            return Placement(False, start - job.submit_s)
        slot += skip
    return Placement(True, 0.0)


def clairvoyant_on_nodes(jobs: tuple[TraceJob, ...], nodes: int, gpus_per_node: int, slo_s: float,
                         resolution_s: int = RESOLUTION_S) -> list[Placement]:
    """The same rule on the simulated pool's nodes instead of pooled GPUs: a job no wider than a
    node needs that many GPUs of one node (the feasible node busiest at its start: best fit), a
    wider one whole nodes, for its whole duration. Not the pinned reference (:func:`clairvoyant`
    is): a diagnostic of how much of a policy's gap to it is node fragmentation, which no
    scheduler of this cluster can avoid entirely (``docs/simulator.md``)."""
    if not jobs:
        return []
    res = float(resolution_s)
    end = max(j.submit_s + slo_s + j.duration_s for j in jobs)
    used = np.zeros((nodes, int(end // res) + 3), dtype=np.int16)
    placements: list[Placement] = []
    for job in jobs:
        wide = job.gpus > gpus_per_node
        need = math.ceil(job.gpus / gpus_per_node) if wide else 1
        if need > nodes:
            placements.append(Placement(True, 0.0))
            continue
        def try_at(slot: int, stop: int, job: TraceJob = job, wide: bool = wide,
                   need: int = need) -> int | None:
            window = used[:, slot:stop]
            short = window != 0 if wide else window > gpus_per_node - job.gpus
            blocked = short.any(axis=1)
            free = np.flatnonzero(~blocked)
            if free.size >= need:
                if wide:
                    used[free[:need], slot:stop] = gpus_per_node
                else:
                    node = free[np.argmax(used[free, slot])]
                    used[node, slot:stop] += job.gpus
                return None
            # Each node can next take the job just after its last shortfall in this window; the
            # job needs ``need`` of them.
            after = np.where(blocked, short.shape[1] - np.argmax(short[:, ::-1], axis=1), 0)
            return int(np.partition(after, need - 1)[need - 1])

        placements.append(_earliest(job, slo_s, res, try_at))
    return placements
