"""The ledger reach (orchestrator.store.accrual) on SQLite and PostgreSQL: for random nodes
(launched or not, live or terminated, times to the microsecond) with random lines and marks
written before or after their termination, the budgets' accrual read in groups equals, to the
micro-dollar per (pool, project), the accrual derived per node from nodes, events, marks and lines
as budgets did before the reach was kept, and the live nodes' prices those of the node rows; the
kept rows equal a rebuild from scratch, and a lost or garbled reach (a load around the store, a
restore of some tables) is made right again by ``rebuild_cost_rollups``
(``burst db rebuild-rollups``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.costs.spend import WindowSpend, _accrued_micros, spend
from orchestrator.domain import NodeState
from orchestrator.domain.costs import CostKind, CostLine
from orchestrator.lifecycle import NodeEvent, transition
from orchestrator.store import Store, reach_groups, reach_version, rollup_version
from orchestrator.store import tables as T
from orchestrator.store.accrual import AccrualGroup, AccrualNode, derive, ledger_reach
from tests.builders import make_node, make_offering

T0 = datetime(2025, 3, 1, 6, 0, tzinfo=UTC)
H = timedelta(hours=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
TABLES = ("ledger_reach_groups", "ledger_reach", "cost_lines", "cost_rollup_hours", "cost_rollup_days",
          "cost_rollup_months", "ledger_marks", "node_events", "nodes")

node_st = st.fixed_dictionaries({
    "pool": st.sampled_from(["gpu", "big"]),
    "project": st.sampled_from([None, "vision", "nlp"]),
    # Few prices, so nodes share groups; one of no whole micro-dollar.
    "price": st.sampled_from([1.0, 9.5, 10.35, 0.0, 32.77, 1.2345678, 2500.0]),
    "launch": st.one_of(st.none(), st.integers(0, 600), st.integers(0, 3)),  # minutes after T0
    "launch_us": st.sampled_from([0, 1800, 5400, 30_000_001, 123_457]),
    "life": st.one_of(st.none(), st.integers(0, 3000)),  # minutes to termination; None: live
    "lines": st.one_of(st.none(), st.integers(0, 30)),  # hours of lines; None: none written
    "mark": st.one_of(st.none(), st.integers(-2, 40)),  # hours after the launch
    "lines_after_end": st.booleans(),  # the roll-up writes them after the termination
})
# Microseconds off the minute: half a micro-dollar at $1/h is 1,800 µs (half to even), and a
# node seen under a minute since its launch counts its one-minute minimum.
moment_st = st.builds(lambda m, us: T0 + timedelta(minutes=m, microseconds=us),
                      st.one_of(st.integers(-120, 60 * 60), st.integers(0, 4)),
                      st.sampled_from([0, 1800, 5400, 3600, 30_000_000, 123_457]))


def empty(store: Store) -> None:
    with store.engine.begin() as conn:
        for table in TABLES:
            conn.exec_driver_sql(f"DELETE FROM {table}")
        reach_version.bump(conn)  # the groups written around the store: stores read them again
        rollup_version.ROLLUPS.bump(conn)  # the roll-ups too: stores read their sums again


def line(subject: str, pool: str, project: str | None, start: datetime, i: int) -> CostLine:
    return CostLine(
        line_key=f"{subject}:{i}", subject=subject, node_id=subject, period_start=start,
        period_end=start + H, kind=CostKind.USAGE, project=project, job_id=None, policy="p",
        pool=pool, provider="aws", region="r", instance_type="t", market="spot",
        price_usd_hour=1.0, instance_seconds=3600.0, gpu_seconds=0.0, cost_micros=1000 + i,
        onprem_equiv_micros=0, user=None)


def build(store: Store, specs: list[dict]) -> None:
    """Each node through the store's own writes: add, launch, lines and mark, termination."""
    for i, d in enumerate(specs):
        node_id = f"n{i}"
        launch = None if d["launch"] is None else T0 + timedelta(minutes=d["launch"],
                                                                 microseconds=d["launch_us"])
        created = T0 - timedelta(minutes=5)
        node = make_node(node_id, state=NodeState.REQUESTED, pool=d["pool"],
                         project=d["project"], offering=make_offering(price=d["price"]),
                         state_since=created, created_at=created)
        assert store.add_node(node, NodeEvent(node_id, created, None, NodeState.REQUESTED,
                                              "test", {}))

        def step(node: Any, target: NodeState, at: datetime) -> Any:
            new, event = transition(node, target, at=at, reason="test")
            assert store.save_transition(node, new, event)
            return new

        def write_lines() -> None:
            if d["lines"] is None:
                return
            base = (launch or T0).replace(minute=0)
            lines = [line(node_id, d["pool"], d["project"], base + k * H, k)
                     for k in range(d["lines"])]
            mark = None if d["mark"] is None else base + d["mark"] * H
            store.write_ledger(node_id, lines, since=EPOCH, mark=mark, at=T0)

        if launch is not None:
            node = step(node, NodeState.LAUNCHING, launch)
        if not d["lines_after_end"]:
            write_lines()
        if d["life"] is not None:
            end = (launch or created) + timedelta(minutes=d["life"])
            if node.state is NodeState.LAUNCHING:
                node = step(node, NodeState.TERMINATING, end)
            node = step(node, NodeState.TERMINATED, end)
        if d["lines_after_end"]:
            write_lines()


