"""Spot capacity from real data: the AWS Spot Advisor buckets and the SkyPilot spot traces.

What the simulated cloud does with a spot offering (:class:`providers.sim.SpotMarket`) and what
the planner is told beforehand (the published prior), both from ``../shared/data`` (see each
directory's ``SOURCE.md``):

* ``aws-spot-advisor/aws_spot_advisor_gpu_2025-06-28.csv``: each (region, instance type)'s
  interruption bucket (Linux). The published prior hazard is the bucket's
  (:func:`orchestrator.domain.capacity.bucket_hazard`); GCP publishes no buckets, so a GCP
  offering, and an AWS one the advisor does not list, takes the middle bucket (2, 10-15 %).
* ``skypilot-spot-traces/availability/1-node/aws-02-15-2023/*.json``: 45 days of whether a
  p3.2xlarge spot instance could be had / stayed alive, every 195 s, in 9 AWS zones (1 = yes).
  Each spot offering replays one of them (the same for every instance type of a region, chosen by
  a seeded hash of the region: capacity in a region moves together), from a seeded phase: a launch
  in a tick with no capacity fails, and a running instance is taken at the next drop. How much of
  the measured disruption an offering sees is its bucket's share over the top bucket's
  (``keep``: 0.1, 0.3, 0.5, 0.7, 1.0), drawn per request.

The traces are V100s of 2023, the buckets GPU types of 2025: the time variation is real, its
scaling per offering is the bucket's. Stated in docs/simulator.md ("Spot").
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from orchestrator.domain.capacity import BUCKET_SHARE, bucket_hazard
from orchestrator.domain.offerings import Offering
from orchestrator.policy.models import Market
from orchestrator.sim.traces import trace_dir

ADVISOR = Path("aws-spot-advisor") / "aws_spot_advisor_gpu_2025-06-28.csv"
AVAILABILITY = Path("skypilot-spot-traces") / "availability" / "1-node" / "aws-02-15-2023"
UNLISTED_BUCKET = 2


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    gap_s: float
    alive: bytes


@lru_cache(maxsize=4)
def advisor_buckets(root: Path) -> dict[tuple[str, str], int]:
    """(region, instance type) -> Spot Advisor interruption bucket (Linux)."""
    out: dict[tuple[str, str], int] = {}
    with open(root / ADVISOR, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["os"] == "Linux":
                out[(row["region"], row["instance_type"])] = int(row["interruption_bucket_index"])
    return out


@lru_cache(maxsize=4)
def availability_series(root: Path) -> tuple[Series, ...]:
    series = []
    for path in sorted((root / AVAILABILITY).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        alive = bytes(1 if v > 0 else 0 for v in data["data"])
        series.append(Series(path.stem, float(data["metadata"]["gap_seconds"]), alive))
    if not series:
        raise FileNotFoundError(f"no availability traces under {root / AVAILABILITY}")
    return tuple(series)


def _bucket(offering: Offering, buckets: dict[tuple[str, str], int]) -> int:
    return buckets.get((offering.region, offering.instance_type), UNLISTED_BUCKET)


def _draw(seed: int, text: str, n: int) -> int:
    digest = hashlib.sha256(f"{seed}|{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % n


def spot_markets(offerings, seed: int, root: Path | None = None) -> dict:
    """Spot offering key -> the :class:`providers.sim.SpotMarket` it replays (module docstring)."""
    from providers.sim import SpotMarket  # noqa: PLC0415 (the sim reaches the sim provider here)

    root = root or trace_dir()
    buckets = advisor_buckets(root)
    series = availability_series(root)
    top = BUCKET_SHARE[-1]
    markets = {}
    for o in offerings:
        if o.market is not Market.SPOT:
            continue
        s = series[_draw(seed, o.region, len(series))]
        keep = BUCKET_SHARE[_bucket(o, buckets)] / top
        markets[o.key] = SpotMarket(s.gap_s, s.alive, _draw(seed, o.key, len(s.alive)), keep,
                                    f"{s.name} x{keep:.1f}")
    return markets


def published_priors(offerings, root: Path | None = None) -> dict[str, float]:
    """Spot offering key -> the hazard its published bucket implies (interruptions per hour)."""
    buckets = advisor_buckets(root or trace_dir())
    return {o.key: bucket_hazard(_bucket(o, buckets)) for o in offerings if o.market is Market.SPOT}
