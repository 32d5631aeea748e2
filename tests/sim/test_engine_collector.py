"""A replay sets the garbage collector up for itself (orchestrator.sim.engine: young passes
rarer, nothing frozen) and puts it back after, also after a failure and where runs
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


def test_garbage_left_before_a_run_is_not_frozen_for_the_run():
    # A cycle no one holds any more, left uncollected (as between the passes of high
    # thresholds): a run freezes nothing, so the collector can still free it during the run.
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
            assert gc.get_freeze_count() == 0
            gc.collect()
            assert gone() is None
    finally:
        if enabled:
            gc.enable()
