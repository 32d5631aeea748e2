"""One attempt of a job on a burst node: what staging its data costs first, and what a cut-short
attempt keeps (its last checkpoint) for the next one.

A burst attempt first stages the job's data to the cloud (the policy's storage, the trace's
``dataset_gb``; :func:`orchestrator.planner.staging.staging_of`): its run is longer by the staging
time, and the world tallies the egress. A job that checkpoints (its interval: the policy's
``checkpoint_every_s`` for its project) resumes on its next node from its last checkpoint: of the
attempt's compute time (past its restart overhead) the whole intervals are kept, the rest is lost,
and the next attempt first spends ``spot.restart_overhead`` loading the checkpoint. A job that
does not checkpoint starts again from the beginning.
"""

from __future__ import annotations

import math
from dataclasses import replace

from orchestrator.planner.staging import Staging, staging_of
from orchestrator.policy.models import Policy
from orchestrator.sim.simjob import SimJob


def stage_attempt(policy: Policy, job: SimJob) -> Staging | None:
    """Set the staging time of ``job``'s burst attempt starting now; the staging (for the world's
    egress tally), or None where the policy stages nothing for it."""
    staging = staging_of(policy, job.domain)
    if staging is not None:
        job.stage_s = staging.staging_s
    return staging


def keep_checkpoint(job: SimJob, ran_s: float, restart_overhead_s: float) -> None:
    """An attempt of ``ran_s`` seconds was cut short: keep its last checkpoint (whole
    intervals of compute past the restart overhead), count the rest as lost, and make the
    next attempt pay the restart overhead first (nothing kept: from the beginning, no
    overhead)."""
    computed = min(max(ran_s - job.stage_s - job.overhead_s, 0.0), job.remaining_s)
    job.stage_s = 0.0  # the next attempt stages again where it lands (burst), or not at all
    interval = job.checkpoint_s
    kept = math.floor(computed / interval) * interval if interval else 0.0
    job.max_loss_s = max(job.max_loss_s, computed - kept)
    job.lost_gpu_s += job.gpus * (ran_s - kept)
    if kept > 0 or (interval and job.remaining_s < job.trace.duration_s):
        job.remaining_s -= kept
        job.overhead_s = restart_overhead_s
    if job.remaining_s < job.trace.duration_s:
        # The planner sees what is left to run (the queue reports the job's new time limit).
        job.domain = replace(job.domain, duration_s=job.run_s)
