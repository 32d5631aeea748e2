"""A seeded mutator of burst's inputs, for the input fuzz tests (tests/property/test_input_fuzz.py).

Two kinds of mutation, both drawn from one ``random.Random(seed)`` so every case is reproducible
from its seed and index:

* **structural**: parse a valid document (a policy, a snapshot, an API body), then replace, drop
  or add a value at a random path with one of :data:`NASTY` values (wrong types, huge or negative
  numbers, naive or absurd times, shell and template text, control characters, deep nesting);
* **textual**: mangle the serialized bytes (flip, insert or delete bytes, splice in bytes that are
  not UTF-8, NUL, deep brackets, 5,000-digit numbers, truncate).
"""

from __future__ import annotations

import copy
import random
from datetime import UTC, datetime, timedelta
from typing import Any

# Values a hostile or broken input carries instead of the right one.
NASTY: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**63, -(2**63), 4_000_000_000_000, 10**30, 1.5, -0.0,
    1e308, -1e308, 1e-320, "", "1", "true", "-1", "1e400", "NaN", " ", "x" * 5000, "${HOME}",
    "$(reboot)", "`id`", "../../etc/passwd", "a\x00b", "\x00", "a\x1b[31mred", "\u202eevil",
    "\ud7ff\ue000", "名前", "[/bold]", "[red]x", "{x}", "%s%n", "\\", "\n", "2026-11-30T02:50:00",
    "2026-11-30T02:50:00Z", "0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59Z",
    "2026-13-45T99:99:99Z", "30s", "0s", "99999999d", "1h30m", "-5m", [], {}, [1, 2, 3],
    {"a": 1}, [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
    "spot", "on-demand", "ready", "failed", "local", "aws", "gpu", "research", "default",
]

_BAD_BYTES = [b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\x01", b"\x7f", b"\xef\xbb\xbf",
              b"\r", b"\t", b"\\", b'"', b"'", b":", b"-", b"{", b"[", b"&a", b"*a", b"!!python/object"]


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into a JSON-like value (dict keys and list indexes), the root included."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, prefix + (index,))
    return found


class Mutator:
    """Seeded mutations of documents and of their text."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def nasty(self) -> Any:
        return copy.deepcopy(self.rng.choice(NASTY))

    def similar(self, value: Any) -> Any:
        """A value of the same type, often at an edge: the document stays valid more often, so
        the code past validation (the planner, the routes) meets odd but well-formed input."""
        rng = self.rng
        if isinstance(value, bool):
            return not value
        if isinstance(value, int):
            return rng.choice([0, 1, 2, 3, 7, 8, 63, 64, 65, 4096, 10_000, value * 2, value - 1,
                               rng.randint(0, 1000)])
        if isinstance(value, float):
            return rng.choice([0.0, 1e-9, 0.5, 9999.99, value * 3, value / 7])
        if isinstance(value, str) and len(value) >= 19 and value[4:5] == "-" and "T" in value:
            moment = datetime(2026, 11, 30, 3, tzinfo=UTC) + timedelta(
                seconds=rng.choice([-1, 0, 1, 59, 3600, -86_400 * 365, 10**9, -(10**9),
                                    rng.randint(-10**6, 10**6)]))
            return moment.isoformat().replace("+00:00", rng.choice(["Z", "+00:00"]))
        if isinstance(value, str):
            return rng.choice(["gpu", "research", "default", "local", "x", value + "-2", value.upper()])
        return value

    def data(self, document: Any, rounds: int | None = None) -> Any:
        """``document`` with 1-3 structural mutations."""
        doc = copy.deepcopy(document)
        for _ in range(rounds or self.rng.randint(1, 3)):
            doc = self._one(doc)
        return doc

    def _one(self, doc: Any) -> Any:
        path = self.rng.choice(paths(doc))
        if not path:
            return self.nasty() if self.rng.random() < 0.1 else doc
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        roll = self.rng.random()
        if roll < 0.3:
            parent[key] = self.similar(parent[key])
        elif roll < 0.6:
            parent[key] = self.nasty()
        elif roll < 0.75 and isinstance(parent, dict):
            del parent[key]
        elif roll < 0.85 and isinstance(parent, dict):
            parent[self.rng.choice(["extra", "${HOME}", "a\x00", "", "gpus", "1"])] = self.nasty()
        elif roll < 0.95 and isinstance(parent, list):
            parent.insert(key, copy.deepcopy(parent[key]))  # a duplicate entry
        else:
            parent[key] = [parent[key]] if self.rng.random() < 0.5 else {"x": parent[key]}
        return doc

    def text(self, data: bytes) -> bytes:
        """``data`` with 1-3 byte-level mutations."""
        out = bytearray(data)
        for _ in range(self.rng.randint(1, 3)):
            at = self.rng.randint(0, len(out))
            roll = self.rng.random()
            if roll < 0.3:
                out[at:at] = self.rng.choice(_BAD_BYTES)
            elif roll < 0.45 and out:
                out[min(at, len(out) - 1)] = self.rng.randint(0, 255)
            elif roll < 0.6:
                del out[at:at + self.rng.randint(1, 40)]
            elif roll < 0.7:
                depth = self.rng.choice([40, 1000, 5000])
                out[at:at] = b"[" * depth + b"]" * depth
            elif roll < 0.8:
                out[at:at] = b"9" * self.rng.choice([41, 4301, 5000])
            elif roll < 0.9:
                span = bytes(out[at:at + self.rng.randint(1, 80)])
                out[at:at] = span * self.rng.randint(2, 4)
            else:
                del out[at:]
        return bytes(out)
