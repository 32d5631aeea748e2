"""JSON forms of stored values: decisions, and the fallback encoder for free-form details.

The store keeps a Decision as one JSON document: the domain's ``decision_to_jsonable`` (what the
CLI's ``--json`` output and the API serve) plus a ``format`` number, so there is one definition of
that shape; ``decision_from_json`` reads it back. Times are ISO 8601 strings with an offset,
always UTC.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from enum import Enum
from typing import Any

from orchestrator.domain.plan import Decision, OfferingOption, Rule
from orchestrator.domain.snapshot_json import decision_to_jsonable
from orchestrator.policy.timefmt import parse_aware

DECISION_FORMAT = 1  # bumped when the document shape changes incompatibly


def to_jsonable(value: Any) -> Any:
    """``value`` made of JSON types only; tuples and sets become lists, times ISO strings."""
    if value is None or isinstance(value, bool | int | float | str):
        # An Enum that is also a str/int is kept as its plain value.
        return value.value if isinstance(value, Enum) else value
    if isinstance(value, Enum):
        return to_jsonable(value.value)
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        # A string keeps every digit: money must not pass through a binary float.
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted((to_jsonable(v) for v in value), key=repr)
    if is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(asdict(value))
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def json_dumps(value: Any) -> str:
    """The encoder the store's engines use for JSON columns."""
    return json.dumps(value, default=_json_default, separators=(",", ":"), sort_keys=True)


def _json_default(value: Any) -> Any:
    return to_jsonable(value)


def _iso(value: datetime) -> str:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"naive datetime {value.isoformat()} cannot be encoded; pass UTC-aware")
    return value.astimezone(UTC).isoformat()


def parse_time(text: str) -> datetime:
    """A stored ISO 8601 time as tz-aware UTC (the store writes UTC: a naive text is UTC)."""
    return parse_aware(text, "stored time", assume_utc=True).astimezone(UTC)


def option_from_json(obj: Mapping[str, Any]) -> OfferingOption:
    return OfferingOption(
        offering_key=str(obj["offering_key"]),
        gpus=int(obj["gpus"]),
        price_usd_hour=float(obj["price_usd_hour"]),
        nodes=int(obj["nodes"]),
        expected_cost_usd=float(obj["expected_cost_usd"]),
        rejected=obj.get("rejected"),
    )


def decision_to_json(decision: Decision) -> dict[str, Any]:
    """The whole Decision as the stored JSON document: the domain's encoding (the one the CLI's
    ``--json`` and the API serve, ``decision_to_jsonable``) with the document ``format``."""
    return {"format": DECISION_FORMAT, **decision_to_jsonable(decision)}


def decision_fingerprint(decision: Decision) -> str:
    """What two decisions share when one repeats the other (see ``Decision.same_as``): a hash
    the store compares in SQL instead of decoding the last record."""
    key = list(decision.repeat_key())
    return hashlib.sha256(json.dumps(key, separators=(",", ":")).encode()).hexdigest()


def decision_from_json(obj: Mapping[str, Any]) -> Decision:
    """The Decision a ``decision_to_json`` document describes.

    ``inputs`` comes back as the JSON dict that was stored: values that were not JSON types (times,
    tuples) come back in their JSON form.
    """
    fmt = obj.get("format", DECISION_FORMAT)
    if fmt != DECISION_FORMAT:
        raise ValueError(f"decision document format {fmt} is not supported "
                         f"(want {DECISION_FORMAT})")
    at = parse_time(obj["at"])
    last_seen = parse_time(obj["last_seen_at"]) if obj.get("last_seen_at") else at
    return Decision(
        id=str(obj["id"]),
        policy=str(obj["policy"]),
        at=at,
        rule=Rule(obj["rule"]),
        summary=str(obj["summary"]),
        inputs=dict(obj.get("inputs") or {}),
        options=tuple(option_from_json(o) for o in obj.get("options") or ()),
        chosen=obj.get("chosen"),
        held_back_by=tuple(obj.get("held_back_by") or ()),
        actions=tuple(obj.get("actions") or ()),
        repeats=int(obj.get("repeats") or 1),
        last_seen_at=last_seen if last_seen != at else None,
    )
