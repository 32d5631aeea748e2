"""The cost roll-ups (orchestrator.store.rollups) on SQLite and PostgreSQL: reports and budgets
read from them equal the sum of the lines to the micro-dollar for random lines (written, rewritten
and deleted through ``write_ledger``) over three months, random windows (whole months, days and
hours) and random groupings; the roll-ups equal a rebuild from the lines after any writes, racing
writers included; migrations 0014 and 0016 build them from what an older store holds."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.costs.report import CostQuery, GroupKey, cost_report
from orchestrator.costs.spend import WindowLines, spend
from orchestrator.domain.costs import NO_PROJECT, CostKind, CostLine
from orchestrator.store import Store
from orchestrator.store import tables as T
from orchestrator.store.rollups import Level, Part, cover

T0 = datetime(2025, 3, 1, 0, 0, tzinfo=UTC)
H = timedelta(hours=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
HOURS = 24 * 6  # the lines' buckets: six days from T0
# The random lines' buckets: from 30 days before T0 (January's last days, February) to 40 days
# after it (March, April's first days), so windows hold whole months, whole days and hours.
SPREAD = range(-24 * 30, 24 * 40)
LEDGER = ("cost_lines", "cost_rollup_hours", "cost_rollup_days", "cost_rollup_months",
          "ledger_marks")
SUBJECTS = ("n-1", "n-2", "n-3", "onprem:gpu")

line_st = st.fixed_dictionaries({
    "subject": st.sampled_from(SUBJECTS),
    "hour": st.one_of(st.integers(0, HOURS - 1), st.integers(SPREAD.start, SPREAD.stop - 1)),
    "kind": st.sampled_from(list(CostKind)),
    "project": st.sampled_from([None, NO_PROJECT, "vision", "nlp"]),
    "user": st.sampled_from([None, "ada", "bob"]),
    "provider": st.sampled_from(["aws", "gcp"]),
    "pool": st.sampled_from(["gpu", "big"]),
    "policy": st.sampled_from(["train", "fast"]),
    "region": st.sampled_from(["us-east-1", "eu-west-1"]),
    "cost": st.integers(0, 50_000_000),
    "equiv": st.integers(0, 1_000_000),
    "gpu_s": st.floats(0, 28_800, allow_nan=False),
    "inst_s": st.floats(0, 3_600, allow_nan=False),
})
moment_st = st.one_of(
    st.none(), st.integers(-30, HOURS * 60 + 30).map(lambda m: T0 + timedelta(minutes=m * 7)),
    # Across the months, on day and month starts too.
    st.integers(SPREAD.start * 60 - 600, SPREAD.stop * 60 + 600).map(
        lambda m: T0 + timedelta(minutes=m)),
    st.integers(-40, 45).map(lambda d: T0 + timedelta(days=d)))
group_st = st.lists(st.sampled_from(list(GroupKey)), unique=True, max_size=3)


def make_line(i: int, d: dict, version: int = 0) -> CostLine:
    start = T0 + d["hour"] * H
    onprem = d["subject"].startswith("onprem:")
    return CostLine(
        line_key=f"{d['subject']}:{d['hour']}:{i}", subject=d["subject"],
        node_id=None if onprem else d["subject"], period_start=start, period_end=start + H,
        kind=CostKind.ONPREM if onprem else d["kind"], project=d["project"], job_id=f"j{i}",
        policy=d["policy"], pool=d["pool"], provider="onprem" if onprem else d["provider"],
        region=d["region"], instance_type="t", market="spot", price_usd_hour=1.0,
        instance_seconds=d["inst_s"], gpu_seconds=d["gpu_s"],
        cost_micros=d["cost"] + version * 7, onprem_equiv_micros=d["equiv"], user=d["user"])


def write_all(store: Store, lines: list[CostLine], before: list[CostLine] = ()) -> None:
    """Make each subject's lines ``lines`` (subjects of neither ``lines`` nor ``before`` have
    none to write)."""
    for subject in sorted({x.subject for x in [*lines, *before]}):
        store.write_ledger(subject, [x for x in lines if x.subject == subject], since=EPOCH,
                           mark=None, at=T0)


def empty(store: Store) -> None:
    with store.engine.begin() as conn:
        for table in LEDGER:
            conn.exec_driver_sql(f"DELETE FROM {table}")


def rollup_rows(store: Store) -> dict[str, set[tuple]]:
    """The roll-ups' rows of at least one line."""
    out = {}
    with store.engine.connect() as conn:
        for table in (T.cost_rollup_hours, T.cost_rollup_days, T.cost_rollup_months):
            out[table.name] = {tuple(r) for r in conn.execute(
                sa.select(table).where(table.c.lines > 0))}
    return out


