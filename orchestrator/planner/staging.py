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
from orchestrator.planner.forecast import predict_onprem_starts
from orchestrator.policy.models import Policy
from orchestrator.policy.storage import DEFAULT_BANDWIDTH_GBPS

HELD_BY = "storage.staging"  # how ``held_back_by`` names the rule


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


@dataclass(frozen=True, slots=True)
class StagingReview:
    """The unmet jobs split by the staging rule, with each job's staging and predicted wait."""

    kept: tuple[Job, ...]  # worth bursting (in scheduling order)
    held: tuple[Job, ...]  # staging takes longer than the predicted on-prem wait: not burst
    staging: dict[str, Staging]
    predicted_start_s: dict[str, float | None]

    def text(self) -> str:
        if not self.held:
            return ""
        shown = ", ".join(
            f"{j.id} ({self.staging[j.id].dataset_gb:g} GB: {self.staging[j.id].staging_s:.0f}s "
            f"> {self.predicted_start_s[j.id]:.0f}s)" for j in self.held[:5])
        more = f" and {len(self.held) - 5} more" if len(self.held) > 5 else ""
        return (f"{len(self.held)} job(s) not burst: staging their data would take longer than "
                f"their predicted on-prem wait: {shown}{more}")

    def inputs(self, granted: dict[str, tuple[float, float]]) -> dict:
        """The decision's ``inputs.staging``: per job considered, its staging, egress and (for
        the jobs granted a node) compute cost; ``granted``: job id -> (USD per GPU-hour of its
        node, hours it is expected to run)."""
        jobs = {}
        held = {j.id for j in self.held}
        for job in (*self.kept, *self.held):
            staging = self.staging.get(job.id)
            if staging is None:  # a job that moves no data (no storage for its project)
                continue
            row = {
                "dataset_gb": round(staging.dataset_gb, 3),
                "checkpoint_gb": round(staging.checkpoint_gb, 3),
                "bandwidth_gbps": staging.bandwidth_gbps,
                "staging_s": round(staging.staging_s, 1),
                "egress_gb": round(staging.egress_gb, 3),
                "egress_usd": round(staging.egress_usd, 4),
                "predicted_onprem_start_s": self.predicted_start_s.get(job.id),
                "burst": job.id not in held,
            }
            if job.id in granted:
                per_gpu_hour, hours = granted[job.id]
                compute = per_gpu_hour * job.gpus * hours
                row["compute_usd"] = round(compute, 4)
                row["total_usd"] = round(compute + staging.egress_usd, 4)
            elif job.id not in held:
                continue  # kept but not granted (a limit held it): its own story is held_back
            jobs[job.id] = row
        return {"jobs": jobs, "held_jobs": len(self.held),
                "egress_usd": round(sum(r["egress_usd"] for r in jobs.values() if r["burst"]), 4)}


def review(policy: Policy, unmet: Sequence[Job], ordered: Iterable[Job],
           onprem_absorbed: tuple[Job, ...], queue: PoolQueue, now: datetime) -> StagingReview:
    """Split ``unmet`` (scheduling order) by the staging rule; ``ordered``: every pending job in
    scheduling order (those that stay queued had they not been burst are it, less the on-prem
    absorbed ones, as :func:`~orchestrator.planner.forecast.predict_onprem_starts` wants)."""
    staging: dict[str, Staging] = {}
    moving: list[Job] = []
    for job in unmet:
        found = staging_of(policy, job)
        if found is not None and found.dataset_gb > 0:
            staging[job.id] = found
            moving.append(job)
        elif found is not None:
            staging[job.id] = found
    onprem = {j.id for j in onprem_absorbed}
    queued = (j for j in ordered if j.id not in onprem)
    starts = predict_onprem_starts(queued, onprem_absorbed, queue, now,
                                   [j.id for j in moving]) if moving else {}
    kept: list[Job] = []
    held: list[Job] = []
    for job in unmet:
        start = starts.get(job.id)
        if job.id in starts and start is not None and staging[job.id].staging_s > start:
            held.append(job)
        else:
            kept.append(job)
    return StagingReview(tuple(kept), tuple(held), staging, starts)


def granted_rates(policy: Policy, review_: StagingReview, grants: Iterable) -> dict[str, tuple[float, float]]:
    """Job id -> (USD per GPU-hour of the node granted for it, hours it is expected to run: its
    duration, else ``budget_commitment.default_runtime``), for :meth:`StagingReview.inputs`."""
    by_id = {j.id: j for j in review_.kept}
    default_h = policy.budget_commitment.default_runtime.total_seconds() / 3600
    out = {}
    for grant in grants:
        for job_id in grant.jobs:
            job = by_id.get(job_id)
            if job is not None:
                hours = job.duration_s / 3600 if job.duration_s else default_h
                out[job_id] = (grant.candidate.offering.price_per_gpu_hour, hours)
    return out


__all__ = ["HELD_BY", "Staging", "StagingReview", "applies", "granted_rates", "review",
           "staging_of"]
