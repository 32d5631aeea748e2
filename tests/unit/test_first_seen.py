"""The record's tallies read values in order of first appearance (orchestrator.planner.demand
.first_seen; orchestrator.domain.pending._first_seen_counts, the owners): both equal the plain
walk of every entry, whether the values all appear early or some first appear late."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.pending import _first_seen_counts
from orchestrator.planner.demand import first_seen


def _reference(values: list[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return counts


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=60), st.integers(0, 3000), st.integers(0, 9000),
       st.booleans())
def test_first_seen_is_the_order_of_first_appearance(head, repeat, huge, late):
    # A long run of one value first (the early read finds only it), then the rest.
    values = [7] * repeat + head + ([huge] if late else [])
    array = np.array(values, dtype=np.int64)
    expected = list(_reference(values))
    for distinct in range(len(expected) + 1):
        assert first_seen(array, distinct) == expected[:distinct]
    assert _first_seen_counts(array, max(values, default=0) + 1) == list(
        _reference(values).items())
