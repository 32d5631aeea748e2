"""The one ISO 8601 time parser of the codebase: every time burst reads needs a timezone.

A time without a timezone is ambiguous, and mixing one with the aware times burst keeps crashes
datetime arithmetic far from where it was read; so every reader (policy, snapshot, API
parameters, agent reports, stored text, CLI options) parses through :func:`parse_aware`, which
refuses it where it is read, naming the field.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Annotated

from pydantic import BeforeValidator

EXAMPLE = "2026-11-30T03:00:00Z"
# Longest ISO 8601 text worth parsing (date, time, microseconds, offset): refuses megabyte strings.
_MAX_CHARS = 64
# Far enough from datetime's ends that adding any duration burst allows (100 years at most)
# cannot overflow: a time outside them is refused where it is read.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


class TimeFormatError(ValueError):
    """A time could not be read; the message names the field and the accepted form."""


def parse_aware(text: object, field: str, *, assume_utc: bool = False) -> datetime:
    """``text`` as an aware datetime; :class:`TimeFormatError` naming ``field`` otherwise.

    Accepts ISO 8601 with a ``Z`` or ``±HH:MM`` offset (``2026-11-30T03:00:00Z``); an aware
    ``datetime`` is returned as it is. ``assume_utc`` is only for text burst itself or a cloud's
    metadata service wrote (stored records, instance-action notices), which is UTC by contract:
    a naive time there is read as UTC instead of refused. Never for user input.
    """
    if isinstance(text, datetime):
        if assume_utc and text.tzinfo is None:
            text = text.replace(tzinfo=UTC)
        return require_aware(text, field)
    if not isinstance(text, str):
        raise TimeFormatError(f"{field}: a time is an ISO 8601 string like {EXAMPLE}, not "
                              f"{type(text).__name__}")
    value = text.strip()
    if len(value) > _MAX_CHARS:
        raise TimeFormatError(f"{field}: not an ISO 8601 time (longer than {_MAX_CHARS} "
                              "characters)")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise TimeFormatError(f"{field}: not an ISO 8601 time: {value[:_MAX_CHARS]!r} (e.g. "
                              f"{EXAMPLE})") from None
    if assume_utc and moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return require_aware(moment, field)


def require_aware(moment: datetime, field: str) -> datetime:
    """``moment`` if it carries a timezone and lies between :data:`EARLIEST` and :data:`LATEST`;
    :class:`TimeFormatError` naming ``field`` otherwise."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise TimeFormatError(f"{field}: times need a timezone (e.g. {EXAMPLE})")
    try:
        inside = EARLIEST <= moment <= LATEST
    except OverflowError:  # e.g. 0001-01-01T00:00+01:00: before the first representable instant
        inside = False
    if not inside:
        raise TimeFormatError(f"{field}: must lie between {EARLIEST.date()} and {LATEST.date()}")
    return moment


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
