"""Values kept from one round to the next while what they were made from is unchanged.

A tick makes the same objects every time from rows that mostly did not change: at 10,000 live
nodes the snapshot's ``Node``\\ s (each converted from its row and built field by field) were a
tenth of a tick on PostgreSQL. :class:`Kept` remembers, per key, what a value was made from (its
*source*: the driver's row, and whatever else went into it) and the value, and hands the value
back in the next round when the new source is equal to the old one. Equality is the only test:
a row whose version, state or any other column changed is a different source, and its value is
made again. So only values that are pure functions of their source may be kept, and only
immutable ones (frozen dataclasses): a kept value is shared by every round that reuses it.

Each :meth:`Kept.round` starts a new round: what the finished round used or made is what the new
one can reuse; the rest is dropped (a node gone from the rows is forgotten a round later). An
interrupted round only loses reuse, never correctness: every hit is checked against its source.
This module imports nothing of burst's.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class Kept(Generic[V]):
    """Values by key, each with the source it was made from (see the module docstring)."""

    __slots__ = ("_last", "_this")

    def __init__(self) -> None:
        self._last: dict[Hashable, tuple[Any, V]] = {}
        self._this: dict[Hashable, tuple[Any, V]] = {}

    def round(self) -> None:
        """Start a new round: the values the last one used or made may be reused in this one."""
        self._last, self._this = self._this, {}

    def get(self, key: Hashable, source: Any) -> V | None:
        """The value kept for ``key`` if it was made from a source equal to ``source`` (then kept
        for the next round too); None otherwise."""
        hit = self._last.get(key)
        if hit is None or (hit[0] is not source and hit[0] != source):
            return None
        self._this[key] = hit
        return hit[1]

    def put(self, key: Hashable, source: Any, value: V) -> V:
        """Keep ``value``, made from ``source``, for the next round; returns ``value``."""
        self._this[key] = (source, value)
        return value

    def __len__(self) -> int:
        """How many values the current round used or made so far."""
        return len(self._this)


__all__ = ["Kept"]
