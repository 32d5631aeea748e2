"""Values kept from one round to the next while their source is unchanged (orchestrator.kept):
a value is handed back only for a source equal to the one it was made from, and forgotten after
a round that did not use it."""

from __future__ import annotations

from datetime import UTC, datetime

from orchestrator.kept import Kept

ROW = ("n1", "ready", datetime(2026, 12, 5, tzinfo=UTC), 3)  # id, state, since, version


def test_a_value_comes_back_for_an_equal_source_only() -> None:
    kept: Kept[str] = Kept()
    assert kept.get("n1", ROW) is None  # nothing kept yet
    value = kept.put("n1", ROW, "node n1 v3")
    kept.round()
    # an equal source, not the same object (each tick reads its rows afresh)
    assert kept.get("n1", tuple(list(ROW))) is value
    kept.round()
    changed = ROW[:3] + (4,)  # the same node at its next version
    assert kept.get("n1", changed) is None
    assert kept.get("n1", ("n1", "draining") + ROW[2:]) is None
    assert kept.get("n2", ROW) is None  # another key


def test_a_value_lasts_while_each_round_uses_it_and_goes_after_one_that_does_not() -> None:
    kept: Kept[str] = Kept()
    kept.put("a", 1, "A")
    kept.put("b", 1, "B")
    kept.round()
    assert kept.get("a", 1) == "A"  # used: kept for the next round too
    assert len(kept) == 1
    kept.round()
    assert kept.get("a", 1) == "A"
    assert kept.get("b", 1) is None  # the round before did not use it: forgotten


def test_a_miss_does_not_keep_the_old_value_and_a_new_one_replaces_it() -> None:
    kept: Kept[str] = Kept()
    kept.put("a", 1, "A1")
    kept.round()
    assert kept.get("a", 2) is None
    kept.put("a", 2, "A2")
    kept.round()
    assert kept.get("a", 1) is None  # the old source's value is gone
    assert kept.get("a", 2) == "A2"


def test_an_unfinished_round_loses_reuse_only() -> None:
    kept: Kept[str] = Kept()
    kept.put("a", 1, "A")
    kept.put("b", 1, "B")
    kept.round()
    assert kept.get("a", 1) == "A"  # the round stops here (an error mid-snapshot)
    kept.round()
    assert kept.get("a", 1) == "A"
    assert kept.get("b", 1) is None  # made again, never stale
