"""What moving a burst job's data costs: staging time and egress, and whether bursting still pays.

A job burst to the cloud must first have its data copied to the cloud region (its datasets:
``size_gb`` in all, at ``bandwidth_gbps``), and brings its checkpoints back when it ends
(``checkpoint_size_gb``); every GB moved either way costs ``egress_usd_per_gb``. Sizes come from
the job's own annotation (``Job.dataset_gb``, e.g. Slurm ``--comment burst.dataset_gb=500``),
else its project's ``storage``, else the pool's (:meth:`Policy.storage_for`).

:func:`review` is the planner's rule: a job whose staging would take longer than its predicted
on-prem wait (:func:`~orchestrator.planner.forecast.predict_onprem_starts`) is not burst: it
would start later in the cloud than on-prem, at a price. A job the model never starts on-prem
(no release in view) is always worth staging. :meth:`StagingReview.inputs` is what the decision
records per job: staging seconds, egress GB and USD, next to the compute cost of the node share
it was granted.

Pure: sizes come through the policy and the snapshot's jobs; ``now`` is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from orchestrator.domain.jobs import Job
from orchestrator.domain.pending import JobsView
from orchestrator.domain.snapshot import PoolQueue
from orchestrator.planner.forecast import MAX_JOBS, predict_onprem_starts
from orchestrator.policy.models import Policy
from orchestrator.policy.storage import DEFAULT_BANDWIDTH_GBPS

HELD_BY = "storage.staging"  # how ``held_back_by`` names the rule
# Jobs the decision lists one by one (those granted a node first, then the held ones); the rest
# are counted (``jobs_omitted``), so a queue of 100k keeps the record small.
MAX_ROWS = 100


@dataclass(frozen=True, slots=True)
class Staging:
    """What bursting one job moves: GB in (datasets) and back (checkpoints), how long staging
    in takes, and what the egress of both costs."""

    dataset_gb: float
    checkpoint_gb: float
    bandwidth_gbps: float
    egress_usd_per_gb: float

    @property
    def staging_s(self) -> float:
        return self.dataset_gb * 8.0 / self.bandwidth_gbps

    @property
    def egress_gb(self) -> float:
        return self.dataset_gb + self.checkpoint_gb

    @property
    def egress_usd(self) -> float:
        return self.egress_gb * self.egress_usd_per_gb


def staging_of(policy: Policy, job: Job) -> Staging | None:
    """The job's staging; None when neither it nor its policy declares any data."""
    storage = policy.storage_for(job.project)
    if storage is None and job.dataset_gb is None:
        return None
    dataset = job.dataset_gb if job.dataset_gb is not None else storage.dataset_gb  # type: ignore[union-attr]
    if storage is None:
        return Staging(dataset, 0.0, DEFAULT_BANDWIDTH_GBPS, 0.0)
    return Staging(dataset, storage.checkpoint_size_gb, storage.bandwidth_gbps,
                   float(storage.egress_usd_per_gb))


def applies(policy: Policy, unmet: Sequence[Job]) -> bool:
    """Whether any unmet job moves data: the policy declares storage, or a job is annotated
    (one look at the column for a queue read as columns)."""
    if policy.pool.storage is not None or any(p.storage is not None for p in policy.projects):
        return True
    if isinstance(unmet, JobsView):
        return bool((~np.isnan(unmet.column("dataset_gb"))).any())
    return any(j.dataset_gb is not None for j in unmet)


