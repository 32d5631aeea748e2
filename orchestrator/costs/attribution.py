"""Cost attribution: the pure maths that turns one node's billing span into cost lines.

No I/O, no clock: everything is passed in, so the roll-up (:mod:`orchestrator.costs.ledger`) and
the tests call the same functions.

Money is integer micro-dollars, computed so that nothing is lost or made up by rounding:

* A node's cost up to time ``t`` is ``C(t) = round(price x (t - launched) / 1 h)`` micro-dollars
  (half to even, exact rational arithmetic). Its cost in an hour bucket is ``C(hi) - C(lo)`` over
  the part of the bucket it lived, so the buckets of a node add up to ``C(end)`` exactly
  (the sum telescopes), never drifting by a micro-dollar per bucket.
* Within a bucket that cost is split between the jobs that ran on the node, by GPU-seconds, and
  an ``idle`` line for the GPU-seconds no job used, by largest remainder: the shares are integers,
  never negative, add up to the bucket's cost exactly, and each is within one micro-dollar of its
  exact proportional share.
* The billing rule (minimum billed time, billing increment) adds ``round(price x billed) -
  C(end)``: a ``minimum`` line in the bucket where the node's termination was confirmed. While
  the node lives, the same line is provisional in the open bucket (what it would cost if it ended
  now), so a young node already counts its minimum. So a node's lines add up to exactly
  ``round(price x billed seconds)``.
* On-prem work costs ``gpu_hour_usd`` per GPU-hour, telescoped per job the same way.

Every burst ``usage`` line also carries what its GPU-seconds would have cost on-prem at the pool's
``gpu_hour_usd`` (``onprem_equiv_micros``), for "cloud versus on-prem" comparisons.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache

from orchestrator.domain.costs import (
    NO_PROJECT,
    NONE,
    ONPREM_PROVIDER,
    CostKind,
    CostLine,
    JobUsage,
)
from orchestrator.domain.offerings import BillingRule

HOUR = timedelta(hours=1)
_US = timedelta(microseconds=1)
_US_PER_S = 1_000_000


def hour_floor(moment: datetime) -> datetime:
    """Start of the UTC hour bucket holding ``moment``."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hour_ceil(moment: datetime) -> datetime:
    """``moment`` if it starts an hour bucket, else the start of the next one."""
    floor = hour_floor(moment)
    return floor if floor == moment else floor + HOUR


def micros(start: datetime, end: datetime) -> int:
    """Whole microseconds from ``start`` to ``end`` (negative if ``end`` is earlier)."""
    return (end - start) // _US


