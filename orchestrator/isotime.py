"""The one ISO 8601 time parser of the codebase: every time burst reads needs a timezone.

A time without a timezone is ambiguous, and mixing one with the aware times burst keeps crashes
datetime arithmetic far from where it was read; so every reader (policy, snapshot, API
parameters, agent reports, stored text, CLI options, the node agent's drain deadlines and the
clouds' instance-action notices) parses through :func:`parse_aware`, which refuses it where it is
read, naming the field.

Standard library only and importing nothing of ours: the node agent, which starts on a bare
cloud image without pydantic, reads its times with it too. :mod:`orchestrator.policy.timefmt`
adds the forms people write (dates, spans back from now) and their pydantic type.
"""

from __future__ import annotations

from datetime import UTC, datetime

EXAMPLE = "2026-11-30T03:00:00Z"
# Longest ISO 8601 text worth parsing (date, time, microseconds, offset): refuses megabyte strings.
MAX_CHARS = 64
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
    if len(value) > MAX_CHARS:
        raise TimeFormatError(f"{field}: not an ISO 8601 time (longer than {MAX_CHARS} "
                              "characters)")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise TimeFormatError(f"{field}: not an ISO 8601 time: {value[:MAX_CHARS]!r} (e.g. "
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


__all__ = ["EARLIEST", "EXAMPLE", "LATEST", "MAX_CHARS", "TimeFormatError", "parse_aware",
           "require_aware"]
