"""Absorption under quotas alone: the job-by-job loop of :func:`.demand.absorb` where the only
verdict on a burst node is a project quota's (no budget) and no job spans nodes.

Each job in scheduling order goes to free on-prem GPUs first, then to a burst bin: a job within
its project's quota takes the plain best fit, one over it only its project's nodes and nodes in
flight (:class:`~orchestrator.planner.bins.OwnedBins`); a start on a foreign ready node counts
to both projects' quotas (:meth:`~orchestrator.planner.admission.Admission.take`). Once only
projects' own nodes are left to projects over their quotas, the rest is placed per project on
the columns (:mod:`.quota_cut`).

Why a loop of its own: this is the path of a policy with quotas and no budget (the benches' and
many sites'), and at 100k pending jobs it places ~9k jobs one by one. Here each project's quota
headroom is kept per project code (refreshed after the rare start that changes it, instead of a
method call and two dict reads per job), the refusal key is built only for a job over its
quota, and the queue's columns are turned into lists chunk by chunk as the loop reaches them
(the loop usually stops after a few thousand jobs of up to a million).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from orchestrator.domain.jobs import Job
from orchestrator.planner.admission import ANY_NODE, NodeAdmitter
from orchestrator.planner.bins import Bins, OwnedBins
from orchestrator.planner.order import Ordered
from orchestrator.planner.quota_cut import OwnPlacement, own_bins_only, place_own

_FIRST_CHUNK = 2048  # jobs turned into lists at once, doubling


@dataclass(slots=True)
class QuotaAbsorption:
    """What :func:`absorb_quotas` decided: ``stop`` is where the loop ended (every job from it on
    is unmet, less what ``own`` placed); the rows are positions in the queue's columns."""

    stop: int
    onprem: list[Job]
    burst_rows: list[int]
    unmet_rows: list[int]
    onprem_gpus: int
    burst_gpus: int
    busy: set[str]
    own: OwnPlacement | None


def absorb_quotas(order: Ordered, onprem: Bins, burst: Bins, admit: NodeAdmitter
                  ) -> QuotaAbsorption:
    """Absorb ``order``'s jobs into ``onprem`` and ``burst`` as :func:`.demand.absorb` does
    under quotas alone (``admit.quotas_only``, no job spread over nodes); see the module
    docstring. ``burst``'s free GPUs are taken through an :class:`OwnedBins` copy."""
    columns = order.columns
    job_at = columns.job
    rows = order.order
    n = len(rows)
    names = columns.projects
    admission = admit.admission
    owners = burst.owners
    classes = list(map(admit.node_class, owners))
    owned = OwnedBins(burst, classes)
    class_free = owned.class_free
    burst_size = burst.node_size
    onprem_place = onprem.place
    place = owned.place
    codes_in_order = columns.project[rows]
    gpus_in_order = columns.gpus[rows]
    code_of = {name: code for code, name in enumerate(names)}
    quotas = admission._quotas
    held = admission.held

    def headroom(code: int) -> int | None:
        """GPUs the project may still start on foreign nodes (None: no quota)."""
        quota = quotas.get(names[code])
        return None if quota is None else quota - held.get(names[code], 0)

    room = [headroom(code) for code in range(len(names))]
    allowed = [owned.rooms_of((ANY_NODE, name)) for name in names]
    place_in = owned.place_in
    out = QuotaAbsorption(n, [], [], [], 0, 0, set(), None)
    burst_rows, unmet_rows, busy = out.burst_rows, out.unmet_rows, out.busy
    refused: dict[tuple[int, int, float], int] = {}
    next_cut = 0  # where the quota cut is next looked for
    onprem_gpus = burst_gpus = 0
    base, size = 0, _FIRST_CHUNK
    done = False
    while base < n and not done:
        end = min(base + size, n)
        durations = np.nan_to_num(columns.duration_s[rows[base:end]], nan=-1.0)  # the key's
        chunk = zip(range(base, end), gpus_in_order[base:end].tolist(), rows[base:end].tolist(),
                    codes_in_order[base:end].tolist(), durations.tolist())
        for index, gpus, row, code, duration in chunk:
            if not onprem.total and not owned.total:
                out.stop = index
                done = True
                break
            if index >= next_cut:
                # Every bin left only a project's own and every project over its quota: the
                # rest is placed per project on the columns (:mod:`.quota_cut`). Looked for
                # when nodes in flight or on-prem fill up, else at doubling gaps (each look
                # reads the rest of the queue).
                if own_bins_only(owned, onprem, admission, codes_in_order[index:],
                                 gpus_in_order[index:], names):
                    out.own = place_own(owned, codes_in_order[index:], gpus_in_order[index:],
                                        names)
                    out.stop = index
                    done = True
                    break
                next_cut = index + max(index, 256)
            if onprem.total and onprem_place(gpus) is not None:
                out.onprem.append(job_at(row))
                onprem_gpus += gpus
                if not onprem.total:
                    next_cut = index + 1  # on-prem is full
                continue
            # Burst nodes take a job only on one node (the built-in queue's dispatcher places
            # no job across nodes): a wider job is never absorbed there.
            placed = None
            if owned.total and gpus <= burst_size:
                limit = room[code]
                if limit is not None and gpus > limit:  # over its quota: own nodes, in flight
                    # A (project, width, duration) refused on every bin stays refused while the
                    # bins only fill and no start loosened admission.
                    key = (code, gpus, duration)
                    if refused.get(key) != admission.loosened:
                        placed = place_in(allowed[code], gpus) if gpus > 0 else None
                        if placed is None:
                            refused[key] = admission.loosened
                else:  # within its quota: the plain best fit
                    placed = place(gpus)
            if placed is None:
                unmet_rows.append(row)
                continue
            klass = classes[placed]
            if klass is ANY_NODE:
                # A node in flight: covered, nothing taken (NodeAdmitter).
                if not class_free[ANY_NODE]:
                    next_cut = index + 1  # the last node in flight is full
            elif klass != names[code]:
                # A foreign ready node: the start counts to both quotas (on its own project's
                # node a start changes nothing).
                admit(job_at(row), owners[placed])
                room[code] = headroom(code)
                if klass in code_of:
                    room[code_of[klass]] = headroom(code_of[klass])
            burst_rows.append(row)
            burst_gpus += gpus
            if owners[placed] is not None:
                busy.add(owners[placed])
        base = end
        size *= 2
    out.onprem_gpus, out.burst_gpus = onprem_gpus, burst_gpus
    return out