def billed_micros(rule: BillingRule, lived_us: int) -> int:
    """The time the provider bills for an instance that lived ``lived_us`` microseconds: at least
    ``minimum_s``, rounded up to whole ``increment_s`` (integers: no float drift)."""
    billed = max(lived_us, 0, rule.minimum_s * _US_PER_S)
    increment = rule.increment_s * _US_PER_S
    if increment > 0:
        billed = -(-billed // increment) * increment
    return billed


@lru_cache(maxsize=4096, typed=True)  # typed: a float and an equal Decimal differ here
def rate(usd: float | Decimal | str | None) -> Fraction:
    """An hourly price as an exact fraction (a float goes through its shortest decimal text, so
    10.35 is 10.35, not the binary value nearest to it). Kept per price: a roll-up asks it for
    every bucket of every node, of a few prices."""
    if usd is None:
        return Fraction(0)
    value = Fraction(Decimal(str(usd)) if isinstance(usd, float) else Decimal(usd))
    if value < 0:
        raise ValueError(f"a price must not be negative, got {usd}")
    return value


def usd_micros(usd_hour: Fraction, duration_us: int) -> int:
    """Micro-dollars of ``duration_us`` microseconds at ``usd_hour`` USD per hour, half to even:
    ``round(usd_hour * duration_us / 3600)``, in integers (no ``Fraction`` made and reduced per
    call: a roll-up of 10,000 nodes makes 60,000 of these)."""
    whole = usd_hour.denominator * 3600
    floor, rest = divmod(usd_hour.numerator * duration_us, whole)
    twice = 2 * rest
    return floor + 1 if twice > whole or (twice == whole and floor & 1) else floor


def largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` (>= 0) into integers proportional to ``weights`` (>= 0, not all zero) that
    add up to ``total``: floor each share, then one more to the largest remainders (the earlier
    on ties)."""
    whole = sum(weights)
    if total < 0 or whole <= 0 or any(w < 0 for w in weights):
        raise ValueError(f"cannot split {total} by weights {list(weights)}")
    shares = [total * w // whole for w in weights]
    left = total - sum(shares)
    order = sorted(range(len(weights)), key=lambda i: (-(total * weights[i] % whole), i))
    for i in order[:left]:
        shares[i] += 1
    return shares


@dataclass(frozen=True, slots=True)
class NodeBilling:
    """What the ledger knows of one burst node: who it is for, its price captured at launch, its
    provider's billing rule, and when it cost money (launch accepted until termination confirmed;
    ``ended`` None while it lives)."""

    node_id: str
    policy: str
    pool: str
    provider: str
    region: str
    instance_type: str
    market: str
    project: str | None
    gpus: int
    price_usd_hour: float
    launched: datetime
    ended: datetime | None = None
    rule: BillingRule = BillingRule()
    onprem_gpu_hour_usd: Decimal | None = None

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"node {self.node_id}: gpus must not be negative, got {self.gpus}")
        rate(self.price_usd_hour)  # refuses a negative price
        if self.ended is not None and self.ended < self.launched:
            raise ValueError(f"node {self.node_id}: ended {self.ended.isoformat()} before "
                             f"launched {self.launched.isoformat()}")


def minimum_bucket(node: NodeBilling, until: datetime) -> datetime:
    """The bucket of the node's ``minimum`` line: the one holding its last billed instant."""
    if until > node.launched:
        return hour_floor(until - _US)
    return hour_floor(node.launched)


def bucket_lines(node: NodeBilling, bucket: datetime, until: datetime,
                 jobs: Iterable[JobUsage], *, final: bool) -> list[CostLine]:
    """The cost lines of ``node`` in the hour bucket starting at ``bucket``, accounting up to
    ``until`` (the confirmed termination, or now for a live node): one ``usage`` line per job by
    its GPU-seconds, one ``idle`` line for the unused ones, and in the node's last bucket the
    ``minimum`` line. Their ``cost_micros`` add up to the node's cost in the bucket exactly."""
    if bucket != hour_floor(bucket):
        raise ValueError(f"bucket {bucket.isoformat()} does not start an hour")
    price = rate(node.price_usd_hour)
    onprem = rate(node.onprem_gpu_hour_usd)
    lo, hi = max(bucket, node.launched), min(bucket + HOUR, until)
    lines: list[CostLine] = []

    def line(kind: CostKind, project: str | None, job_id: str | None, end: datetime,
             instance_s: float, gpu_s: float, cost: int, equiv: int = 0,
             user: str | None = None) -> CostLine:
        return CostLine(
            line_key=f"{node.node_id}:{bucket:%Y-%m-%dT%H}:{kind}:{job_id or NONE}",
            subject=node.node_id, node_id=node.node_id, period_start=bucket, period_end=end,
            kind=kind, project=project, job_id=job_id, policy=node.policy, pool=node.pool,
            provider=node.provider, region=node.region, instance_type=node.instance_type,
            market=node.market, price_usd_hour=float(node.price_usd_hour),
            instance_seconds=instance_s, gpu_seconds=gpu_s, cost_micros=cost,
            onprem_equiv_micros=equiv, final=final, user=user)

    owner = node.project or NO_PROJECT
    if hi > lo:
        span = micros(lo, hi)
        cost = (usd_micros(price, micros(node.launched, hi))
                - usd_micros(price, micros(node.launched, lo)))
        # job id -> (project, user, GPU-microseconds)
        used: dict[str, tuple[str | None, str | None, int]] = {}
        for job in sorted(jobs, key=lambda j: (j.job_id, j.start)):
            start, end = max(lo, job.start), min(hi, job.end or hi)
            if end > start and job.gpus > 0:
                project, user, weight = used.get(job.job_id, (job.project, job.user, 0))
                used[job.job_id] = (project, user, weight + job.gpus * micros(start, end))
        capacity = node.gpus * span
        busy = sum(w for _, _, w in used.values())
        idle = max(capacity - busy, 0)
        weights = [w for _, _, w in used.values()] + [idle]
        whole = sum(weights)
        if whole == 0:  # a node without GPUs that ran nothing: all of it is idle
            weights, whole = [0] * len(used) + [1], 1
        shares = largest_remainder(cost, weights)
        for (job_id, (project, user, weight)), share in zip(used.items(), shares, strict=False):
            equiv = usd_micros(onprem, weight)
            lines.append(line(CostKind.USAGE, project, job_id, hi,
                              span * weight / whole / _US_PER_S, weight / _US_PER_S, share, equiv,
                              user))
        if idle or shares[-1]:
            lines.append(line(CostKind.IDLE, owner, None, hi,
                              span * weights[-1] / whole / _US_PER_S, idle / _US_PER_S, shares[-1]))
    if bucket == minimum_bucket(node, until):
        lived = max(micros(node.launched, until), 0)
        billed = billed_micros(node.rule, lived)
        extra = billed - lived
        cost = usd_micros(price, billed) - usd_micros(price, lived)
        if extra or cost:
            lines.append(line(CostKind.MINIMUM, owner, None, max(until, node.launched),
                              extra / _US_PER_S, node.gpus * extra / _US_PER_S, cost))
    return lines


def node_lines(node: NodeBilling, jobs: Sequence[JobUsage], *, start: datetime, until: datetime,
               final_through: datetime) -> list[CostLine]:
    """Every line of ``node`` from the bucket ``start`` up to ``until``; a bucket ending by
    ``final_through`` is final."""
    bucket = max(hour_floor(start), hour_floor(node.launched))
    last = minimum_bucket(node, until)
    lines: list[CostLine] = []
    while bucket <= last:
        lines.extend(bucket_lines(node, bucket, until, jobs, final=bucket + HOUR <= final_through))
        bucket += HOUR
    return lines


def node_cost_micros(node: NodeBilling, until: datetime) -> int:
    """The whole bill of ``node`` up to ``until`` in micro-dollars: ``round(price x billed)``
    (what its lines add up to; the tests check that they do)."""
    lived = max(micros(node.launched, until), 0)
    return usd_micros(rate(node.price_usd_hour), billed_micros(node.rule, lived))


def onprem_lines(pool: str, policy: str, gpu_hour_usd: Decimal | float, jobs: Sequence[JobUsage],
                 *, start: datetime, until: datetime, final_through: datetime) -> list[CostLine]:
    """The ``onprem`` lines of a pool's on-prem work from the bucket ``start`` up to ``until``:
    per job and bucket, its GPU-seconds at ``gpu_hour_usd`` (a running job counts until
    ``until``). A bucket ending by ``final_through`` is final."""
    per_gpu = rate(gpu_hour_usd)
    subject = f"onprem:{pool}"
    lines: list[CostLine] = []
    for job in sorted(jobs, key=lambda j: (j.job_id, j.start)):
        end = min(job.end or until, until)
        if end <= job.start or job.gpus <= 0:
            continue
        job_rate = per_gpu * job.gpus
        bucket = max(hour_floor(start), hour_floor(job.start))
        while bucket < end:
            lo, hi = max(bucket, job.start), min(bucket + HOUR, end)
            if hi > lo:
                cost = (usd_micros(job_rate, micros(job.start, hi))
                        - usd_micros(job_rate, micros(job.start, lo)))
                lines.append(CostLine(
                    line_key=f"{subject}:{bucket:%Y-%m-%dT%H}:{job.job_id}", subject=subject,
                    node_id=None, period_start=bucket, period_end=hi, kind=CostKind.ONPREM,
                    project=job.project, job_id=job.job_id, policy=policy, pool=pool,
                    provider=ONPREM_PROVIDER, region=NONE, instance_type=NONE, market=NONE,
                    price_usd_hour=float(per_gpu), instance_seconds=0.0,
                    gpu_seconds=job.gpus * micros(lo, hi) / _US_PER_S, cost_micros=cost,
                    final=bucket + HOUR <= final_through, user=job.user))
            bucket += HOUR
    return lines


__all__ = [
    "HOUR", "NodeBilling", "billed_micros", "bucket_lines", "hour_ceil", "hour_floor",
    "largest_remainder", "micros", "minimum_bucket", "node_cost_micros", "node_lines",
    "onprem_lines", "rate", "usd_micros",
]
