"""The batched ledger writer (``Store.write_ledgers``) on SQLite and PostgreSQL: on random writes
and on random sites rolled up at random ticks it leaves exactly the lines, roll-ups, marks and
ledger reach that writing each subject with ``write_ledger`` in turn leaves (the per-node path,
on a SQLite store beside it); a failure at any step of a batch leaves nothing of it written; and
a batch is a constant number of statements, whatever its number of subjects."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.costs.ledger import roll_up
from orchestrator.domain.costs import CostKind, CostLine
from orchestrator.domain.jobs import JobState
from orchestrator.store import Store, reach_groups
from orchestrator.store import tables as T
from orchestrator.store.accrual import ledger_reach
from orchestrator.store.ledger_batch import LedgerWrite, Written
from tests.builders import POOL, T0
from tests.integration.test_ledger import H, M, launch, onprem_policy, terminate

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NODES = ("n-1", "n-2", "n-3", "n-4")
SUBJECTS = (*NODES, "onprem:gpu")
ROLLUPS = (T.cost_rollup_hours, T.cost_rollup_days, T.cost_rollup_months)
SETTINGS = settings(max_examples=25, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
SITES = settings(SETTINGS, max_examples=10)  # a site is two stores' histories: fewer


class PerSubjectStore(Store):
    """The real store whose batched writer writes each subject with ``write_ledger`` in turn, a
    transaction each: the per-node path the batch must match."""

    def write_ledgers(self, writes: Sequence[LedgerWrite], *, at: datetime) -> list[Written]:
        return [Written(*self.write_ledger(w.subject, w.lines, since=w.since, mark=w.mark,
                                           at=at)) for w in writes]


@pytest.fixture
def ref(tmp_path: Path) -> Iterator[PerSubjectStore]:
    s = PerSubjectStore(f"sqlite:///{tmp_path / 'ref.db'}")
    s.upgrade()
    try:
        yield s
    finally:
        s.close()


def wipe(store: Store) -> None:
    """Every row of every table gone (a fresh site per hypothesis example)."""
    tables = list(reversed(T.Base.metadata.sorted_tables))
    with store.engine.begin() as conn:
        if store.dialect == "postgresql":
            conn.exec_driver_sql("TRUNCATE " + ", ".join(f'"{t.name}"' for t in tables)
                                 + " RESTART IDENTITY")
        else:
            for table in tables:
                conn.execute(sa.delete(table))


def ledger_state(store: Store) -> dict[str, object]:
    """Lines, roll-up rows of any line or sum, marks and ledger reach, as comparable values."""
    out: dict[str, object] = {"lines": store.ledger_lines(), "marks": store.ledger_marks()}
    with store.engine.connect() as conn:
        for table in ROLLUPS:
            sums = [table.c[s] for s in ("cost_micros", "idle_micros", "onprem_micros",
                                         "onprem_equiv_micros", "gpu_us", "instance_us", "lines")]
            out[table.name] = sorted(tuple(r) for r in conn.execute(
                sa.select(table).where(sa.or_(*(s != 0 for s in sums)))))
        out["reach"] = sorted(tuple(r) for r in conn.execute(sa.select(ledger_reach)))
        groups = reach_groups.kept(conn)
        assert groups == reach_groups.derive(conn)  # the counts kept with the reach
        out["reach_groups"] = sorted(groups.items(), key=lambda g: reach_groups.group_key(g[0]))
    return out


def add_nodes(*stores: Store) -> None:
    for store in stores:
        for i, node in enumerate(NODES):
            launch(store, node, T0 - (i + 1) * 17 * M, price=[4.1, 32.77, 0.35, 12.0][i])
        terminate(store, "n-4", T0 + 2 * H + 5 * M)


# -- random writes ---------------------------------------------------------------------------------

line_st = st.tuples(st.integers(0, 6), st.integers(0, 2), st.integers(0, 2),
                    st.sampled_from([None, "vision", "nlp"]), st.sampled_from([None, "ada"]),
                    st.sampled_from(list(CostKind)))
write_st = st.fixed_dictionaries({
    "since": st.sampled_from([None, 0, 1, 2, 3]),
    "mark": st.one_of(st.none(), st.integers(0, 7)),
    "lines": st.lists(line_st, max_size=6, unique_by=lambda x: (x[0], x[1])),
})
round_st = st.dictionaries(st.sampled_from(SUBJECTS), write_st, max_size=len(SUBJECTS))


def make_write(subject: str, spec: dict) -> LedgerWrite:
    since = EPOCH if spec["since"] is None else T0 + spec["since"] * H
    onprem = subject.startswith("onprem:")
    lines = []
    for hour, slot, version, project, user, kind in spec["lines"]:
        start = T0 + hour * H
        if start < since:
            continue
        lines.append(CostLine(
            line_key=f"{subject}:{hour}:{slot}", subject=subject,
            node_id=None if onprem else subject, period_start=start,
            period_end=start + (slot + 1) * 20 * M, kind=CostKind.ONPREM if onprem else kind,
            project=project, job_id=None if kind is CostKind.IDLE else f"j{slot}",
            policy="train", pool=POOL, provider="onprem" if onprem else "aws", region="r",
            instance_type="g8", market="spot", price_usd_hour=4.5,
            instance_seconds=1200.0 * (slot + 1), gpu_seconds=600.5 * (slot + 1) + version,
            cost_micros=1_000_003 * (slot + 1) + 7 * version, onprem_equiv_micros=11 * version,
            final=version == 2, user=user))
    mark = None if spec["mark"] is None else T0 + spec["mark"] * H
    return LedgerWrite(subject, lines, since=since, mark=mark)


@SETTINGS
@given(rounds=st.lists(round_st, min_size=1, max_size=4))
def test_a_batch_writes_what_writing_each_subject_in_turn_writes(
        store: Store, ref: PerSubjectStore, rounds: list[dict]) -> None:
    wipe(store)
    wipe(ref)
    add_nodes(store, ref)
    for r, specs in enumerate(rounds):
        writes = [make_write(subject, spec) for subject, spec in sorted(specs.items())]
        at = T0 + r * M
        assert store.write_ledgers(writes, at=at) == ref.write_ledgers(writes, at=at)
        assert ledger_state(store) == ledger_state(ref)
    # Run again: nothing changes, nothing is written.
    assert not any(store.write_ledgers(writes, at=at))
    # The roll-ups and the reach the batches kept are what a rebuild from scratch derives.
    kept = ledger_state(store)
    store.rebuild_cost_rollups()
    assert ledger_state(store) == kept


# -- random sites, rolled up -----------------------------------------------------------------------

def build_site(store: Store, seed: int, first_tick: datetime) -> None:
    """Nodes launched before ``first_tick`` (a few never launched, some ending during the ticks)
    with job runs of fixed ids, and on-prem work; the same site for the same seed."""
    rng = random.Random(seed)
    for i in range(rng.randint(1, 12)):
        node = f"g{i}"
        launched = first_tick - timedelta(seconds=rng.uniform(30, 5 * 3600))
        launch(store, node, launched, price=rng.choice([4.1, 32.77, 0.35, 12.0, 98.32]),
               gpus=8, project=rng.choice(["vision", "nlp", None]),
               pool=rng.choice([POOL, "other"]))
        for j in range(rng.randint(0, 3)):
            start = launched + timedelta(seconds=rng.uniform(0, 4 * 3600))
            end = start + timedelta(seconds=rng.uniform(60, 3 * 3600))
            run(store, f"j-{i}-{j}", rng.choice(["vision", "nlp"]), rng.choice([1, 2, 4]),
                start, end if rng.random() < 0.7 else None, node)
        if rng.random() < 0.3:
            terminate(store, node, first_tick + timedelta(seconds=rng.uniform(60, 3 * 3600)))
    for j in range(rng.randint(0, 3)):
        start = first_tick - timedelta(seconds=rng.uniform(0, 3 * 3600))
        run(store, f"j-onprem-{j}", "vision", 4, start,
            start + timedelta(seconds=rng.uniform(60, 7200)), None)


def run(store: Store, job_id: str, project: str, gpus: int, start: datetime,
        end: datetime | None, node_id: str | None) -> None:
    job = store.submit_job(project, POOL, gpus, 0, None, None, start - M, job_id=job_id)
    job = store.start_job(job, placement="burst" if node_id else "onprem", node_id=node_id,
                          at=start)
    assert job is not None
    if end is not None:
        assert store.finish_job(job, state=JobState.DONE, exit_code=0, at=end) is not None


@SITES
@given(seed=st.integers(0, 10_000), steps=st.lists(
    st.tuples(st.sampled_from([10, 60, 7 * 60, 20 * 60, 55 * 60]), st.booleans()),
    min_size=1, max_size=8))
def test_a_batched_roll_up_writes_what_the_per_node_roll_up_writes(
        store: Store, ref: PerSubjectStore, seed: int, steps: list[tuple[int, bool]]) -> None:
    wipe(store)
    wipe(ref)
    tick = T0 + 6 * H + 7 * M
    build_site(store, seed, tick)
    build_site(ref, seed, tick)
    policies = [onprem_policy(2.0)]
    for seconds, skip_fresh in steps:
        got = roll_up(store, policies, tick, skip_fresh=skip_fresh)
        assert got == roll_up(ref, policies, tick, skip_fresh=skip_fresh)
        assert ledger_state(store) == ledger_state(ref)
        tick += timedelta(seconds=seconds)
    # The roll-ups and the reach the batches kept are what a rebuild derives, but for the
    # micro-seconds of lines whose seconds end in half a micro-second (an idle remainder): the
    # writers round those half to even (Python), the rebuild half away from zero (SQL), on the
    # per-node path alike.
    kept = _without_us(ledger_state(store))
    store.rebuild_cost_rollups()
    assert _without_us(ledger_state(store)) == kept


def _without_us(state: dict[str, object]) -> dict[str, object]:
    """``state`` with the roll-ups' gpu_us and instance_us left out (the 7 sums end with
    gpu_us, instance_us, lines)."""
    return {k: [(*r[:-3], r[-1]) for r in v] if k.startswith("cost_rollup_") else v  # type: ignore[union-attr]
            for k, v in state.items()}


# -- all or nothing -------------------------------------------------------------------------------

def _failing_write(step: str) -> LedgerWrite:
    """A write of n-3 that fails at ``step`` of the batch: its line's cost does not fit a
    BIGINT (the lines' upsert), its GPU-seconds' micro-seconds do not (the roll-ups'
    increments), or the reach's update of n-3 is refused (a trigger, the last step)."""
    line = make_write("n-3", {"since": 0, "mark": 5, "lines": [(4, 0, 1, "nlp", None,
                                                                CostKind.USAGE)]}).lines[0]
    if step == "lines":
        line = replace(line, cost_micros=2**63)
    elif step == "rollups":
        line = replace(line, gpu_seconds=1e14)
    return LedgerWrite("n-3", [line], since=T0, mark=T0 + 5 * H)


def _refuse_reach_of_n3(store: Store) -> None:
    with store.engine.begin() as conn:
        if store.dialect == "postgresql":
            conn.exec_driver_sql(
                "CREATE OR REPLACE FUNCTION refuse_n3() RETURNS trigger AS $$ BEGIN "
                "RAISE EXCEPTION 'refused'; END $$ LANGUAGE plpgsql")
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse_n3 BEFORE UPDATE ON ledger_reach FOR EACH ROW "
                "WHEN (NEW.node_id = 'n-3') EXECUTE FUNCTION refuse_n3()")
        else:
            conn.exec_driver_sql(
                "CREATE TRIGGER refuse_n3 BEFORE UPDATE ON ledger_reach FOR EACH ROW "
                "WHEN NEW.node_id = 'n-3' BEGIN SELECT RAISE(ABORT, 'refused'); END")


