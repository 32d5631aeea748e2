"""``trigger.spare_room`` through the simulator: the real planner and executor on the virtual clock
(tests.sim.helpers), the world's burst dispatcher honouring the decision's kept jobs.

One 4-GPU on-prem node runs a 4-GPU job for 40 minutes. A 2-GPU one-hour job queued behind it
cannot start on-prem within the 30-minute SLO: it is burst, on a 4-GPU node, leaving 2 GPUs of
spare room. Then a 1-GPU ten-hour job arrives, which on-prem starts within the SLO (the on-prem
node frees at +40 min). Without the rule the burst node's spare room takes it at once, and the node
runs ten hours instead of one; with it the job waits for on-prem (inside its SLO), and the node is
drained after its hour. A half-hour job in the same place still takes the room: it ends before the
node's own job does, so it adds no node time.
"""

from __future__ import annotations

from orchestrator.sim.controllers import PolicyController
from tests.sim.helpers import job, run_with, sim_policy, trace

OFFERINGS = [{"provider": "sim", "region": "r1", "instance_type": "s4", "gpus": 4,
              "price_usd_hour": 4}]


def _run(jobs, **trigger):
    policy = sim_policy(offerings=OFFERINGS, pool={"onprem": {"nodes": 1, "gpus_per_node": 4}},
                        trigger={"wait_slo": "30m", "expected_boot": "2m", "wait_model": "nodes",
                                 "onprem_margin": "1m", **trigger})
    return run_with(lambda p: PolicyController(p, "t"), policy, jobs, nodes=1, gpus_per_node=4,
                    node_gpus=4, onprem="4")


def _cost(engine) -> float:
    return sum(b.cost_micro_usd for b in engine.provider.bills()) / 1e6


# The 2-GPU job is burst at about +26 min (its deadline less the boot); its node is up at +28.
LONG = trace(("fill", 0, 2400, 4), ("mid", 60, 3600, 2), ("long", 1900, 36000, 1))
SHORT = trace(("fill", 0, 2400, 4), ("mid", 60, 3600, 2), ("short", 1900, 1800, 1))


def test_a_long_job_kept_for_on_prem_does_not_take_a_burst_nodes_spare_room() -> None:
    plain = _run(LONG)
    assert job(plain, "mid").where == "burst"
    assert job(plain, "long").where == "burst"  # on the spare room, for ten hours
    kept = _run(LONG, spare_room={"enabled": True})
    assert job(kept, "mid").where == "burst"
    assert job(kept, "long").where == "onprem"
    assert job(kept, "long").wait_s <= 1800
    assert kept.world.spare_passed_over > 0
    assert _cost(kept) < _cost(plain) / 4


def test_a_job_that_ends_before_the_node_does_still_takes_the_room() -> None:
    for engine in (_run(SHORT), _run(SHORT, spare_room={"enabled": True})):
        assert job(engine, "short").where == "burst"


def test_with_max_extension_zero_only_work_inside_the_nodes_time_joins() -> None:
    # The half-hour job ends before the node's hour: allowed even with no extension at all.
    engine = _run(SHORT, spare_room={"enabled": True, "max_extension": 0.0})
    assert job(engine, "short").where == "burst"
    engine = _run(LONG, spare_room={"enabled": True, "max_extension": 0.0})
    assert job(engine, "long").where == "onprem"


def test_the_decisions_record_the_kept_jobs() -> None:
    engine = _run(LONG, spare_room={"enabled": True})
    records = [r for d in engine.store.decisions
               for r in ((d.inputs.get("wait_aware") or {}).get("spare_room") or {})
               .get("records", ())]
    assert any(r["job"] == "long" and r["runtime_s"] == 36000.0 for r in records)


def test_a_baseline_replayed_on_a_spare_room_policys_world_dispatches_as_plain() -> None:
    # Greedy plans nothing and keeps no job: the world's dispatch must not treat every job as
    # kept (it did, when the world read the rule off the policy: the baseline then bursted
    # nothing onto spare room and took minutes on full ITP).
    from orchestrator.sim.controllers import GreedyController

    def greedy(trigger):
        policy = sim_policy(offerings=OFFERINGS, pool={"onprem": {"nodes": 1, "gpus_per_node": 4}},
                            trigger={"wait_slo": "30m", **trigger})
        return run_with(lambda p: GreedyController(p), policy, LONG, nodes=1, gpus_per_node=4,
                        node_gpus=4, onprem="4")

    plain, spare = greedy({}), greedy({"spare_room": {"enabled": True, "max_extension": 0}})
    assert _cost(spare) == _cost(plain) > 0
    assert ([(j.trace.job_id, j.start_s, j.where) for j in spare.world.jobs]
            == [(j.trace.job_id, j.start_s, j.where) for j in plain.world.jobs])
    assert spare.world.spare_passed_over == 0
