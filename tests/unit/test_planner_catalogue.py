"""How policy offerings are matched to a provider catalogue that prices by region."""

from __future__ import annotations

from orchestrator.domain import Offering
from orchestrator.planner.offerings import resolve_candidates
from orchestrator.policy import Market
from tests.builders import T0, make_policy


def test_zone_pinned_spot_offering_takes_its_on_demand_twin_from_the_region_row():
    policy = make_policy(offerings=[{"provider": "aws", "region": "us-east-1", "zone": "us-east-1a",
                                     "instance_type": "g5.12xlarge", "market": "spot",
                                     "fallback_on_demand": True, "gpus": 4, "price_usd_hour": 2.2}])
    catalogue = (Offering("aws", "us-east-1", None, "g5.12xlarge", Market.ON_DEMAND, 4, 5.672, "A10G"),)
    usable, rejected = resolve_candidates(policy, catalogue, (), T0)
    assert rejected == []
    by_market = {c.offering.market: c.offering for c in usable}
    assert by_market[Market.SPOT].price_usd_hour == 2.2
    on_demand = by_market[Market.ON_DEMAND]
    assert on_demand.price_usd_hour == 5.672 and on_demand.zone == "us-east-1a"
    assert on_demand.key == "aws/us-east-1/us-east-1a/g5.12xlarge/on-demand"


def test_a_zone_row_wins_over_the_region_row():
    policy = make_policy(offerings=[{"provider": "aws", "region": "us-east-1", "zone": "us-east-1a",
                                     "instance_type": "g5.12xlarge", "market": "on-demand"}])
    catalogue = (Offering("aws", "us-east-1", None, "g5.12xlarge", Market.ON_DEMAND, 4, 5.672),
                 Offering("aws", "us-east-1", "us-east-1a", "g5.12xlarge", Market.ON_DEMAND, 4, 5.0))
    [candidate], _ = resolve_candidates(policy, catalogue, (), T0)
    assert candidate.offering.price_usd_hour == 5.0
