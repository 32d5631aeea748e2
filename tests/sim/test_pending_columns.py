"""The world's pending queue as columns (orchestrator.sim.pendingcols): selected from the columns
of every job, it equals, field for field and Job for Job, the columns built from the pending
jobs' own records, also after a job's record changed (a requeue reports what is left to run)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.pending import JobsView, PendingColumns
from orchestrator.planner.order import ordered
from orchestrator.sim.pendingcols import QueueColumns
from orchestrator.sim.simjob import SimJob
from orchestrator.sim.world import World
from tests.sim.helpers import sim_policy, trace

FIELDS = ("ids", "projects", "project", "gpus", "priority", "submitted_us", "duration_s",
          "checkpoint_s", "users", "user", "dataset_gb", "pool")


def _same(made: PendingColumns, jobs: list[SimJob]) -> None:
    built = PendingColumns.from_jobs([j.domain for j in jobs], "gpu")
    assert list(ordered(made, sim_policy()).order) == list(ordered(built, sim_policy()).order)
    for name in FIELDS:
        a, b = getattr(made, name), getattr(built, name)
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b, equal_nan=True), name
        else:
            assert a == b, name
    assert all(made.job(i) is job.domain for i, job in enumerate(jobs))


def test_any_selection_equals_the_columns_of_its_jobs():
    jobs = trace(("a", 0, 600, 8, "p1"), ("b", 5, 60, 2, "p2", 3), ("c", 5, 120, 1, None),
                 ("d", 9, 30, 4, "p2"), ("e", 12, 999, 8, "p1", 1))
    world = World(sim_policy(), jobs.jobs, 1, 8, store=None)  # (no store read here)
    columns = QueueColumns("gpu", world.jobs)
    for picked in ([0], [3, 1], [4, 2, 0, 1], [1, 2, 3, 4, 0]):
        chosen = [world.jobs[i] for i in picked]
        _same(columns.pending({j.index: j for j in chosen}), chosen)
    assert len(columns.pending({})) == 0


def test_a_changed_record_is_read_again():
    jobs = trace(("a", 0, 600, 8), ("b", 5, 60, 2), ("c", 5, 120, 1))
    world = World(sim_policy(), jobs.jobs, 1, 8, store=None)
    columns = QueueColumns("gpu", world.jobs)
    chosen = {j.index: j for j in world.jobs}
    _same(columns.pending(chosen), list(chosen.values()))
    world.jobs[1].domain = dataclasses.replace(world.jobs[1].domain, duration_s=7.0)
    columns.changed()
    made = columns.pending(chosen)
    assert made.duration_s[1] == 7.0
    _same(made, list(chosen.values()))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4), max_size=8), st.lists(st.integers(0, 7), max_size=8),
       st.booleans())
def test_a_selection_of_a_selection_reads_its_ids_when_asked(first, second, gather_first):
    # A selection's ids are gathered when first read (PendingColumns.ids), or read one by one
    # (id_of, a view's ids()): the same ids, also for a selection made from a selection.
    jobs = trace(("a", 0, 600, 8, "p1"), ("b", 5, 60, 2, "p2", 3), ("c", 5, 120, 1, None),
                 ("d", 9, 30, 4, "p2"), ("e", 12, 999, 8, "p1", 1))
    world = World(sim_policy(), jobs.jobs, 1, 8, store=None)
    columns = QueueColumns("gpu", world.jobs)
    chosen = [world.jobs[i] for i in dict.fromkeys(first)]
    made = columns.pending({j.index: j for j in chosen})
    if gather_first:
        assert made.ids == tuple(j.trace.job_id for j in chosen)
    rows = [i for i in second if i < len(chosen)]
    again = made.select(rows)
    expected = tuple(chosen[i].trace.job_id for i in rows)
    assert [again.id_of(i) for i in range(len(rows))] == list(expected)
    assert JobsView(again, list(range(len(rows)))[::-1]).ids() == list(expected)[::-1]
    assert again.ids == expected
    assert [again.job(i).id for i in range(len(rows))] == list(expected)
