"""A replay sets the garbage collector up for itself (orchestrator.sim.engine: what exists when it
starts frozen, young passes rarer) and puts it back after, also after a failure and where runs
overlap (threads): the last run to end restores it."""

from __future__ import annotations

import gc

import pytest

from orchestrator.sim import engine


def test_the_collector_is_put_back_after_nested_runs_and_failures():
    before = gc.get_threshold()
    with engine._collector_for_a_run():
        assert gc.get_threshold()[0] == max(before[0], engine.YOUNG_GC)
        with pytest.raises(RuntimeError):
            with engine._collector_for_a_run():
                raise RuntimeError("a run failed")
        assert gc.get_threshold()[0] == max(before[0], engine.YOUNG_GC)  # (one still runs)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_garbage_left_before_a_run_is_collected_not_frozen():
    # A cycle no one holds any more, left uncollected (the collector off, as between the passes
    # of high thresholds): the run must not freeze it for its whole length.
    import weakref

    class Cyclic:
        pass

    enabled = gc.isenabled()
    gc.disable()
    try:
        first, second = Cyclic(), Cyclic()
        first.other, second.other = second, first
        gone = weakref.ref(first)
        del first, second
        assert gone() is not None  # still there: only the collector frees a cycle
        with engine._collector_for_a_run():
            assert gone() is None
    finally:
        if enabled:
            gc.enable()
