"""Keeping the jobs burst keeps for on-prem off burst nodes (``trigger.spare_room``): which
burst nodes the plan allows each kept job, the exclusions written to Slurm from that (a job's
own kept, only changes, grouped), and how a dynamic node held at registration is told apart.
The same against a real slurmctld: ``tests/integration/test_slurm_kept_off.py``."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.fabric.kept_off import exclusions, held_joining
from orchestrator.fabric.router import FabricRouter
from orchestrator.planner.spare_room import Busy, KeptOnPrem
from orchestrator.sources.slurm_cli import expand_hostlist
from tests.builders import make_job

BURST = {"burst-1", "burst-2", "dyn-a"}


def _pending(**excluded: str) -> dict[str, dict]:
    return {job_id: {"job_id": int(job_id[1:]), "excluded_nodes": names}
            for job_id, names in excluded.items()}


def test_allowed_nodes_follow_the_share_and_the_launch():
    jobs = [make_job("short", gpus=2, duration_s=600.0), make_job("long", gpus=2, duration_s=7200.0),
            make_job("unknown", gpus=1), make_job("wide", gpus=8, duration_s=600.0)]
    busy = (Busy("n1", 4, 3600.0), Busy("n2", 4, 0.0), Busy("n3", 4, 60.0, frozenset({"long"})))
    kept = KeptOnPrem(("short", "long", "unknown", "wide"), (), 0.0, jobs=jobs, busy=busy)
    allowed = kept.allowed_nodes()
    # The short job ends before n1's work (adds nothing); the long one only on the node launched
    # for it; unknown runtimes and wide jobs (share 0: whole nodes add their whole runtime) none.
    assert allowed == {"short": frozenset({"n1"}), "long": frozenset({"n3"})}
    assert KeptOnPrem((), (), 1.0).allowed_nodes() == {}


def test_kept_jobs_get_the_burst_names_they_may_not_take_and_keep_their_own():
    pending = _pending(j1="onprem-1", j2="", j3="burst-1,onprem-2", j4="burst-[1-2],dyn-a")
    changes = exclusions(pending, BURST, kept=["j1", "j2"], allowed={"j2": {"burst-2"}},
                         expand=expand_hostlist)
    assert changes == {
        ("burst-1", "burst-2", "dyn-a", "onprem-1"): ["j1"],
        ("burst-1", "dyn-a"): ["j2"],
        ("onprem-2",): ["j3"],  # no longer kept: burst's names lifted, its own stays
        (): ["j4"],
    }


def test_an_array_task_names_its_array_and_nothing_changes_twice():
    pending = _pending(j7="")
    first = exclusions(pending, BURST, kept=["j7_3"], allowed={}, expand=expand_hostlist)
    assert first == {("burst-1", "burst-2", "dyn-a"): ["j7"]}
    done = _pending(j7="burst-[1-2],dyn-a")
    assert exclusions(done, BURST, kept=["j7_3"], allowed={}, expand=expand_hostlist) == {}


@given(st.dictionaries(st.sampled_from(["j1", "j2", "j3", "j4"]),
                       st.sets(st.sampled_from(sorted(BURST | {"onprem-1", "onprem-2"})))),
       st.sets(st.sampled_from(["j1", "j2", "j3", "j4"])),
       st.dictionaries(st.sampled_from(["j1", "j2", "j3", "j4"]),
                       st.sets(st.sampled_from(sorted(BURST)))))
def test_after_the_update_each_job_excludes_exactly_its_own_and_what_it_may_not_take(
        current, kept, allowed):
    pending = _pending(**{j: ",".join(sorted(names)) for j, names in current.items()})
    changes = exclusions(pending, BURST, kept=sorted(kept), allowed=allowed,
                         expand=expand_hostlist)
    after = {j: set(names) for j, names in current.items()}
    for names, ids in changes.items():
        for job_id in ids:
            assert set(names) != after[job_id]  # only changes are written
            after[job_id] = set(names)
    for job_id, names in after.items():
        own = current[job_id] - BURST
        want = own | (BURST - allowed.get(job_id, set())) if job_id in kept else own
        assert names == want


def test_a_dynamic_node_held_at_registration_is_drained_without_a_reason():
    assert held_joining({"state_flags": ["DRAIN", "DYNAMIC_NORM"], "reason": ""})
    assert not held_joining({"state_flags": ["DRAIN"], "reason": "burst: release"})
    assert not held_joining({"state_flags": ["DYNAMIC_NORM"], "reason": ""})


def test_the_router_hands_the_kept_jobs_to_the_policys_fabric_only_where_it_has_one():
    calls = []

    class Keeping:
        def keep_onprem(self, policy, order, kept):
            calls.append((policy.name, order, kept))
            return 1

    router = FabricRouter(SimpleNamespace(), {"slurm-policy": Keeping()})
    kept = KeptOnPrem(("a",), (), 0.0)
    assert router.keep_onprem(SimpleNamespace(name="slurm-policy"), (), kept) == 1
    assert router.keep_onprem(SimpleNamespace(name="builtin-policy"), (), kept) == 0
    assert calls == [("slurm-policy", (), kept)]


def test_the_slurm_fabric_reads_the_pending_jobs_once_for_the_order_and_the_exclusions(tmp_path):
    # A plan that keeps jobs in order with spare_room hands both to Slurm: one squeue read.
    from datetime import UTC, datetime

    from orchestrator.fabric.slurm import SlurmFabric
    from orchestrator.store import Store
    from tests.builders import FixedClock
    from tests.slurm_env import slurm_policy

    class Cli:  # what the fabric reads and writes of Slurm, counted
        def __init__(self):
            self.reads, self.writes = 0, []

        def jobs(self):
            self.reads += 1
            return [{"job_id": 7, "job_state": "PENDING", "partition": "gpu", "priority": 10,
                     "nice": 0, "excluded_nodes": ""}]

        def nodes(self):
            return []

        def set_nice(self, job_id, nice):
            self.writes.append(("nice", job_id))

        def set_excluded(self, job_ids, names):
            self.writes.append(("exclude", tuple(job_ids), tuple(names)))

        def hostnames(self, expr):
            return expand_hostlist(expr)

    store = Store(f"sqlite:///{tmp_path / 'burst.db'}")
    store.upgrade()
    policy = slurm_policy(tmp_path / "slurm.conf", join="slot", slots=["burst-[1-4]"],
                          trigger={"wait_slo": "30m", "wait_model": "nodes",
                                   "onprem_order": "longest-first",
                                   "spare_room": {"enabled": True, "max_extension": 0}})
    cli = Cli()
    fabric = SlurmFabric(store, {policy.name: policy},
                         FixedClock(datetime(2026, 1, 1, tzinfo=UTC)), cli_factory=lambda conf: cli)
    kept = KeptOnPrem(("7",), (), 0.0, jobs=[make_job("7", gpus=4, duration_s=600.0)])
    assert fabric.keep_onprem(policy, ("7",), kept) == 2
    assert cli.reads == 1
    slots = ("burst-1", "burst-2", "burst-3", "burst-4")
    assert cli.writes == [("nice", "7"), ("exclude", ("7",), slots)]
    store.close()


def test_the_executor_hands_every_spare_room_decision_to_the_fabric_even_an_empty_one(tmp_path):
    from orchestrator.planner import plan
    from orchestrator.store import Store
    from tests.builders import T0, make_policy, make_rig, make_snapshot, offering_spec

    store = Store(f"sqlite:///{tmp_path / 'burst.db'}")
    store.upgrade()
    policy = make_policy(trigger={"wait_slo": "30m", "spare_room": {"enabled": True}},
                         offerings=[offering_spec(gpus=4, price=4)])
    rig = make_rig(store, policy=policy)
    calls = []

    class Keeping:
        def keep_onprem(self, policy, order, kept):
            calls.append((policy.name, kept.kept))
            return 0

    rig.executor.fabric = Keeping()
    rig.executor.execute(plan(make_snapshot([], taken_at=T0), [policy], T0))
    assert calls == [(policy.name, ())]  # nothing kept: what was kept off before is lifted
    plain = make_policy(offerings=[offering_spec(gpus=4, price=4)])
    assert plan(make_snapshot([], taken_at=T0), [plain], T0).decisions[0].kept_off is None
    store.close()


def test_a_dynamic_node_joins_held_where_decisions_keep_jobs_off_burst_nodes(tmp_path):
    from datetime import UTC, datetime

    from orchestrator.domain.nodes import NodeState
    from orchestrator.fabric.kept_off import JOINING_REASON
    from orchestrator.fabric.slurm import SlurmFabric
    from orchestrator.store import Store
    from tests.builders import FixedClock, make_node
    from tests.slurm_env import slurm_policy

    store = Store(f"sqlite:///{tmp_path / 'burst.db'}")
    store.upgrade()
    conf = tmp_path / "slurm.conf"
    nodes = {"wait_slo": "30m", "wait_model": "nodes"}
    cases = {"spare": ({"wait_slo": "30m", "spare_room": {"enabled": True}}, JOINING_REASON),
             "order": ({**nodes, "onprem_order": "longest-first"}, JOINING_REASON),
             "submit": (nodes, None)}
    for index, (name, (trigger, hold)) in enumerate(cases.items()):
        policy = slurm_policy(conf, trigger=trigger)
        fabric = SlurmFabric(store, {policy.name: policy}, FixedClock(datetime(2026, 1, 1,
                                                                               tzinfo=UTC)))
        node = make_node(f"n-{index}", policy=policy.name, state=NodeState.JOINING)
        assert fabric.join_spec(node, gpus=4)["hold_reason"] == hold, name
    store.close()