def _drop_trigger(store: Store) -> None:
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER IF EXISTS refuse_n3"
                             + (" ON ledger_reach" if store.dialect == "postgresql" else ""))


@pytest.mark.parametrize("step", ["lines", "rollups", "reach"])
def test_a_failure_mid_batch_leaves_nothing_written(store: Store, step: str) -> None:
    add_nodes(store)
    first = {"since": None, "mark": 1, "lines": [(h, s, 0, "vision", "ada", CostKind.USAGE)
                                                 for h in range(4) for s in range(2)]}
    store.write_ledgers([make_write(s, first) for s in SUBJECTS], at=T0)
    before = ledger_state(store)
    # Every other subject would have lines deleted, rewritten and added, and its mark moved.
    second = {"since": 1, "mark": 3, "lines": [(h, s, 1, "nlp", None, CostKind.IDLE)
                                               for h in range(2, 6) for s in range(1)]}
    writes = [make_write(s, second) for s in SUBJECTS if s != "n-3"]
    writes.insert(2, _failing_write(step))
    if step == "reach":
        _refuse_reach_of_n3(store)
    seen: list[str] = []

    def count(conn, cursor, statement, *args) -> None:
        seen.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", count)
    try:
        with pytest.raises(Exception):  # noqa: B017 - what the database says differs
            store.write_ledgers(writes, at=T0 + M)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", count)
        _drop_trigger(store)
    # It failed where meant to, after the batch's stale lines were deleted.
    failed = {"lines": "INSERT INTO cost_lines", "rollups": "INSERT INTO cost_rollup_hours",
              "reach": "UPDATE ledger_reach"}[step]
    assert seen[-1].startswith(failed), seen[-1]
    assert any(x.startswith("DELETE FROM cost_lines") for x in seen)
    assert ledger_state(store) == before
    # The same batch without the failing write goes through whole.
    done = store.write_ledgers([w for w in writes if w.subject != "n-3"], at=T0 + M)
    assert all(done) and ledger_state(store) != before


