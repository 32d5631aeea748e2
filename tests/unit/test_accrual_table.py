"""The accrual groups as columns (orchestrator.store.accrual_table.AccrualTable): every window's
micro-dollars per (pool, project) equal the scalar derivation's (``spend._accrued_us`` per group,
times its count, summed per (pool, project), those that accrued nothing left out), to the
integer micro-dollar: half-micro-dollar ties, the billing minimum and increment, spans ending
before they start, prices of many decimals and spans long enough to leave int64 (worked on
Python integers), and groups of many nodes."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.costs.attribution import rate
from orchestrator.costs.ledger import DEFAULT_BILLING
from orchestrator.costs.spend import _accrued_us, accrual_table
from orchestrator.domain.offerings import BillingRule
from orchestrator.store.accrual import AccrualGroup
from orchestrator.store.accrual_table import AccrualTable, ReachGroupSet

T = 1_764_547_200_000_000  # 2025-12-01 in microseconds since the epoch
PRICES = [0.0, 1.0, 9.5, 10.35, 32.77, 1.2345678, 2500.0, 0.000001, 98765.4321987, 3.3]


@st.composite
def group_st(draw: st.DrawFn) -> AccrualGroup:
    start = T + draw(st.one_of(st.integers(-10**10, 10**10),
                               st.sampled_from([0, 1800, 5400, 30_000_001, -59_999_999])))
    billed = draw(st.booleans())
    ended = draw(st.one_of(st.none(), st.integers(-10**9, 10**11).map(lambda d: start + d)))
    return AccrualGroup(draw(st.sampled_from(["gpu", "big"])),
                        draw(st.sampled_from([None, "nlp", "vision"])),
                        draw(st.sampled_from(PRICES)), start, ended,
                        start if billed else None, draw(st.sampled_from([1, 2, 7, 10_000])))


def scalar(groups: list[AccrualGroup], since_us: int, stop_us: int
           ) -> dict[tuple[str, str | None], int]:
    """What WindowSpend.accrued summed before the table (one call a group)."""
    out: dict[tuple[str, str | None], int] = {}
    for pool, project, price, launched, ended, covered, count in groups:
        micros = _accrued_us(price, launched, ended, covered, since_us, stop_us)
        if micros:
            out[(pool, project)] = out.get((pool, project), 0) + micros * count
    return out


@settings(max_examples=400, deadline=None)
@given(groups=st.lists(group_st(), max_size=30),
       since=st.integers(-2 * 10**10, 10**10), length=st.integers(0, 3 * 10**10))
def test_the_table_accrues_what_each_group_does_alone(groups: list, since: int,
                                                      length: int) -> None:
    table = accrual_table(groups)
    assert table.accrued(T + since, T + since + length) == scalar(
        groups, T + since, T + since + length)


def test_half_micro_dollars_round_to_even() -> None:
    """$1/h for 1,800 µs is half a micro-dollar: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, 3.5 -> 4."""
    groups = [AccrualGroup(f"p{i}", None, 1.0, T, T + span, T, 1)
              for i, span in enumerate([1800, 5400, 9000, 12600])]
    got = accrual_table(groups).accrued(T, T + 10**9)
    assert got == {("p1", None): 2, ("p2", None): 2, ("p3", None): 4}
    assert got == scalar(groups, T, T + 10**9)


def test_the_billing_minimum_and_increment() -> None:
    """Never covered by lines and counted from its launch: at least the minimum, rounded up to
    the increment; from a later window start, or covered by lines, the span as it is."""
    rule = BillingRule(minimum_s=60, increment_s=7)
    groups = [AccrualGroup("gpu", None, 3600.0, T, None, None, 3),  # $1 a second
              AccrualGroup("gpu", "nlp", 3600.0, T, None, T, 1)]
    table = AccrualTable(groups, rate, rule)
    assert table.accrued(T, T + 1_000_000) == {("gpu", None): 3 * 63_000_000,
                                               ("gpu", "nlp"): 1_000_000}
    assert table.accrued(T + 1, T + 1_000_001) == {("gpu", None): 3 * 1_000_000,
                                                   ("gpu", "nlp"): 1_000_000}
    assert table.accrued(T + 5, T + 5) == {}


def test_products_past_int64_are_worked_on_python_integers() -> None:
    """A price of many decimals over a year: numerator x span leaves 63 bits."""
    price = 12345.678912345678
    assert rate(price).numerator * 365 * 86_400 * 10**6 > 2**63
    groups = [AccrualGroup("gpu", "nlp", price, T, None, None, 10_000),
              AccrualGroup("gpu", "nlp", 9.5, T - 10**12, None, T - 10**12, 3)]
    for stop in (T + 365 * 86_400 * 10**6, T + 1):
        assert accrual_table(groups).accrued(T - 10**13, stop) == scalar(
            groups, T - 10**13, stop)


def test_sums_past_int64_are_worked_on_python_integers() -> None:
    """Each group's total fits 63 bits, their (pool, project) sum does not."""
    count = 2**62 // 9_500_000
    groups = [AccrualGroup("gpu", "nlp", 9.5, T + k, None, T + k, count) for k in range(3)]
    got = accrual_table(groups).accrued(T, T + 3_600_000_000)
    assert got == scalar(groups, T, T + 3_600_000_000)
    assert got[("gpu", "nlp")] > 2**63


def test_no_groups_accrue_nothing() -> None:
    assert accrual_table([]).accrued(T, T + 10**9) == {}


def test_a_group_set_builds_its_table_once() -> None:
    groups = [AccrualGroup("gpu", None, 9.5, T, None, None, 4)]
    kept = ReachGroupSet(3, groups, [])
    first = kept.table(rate, DEFAULT_BILLING)
    assert kept.table(rate, DEFAULT_BILLING) is first
    assert first.accrued(T, T + 3_600_000_000) == {("gpu", None): 4 * 9_500_000}
    assert Fraction(9.5) == rate(9.5)