def from_scratch(store: Store) -> list[AccrualNode]:
    """The accrual nodes as budgets derived them before the reach was kept: the nodes not final
    through their end, their first launching and terminated events and their lines' reach past
    their mark, per node from the source tables."""
    n, m, e, c = T.nodes.c, T.ledger_marks.c, T.node_events.c, T.cost_lines.c
    at = sa.type_coerce(e.at, T.UtcDateTime())

    def first(state: NodeState) -> Any:
        return sa.type_coerce(sa.select(sa.func.min(at)).where(
            e.node_id == n.id, e.to_state == state.value).scalar_subquery(), T.UtcDateTime())

    reach = sa.type_coerce(sa.select(sa.func.max(c.period_end)).where(
        c.subject == n.id, sa.or_(m.final_through.is_(None), c.period_start >= m.final_through))
        .scalar_subquery(), T.UtcDateTime())
    query = (sa.select(n.id, n.project, n.price_usd_hour, n.pool, m.final_through,
                       first(NodeState.LAUNCHING).label("launched"),
                       first(NodeState.TERMINATED).label("ended"), reach.label("reach"))
             .select_from(T.nodes.outerjoin(T.ledger_marks, m.subject == n.id))
             .where(sa.or_(n.state != NodeState.TERMINATED.value, m.final_through.is_(None),
                           m.final_through < n.state_since)))
    out = []
    with store.engine.connect() as conn:
        for r in conn.execute(query):
            if r.launched is None:
                continue
            mark = r.final_through
            covered = r.reach if mark is None else (
                mark if r.reach is None or r.reach < mark else r.reach)
            out.append(AccrualNode(r.id, r.project, r.price_usd_hour, r.launched, r.ended,
                                   covered, r.pool))
    return out


def grouped(nodes: list[AccrualNode], since: datetime, until: datetime,
            now: datetime) -> dict[tuple[str, str | None], int]:
    out: dict[tuple[str, str | None], int] = {}
    for node in nodes:
        micros = _accrued_micros(node, since, until, now)
        if micros:
            out[(node.pool, node.project)] = out.get((node.pool, node.project), 0) + micros
    return out


def live_prices(store: Store) -> list[tuple[str, str | None, float, int]]:
    n = T.nodes.c
    counts: dict[tuple[str, str | None, float], int] = {}
    with store.engine.connect() as conn:
        for r in conn.execute(sa.select(n.pool, n.project, n.price_usd_hour)
                              .where(n.state != NodeState.TERMINATED.value)):
            key = (r.pool, r.project, r.price_usd_hour)
            counts[key] = counts.get(key, 0) + 1
    return sorted(((*k, v) for k, v in counts.items()), key=_order)


def _order(row: tuple) -> tuple:
    return (row[0], row[1] is None, row[1] or "", *row[2:])


def reach_rows(store: Store) -> set[tuple]:
    """The kept reach rows, checked equal to a derivation from scratch, and its kept group
    counts to the ``GROUP BY`` of the rows."""
    with store.engine.connect() as conn:
        kept = {tuple(r) for r in conn.execute(sa.select(ledger_reach))}
        derived = {tuple(row[col.name] for col in ledger_reach.columns)
                   for row in derive(conn)}
        assert reach_groups.kept(conn) == reach_groups.derive(conn)
    assert kept == derived
    return kept


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(specs=st.lists(node_st, min_size=1, max_size=6), since=moment_st, until=moment_st,
       now=moment_st, garble=st.sampled_from(["none", "drop", "stale", "counts"]))
