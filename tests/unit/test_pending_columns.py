"""The columnar pending queue (:mod:`orchestrator.domain.pending`) and the planner on it.

* :class:`PendingColumns` built from query rows holds the same jobs as the rows say (times to the
  microsecond, naive times as UTC, unknown durations), counts them per (project, priority, width)
  as a Counter would, and reads as a sequence of those jobs; a selection of its rows is the
  columns of those rows alone.
* The planner decides the same, to the repr of the plan, on a queue handed as a tuple of jobs and
  on the same queue handed as columns built from rows, with and without ``trigger.wait_slo``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, timedelta

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.domain.pending import JobsView, PendingColumns, columns_of, from_us, to_us
from orchestrator.domain.snapshot import OnPremRelease
from orchestrator.planner import demand as demand_module
from orchestrator.planner import plan
from orchestrator.planner.demand import scheduling_order
from tests.builders import T0, make_job, make_node, make_policy, make_snapshot, offering_spec

M = timedelta(minutes=1)
PROJECTS = [{"name": "a", "priority": 2, "max_burst_gpus": 24}, {"name": "b", "priority": 0}]

JOB_SPECS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(0, 2), st.integers(0, 90),
              st.integers(1, 12), st.sampled_from([None, 600.0, 3600.0, 0.0, 1e3 / 3]),
              st.integers(0, 999_999)),
    max_size=60)


def _jobs(specs) -> tuple:
    # Ids not in submit order; microseconds in the submit times; ties when ``us`` repeats.
    return tuple(dataclasses.replace(
        make_job(f"j{(i * 7) % 61}", project=p, priority=prio, gpus=g,
                 submitted_at=T0 - age * M + timedelta(microseconds=us % 3), duration_s=d),
        user=[None, "ann", "bob"][us % 3], checkpoint_s=[None, 300.0][us % 2])
        for i, (p, prio, age, g, d, us) in enumerate(specs))


def _rows(jobs, naive: bool = False) -> list[tuple]:
    return [(j.id, j.project, j.gpus, j.priority,
             j.submitted_at.replace(tzinfo=None) if naive else j.submitted_at, j.duration_s,
             j.checkpoint_s, j.user, j.dataset_gb) for j in jobs]


def _as_columns(snapshot):
    queues = {name: dataclasses.replace(q, pending=PendingColumns.from_rows(name, _rows(q.pending)))
              for name, q in snapshot.queues.items()}
    return dataclasses.replace(snapshot, queues=queues)


@settings(max_examples=40, deadline=None)
@given(JOB_SPECS, st.booleans())
def test_columns_from_rows_hold_the_jobs_the_rows_say(specs, naive) -> None:
    jobs = _jobs(specs)
    columns = PendingColumns.from_rows("gpu", _rows(jobs, naive))
    assert len(columns) == len(jobs)
    assert tuple(columns) == jobs  # submitted_at back as UTC, to the microsecond
    assert columns.submitted_us.tolist() == [to_us(j.submitted_at) for j in jobs]
    assert all(from_us(to_us(j.submitted_at)) == j.submitted_at for j in jobs)
    assert columns.counts() == dict(Counter((j.project, j.priority, j.gpus) for j in jobs))
    assert list(columns.counts()) == list(dict.fromkeys((j.project, j.priority, j.gpus)
                                                        for j in jobs))
    assert columns.total_gpus == sum(j.gpus for j in jobs)
    assert columns[1:3] == jobs[1:3]
    assert columns_of(jobs, "gpu") == columns and columns_of(columns) is columns
    view = JobsView(columns, np.arange(len(jobs))[::-1])
    assert tuple(view) == jobs[::-1]


@settings(max_examples=40, deadline=None)
@given(JOB_SPECS, st.data())
def test_selected_rows_are_the_columns_of_those_rows_alone(specs, data) -> None:
    # What the queue read does per pool and when dispatch starts jobs: a selection must be
    # field for field the columns built from the selected rows (codes renumbered too).
    jobs = _jobs(specs)
    columns = PendingColumns.from_rows("gpu", _rows(jobs))
    rows = data.draw(st.lists(st.integers(0, max(len(jobs) - 1, 0)), unique=True,
                              max_size=len(jobs)))
    picked = columns.select(np.array(rows, dtype=np.int64), "other")
    alone = PendingColumns.from_rows("other", _rows([jobs[i] for i in rows]))
    for name in ("ids", "projects", "users", "pool"):
        assert getattr(picked, name) == getattr(alone, name), name
    for name in ("project", "gpus", "priority", "submitted_us", "duration_s", "checkpoint_s",
                 "user", "dataset_gb"):
        assert np.array_equal(getattr(picked, name), getattr(alone, name), equal_nan=True), name
    assert picked.counts() == alone.counts() and tuple(picked) == tuple(alone)


def test_a_naive_time_is_utc_and_unknown_durations_are_nan() -> None:
    at = T0.astimezone(UTC).replace(tzinfo=None, microsecond=123457)
    columns = PendingColumns.from_rows("gpu", [("j1", "a", 2, None, at, None)],
                                       fields=("id", "project", "gpus", "priority", "submitted_at",
                                               "duration_s"))
    assert columns[0].submitted_at == at.replace(tzinfo=UTC)
    assert columns[0].priority == 0 and columns[0].duration_s is None
    assert np.isnan(columns.duration_s[0])
    assert columns.duration_s.flags.writeable is False


def test_rows_in_a_query_s_own_column_order() -> None:
    # The built-in queue's read: its own column order, extra columns ignored.
    fields = ("id", "project", "pool", "gpus", "priority", "duration_s", "submitted_at",
              "attempts", "version", "user")
    columns = PendingColumns.from_rows("gpu", [("j1", None, "gpu", 4, 1, None, T0, 0, 3, "ann")],
                                       fields=fields)
    job = columns[0]
    assert (job.id, job.project, job.gpus, job.priority, job.user) == ("j1", None, 4, 1, "ann")
    assert job.submitted_at == T0 and job.duration_s is None and job.checkpoint_s is None
    with pytest.raises(ValueError, match="lack the field"):
        PendingColumns.from_rows("gpu", [("j1", 4)], fields=("id", "gpus"))
    with pytest.raises(ValueError, match="have 2 fields, not 4"):
        PendingColumns.from_rows("gpu", [("j1", "a")], fields=("id", "project", "gpus",
                                                                "submitted_at"))


def test_columns_of_another_length_are_refused() -> None:
    with pytest.raises(ValueError, match="pending column 'gpus' has shape"):
        PendingColumns("gpu", ["j1", "j2"], ["a"], [0, 0], [1], [0, 0], [0, 0], [0.0, 0.0])
    with pytest.raises(ValueError, match="code outside 'projects'"):
        PendingColumns("gpu", ["j1"], ["a"], [3], [1], [0], [0], [0.0])


@settings(max_examples=50, deadline=None)
@given(JOB_SPECS, st.lists(st.integers(0, 8), max_size=4), st.lists(st.integers(0, 8), max_size=4),
       st.booleans(), st.sampled_from([1, 5, 60]), st.integers(0, 3))
def test_the_plan_is_the_same_on_columns_as_on_jobs(specs, onprem, busy, wait, max_nodes,
                                                    default) -> None:
    policy = make_policy(
        projects=PROJECTS, default_project_priority=default,
        trigger={"sustained_for": "0s", **({"wait_slo": "30m"} if wait else {})},
        limits={"max_nodes": max_nodes},
        offerings=[offering_spec("g8", gpus=8, price=10), offering_spec("g4", gpus=4, price=4)])
    jobs = _jobs(specs)
    nodes = [make_node(f"n{i}", gpus_busy=b) for i, b in enumerate(busy)]
    snapshot = make_snapshot(jobs, nodes=nodes, onprem_free=onprem, onprem_total=sum(onprem) + 16)
    queue = snapshot.queues["gpu"]
    releases = tuple(OnPremRelease(2, T0 + k * 7 * M) for k in range(3))
    snapshot = dataclasses.replace(
        snapshot, queues={"gpu": dataclasses.replace(queue, onprem_releases=releases)})
    demand_module._ORDER_MEMO.clear()
    on_jobs = plan(snapshot, [policy], T0)
    on_columns = plan(_as_columns(snapshot), [policy], T0)
    assert repr(on_columns) == repr(on_jobs)
    assert scheduling_order(PendingColumns.from_jobs(jobs), policy) == scheduling_order(jobs, policy)
