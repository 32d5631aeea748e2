"""Unit tests of the policy value units: durations (``1h30m``) and money (plain USD numbers)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.policy.units import format_duration, parse_duration, parse_money


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0s", timedelta(0)),
        ("30s", timedelta(seconds=30)),
        ("10m", timedelta(minutes=10)),
        ("1h", timedelta(hours=1)),
        ("2d", timedelta(days=2)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1d2h3m4s", timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("90m", timedelta(minutes=90)),  # not normalised on input, only on output
        ("  5m ", timedelta(minutes=5)),  # surrounding blanks are tolerated
    ],
)
def test_parse_duration_accepts_the_one_spelling(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


def test_parse_duration_passes_timedelta_through() -> None:
    assert parse_duration(timedelta(minutes=3)) == timedelta(minutes=3)


@pytest.mark.parametrize(
    "text",
    [
        "10 minutes", "1.5h", "600", "", "h", "1m1h", "1h 30m", "-5m", "5M", "PT5M", "1w", "m5",
        "5mm",
    ],
)
def test_parse_duration_rejects_other_spellings(text: str) -> None:
    with pytest.raises(ValueError, match="like 30s, 10m, 1h30m or 2d"):
        parse_duration(text)


@pytest.mark.parametrize("value", [600, 1.5, None, True, ["10m"]])
def test_parse_duration_rejects_non_strings(value: object) -> None:
    with pytest.raises(ValueError, match="a duration is a string"):
        parse_duration(value)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (timedelta(0), "0s"),
        (timedelta(seconds=30), "30s"),
        (timedelta(minutes=90), "1h30m"),
        (timedelta(days=1, seconds=1), "1d1s"),
        (timedelta(hours=48), "2d"),
    ],
)
def test_format_duration_is_canonical(value: timedelta, text: str) -> None:
    assert format_duration(value) == text
    assert parse_duration(text) == value


@given(st.integers(min_value=0, max_value=10**9))
def test_duration_round_trip(seconds: int) -> None:
    value = timedelta(seconds=seconds)
    text = format_duration(value)
    assert parse_duration(text) == value
    assert format_duration(parse_duration(text)) == text


@given(
    st.tuples(*(st.one_of(st.none(), st.integers(0, 10_000)) for _ in range(4))).filter(
        lambda parts: any(p is not None for p in parts)
    )
)
def test_any_well_ordered_spelling_parses(parts: tuple[int | None, ...]) -> None:
    text = "".join(f"{n}{unit}" for n, unit in zip(parts, "dhms", strict=True) if n is not None)
    days, hours, minutes, seconds = (n or 0 for n in parts)
    assert parse_duration(text) == timedelta(
        days=days, hours=hours, minutes=minutes, seconds=seconds
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, Decimal("0")),
        (12, Decimal("12")),
        (12.5, Decimal("12.5")),
        (3.06, Decimal("3.06")),  # a YAML float: its shortest repr, not binary noise
        ("3.06", Decimal("3.06")),
        ("21.957642", Decimal("21.957642")),
        (" 7 ", Decimal("7")),
        (Decimal("1.25"), Decimal("1.25")),
    ],
)
def test_parse_money_accepts_plain_usd(value: object, expected: Decimal) -> None:
    assert parse_money(value) == expected


@pytest.mark.parametrize(
    "value",
    ["$3", "3$", "-1", -1, -0.5, "abc", "", "1,000", "1e3", 1e-9, "0.0000001", "USD 3", ".5", "5."],
)
def test_parse_money_rejects_other_spellings(value: object) -> None:
    with pytest.raises(ValueError, match="money|amount"):
        parse_money(value)


@pytest.mark.parametrize("value", [True, False, None, [1], {"usd": 1}])
def test_parse_money_rejects_non_numbers(value: object) -> None:
    with pytest.raises(ValueError, match="money is a plain number"):
        parse_money(value)


def test_parse_money_rejects_negative_decimal() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        parse_money(Decimal("-1"))


@given(st.decimals(min_value=0, max_value=10**6, places=6, allow_nan=False, allow_infinity=False))
def test_money_round_trips_through_text(amount: Decimal) -> None:
    assert parse_money(format(amount, "f")) == amount
