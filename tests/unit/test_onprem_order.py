"""The nice values that make Slurm start the kept jobs in the planner's order
(:mod:`orchestrator.fabric.onprem_order`), on squeue records: the kept jobs above every other
pending job, in order; a negative nice as squeue --json wraps it; array tasks; only changes;
a job dropped from the order set back to 0.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.fabric.onprem_order import nice_values, signed_nice

WRAP = 1 << 32


def _record(priority: int, nice: int = 0) -> dict:
    return {"priority": priority - nice, "nice": nice % WRAP if nice < 0 else nice}


def test_the_kept_jobs_come_first_in_order_above_every_other_job() -> None:
    pending = {"1": _record(4_294_901_759), "2": _record(4_294_901_758),
               "3": _record(4_294_901_757)}
    nice = nice_values(pending, ["3", "2"])
    final = {k: pending[k]["priority"] - nice.get(k, 0) for k in pending}
    assert final["3"] > final["2"] > final["1"]
    assert final["3"] < WRAP  # priority/basic's priorities leave room below 2**32


def test_a_negative_nice_is_read_back_as_squeue_reports_it() -> None:
    assert signed_nice(4_294_966_296) == -1000 and signed_nice(None) == 0
    assert signed_nice(100) == 100


def test_only_changes_are_made_and_a_dropped_job_is_set_back() -> None:
    pending = {"1": _record(100), "2": _record(90), "3": _record(80)}
    first = nice_values(pending, ["3", "2"])
    applied = {k: _record(100 - 10 * (int(k) - 1), first.get(k, 0)) for k in pending}
    assert nice_values(applied, ["3", "2"], raised=["3", "2"]) == {}
    assert nice_values(applied, ["1"], raised=["3", "2"]) == {"1": nice_values(
        applied, ["1"])["1"], "3": 0, "2": 0}


def test_an_array_task_names_its_array_and_unknown_jobs_are_skipped() -> None:
    pending = {"7": _record(50), "8": _record(60)}
    assert set(nice_values(pending, ["7_0", "7_1", "99"])) == {"7"}
    assert nice_values(pending, ["99"]) == {}


@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=12, unique=True),
       st.data())
def test_any_order_is_realised(priorities, data) -> None:
    pending = {str(i): _record(p) for i, p in enumerate(priorities)}
    order = data.draw(st.permutations(list(pending)).map(lambda ids: ids[:len(ids) // 2 + 1]))
    nice = nice_values(pending, order)
    final = {k: pending[k]["priority"] - nice.get(k, 0) for k in pending}
    kept = [final[k] for k in order]
    assert kept == sorted(kept, reverse=True) and len(set(kept)) == len(kept)
    others = [final[k] for k in pending if k not in order]
    assert not others or min(kept) > max(others)


def test_the_router_hands_the_order_to_the_policys_fabric_only_where_it_has_one() -> None:
    from types import SimpleNamespace

    from orchestrator.fabric.router import FabricRouter

    calls = []

    class Ordering:
        def keep_onprem(self, policy, order, kept):
            calls.append((policy.name, order, kept))
            return len(order)

    router = FabricRouter(SimpleNamespace(), {"slurm-policy": Ordering()})
    assert router.keep_onprem(SimpleNamespace(name="slurm-policy"), ("a", "b"), None) == 2
    assert router.keep_onprem(SimpleNamespace(name="builtin-policy"), ("a",), None) == 0
    assert calls == [("slurm-policy", ("a", "b"), None)]