def in_window(line: CostLine, since: datetime | None, until: datetime | None) -> bool:
    return (since is None or line.period_start >= since) and (
        until is None or line.period_start < until)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(first=st.lists(line_st, max_size=40), keep=st.lists(st.booleans(), max_size=40),
       since=moment_st, until=moment_st, group_by=group_st,
       projects=st.one_of(st.none(), st.sets(st.sampled_from([NO_PROJECT, "vision", "nlp"]))),
       pool=st.sampled_from([None, "gpu"]))
def test_reports_from_roll_ups_equal_the_sum_of_lines(
        store: Store, first: list[dict], keep: list[bool], since: datetime | None,
        until: datetime | None, group_by: list[GroupKey], projects: set[str] | None,
        pool: str | None) -> None:
    empty(store)
    lines = [make_line(i, d) for i, d in enumerate(first)]
    write_all(store, lines)
    # A second roll-up rewrites some lines (a new version) and drops the others.
    kept = [make_line(i, d, version=1) for i, d in enumerate(first)
            if i < len(keep) and keep[i]]
    write_all(store, kept, lines)
    if since is not None and until is not None and since >= until:
        since, until = until, since + H
    keys = [str(k) for k in group_by]
    filters = {"since": since, "until": until, "projects": projects, "pool": pool}
    fast = store.cost_sums(keys, **filters)
    slow = store.cost_sums(keys, **filters, from_lines=True)
    assert [(s.keys, s.cost_micros, s.idle_micros, s.onprem_micros, s.onprem_equiv_micros,
             s.lines) for s in fast] == \
           [(s.keys, s.cost_micros, s.idle_micros, s.onprem_micros, s.onprem_equiv_micros,
             s.lines) for s in slow]
    for a, b in zip(fast, slow, strict=True):
        assert a.gpu_seconds == pytest.approx(b.gpu_seconds, abs=1e-3)
        assert a.instance_seconds == pytest.approx(b.instance_seconds, abs=1e-3)

    # Against the lines themselves, summed here: the report's total, and budgets' spend.
    wanted = [x for x in kept if in_window(x, since, until) and (pool is None or x.pool == pool)
              and (projects is None or x.project in projects
                   or (x.project is None and NO_PROJECT in projects))]
    burst = sum(x.cost_micros for x in wanted if x.kind != CostKind.ONPREM)
    report = cost_report(store, CostQuery(since=since, until=until, group_by=tuple(group_by),
                                           projects=None if projects is None
                                           else frozenset(projects), pool=pool))
    assert report.total.cost_usd_exact * 1_000_000 == burst
    assert report.total.lines == len(wanted)
    assert sum(r.cost_usd for r in report.rows) == report.total.cost_usd  # to the cent
    if since is not None and until is not None:
        project = None if projects is None or len(projects) != 1 else next(iter(projects))
        budget_lines = [x for x in kept if in_window(x, since, until) and x.kind != CostKind.ONPREM
                        and (pool is None or x.pool == pool)
                        and (project is None or x.project == project
                             or (project == NO_PROJECT and x.project is None))]
        want = sum(x.cost_micros for x in budget_lines)
        assert store.ledger_cost_micros(since=since, until=until, pool=pool, project=project) \
            == want
        # Budgets sharing a window read it once, grouped by pool and project (no node: no accrual).
        assert spend(store, since=since, until=until, now=until, pool=pool, project=project,
                     lines=WindowLines(store)(since, until)) * 1_000_000 == want
    # What the writes left equals a rebuild from the lines.
    before = rollup_rows(store)
    store.rebuild_cost_rollups()
    assert rollup_rows(store) == before