# -- a constant number of statements --------------------------------------------------------------

def _statements(store: Store, subjects: int) -> int:
    """Statements one batch of ``subjects`` nodes runs, each node with lines to delete, rewrite
    and add and a mark to move."""
    nodes = [f"s{i:03d}" for i in range(subjects)]
    for node in nodes:
        launch(store, node, T0 - 20 * M)
    first = {"since": None, "mark": 1, "lines": [(h, 0, 0, "vision", None, CostKind.USAGE)
                                                 for h in range(3)]}
    store.write_ledgers([make_write(n, first) for n in nodes], at=T0)
    second = {"since": 1, "mark": 2, "lines": [(h, 0, 1, "nlp", None, CostKind.USAGE)
                                               for h in range(2, 4)]}
    batch = [make_write(n, second) for n in nodes]
    seen: list[str] = []

    def count(conn, cursor, statement, *args) -> None:
        seen.append(statement)

    sa.event.listen(store.engine, "before_cursor_execute", count)
    try:
        done = store.write_ledgers(batch, at=T0 + M)
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", count)
    assert all(d.lines_written == 2 and d.lines_deleted == 1 for d in done)
    return len(seen)


def test_a_batch_is_a_constant_number_of_statements(store: Store) -> None:
    few = _statements(store, 3)
    wipe(store)
    assert _statements(store, 120) == few
