"""The sim provider keeps the Provider contract on a virtual clock, and its configurable boot
times, capacity errors and spot interruptions behave as documented; it is built by wiring."""

from __future__ import annotations

from datetime import timedelta

import pytest

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import (
    CapacityError,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    Provider,
)
from orchestrator.policy import DEFAULT_POLICY_PATH, Market, load_policy
from orchestrator.sim.engine import SimClock
from orchestrator.sim.world import at
from orchestrator.wiring import Settings, build_provider, sim_catalogue
from tests.sim.helpers import sim_policy

SPOT = Offering("sim", "r1", None, "s8", Market.SPOT, 8, 4.0)
ON_DEMAND = Offering("sim", "r1", None, "s8", Market.ON_DEMAND, 8, 12.0)


def provider(clock: SimClock | None = None, **knobs):
    return build_provider("sim", Settings.model_construct(), [sim_policy()],
                          options={"clock": clock or SimClock(), **knobs})


def request(n: int, offering: Offering = SPOT, cluster: str = "burst") -> LaunchRequest:
    tags = OwnershipTags(cluster, "simtest", f"node-{n}", f"r-{n}")
    return LaunchRequest(f"r-{n}", offering, tags, "#!/bin/bash\n")


def test_it_is_a_provider_built_by_wiring_from_the_policies_catalogues():
    sim = provider()
    assert isinstance(sim, Provider) and sim.name == "sim"
    aws = load_policy("policies/examples/aws-spot-fallback.yaml")
    keys = {o.key: o for o in sim_catalogue([aws])}
    # The bundled AWS rows of the policy's region and types, relabelled as sold by sim.
    p4d = keys["sim/us-east-1/-/p4d.24xlarge/on-demand"]
    assert p4d.gpus == 8 and p4d.price_usd_hour > 10
    assert "sim/us-east-1/-/p4d.24xlarge/spot" in keys
    local = {o.key for o in sim_catalogue([load_policy(DEFAULT_POLICY_PATH)])}
    assert "sim/local/local-a/local.4gpu/on-demand" in local  # the spot offering's fallback twin


def test_launch_is_idempotent_on_the_request_id_and_follows_the_virtual_clock():
    clock = SimClock()
    sim = provider(clock, boot={"median_s": 120.0, "sigma": 0.0, "min_s": 60.0})
    [first] = sim.launch(request(1))
    assert first.state is InstanceState.PENDING and first.launched_at == at(0)
    assert sim.launch(request(1)) == [first]  # "already done" returns the same instance
    assert first.tags["burst:node-id"] == "node-1"
    clock.t = 119.0
    assert sim.describe([first.id])[0].state is InstanceState.PENDING
    clock.t = 120.0
    assert sim.describe([first.id])[0].state is InstanceState.RUNNING
    sim.launch(request(2, cluster="other"))
    assert [i.id for i in sim.list_owned("burst")] == [first.id]
    sim.terminate([first.id, "sim-unknown"])
    sim.terminate([first.id])  # idempotent
    assert sim.describe([first.id])[0].state is InstanceState.TERMINATED
    clock.t += 7200
    assert sim.list_owned("burst") == []  # listed for an hour after termination, then gone


def test_billing_is_per_second_with_the_offering_minimum_at_the_requested_price():
    clock = SimClock()
    sim = provider(clock)
    [short] = sim.launch(request(1, ON_DEMAND))
    [long] = sim.launch(request(2, SPOT))
    clock.t = 30
    sim.terminate([short.id])
    clock.t = 3600
    sim.terminate([long.id])
    bills = {b.instance_id: b for b in sim.bills()}
    assert bills[short.id].billed_s == 60  # one-minute minimum
    assert bills[short.id].cost_micro_usd == round(60 * 12.0 * 1_000_000 / 3600)
    assert bills[long.id].billed_s == 3600 and bills[long.id].cost_micro_usd == 4_000_000