def test_the_accrual_aggregate_equals_the_per_node_derivation(
        store: Store, specs: list[dict], since: datetime, until: datetime, now: datetime,
        garble: str) -> None:
    empty(store)
    build(store, specs)
    if since >= until:
        since, until = until, since + H
    want = grouped(from_scratch(store), since, until, now)
    assert WindowSpend(store, now).accrued(since, until) == want
    per_node = [AccrualGroup.of_node(node) for node in store.ledger_accrual_nodes()]
    assert WindowSpend(store, now, per_node).accrued(since, until) == want
    assert sorted(store.live_node_price_counts(), key=_order) == live_prices(store)
    assert sorted(store.ledger_accrual_nodes(), key=lambda a: a.node_id) == \
        sorted(from_scratch(store), key=lambda a: a.node_id)
    for pool, project in [(None, None), ("gpu", None), ("big", "nlp")]:
        total = sum(v for (p, j), v in want.items()
                    if (pool is None or p == pool) and (project is None or j == project))
        lines = store.ledger_cost_micros(since=since, until=until, pool=pool, project=project)
        assert spend(store, since=since, until=until, now=now, pool=pool,
                     project=project) * 1_000_000 == lines + total
    kept = reach_rows(store)

    # A crash of the old kind (rows loaded around the store, a restore of some tables) leaves
    # the reach wrong; rebuilding the roll-ups rebuilds it too.
    with store.engine.begin() as conn:
        if garble == "drop":
            conn.execute(sa.delete(ledger_reach))
        elif garble == "stale":
            conn.execute(sa.update(ledger_reach).values(covered_us=None, mark_us=None))
        elif garble == "counts":
            conn.execute(sa.update(reach_groups.ledger_reach_groups).values(nodes=7))
    store.rebuild_cost_rollups()
    assert reach_rows(store) == kept
    assert WindowSpend(store, now).accrued(since, until) == want


def test_half_a_micro_dollar_rounds_to_even_as_python_does(store: Store) -> None:
    """$1/h for 1,800 µs is half a micro-dollar: a group of nodes accrues its count times one
    node's rounded micro-dollars (0.5 -> 0, 1.5 -> 2, 2.5 -> 2, half to even), never the rounded
    sum of their exact cost."""
    empty(store)
    halves = [1800, 5400, 9000, 3_600_000_000 + 1800]
    specs = [{"pool": f"p{i}", "project": None, "price": price, "launch": 0, "launch_us": 0,
              "life": None, "lines": 0, "mark": 0, "lines_after_end": False}
             for i, price in enumerate([1.0, 1.0, 1.0, 1.0, 2500.0, 1.2345678])]
    specs += [{**specs[0], "pool": "p0"}, {**specs[0], "pool": "p0"}]  # three alike in p0
    build(store, specs)  # each marked final through its launch: accrual from there, no minimum
    for span in halves:
        now = T0 + timedelta(microseconds=span)
        got = WindowSpend(store, now).accrued(T0 - H, T0 + 2 * H)
        assert got == grouped(from_scratch(store), T0 - H, T0 + 2 * H, now)
        assert got.get(("p0", None), 0) == 3 * round(span / 3600)  # Python's half to even


def test_migrations_build_the_reach_from_what_a_store_holds(store: Store) -> None:
    """0019 derives the rows from nodes, events, marks and lines; 0020 their groups' columns;
    0021 counts the groups: from a store at 0018, 0019 or 0020 alike, the rows and counts the
    upkeep keeps."""
    empty(store)
    specs = [{"pool": ["gpu", "big"][i % 2], "project": [None, "nlp", "vision"][i % 3],
              "price": [9.5, 1.2345678, 32.77][i % 3], "launch": [None, 5, 30, 90][i % 4],
              "launch_us": [0, 1800][i % 2], "life": [None, 40, 200][i % 3],
              "lines": [None, 0, 3][i % 3], "mark": [None, 1, 5][(i // 3) % 3],
              "lines_after_end": bool(i % 2)} for i in range(18)]
    build(store, specs)
    want = reach_rows(store)
    assert want  # live and unfinished nodes
    for revision in ("0018", "0019", "0020"):
        store.downgrade(revision)
        store.upgrade()
        assert reach_rows(store) == want
