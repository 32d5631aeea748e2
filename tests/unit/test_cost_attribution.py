"""Cost attribution maths (orchestrator.costs.attribution): pure functions, exact integers.

The invariants, checked by example and by hypothesis on generated nodes and jobs: a node's lines
add up to exactly round(price x billed seconds) micro-dollars; no line is negative; a bucket's
cost is split between jobs in proportion to their GPU-seconds (each share within one
micro-dollar of its exact value), the rest is idle; the minimum line sits in the last bucket.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.costs.attribution import (
    HOUR,
    NodeBilling,
    billed_micros,
    bucket_lines,
    hour_ceil,
    hour_floor,
    largest_remainder,
    micros,
    node_cost_micros,
    node_lines,
    onprem_lines,
    rate,
    usd_micros,
)
from orchestrator.domain.costs import CostKind, JobUsage
from orchestrator.domain.offerings import BillingRule

T = datetime(2025, 3, 1, 10, 0, tzinfo=UTC)
S = timedelta(seconds=1)
M = timedelta(minutes=1)


def node(launched: datetime = T, ended: datetime | None = None, *, price: float = 36.0,
         gpus: int = 8, project: str | None = "vision", rule: BillingRule = BillingRule(),
         onprem: Decimal | None = None) -> NodeBilling:
    return NodeBilling(node_id="n1", policy="train", pool="gpu", provider="aws",
                       region="us-east-1", instance_type="g8", market="spot", project=project,
                       gpus=gpus, price_usd_hour=price, launched=launched, ended=ended,
                       rule=rule, onprem_gpu_hour_usd=onprem)


def lines_of(n: NodeBilling, jobs: list[JobUsage] = (), until: datetime | None = None):
    until = until or n.ended
    assert until is not None
    return node_lines(n, list(jobs), start=hour_floor(n.launched), until=until,
                      final_through=hour_ceil(until))


def by_kind(lines) -> dict[str, int]:
    out: dict[str, int] = defaultdict(int)
    for line in lines:
        out[f"{line.kind}:{line.job_id or '-'}"] += line.cost_micros
    return dict(out)


# -- building blocks -----------------------------------------------------------------------------


def test_hour_buckets() -> None:
    assert hour_floor(T + 59 * M) == T
    assert hour_ceil(T) == T and hour_ceil(T + S) == T + HOUR


def test_billing_rule_in_integers() -> None:
    aws = BillingRule()
    assert billed_micros(aws, 10_000_000) == 60_000_000  # one-minute minimum
    assert billed_micros(aws, 61_500_000) == 62_000_000  # per second, rounded up
    assert billed_micros(aws, 0) == 60_000_000
    hourly = BillingRule(minimum_s=3600, increment_s=3600)
    assert billed_micros(hourly, 3_600_000_001) == 7_200_000_000
    assert billed_micros(BillingRule(minimum_s=0, increment_s=0), 1234) == 1234


def test_prices_are_exact_decimals_and_never_negative() -> None:
    assert rate(10.35) == Fraction(1035, 100)  # not the float nearest to it
    assert rate(Decimal("0.1")) == Fraction(1, 10)
    with pytest.raises(ValueError, match="negative"):
        node(price=-1.0)


def test_a_price_kept_per_type_is_still_exact() -> None:
    # 0.1 as a float and the Decimal of its exact binary value are equal, and hash alike: the
    # kept rates must not hand one the other's fraction.
    assert rate(0.1) == Fraction(1, 10)
    assert rate(Decimal(0.1)) == Fraction(Decimal(0.1)) != Fraction(1, 10)
    assert rate(0.1) == Fraction(1, 10)


@given(price=st.fractions(min_value=0, max_value=1000, max_denominator=10**6),
       duration=st.integers(-10**13, 10**13))
def test_micro_dollars_in_integers_round_half_to_even_as_fractions_do(price: Fraction,
                                                                      duration: int) -> None:
    assert usd_micros(price, duration) == round(price * duration / 3600)
    # Exactly half a micro-dollar: to the even one.
    assert usd_micros(Fraction(1, 1), 1800) == 0 and usd_micros(Fraction(1, 1), 5400) == 2


def test_largest_remainder() -> None:
    assert largest_remainder(10, [1, 1, 1]) == [4, 3, 3]  # earlier first on ties
    assert largest_remainder(100, [2, 1]) == [67, 33]
    assert largest_remainder(0, [5, 0]) == [0, 0]
    with pytest.raises(ValueError):
        largest_remainder(5, [0, 0])


# -- one node ------------------------------------------------------------------------------------


def test_idle_node_over_two_buckets_with_the_minimum_at_its_end() -> None:
    # 10:30 to 11:15 at $36/h = $27 exactly; no jobs: all idle.
    n = node(T + 30 * M, T + 75 * M)
    lines = lines_of(n)
    assert [(line.period_start, line.kind, line.cost_micros) for line in lines] == [
        (T, CostKind.IDLE, 18_000_000), (T + HOUR, CostKind.IDLE, 9_000_000)]
    assert lines[0].gpu_seconds == 8 * 1800 and lines[0].instance_seconds == 1800
    assert lines[0].project == lines[1].project == "vision" and lines[1].period_end == n.ended
    assert all(line.final for line in lines)


def test_short_node_pays_the_minimum_in_the_bucket_of_its_termination() -> None:
    n = node(T + 59 * M + 55 * S, T + HOUR + 5 * S, project=None)  # lived 10 s across 11:00
    lines = lines_of(n)
    assert [(line.period_start, line.kind, line.cost_micros) for line in lines] == [
        (T, CostKind.IDLE, 50_000), (T + HOUR, CostKind.IDLE, 50_000),
        (T + HOUR, CostKind.MINIMUM, 500_000)]  # 50 s more of $36/h
    minimum = lines[-1]
    assert minimum.project == "-" and minimum.job_id is None
    assert minimum.instance_seconds == 50 and minimum.gpu_seconds == 400
    assert sum(line.cost_micros for line in lines) == node_cost_micros(n, n.ended) == 600_000


def test_shared_node_splits_by_gpu_seconds_and_reports_idle() -> None:
    # 8 GPUs for one hour at $36: a (vision) 4 GPUs all hour, b (nlp) 2 GPUs for half an hour.
    n = node(T, T + HOUR, onprem=Decimal("2"))
    jobs = [JobUsage("a", "vision", 4, T - HOUR, None),
            JobUsage("b", "nlp", 2, T + 15 * M, T + 45 * M)]
    lines = lines_of(n, jobs)
    assert by_kind(lines) == {"usage:a": 18_000_000, "usage:b": 4_500_000, "idle:-": 13_500_000}
    usage = {line.job_id: line for line in lines if line.kind is CostKind.USAGE}
    assert usage["a"].project == "vision" and usage["b"].project == "nlp"
    assert usage["a"].gpu_seconds == 4 * 3600 and usage["b"].gpu_seconds == 2 * 1800
    assert usage["b"].instance_seconds == pytest.approx(3600 * 1 / 8)
    # On-prem equivalent: GPU-hours x $2 (4 GPU-h -> $8, 1 GPU-h -> $2); idle has none.
    assert usage["a"].onprem_equiv_micros == 8_000_000
    assert usage["b"].onprem_equiv_micros == 2_000_000
    assert sum(line.instance_seconds for line in lines) == pytest.approx(3600)
    assert sum(line.gpu_seconds for line in lines) == pytest.approx(8 * 3600)


def test_oversubscribed_node_splits_everything_between_jobs() -> None:
    n = node(T, T + HOUR, gpus=1)
    jobs = [JobUsage("a", "x", 1, T, T + HOUR), JobUsage("b", "y", 1, T, T + HOUR)]
    assert by_kind(lines_of(n, jobs)) == {"usage:a": 18_000_000, "usage:b": 18_000_000}


def test_live_node_carries_a_provisional_minimum_in_the_open_bucket() -> None:
    n = node(T + 30 * M)
    now = T + 30 * M + 20 * S
    lines = node_lines(n, [], start=T, until=now, final_through=T)
    assert [(line.kind, line.cost_micros, line.final) for line in lines] == [
        (CostKind.IDLE, 200_000, False), (CostKind.MINIMUM, 400_000, False)]
    assert lines[-1].period_end == now
    later = node_lines(n, [], start=T, until=T + 90 * M, final_through=T + HOUR)
    assert [(line.period_start, line.kind, line.final) for line in later] == [
        (T, CostKind.IDLE, True), (T + HOUR, CostKind.IDLE, False)]  # past the minimum


def test_bucket_must_start_an_hour() -> None:
    with pytest.raises(ValueError, match="does not start an hour"):
        bucket_lines(node(T, T + HOUR), T + M, T + HOUR, [], final=True)


def test_onprem_lines_price_gpu_hours_per_job_and_bucket() -> None:
    jobs = [JobUsage("a", "vision", 4, T + 30 * M, T + 90 * M), JobUsage("b", "nlp", 1, T, None)]
    lines = onprem_lines("gpu", "train", Decimal("1.5"), jobs, start=T, until=T + 2 * HOUR,
                         final_through=T + HOUR)
    got = [(line.job_id, line.period_start, line.cost_micros, line.gpu_seconds, line.final)
           for line in lines]
    assert got == [
        ("a", T, 3_000_000, 4 * 1800, True), ("a", T + HOUR, 3_000_000, 4 * 1800, False),
        ("b", T, 1_500_000, 3600, True), ("b", T + HOUR, 1_500_000, 3600, False)]
    assert {line.provider for line in lines} == {"onprem"} and lines[0].subject == "onprem:gpu"
    assert all(line.kind is CostKind.ONPREM and line.node_id is None for line in lines)


# -- properties ----------------------------------------------------------------------------------

PRICES = st.sampled_from([0.0, 0.35, 4.1, 10.35, 32.77, 98.32, 123.456789])
RULES = st.sampled_from([BillingRule(), BillingRule(0, 1), BillingRule(600, 60),
                         BillingRule(3600, 3600)])


@st.composite
def histories(draw):
    launched = T + timedelta(microseconds=draw(st.integers(0, 3_600_000_000)))
    life = timedelta(microseconds=draw(st.one_of(st.integers(0, 120_000_000),
                                                 st.integers(0, 30 * 3_600_000_000))))
    gpus = draw(st.sampled_from([0, 1, 4, 8]))
    n = node(launched, launched + life, price=draw(PRICES), gpus=gpus, rule=draw(RULES),
             project=draw(st.sampled_from(["a", None])),
             onprem=draw(st.sampled_from([None, Decimal("1.25")])))
    jobs = []
    for i in range(draw(st.integers(0, 6))):
        start = launched + timedelta(seconds=draw(st.integers(-3600, 30 * 3600)))
        ends = st.integers(1, 40 * 3600).map(lambda s, start=start: start + timedelta(seconds=s))
        end = draw(st.one_of(st.none(), ends))
        jobs.append(JobUsage(f"j{i}", draw(st.sampled_from(["a", "b", "c"])),
                             draw(st.integers(1, 8)), start, end))
    return n, jobs


@settings(max_examples=100, deadline=None)
@given(histories())
def test_lines_add_up_exactly_never_negative_and_split_by_use(history) -> None:
    n, jobs = history
    lines = lines_of(n, jobs)
    assert sum(line.cost_micros for line in lines) == node_cost_micros(n, n.ended)
    assert all(line.cost_micros >= 0 and line.onprem_equiv_micros >= 0 for line in lines)
    assert all(line.gpu_seconds >= 0 and line.instance_seconds >= 0 for line in lines)
    assert len({line.line_key for line in lines}) == len(lines)
    minimum = [line for line in lines if line.kind is CostKind.MINIMUM]
    assert len(minimum) <= 1
    if minimum:
        assert minimum[0].period_start == max(line.period_start for line in lines)
    # Per bucket: usage shares within one micro-dollar of cost x (job GPU-s / all GPU-s).
    buckets: dict[datetime, list] = defaultdict(list)
    for line in lines:
        if line.kind is not CostKind.MINIMUM:
            buckets[line.period_start].append(line)
    for bucket, group in buckets.items():
        cost = sum(line.cost_micros for line in group)
        lo, hi = max(bucket, n.launched), min(bucket + HOUR, n.ended)
        whole = max(n.gpus * micros(lo, hi), sum(
            j.gpus * max(micros(max(lo, j.start), min(hi, j.end or hi)), 0) for j in jobs))
        for line in group:
            if line.kind is CostKind.USAGE and whole:
                exact = Fraction(cost) * Fraction(round(line.gpu_seconds * 1_000_000)) / whole
                assert abs(line.cost_micros - exact) < 1 + Fraction(1, 10**6) * cost
    # The bill never depends on jobs: the same node without them costs the same.
    assert sum(line.cost_micros for line in lines_of(n)) == node_cost_micros(n, n.ended)


@settings(max_examples=100, deadline=None)
@given(histories(), st.integers(1, 40))
def test_incremental_buckets_equal_one_pass(history, cut_hours) -> None:
    """Lines computed from a later bucket on are the same as that part of a whole pass: a
    roll-up that resumes from its mark writes what a full recomputation would."""
    n, jobs = history
    whole = lines_of(n, jobs)
    start = hour_floor(n.launched) + cut_hours * HOUR
    resumed = node_lines(n, jobs, start=start, until=n.ended, final_through=hour_ceil(n.ended))
    assert resumed == [line for line in whole if line.period_start >= start]