def test_an_instance_gone_an_hour_is_forgotten_but_its_bill_is_kept_in_launch_order():
    """A replay launches thousands: an instance terminated more than an hour ago is swept (at a
    later launch) down to its final bill, which stays where it was among the bills."""
    clock = SimClock()
    sim = provider(clock)
    launched = [sim.launch(request(n, ON_DEMAND))[0] for n in range(1, 4)]
    clock.t = 600
    sim.terminate([launched[1].id])
    before = sim.bills()
    assert sim.user_data(launched[1].id) == "#!/bin/bash\n"
    clock.t = 600 + 3601
    [late] = sim.launch(request(4, ON_DEMAND))  # sweeps
    assert sim.describe([launched[1].id]) == []  # forgotten, as a cloud's API forgets it
    with pytest.raises(KeyError):
        sim.user_data(launched[1].id)
    assert [i.id for i in sim.describe([i.id for i in launched])] == [launched[0].id,
                                                                      launched[2].id]
    bills = sim.bills(until=at(600))
    assert [b.instance_id for b in bills] == [i.id for i in launched] + [late.id]
    assert bills[:3] == before  # the forgotten one's bill is the one it had
    assert bills[1].ended_at == at(600) and bills[1].billed_s == 600


def test_capacity_errors_come_at_the_configured_rate_and_carry_the_request():
    sim = provider(rates={"spot_capacity_error": 0.3})
    errors = 0
    for n in range(400):
        try:
            sim.launch(request(n))
        except CapacityError as exc:
            errors += 1
            assert exc.provider == "sim" and exc.offering_key == SPOT.key
            assert exc.request_id == f"r-{n}"
    assert 80 <= errors <= 160  # 30 % of 400, give or take
    for n in range(50):
        sim.launch(request(1000 + n, ON_DEMAND))  # the on-demand rate is 0 by default
    assert sim.capacity_errors == errors


def test_spot_instances_are_interrupted_after_exponential_lifetimes_on_demand_never():
    clock = SimClock()
    sim = provider(clock, rates={"interruptions_per_hour": 2.0})
    spots = [sim.launch(request(n))[0] for n in range(200)]
    steady = [sim.launch(request(1000 + n, ON_DEMAND))[0] for n in range(20)]
    lifetimes = [sim.timeline(i.id).interrupt_at - sim.timeline(i.id).running_at for i in spots]
    mean_h = sum(d.total_seconds() for d in lifetimes) / len(lifetimes) / 3600
    assert 0.35 < mean_h < 0.7  # exponential with rate 2/h: mean 0.5 h
    assert all(sim.timeline(i.id).interrupt_at is None for i in steady)
    victim = spots[0]
    clock.t = (sim.timeline(victim.id).interrupt_at - at(0)).total_seconds()
    assert sim.describe([victim.id])[0].state is InstanceState.TERMINATED
    [bill] = [b for b in sim.bills() if b.instance_id == victim.id]
    assert bill.ended_at == sim.timeline(victim.id).interrupt_at  # billing stops at the reclaim


def test_draws_depend_on_seed_and_request_id_only():
    def boot_times(seed: int, ids: list[int]) -> dict[int, timedelta]:
        sim = provider(seed=seed)
        out = {}
        for n in ids:
            [instance] = sim.launch(request(n))
            timeline = sim.timeline(instance.id)
            out[n] = timeline.running_at - timeline.launched_at
        return out

    forward = boot_times(7, list(range(20)))
    backward = boot_times(7, list(reversed(range(20))))
    assert forward == backward  # order of launches does not matter
    assert boot_times(8, list(range(20))) != forward
    assert len(set(forward.values())) > 10  # a distribution, not a constant


def test_bad_requests_and_knobs_are_refused_clearly():
    sim = provider()
    with pytest.raises(InvalidRequest, match="not a sim offering"):
        sim.launch(request(1, Offering("aws", "r1", None, "x", Market.SPOT, 8, 1.0)))
    with pytest.raises(ValueError, match="probability"):
        provider(rates={"spot_capacity_error": 1.5})
    with pytest.raises(ValueError, match="min_s <= median_s"):
        provider(boot={"median_s": 10.0})
