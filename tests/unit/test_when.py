"""Times as people write them: ISO with a zone, a date (UTC midnight), a span back from now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from orchestrator.policy.timefmt import WHEN_FORMS, TimeFormatError, When, parse_when

NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
    ("2026-12-01T05:00:00+01:00", datetime(2026, 12, 1, 4, tzinfo=UTC)),
    ("2026-12-01T05:00:00Z", datetime(2026, 12, 1, 5, tzinfo=UTC)),
    ("30m", NOW - timedelta(minutes=30)),
    ("12h", NOW - timedelta(hours=12)),
    ("7d", NOW - timedelta(days=7)),
    ("30d", NOW - timedelta(days=30)),
    ("2w", NOW - timedelta(weeks=2)),
    (" 7d ", NOW - timedelta(days=7)),
])
def test_accepted_forms(text, expected):
    moment = parse_when(text, "--from", NOW)
    assert moment == expected and moment.tzinfo is UTC


@pytest.mark.parametrize(("text", "needle"), [
    ("yesterday", WHEN_FORMS),
    ("7 days", WHEN_FORMS),
    ("2026-12-01T05:00:00", "need a timezone"),
    ("2026-13-01", "not a calendar date"),
    ("999999d", "reaches before"),
    ("", WHEN_FORMS),
    (17, "not int"),
])
def test_anything_else_names_the_field_and_the_forms(text, needle):
    with pytest.raises(TimeFormatError) as caught:
        parse_when(text, "--from", NOW)
    assert str(caught.value).startswith("--from: ") and needle in str(caught.value)


@given(st.text(max_size=40))
def test_never_anything_but_a_moment_or_a_clear_error(text):
    try:
        moment = parse_when(text, "from", NOW)
    except TimeFormatError as exc:
        assert str(exc).startswith("from: ")
    else:
        assert moment.tzinfo is not None


def test_the_pydantic_type():
    class Window(BaseModel):
        since: When

    assert Window(since="2026-12-01").since == datetime(2026, 12, 1, tzinfo=UTC)
    assert datetime.now(UTC) - Window(since="1h").since > timedelta(minutes=59)
    with pytest.raises(ValueError):
        Window(since="later")