def test_a_quarter_reads_months_days_and_hours_equal_to_the_lines(store: Store) -> None:
    """Lines in every hour bucket kind of a window over three months: the roll-ups' sums (whole
    months, edge days, edge hours; and by day, which reads no month) equal the lines'."""
    empty(store)
    hours = [-24 * 30, -24 * 29 + 3, -24 * 28, -24 * 10, -5, 0, 24 * 3 + 7, 24 * 31, 24 * 39 + 20,
             24 * 39 + 21]  # the first and the last outside the window
    lines = [make_line(i, {"subject": SUBJECTS[i % 4], "hour": h, "kind": CostKind.USAGE,
                           "project": ["vision", "nlp", None][i % 3], "user": "ada",
                           "provider": "aws", "pool": "gpu", "policy": "train", "region": "r",
                           "cost": 1_000_003 * (i + 1), "equiv": i, "gpu_s": 60.0 * i,
                           "inst_s": 36.0 * i}) for i, h in enumerate(hours)]
    write_all(store, lines)
    since, until = T0 - timedelta(days=29, hours=22), T0 + timedelta(days=39, hours=21)
    for keys in (["project"], ["project", "day"], []):
        fast = store.cost_sums(keys, since=since, until=until)
        slow = store.cost_sums(keys, since=since, until=until, from_lines=True)
        assert [(s.keys, s.cost_micros, s.lines) for s in fast] == \
            [(s.keys, s.cost_micros, s.lines) for s in slow]
    assert sum(s.lines for s in store.cost_sums([], since=since, until=until)) == 8
    assert sum(s.lines for s in store.cost_sums([])) == len(lines)


def _hours_of(part: Part, lo: datetime, hi: datetime) -> range:
    """The hour indexes (from ``lo``) a part's buckets hold, an unbounded side cut at lo/hi."""
    start = lo if part.start is None else part.start
    end = hi if part.end is None else part.end
    return range(int((start - lo) / H), int((end - lo) / H))


@settings(max_examples=300, deadline=None)
@given(a=st.one_of(st.none(), st.integers(0, 24 * 120)),
       b=st.one_of(st.none(), st.integers(0, 24 * 120)), by_day=st.booleans())
def test_a_window_is_covered_exactly_once_by_its_signed_parts(
        a: int | None, b: int | None, by_day: bool) -> None:
    """Every hour bucket of the window counted once, every other bucket zero times, whatever the
    window (whole months, days, hours, unbounded sides); never coarser than asked."""
    base = datetime(2024, 12, 1, tzinfo=UTC)  # 120 days over a year's end and a leap February
    lo = None if a is None else base + a * H
    hi = None if b is None else base + b * H
    level = Level.DAY if by_day else Level.MONTH
    parts = cover(lo, hi, level)
    outer_lo, outer_hi = base - timedelta(days=70), base + timedelta(days=200)
    counts = [0] * int((outer_hi - outer_lo) / H)
    for part in parts:
        assert part.level <= level
        for h in _hours_of(part, outer_lo, outer_hi):
            counts[h] += part.sign
    for h, n in enumerate(counts):
        moment = outer_lo + h * H
        inside = (lo is None or moment >= lo) and (hi is None or moment < hi)
        assert n == (1 if inside else 0), (moment, parts)


