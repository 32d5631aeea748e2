"""Times as people write them: ISO 8601 with a timezone, a date, or a span back from now
(:func:`parse_when`, and :data:`When` for pydantic models). The ISO parser itself is
:func:`orchestrator.isotime.parse_aware`, the one of the codebase, re-exported here.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Annotated

from pydantic import BeforeValidator

from orchestrator.isotime import (
    EARLIEST,
    EXAMPLE,
    LATEST,
    TimeFormatError,
    parse_aware,
    require_aware,
)
from orchestrator.isotime import MAX_CHARS as _MAX_CHARS

# -- times as people write them (report windows, API ?from=/?to=, task arguments) ----------------

#: What :func:`parse_when` accepts, for error messages.
WHEN_FORMS = (f"an ISO 8601 time with a timezone ({EXAMPLE}), a date (2026-12-01: UTC midnight) "
              "or a span back from now (30m, 12h, 7d, 2w)")
_SPAN = re.compile(r"^(\d{1,6})([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def parse_when(text: object, field: str, now: datetime) -> datetime:
    """A moment as people write one, in UTC: an ISO time with a timezone, a date (its UTC
    midnight), or a relative span (``30m``, ``7d``) back from ``now``. Anything else is a
    :class:`TimeFormatError` naming ``field`` and the accepted forms."""
    require_aware(now, "now")
    if isinstance(text, datetime):
        return require_aware(text, field).astimezone(UTC)
    if not isinstance(text, str):
        raise TimeFormatError(f"{field}: expected {WHEN_FORMS}, not {type(text).__name__}")
    value = text.strip()
    span = _SPAN.match(value)
    if span is not None:
        seconds = int(span.group(1)) * _UNIT_S[span.group(2)]
        try:
            return require_aware(now - timedelta(seconds=seconds), field).astimezone(UTC)
        except OverflowError:
            raise TimeFormatError(f"{field}: {value!r} reaches before {EARLIEST.date()}") from None
    if _DATE.match(value):
        try:
            day = date.fromisoformat(value)
        except ValueError:
            raise TimeFormatError(f"{field}: {value!r} is not a calendar date") from None
        return require_aware(datetime(day.year, day.month, day.day, tzinfo=UTC), field)
    try:
        return parse_aware(value, field).astimezone(UTC)
    except TimeFormatError as exc:
        if "timezone" in str(exc) or "between" in str(exc):
            raise
        raise TimeFormatError(f"{field}: expected {WHEN_FORMS}; got {value[:_MAX_CHARS]!r}") from None


def _when_now(value: object) -> datetime:
    return parse_when(value, "time", datetime.now(UTC))


#: The pydantic form of :func:`parse_when` (relative spans count back from the wall clock), for
#: models whose fields take a moment as people write one.
When = Annotated[datetime, BeforeValidator(_when_now)]


__all__ = ["EARLIEST", "EXAMPLE", "LATEST", "WHEN_FORMS", "TimeFormatError", "When", "parse_aware",
           "parse_when", "require_aware"]