class StagingReview:
    """The unmet jobs split by the staging rule, with each job's staging and predicted wait.

    Only the first :data:`~orchestrator.planner.forecast.MAX_JOBS` unmet jobs can be held: the
    forecast predicts no later one (a later job is always kept), so a queue of 100k jobs costs
    the tick a look at 500 of them, and ``kept`` stays the queue's view when nothing is held."""

    def __init__(self, policy: Policy, kept: Sequence[Job], held: tuple[Job, ...],
                 predicted_start_s: dict[str, float | None]):
        self.policy = policy
        self.kept = kept  # worth bursting (in scheduling order)
        self.held = held  # staging takes longer than the predicted on-prem wait: not burst
        self.predicted_start_s = predicted_start_s
        self._by_project: dict[str | None, Staging | None] = {}

    def staging(self, job: Job) -> Staging | None:
        """:func:`staging_of`, the project's worked out once."""
        if job.dataset_gb is not None:
            return staging_of(self.policy, job)
        if job.project not in self._by_project:
            self._by_project[job.project] = staging_of(self.policy, job)
        return self._by_project[job.project]

    def text(self) -> str:
        if not self.held:
            return ""
        parts = []
        for job in self.held[:5]:
            staging = self.staging(job)
            assert staging is not None
            parts.append(f"{job.id} ({staging.dataset_gb:g} GB: {staging.staging_s:.0f}s "
                         f"> {self.predicted_start_s[job.id]:.0f}s)")
        more = f" and {len(self.held) - 5} more" if len(self.held) > 5 else ""
        return (f"{len(self.held)} job(s) not burst: staging their data would take longer than "
                f"their predicted on-prem wait: {', '.join(parts)}{more}")

    def inputs(self, granted: dict[str, tuple[Job, float, float]]) -> dict:
        """The decision's ``inputs.staging``: per job granted a node or held (at most
        :data:`MAX_ROWS`, granted first), its staging, egress and (granted) compute cost;
        ``granted``: job id -> (the job, USD per GPU-hour of its node, hours it is expected
        to run), as :func:`granted_rates` gives it."""
        listed = [(job, True) for job, _, _ in granted.values()] + [(j, False) for j in self.held]
        listed = [(job, burst, st) for job, burst in listed
                  if (st := self.staging(job)) is not None]
        burst_egress = sum(st.egress_usd for _, burst, st in listed if burst)
        jobs = {}
        for job, burst, staging in listed[:MAX_ROWS]:
            row: dict = {
                "dataset_gb": round(staging.dataset_gb, 3),
                "checkpoint_gb": round(staging.checkpoint_gb, 3),
                "bandwidth_gbps": staging.bandwidth_gbps,
                "staging_s": round(staging.staging_s, 1),
                "egress_gb": round(staging.egress_gb, 3),
                "egress_usd": round(staging.egress_usd, 4),
                "predicted_onprem_start_s": self.predicted_start_s.get(job.id),
                "burst": burst,
            }
            if burst:
                _, per_gpu_hour, hours = granted[job.id]
                compute = per_gpu_hour * job.gpus * hours
                row["compute_usd"] = round(compute, 4)
                row["total_usd"] = round(compute + staging.egress_usd, 4)
            jobs[job.id] = row
        return {"jobs": jobs, "held_jobs": len(self.held),
                "jobs_omitted": max(len(listed) - MAX_ROWS, 0),
                "egress_usd": round(burst_egress, 4)}


def review(policy: Policy, unmet: Sequence[Job], ordered: Iterable[Job],
           onprem_absorbed: tuple[Job, ...], queue: PoolQueue, now: datetime) -> StagingReview:
    """Split ``unmet`` (scheduling order) by the staging rule; ``ordered``: every pending job in
    scheduling order (those that stay queued had they not been burst are it, less the on-prem
    absorbed ones, as :func:`~orchestrator.planner.forecast.predict_onprem_starts` wants)."""
    result = StagingReview(policy, unmet, (), {})
    head = unmet[:MAX_JOBS]  # no later unmet job gets a prediction (see the class docstring)
    moving = [job for job in head if (st := result.staging(job)) is not None and st.dataset_gb > 0]
    if not moving:
        return result
    onprem = {j.id for j in onprem_absorbed}
    queued = (j for j in ordered if j.id not in onprem)
    starts = predict_onprem_starts(queued, onprem_absorbed, queue, now, [j.id for j in moving])
    held_at = []
    for position, job in enumerate(head):
        start = starts.get(job.id)
        staging = result.staging(job) if start is not None else None
        if staging is not None and staging.staging_s > start:  # type: ignore[operator]
            held_at.append(position)
    result.predicted_start_s = starts
    if not held_at:
        return result
    held = tuple(head[i] for i in held_at)
    if isinstance(unmet, JobsView):
        mask = np.ones(len(unmet), dtype=bool)
        mask[held_at] = False
        result.kept = unmet.where(mask)
    else:
        skip = set(held_at)
        result.kept = tuple(j for i, j in enumerate(unmet) if i not in skip)
    result.held = held
    return result


def granted_rates(policy: Policy, review_: StagingReview,
                  grants: Iterable) -> dict[str, tuple[Job, float, float]]:
    """Job id -> (the job, USD per GPU-hour of the node granted for it, hours it is expected to
    run: its duration, else ``budget_commitment.default_runtime``), for
    :meth:`StagingReview.inputs`. The jobs are looked up in ``kept`` in order until all are
    found (granted jobs come first in scheduling order)."""
    rates = {job_id: grant.candidate.offering.price_per_gpu_hour
             for grant in grants for job_id in grant.jobs}
    default_h = policy.budget_commitment.default_runtime.total_seconds() / 3600
    out: dict[str, tuple[Job, float, float]] = {}
    for job in review_.kept:
        if len(out) == len(rates):
            break
        if job.id in rates:
            hours = job.duration_s / 3600 if job.duration_s else default_h
            out[job.id] = (job, rates[job.id], hours)
    return out


__all__ = ["HELD_BY", "Staging", "StagingReview", "applies", "granted_rates", "review",
           "staging_of"]
