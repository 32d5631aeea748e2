"""The built-in queue's claim under ``trigger.spare_room``, on real stores (SQLite and
PostgreSQL): each plan's kept jobs are recorded (``kept_onprem``, migration 0024, written by the
built-in fabric), and a burst node asking for work is not handed a kept job that would outlast
its running work by more than the job's share; a job not kept, or kept no more, is handed as
before."""

from __future__ import annotations

from datetime import timedelta

from orchestrator.planner.spare_room import KeptOnPrem
from orchestrator.store import Store
from tests.builders import POOL, T0, make_policy, make_rig, offering_spec

M = timedelta(minutes=1)


def test_a_kept_job_takes_a_nodes_room_only_where_the_nodes_work_outlasts_it(store: Store):
    policy = make_policy(trigger={"wait_slo": "30m",
                                  "spare_room": {"enabled": True, "max_extension": 0}},
                         pool={"onprem": {"nodes": 1, "gpus_per_node": 4}},
                         offerings=[offering_spec(gpus=8, price=8)])
    rig = make_rig(store, policy=policy)
    store.submit_job("nlp", POOL, 4, 0, 5 * 3600.0, None, T0)  # fills on-prem
    first = store.submit_job("nlp", POOL, 4, 0, 2 * 3600.0, None, T0 + M)
    long = store.submit_job("nlp", POOL, 4, 0, 10 * 3600.0, None, T0 + 2 * M)
    short = store.submit_job("nlp", POOL, 4, 0, 1800.0, None, T0 + 3 * M)
    rig.launched_ready("n1", (first.id,), T0 + M)
    node = store.get_node("n1")
    assert rig.queue.claim_for_node(node, 8, T0 + 5 * M).id == first.id  # its launch's job

    # The plan keeps both for on-prem: the ten-hour job would keep the node for eight hours
    # after its work ends (max_extension 0 allows none); the half-hour one adds nothing.
    kept = KeptOnPrem((long.id, short.id), (), 0.0)
    assert rig.fabric.keep_onprem(policy, (), kept) == 2
    assert rig.fabric.keep_onprem(policy, (), kept) == 0  # nothing changes
    assert store.kept_onprem(policy.name) == {long.id, short.id}
    assert rig.queue.claim_for_node(node, 4, T0 + 6 * M).id == short.id
    assert store.get_job(long.id).state.value == "pending"

    # A later plan keeps it no more (due for the cloud, say): it is handed as before.
    assert rig.fabric.keep_onprem(policy, (), KeptOnPrem((), (), 0.0)) == 2
    assert store.kept_onprem(policy.name) == frozenset()
    rig.queue.finish(short.id, "n1", "succeeded", 0, T0 + 8 * M)
    assert rig.queue.claim_for_node(store.get_node("n1"), 4, T0 + 9 * M).id == long.id