def test_a_quarter_reads_a_few_buckets() -> None:
    m = lambda month, day=1, hour=0: datetime(2025, month, day, hour, tzinfo=UTC)  # noqa: E731
    # 91 days to November 30: August 31, September, October, and November less its 30th.
    assert cover(datetime(2026, 8, 31, tzinfo=UTC), datetime(2026, 11, 30, tzinfo=UTC)) == [
        Part(Level.MONTH, datetime(2026, 9, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)),
        Part(Level.DAY, datetime(2026, 8, 31, tzinfo=UTC), datetime(2026, 9, 1, tzinfo=UTC)),
        Part(Level.MONTH, datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)),
        Part(Level.DAY, datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC),
             -1)]
    # March to the 20th at 14:00: the month less the 11 days after the 20th and the 20th's last
    # 10 hours (22 buckets), not the 19 days and 14 hours up to it (33).
    assert sum(p.buckets for p in cover(m(3), m(3, 20, 14))) == 22
    assert cover(m(3), m(4)) == [Part(Level.MONTH, m(3), m(4))]
    assert cover(m(3, 5, 2), m(3, 5, 4)) == [Part(Level.HOUR, m(3, 5, 2), m(3, 5, 4))]
    assert cover(None, None) == [Part(Level.MONTH, None, None)]
    assert cover(m(3, 5), m(3, 7), Level.DAY) == [Part(Level.DAY, m(3, 5), m(3, 7))]


def test_racing_writers_keep_the_roll_ups_exact(store: Store) -> None:
    """Eight writers rewrite two subjects at once (different versions, shared groups): the
    roll-ups are the sums of whichever lines won, never a line counted twice."""
    base = {"kind": CostKind.USAGE, "project": "vision", "user": "ada", "provider": "aws",
            "pool": "gpu", "policy": "train", "region": "r", "cost": 1_000_000, "equiv": 0,
            "gpu_s": 3600.0, "inst_s": 3600.0}
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for round_ in range(4):
                subject = SUBJECTS[(n + round_) % 2]
                lines = [make_line(i, {**base, "subject": subject, "hour": i}, version=n)
                         for i in range((n + round_) % 5 + 1)]
                store.write_ledger(subject, lines, since=EPOCH, mark=None, at=T0)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    lines = store.ledger_lines()
    total = store.cost_sums([])
    assert total[0].cost_micros == sum(x.cost_micros for x in lines)
    assert total[0].lines == len(lines)
    before = rollup_rows(store)
    store.rebuild_cost_rollups()
    assert rollup_rows(store) == before


def test_migration_builds_the_roll_ups_from_existing_lines(store: Store) -> None:
    lines = [make_line(i, {"subject": SUBJECTS[i % 4], "hour": i * 5 % HOURS,
                           "kind": list(CostKind)[i % 3], "project": [None, "vision", "-"][i % 3],
                           "user": [None, "ada"][i % 2], "provider": "aws", "pool": "gpu",
                           "policy": "train", "region": "r", "cost": 1_234_567 * i, "equiv": i,
                           "gpu_s": 100.5 * i, "inst_s": 36.0 * i}) for i in range(60)]
    write_all(store, lines)
    want = rollup_rows(store)
    report = cost_report(store, CostQuery(group_by=(GroupKey.PROJECT, GroupKey.DAY)))
    by_project = cost_report(store, CostQuery(since=T0 - timedelta(days=30),
                                              until=T0 + timedelta(days=40)))
    store.downgrade("0013")
    assert "cost_rollup_days" not in sa.inspect(store.engine).get_table_names()
    store.upgrade()
    assert rollup_rows(store) == want
    assert cost_report(store, CostQuery(group_by=(GroupKey.PROJECT, GroupKey.DAY))) == report
    # 0016 builds the month roll-up from the day one.
    store.downgrade("0015")
    assert "cost_rollup_months" not in sa.inspect(store.engine).get_table_names()
    store.upgrade()
    assert rollup_rows(store) == want
    assert want["cost_rollup_months"]  # the lines' month: March
    assert cost_report(store, CostQuery(since=T0 - timedelta(days=30),
                                        until=T0 + timedelta(days=40))) == by_project
