"""CapacityLearner: counts pooled by region and market (``pool_by``), and the exposure of nodes
still alive (``started``)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.capacity import CapacityLearner, region_market

G2 = "gcp/us-east5/us-east5-a/g2-standard-48/spot"
G2_WIDE = "gcp/us-east5/us-east5-a/g2-standard-96/spot"
ELSEWHERE = "gcp/us-west2/us-west2-a/g2-standard-96/spot"
G2_ON_DEMAND = "gcp/us-east5/us-east5-a/g2-standard-48/on-demand"
PRIOR = {G2: 0.0002, G2_WIDE: 0.0002, ELSEWHERE: 0.0002}


def test_region_market_groups_types_of_one_region_and_market():
    assert region_market(G2) == region_market(G2_WIDE) == "gcp/us-east5/spot"
    assert region_market(ELSEWHERE) != region_market(G2)
    assert region_market(G2_ON_DEMAND) != region_market(G2)
    assert region_market("odd-key") == "odd-key"


def test_a_reclaim_of_one_type_raises_the_hazard_of_its_region_only_when_pooled():
    alone = CapacityLearner(PRIOR)
    pooled = CapacityLearner(PRIOR, pool_by=region_market)
    for learner in (alone, pooled):
        learner.launch(G2, 1.0, refused=False)
        learner.ran(G2, 0.5, 1.5, interrupted=True)
        learner.launch(G2, 1.5, refused=True)
    assert alone.health(G2_WIDE, 2.0).preemptions_per_hour == 0.0002  # untried: the prior
    wide = pooled.health(G2_WIDE, 2.0)
    assert wide.preemptions_per_hour == pooled.health(G2, 2.0).preemptions_per_hour > 0.03
    assert wide.stockout_odds > 0 and alone.health(G2_WIDE, 2.0).stockout_odds == 0
    assert pooled.health(ELSEWHERE, 2.0).preemptions_per_hour == 0.0002
    assert pooled.known(G2_WIDE)


def test_live_nodes_count_their_exposure_until_they_end():
    learner = CapacityLearner(PRIOR)
    learner.launch(G2, 0.0, refused=False)
    learner.ran(G2, 1.0, 1.0, interrupted=True)
    before = learner.health(G2, 1.0).preemptions_per_hour
    learner.started(G2, "n1", 1.0)
    learner.started(G2, "n1", 1.0)  # counted once
    later = learner.health(G2, 25.0)
    assert later.preemptions_per_hour < before
    assert later.evidence_hours >= 24.0
    learner.ran(G2, 24.0, 25.0, interrupted=False, node_id="n1")
    ended = learner.health(G2, 25.0)
    # the node's hours moved from live to ended: the same exposure, counted once
    assert abs(ended.evidence_hours - later.evidence_hours) <= 0.2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from((G2, G2_WIDE, ELSEWHERE)), st.booleans(),
                          st.floats(0.0, 10.0)), max_size=20), st.floats(0.0, 50.0))
def test_pooled_hazard_is_one_figure_for_the_whole_group(history, later):
    pooled = CapacityLearner(PRIOR, pool_by=region_market)
    t = 0.0
    for key, interrupted, hours in history:
        t += 0.25
        pooled.ran(key, hours, t, interrupted=interrupted)
    for key in (G2, G2_WIDE, ELSEWHERE):
        health = pooled.health(key, t + later)
        assert health.preemptions_per_hour >= 0.0
        group = [k for k in (G2, G2_WIDE, ELSEWHERE) if region_market(k) == region_market(key)]
        assert all(pooled.health(k, t + later).preemptions_per_hour
                   == health.preemptions_per_hour for k in group)
