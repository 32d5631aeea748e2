"""Offerings: kinds of cloud node a provider can launch, with GPUs and price.

Prices are floats in USD per hour: the planner only compares and sums them for planning. The cost
ledger (which must reconcile to the cent) keeps its own Decimal arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.policy.enums import Interconnect
from orchestrator.policy.models import Market


@dataclass(frozen=True, slots=True)
class BillingRule:
    """How a provider bills an instance: per ``increment_s`` with a ``minimum_s`` floor.

    AWS and GCP bill Linux instances per second with a one-minute minimum.
    """

    minimum_s: int = 60
    increment_s: int = 1

    def billed_seconds(self, seconds: float) -> float:
        seconds = max(seconds, float(self.minimum_s))
        increments = -(-seconds // self.increment_s)  # ceil without floats drifting
        return increments * self.increment_s


@dataclass(frozen=True, slots=True)
class Offering:
    """One launchable (provider, location, instance type, market) with its GPUs and price."""

    provider: str
    region: str
    zone: str | None
    instance_type: str
    market: Market
    gpus: int
    price_usd_hour: float
    gpu_model: str = ""
    vcpus: int | None = None
    memory_gib: float | None = None
    billing: BillingRule = BillingRule()
    # The node-to-node fabric of the instance type (``providers/data/interconnect.csv``) and its
    # published bandwidth per node in Gbit/s (0: not published / none).
    interconnect: Interconnect = Interconnect.NONE
    interconnect_gbps: int = 0

    @property
    def key(self) -> str:
        """Stable identity, the same text as ``OfferingSpec.key`` in the policy."""
        return offering_key(self.provider, self.region, self.zone, self.instance_type, self.market)

    @property
    def price_per_gpu_hour(self) -> float:
        return self.price_usd_hour / self.gpus


def offering_key(provider: str, region: str, zone: str | None, instance_type: str, market: Market | str) -> str:
    return f"{provider}/{region}/{zone or '-'}/{instance_type}/{Market(market)}"


def offering_from_key(key: str, gpus: int, price_usd_hour: float, gpu_model: str = "") -> Offering:
    """Rebuild an offering from its key and a node's recorded GPUs and price (for re-issued launches)."""
    provider, region, zone, instance_type, market = key.split("/")
    return Offering(provider=provider, region=region, zone=None if zone == "-" else zone,
                    instance_type=instance_type, market=Market(market), gpus=gpus,
                    price_usd_hour=price_usd_hour, gpu_model=gpu_model)
