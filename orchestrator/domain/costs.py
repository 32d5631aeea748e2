"""Values of the cost ledger: one cost line, and one job's use of GPUs, as plain typed values.

A :class:`CostLine` is what one node (or a pool's on-prem work) cost in one hour bucket, and for
whom; money is integer micro-dollars so that sums over any grouping are exact. The maths that
makes them is :mod:`orchestrator.costs.attribution`; the store keeps them in ``cost_lines``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum


class CostKind(StrEnum):
    """What a cost line pays for."""

    USAGE = "usage"  # a job's share of a burst node: its GPU-seconds of the node
    IDLE = "idle"  # GPU-seconds of a burst node no job used (booting, joining, idle, draining)
    MINIMUM = "minimum"  # what the billing rule adds beyond the time lived: minimum and rounding
    ONPREM = "onprem"  # amortised cost of work that ran on-prem (pool.onprem.gpu_hour_usd)
    EGRESS = "egress"  # a burst job's data staged in and checkpoints brought back (storage)


NO_PROJECT = "-"  # lines of nodes launched for no project (min_nodes, pre-warm)
ONPREM_PROVIDER = "onprem"  # the provider column of on-prem lines
NONE = "-"  # region, instance type, market of on-prem lines; node or job of a line without one


@dataclass(frozen=True, slots=True)
class JobUsage:
    """One job's run on a node (or on-prem): ``gpus`` GPUs from ``start`` until ``end`` (None:
    still running)."""

    job_id: str
    project: str | None
    gpus: int
    start: datetime
    end: datetime | None = None
    user: str | None = None


@dataclass(frozen=True, slots=True)
class CostLine:
    """One line of the ledger: ``cost_micros`` micro-dollars of ``kind`` in the hour bucket that
    starts at ``period_start``, attributed to ``project`` (and ``job_id`` and ``user`` for usage
    and on-prem lines; ``project`` None: a job of no project, ``user`` None: a line of no job, or
    a job whose user is not known). ``period_end`` is how far into the bucket the line accounts for (the bucket's end once
    it is closed, earlier while it is open or where the node ended). ``subject`` is what the line
    belongs to for the roll-up: the node id, or ``onprem:<pool>``."""

    line_key: str
    subject: str
    node_id: str | None
    period_start: datetime
    period_end: datetime
    kind: CostKind
    project: str | None
    job_id: str | None
    policy: str
    pool: str
    provider: str
    region: str
    instance_type: str
    market: str
    price_usd_hour: float
    instance_seconds: float
    gpu_seconds: float
    cost_micros: int
    onprem_equiv_micros: int = 0
    final: bool = False
    user: str | None = None

    @property
    def day(self) -> str:
        """UTC date of the bucket, YYYY-MM-DD."""
        return self.period_start.astimezone(UTC).date().isoformat()


__all__ = ["NONE", "NO_PROJECT", "ONPREM_PROVIDER", "CostKind", "CostLine", "JobUsage"]
