"""The two value forms a policy writes by hand: durations and money.

Each has exactly one accepted spelling so that a policy reads the same everywhere:

* a duration is a string of whole-number parts in descending order, ``d``/``h``/``m``/``s``:
  ``30s``, ``10m``, ``1h30m``, ``2d``. ``10 minutes``, ``600`` or ``1.5h`` are rejected.
* money is a plain non-negative number of US dollars, written as a YAML number or a numeric string
  (``12.5``, ``"3.06"``), with at most 6 decimal places; ``$12`` is rejected.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

DURATION_PATTERN = r"^(?=\d)(\d+d)?(\d+h)?(\d+m)?(\d+s)?$"
_DURATION_RE = re.compile(DURATION_PATTERN)
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
MONEY_PATTERN = r"^\d+(\.\d{1,6})?$"
_MONEY_RE = re.compile(MONEY_PATTERN)


# Far beyond any real window or timeout, and far inside timedelta's range: a date plus it stays a
# date (an overflow there would surface as a crash, not as an error naming the value).
MAX_DURATION_S = 100 * 366 * 86_400


def parse_duration(value: Any) -> timedelta:
    """Parse ``1h30m``-style text into a timedelta; raise ValueError naming the accepted form."""
    if isinstance(value, timedelta):
        return value
    if not isinstance(value, str):
        raise ValueError(
            f"a duration is a string like 30s, 10m, 1h30m or 2d, not {type(value).__name__} {value!r}"
        )
    text = value.strip()
    if not _DURATION_RE.match(text):
        raise ValueError(f"bad duration {value!r}: write it like 30s, 10m, 1h30m or 2d")
    seconds = 0
    for number, unit in re.findall(r"(\d+)([dhms])", text):
        seconds += int(number) * _UNIT_SECONDS[unit]
    if seconds > MAX_DURATION_S:
        raise ValueError(f"duration {value!r} is too long: at most {MAX_DURATION_S // 86_400}d")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """The canonical text of a duration, the inverse of :func:`parse_duration`."""
    seconds = int(value.total_seconds())
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in _UNIT_SECONDS.items():
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def parse_money(value: Any) -> Decimal:
    """Parse a plain non-negative USD amount into a Decimal."""
    if isinstance(value, Decimal):
        amount = value
    elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"money is a plain number of US dollars like 12.50, not {value!r}")
    else:
        text = str(value).strip()
        if not _MONEY_RE.match(text):
            raise ValueError(
                f"bad amount {value!r}: money is a plain non-negative number of US dollars "
                "like 12.50 (no currency sign, at most 6 decimals)"
            )
        try:
            amount = Decimal(text)
        except InvalidOperation as exc:  # pragma: no cover - the pattern already guards this
            raise ValueError(f"bad amount {value!r}") from exc
    if amount < 0:
        raise ValueError(f"amount {value!r} must not be negative")
    return amount


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema({"type": "string", "pattern": DURATION_PATTERN, "examples": ["30s", "10m", "1h30m"]}),
]

Money = Annotated[
    Decimal,
    BeforeValidator(parse_money),
    PlainSerializer(lambda d: format(d, "f"), return_type=str),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": MONEY_PATTERN},
            ],
            "description": "US dollars",
        }
    ),
]
