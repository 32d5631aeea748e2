"""Egress lines: what moving a burst job's data to the cloud region and its checkpoints back cost.

Pure, like :mod:`.attribution`: each run of a job on a burst node stages its data in (the
datasets of its project's ``storage``, else the pool's) and brings its checkpoints back
(``checkpoint_size_gb``), every GB at ``egress_usd_per_gb``. The ledger writes that as one
``egress`` line of the job, in the hour bucket where the run started, attributed to the job's
project and user (key ``<node>:<bucket>:egress:<job>``; two runs of a job on one node in one hour
are one line of both). A run that started before the roll-up's first open bucket was accounted
already and is not repeated; a node whose policy is no longer loaded, or a storage without an
egress price, gets no egress lines.

The sizes are those the policy declares: the planner also reads a job's own annotation
(``burst.dataset_gb``), which the job runs the ledger reads do not carry.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal

from orchestrator.costs.attribution import HOUR, NodeBilling, hour_floor
from orchestrator.domain.costs import CostKind, CostLine, JobUsage
from orchestrator.policy.storage import Storage

_MICROS = Decimal(1_000_000)


def egress_micros(storage: Storage) -> int:
    """Micro-dollars of one run's egress: (datasets + checkpoints) GB x the rate, half to even."""
    gb = Decimal(str(storage.dataset_gb)) + Decimal(str(storage.checkpoint_size_gb))
    usd = gb * Decimal(storage.egress_usd_per_gb)
    return int((usd * _MICROS).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def egress_lines(node: NodeBilling, jobs: Sequence[JobUsage],
                 storage_for: Callable[[str | None], Storage | None], *, start: datetime,
                 until: datetime, final_through: datetime) -> list[CostLine]:
    """The ``egress`` lines of the runs on ``node`` that started in the buckets from ``start``
    up to ``until``; a bucket ending by ``final_through`` is final."""
    first = max(hour_floor(start), hour_floor(node.launched))
    by_key: dict[tuple[datetime, str], CostLine] = {}
    for job in sorted(jobs, key=lambda j: (j.start, j.job_id)):
        bucket = hour_floor(job.start)
        if bucket < first or job.start >= until:
            continue
        storage = storage_for(job.project)
        if storage is None:
            continue
        cost = egress_micros(storage)
        if cost <= 0:
            continue
        key = (bucket, job.job_id)
        earlier = by_key.get(key)
        if earlier is not None:
            cost += earlier.cost_micros
        by_key[key] = CostLine(
            line_key=f"{node.node_id}:{bucket:%Y-%m-%dT%H}:{CostKind.EGRESS}:{job.job_id}",
            subject=node.node_id, node_id=node.node_id, period_start=bucket,
            period_end=min(bucket + HOUR, until), kind=CostKind.EGRESS, project=job.project,
            job_id=job.job_id, policy=node.policy, pool=node.pool, provider=node.provider,
            region=node.region, instance_type=node.instance_type, market=node.market,
            price_usd_hour=float(node.price_usd_hour), instance_seconds=0.0, gpu_seconds=0.0,
            cost_micros=cost, final=bucket + HOUR <= final_through, user=job.user)
    return list(by_key.values())


__all__ = ["egress_lines", "egress_micros"]
