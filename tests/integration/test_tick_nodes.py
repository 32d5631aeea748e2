"""The tick's nodes read once (``Store.tick_nodes``), the runs a tick's roll-up reads in one
query (``Store.runs_moved_after``), and what a tick makes of rows that did not change kept from
the last tick (``orchestrator.kept``: the snapshot's Nodes, the running jobs and their burst
runs), on both databases: each gives what the reads it replaces gave, and a node or a job whose
row (or usage) changed is made again, never reused stale."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from orchestrator.costs.ledger import SETTLE, _clock_only_test, roll_up
from orchestrator.costs.spend import budget_spend
from orchestrator.domain import NodeState
from orchestrator.domain.nodes import Node
from orchestrator.observe import Observer
from orchestrator.domain.jobs import JobState
from orchestrator.sources.builtin import BuiltinQueue, NodeUsage
from orchestrator.store import Store
from orchestrator.store.ledger import FreshNode
from orchestrator.store.ticknodes import NODE_FIELDS, node_values
from tests.builders import T0, make_policy
from tests.integration.test_ledger import H, M, launch, onprem_policy, run_job, step, terminate

S = NodeState
POLICIES = [onprem_policy(), onprem_policy(name="other", pool="other")]


def _site(store: Store) -> None:
    """Live nodes of two policies (ready, launching, only requested), a node terminated whose
    ledger is not final yet (a roll-up candidate, not live) and one whose ledger is (neither)."""
    launch(store, "a", T0 - 3 * H)
    launch(store, "b", T0 - 2 * H, policy="other", pool="other")
    launch(store, "c", T0 - 2 * H)
    launch(store, "d", T0 - 5 * H, price=3.5)
    launch(store, "e", T0 - 30 * M)  # stays launching
    for node in ("a", "b"):
        for state in (S.BOOTING, S.JOINING, S.READY):
            step(store, node, state, T0 - H)
    terminate(store, "d", T0 - 4 * H)
    run_job(store, "vision", 2, T0 - 2 * H, T0 - 90 * M, node_id="a")
    run_job(store, "nlp", 4, T0 - 50 * M, None, node_id="a")
    run_job(store, "nlp", 8, T0 - 40 * M, None, node_id="b")
    roll_up(store, POLICIES, T0)  # d's ledger final through its end
    terminate(store, "c", T0 + M)  # c's is not
    # times to the microsecond, one before the epoch (read as microseconds on PostgreSQL)
    b = store.get_node("b")
    assert store.update_node(b, last_heartbeat=T0 - timedelta(microseconds=123_457),
                             drain_deadline=datetime(1969, 12, 31, 23, 59, 59, 999_999,
                                                     tzinfo=UTC)) is not None


def _same(candidates: list) -> list:
    """Candidates as the roll-up uses them: a FreshNode's row (the driver's, whose times may be
    datetimes or microseconds) by the LedgerNode it makes."""
    return [(c.node_id, c.reach_us, c.since_us, Store.ledger_node(c.row))
            if isinstance(c, FreshNode) else c for c in candidates]


def test_the_tick_nodes_are_the_live_nodes_and_the_roll_up_candidates(store: Store) -> None:
    _site(store)
    tick = store.tick_nodes()
    live = [node_values(r) for r in tick.live()]
    assert live == store.node_fields()
    assert [Node(*v) for v in live] == store.nodes()
    assert [v[0] for v in live] == ["a", "b", "e"]  # by creation; not c, nor d
    assert store.live_node_rows() == [r[:len(NODE_FIELDS)] for r in tick.live()]
    # the roll-up's candidates: c too (terminated, not final), not d (final through its end)
    assert store.ledger_candidates(nodes=tick) == store.ledger_candidates()
    assert [n.node_id for n in store.ledger_candidates(nodes=tick)] == ["a", "b", "c", "e"]
    assert (store.ledger_candidates({"other"}, nodes=tick)
            == store.ledger_candidates({"other"}) != [])
    # budgets' burn rates: the live nodes' prices per (pool, project)
    prices = tick.live_prices_by_group()
    assert ({k: sorted(v) for k, v in prices.items()}
            == {k: sorted(v) for k, v in store.live_node_prices_by_group().items()})
    assert sum(len(v) for v in prices.values()) == 3
    policies = [make_policy(name=p.name, pool=p.pool.model_dump(),
                            budgets=[{"name": "all", "limit_usd": 1000}])
                for p in POLICIES]
    assert (budget_spend(store, policies, T0, prices) == budget_spend(store, policies, T0)
            != {})
    for now in (T0 + 2 * M, T0 + H + SETTLE + 2 * M):
        fresh = _clock_only_test(now, SETTLE, {})
        shared = store.ledger_candidates(None, fresh, nodes=tick)
        assert _same(shared) == _same(store.ledger_candidates(None, fresh))
        assert any(isinstance(c, FreshNode) for c in shared) == (now == T0 + 2 * M)


def test_a_roll_up_on_the_tick_nodes_writes_what_one_reading_its_own_does(
        store: Store) -> None:
    _site(store)
    now = T0 + 2 * H
    rolled = roll_up(store, POLICIES, now, nodes=store.tick_nodes())
    assert rolled.nodes >= 1 and rolled.lines_written >= 1
    # a second roll-up, reading its own candidates, finds nothing left to write
    again = roll_up(store, POLICIES, now)
    assert (again.lines_written, again.lines_deleted) == (0, 0)


def test_the_runs_moved_after_a_time_are_the_runs_of_each_node_read_by_id(store: Store) -> None:
    _site(store)
    run_job(store, "vision", 1, T0 - 4 * H, T0 - 3 * H, node_id="a")  # ended before `since`
    since = T0 - 80 * M
    by_id = store.burst_job_usages(["a", "b", "c"], since)  # one IN (...) list
    assert sorted(by_id) == ["a", "b"] and len(by_id["a"]) == 1  # the open run only
    # past 500 ids, one query of the runs that moved after `since`, kept for the ids asked
    many = ["a", "b", "c"] + [f"x{i:04d}" for i in range(600)]
    assert store.burst_job_usages(many, since) == by_id
    assert store.burst_job_usages(["b"] + many[3:], since) == {"b": by_id["b"]}
    moved = store.runs_moved_after(since)
    assert {k: v for k, v in moved.items() if k in {"a", "b", "c"}} == by_id
    assert store.runs_moved_after(T0 - 5 * H)["a"] == store.burst_job_usages(["a"], T0 - 5 * H)["a"]


class _Queue:
    """A queue source whose node usage the test sets."""

    def __init__(self) -> None:
        self.usage: dict[str, NodeUsage] = {}

    def observe(self, now, **_: object) -> dict:  # noqa: ANN001
        return {}

    def node_usage(self, node_ids: list[str], **_: object) -> dict[str, NodeUsage]:
        return {n: self.usage[n] for n in node_ids if n in self.usage}


def _nodes(observer: Observer, store: Store, shared: bool = True) -> dict[str, Node]:
    nodes = store.tick_nodes() if shared else None
    return {n.id: n for n in observer.snapshot(T0 + H, nodes=nodes).nodes}


@pytest.mark.parametrize("shared", [True, False], ids=["tick-nodes", "own-read"])
def test_a_snapshot_reuses_the_nodes_whose_row_and_usage_did_not_change(store: Store,
                                                                        shared: bool) -> None:
    _site(store)
    queue = _Queue()
    queue.usage = {"a": NodeUsage(2, 1, None), "b": NodeUsage(0, 0, T0 - 20 * M)}
    observer = Observer(store, queue, {})

    def fresh() -> dict[str, Node]:  # what an observer keeping nothing makes
        return _nodes(Observer(store, queue, {}), store, shared)

    first = _nodes(observer, store, shared)
    assert first == fresh() and sorted(first) == ["a", "b", "e"]
    assert first["a"].gpus_busy == 2 and first["b"].idle_since == T0 - 20 * M
    second = _nodes(observer, store, shared)
    assert all(second[k] is first[k] for k in first)  # nothing changed: the same objects

    # a's row changes (a heartbeat: a new version), b's usage changes, e is left alone
    a = store.get_node("a")
    assert store.update_node(a, last_heartbeat=T0 + 30 * M) is not None
    queue.usage["b"] = NodeUsage(8, 1, T0 - 20 * M)
    third = _nodes(observer, store, shared)
    assert third == fresh()
    assert third["a"] is not first["a"] and third["a"].last_heartbeat == T0 + 30 * M
    assert third["a"].gpus_busy == 2  # its usage folded in again
    assert third["b"] is not first["b"] and (third["b"].gpus_busy, third["b"].idle_since) == (8, None)
    assert third["e"] is first["e"]

    # a state change: b drains; the same usage as before
    step(store, "b", S.DRAINING, T0 + 40 * M)
    fourth = _nodes(observer, store, shared)
    assert fourth == fresh() and fourth["b"].state is S.DRAINING and fourth["b"] is not third["b"]
    assert fourth["a"] is third["a"] and fourth["e"] is first["e"]

    # usage back to what it was two snapshots ago: made again, not the older object
    queue.usage["a"] = NodeUsage(0, 0, T0 + 50 * M)
    fifth = _nodes(observer, store, shared)
    assert fifth == fresh() and fifth["a"].idle_since == T0 + 50 * M

    # a node that ends leaves the snapshot
    terminate(store, "e", T0 + 55 * M)
    assert sorted(_nodes(observer, store, shared)) == ["a", "b"]


def test_running_jobs_and_their_burst_runs_are_kept_while_their_rows_are_unchanged(
        store: Store, store_url: str) -> None:
    _site(store)
    on_b = run_job(store, "vision", 1, T0 - 30 * M, None, node_id="b")
    moved = run_job(store, "vision", 2, T0 - 20 * M, None, node_id="a")
    queue = BuiltinQueue(store, POLICIES)

    def fresh() -> tuple[list, tuple]:  # as a store and a queue keeping nothing read them
        other = Store(store_url)
        try:
            read = other.queue_read(T0)
            return read.running, BuiltinQueue(other, POLICIES).burst_runs(read)
        finally:
            other.close()

    first = store.queue_read(T0)
    first_runs = queue.burst_runs(first)
    assert (first.running, first_runs) == fresh() and len(first_runs) == 4
    second = store.queue_read(T0)
    assert all(x is y for x, y in zip(first.running, second.running, strict=True))
    assert all(x is y for x, y in zip(first_runs, queue.burst_runs(second), strict=True))

    # one job finishes, one is handed back and starts again on another node, one starts
    job = store.get_job(on_b)
    assert store.finish_job(job, state=JobState.DONE, exit_code=0, at=T0) is not None
    job = store.requeue_job(store.get_job(moved), T0)
    assert store.start_job(job, placement="burst", node_id="b", at=T0 + M) is not None
    started = run_job(store, "nlp", 1, T0 + 2 * M, None, node_id="a")
    third = store.queue_read(T0 + 3 * M)
    third_runs = queue.burst_runs(third)
    assert (third.running, third_runs) == fresh()
    by_id = {j.id: j for j in first.running}
    for j in third.running:
        if j.id in (moved, started):
            assert j is not by_id.get(j.id) and j.node_id in ("a", "b")
        else:
            assert j is by_id[j.id]
    assert on_b not in {j.id for j in third.running}
    runs = {r.job_id: r for r in first_runs}
    assert [r.node_id for r in third_runs if r.job_id == moved] == ["b"]
    assert all((r is runs.get(r.job_id)) == (r.job_id not in (moved, started)) for r in third_runs)
