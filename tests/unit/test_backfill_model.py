"""The shared on-prem scheduler model (orchestrator/planner/backfill.py): Slurm's main scheduler
and backfill pass on whole nodes. Checked against real Slurm by bench/slurm_backfill.py and
tests/integration/test_slurm_backfill_model.py (long)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.planner.backfill import (
    BackfillConfig,
    NodeSpace,
    PendingJob,
    backfill_pass,
    earliest_window,
    fifo_pass,
)


def space(nodes: int, per_node: int, running: list[tuple[int, float, int]], now: float = 0.0):
    free = [per_node] * nodes
    for node, _, gpus in running:
        free[node] -= gpus
    return NodeSpace([per_node] * nodes, free, running, now)


def test_earliest_start_is_when_a_node_frees_enough_gpus():
    s = space(2, 4, [(0, 100.0, 4), (1, 50.0, 2)])
    assert s.earliest(2, 10.0) == (0.0, ((1, 2),))  # node 1 has 2 free now
    assert s.earliest(3, 10.0) == (50.0, ((1, 3),))
    assert s.earliest(8, 10.0) == (100.0, ((0, 4), (1, 4)))  # whole nodes, both free at 100


def test_a_reservation_keeps_a_long_job_off_its_nodes_but_not_a_short_one():
    s = space(2, 4, [(0, 100.0, 4), (1, 50.0, 2)])
    jobs = [PendingJob("wide", 8, 300.0), PendingJob("long", 2, 200.0),
            PendingJob("short", 2, 90.0)]
    result = backfill_pass(s, jobs, BackfillConfig())
    assert result.planned["wide"] == 100.0
    assert [key for key, _ in result.started] == ["short"]  # ends by 100: delays nobody
    assert result.planned["long"] == 400.0  # after the wide job


def test_easy_reserves_for_the_first_blocked_job_only():
    jobs = [PendingJob("wide", 8, 300.0), PendingJob("mid", 4, 300.0),
            PendingJob("small", 2, 200.0)]
    slurm = backfill_pass(space(2, 4, [(0, 100.0, 4), (1, 50.0, 2)]), jobs, BackfillConfig())
    easy = backfill_pass(space(2, 4, [(0, 100.0, 4), (1, 50.0, 2)]), jobs,
                         BackfillConfig(reservations=1))
    assert slurm.started == [] and easy.started == []  # small would delay wide either way
    assert slurm.planned == {"wide": 100.0, "mid": 400.0, "small": 400.0}
    assert easy.planned == {"wide": 100.0}  # the others are only tried for a start now


def test_depth_limits_what_a_pass_examines():
    jobs = [PendingJob("wide", 8, 300.0)] + [PendingJob(f"s{i}", 1, 10.0) for i in range(3)]
    result = backfill_pass(space(2, 4, [(0, 100.0, 4)]), jobs, BackfillConfig(max_job_test=2))
    assert result.tested == 2 and [k for k, _ in result.started] == ["s0"]


def test_fifo_stops_at_the_first_job_that_does_not_fit_and_skips_impossible_ones():
    s = space(2, 4, [(0, 100.0, 3)])
    jobs = [PendingJob("huge", 16, 1.0), PendingJob("a", 1, 10.0), PendingJob("b", 4, 10.0),
            PendingJob("c", 4, 10.0), PendingJob("d", 1, 10.0)]
    assert [k for k, _ in fifo_pass(s, jobs)] == ["a", "b"]


def test_best_fit_picks_the_node_with_least_free_room():
    s = space(3, 4, [(0, 100.0, 1), (1, 100.0, 3)])
    assert s.fits_now(1, 10.0) == ((1, 1),)
    assert s.fits_now(4, 10.0) == ((2, 4),)


runs = st.lists(st.tuples(st.integers(0, 3), st.integers(1, 500), st.integers(1, 4)),
                max_size=8)
queue = st.lists(st.tuples(st.integers(1, 12), st.integers(1, 400)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(runs, queue, st.integers(0, 12))
def test_a_pass_never_overcommits_a_node_nor_delays_a_reservation(running, pending, reserve):
    per_node = 4
    used = [0] * 4
    kept = []
    for node, end, gpus in running:
        if used[node] + gpus <= per_node:
            used[node] += gpus
            kept.append((node, float(end), gpus))
    jobs = [PendingJob(i, gpus, float(limit)) for i, (gpus, limit) in enumerate(pending)]
    s = space(4, per_node, kept)
    result = backfill_pass(s, jobs, BackfillConfig(reservations=reserve), plan_all=True)
    # The space after the pass holds every start and reservation: no node is ever short.
    for frees in s.frees:
        assert min(frees) >= 0
    for frees, times in zip(s.frees, s.times):
        assert times == sorted(times) and frees[-1] == per_node
    started = {key for key, _ in result.started}
    for key, alloc in result.started:
        job = jobs[key]
        assert sum(g for _, g in alloc) >= job.gpus
        assert len(alloc) == 1 or all(g == per_node for _, g in alloc)
    # Every job no wider than the cluster either starts now or has a planned start later.
    for job in jobs:
        if job.gpus <= 4 * per_node:
            assert (job.key in started) != (job.key in result.planned)
            if job.key in result.planned:
                assert 0 < result.planned[job.key] < math.inf


def _loaded(s: NodeSpace) -> NodeSpace:
    """``s`` with every node's steps read (the wait model's space reads a node's when first
    asked: ``NodeSpace.steps``)."""
    for node in range(len(s.sizes)):
        s.steps(node)
    return s


def _reference_earliest(s: NodeSpace, gpus: int, limit: float):
    """What ``NodeSpace.earliest`` answered before it read each node only up to the best start
    found so far and kept the whole-node windows: every node's first window, the best by
    (start, room, node); a wide job by the sweep over every node's windows."""
    if gpus > s.node_size:
        size, need = s.node_size, math.ceil(gpus / s.node_size)
        if sum(1 for x in s.sizes if x == size) < need:
            return None
        events = []
        for node, node_size in enumerate(s.sizes):
            if node_size != size:
                continue
            times, frees = s.times[node], s.frees[node]
            k, n = 0, len(times)
            while k < n:
                if frees[k] != size:
                    k += 1
                    continue
                j = k
                while j + 1 < n and frees[j + 1] == size:
                    j += 1
                opens, closes = times[k], (times[j + 1] if j + 1 < n else math.inf)
                if closes - limit >= opens:
                    events += [(opens, 0, node), (closes - limit, 1, node)]
                k = j + 1
        events.sort()
        open_nodes: set[int] = set()
        for when, kind, node in events:
            if kind == 0:
                open_nodes.add(node)
                if len(open_nodes) >= need:
                    return when, tuple((i, s.sizes[i]) for i in sorted(open_nodes)[:need])
            else:
                open_nodes.discard(node)
        return None
    best = None
    for node, size in enumerate(s.sizes):
        if size < gpus:
            continue
        start = earliest_window(s.times[node], s.frees[node], gpus, limit)
        if start is None:
            continue
        room = s.frees[node][s.times[node].index(start)]
        if best is None or (start, room, node) < best:
            best = (start, room, node)
    return None if best is None else (best[0], ((best[2], gpus),))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([4, 4, 4, 8]), min_size=1, max_size=8),
       st.lists(st.tuples(st.integers(0, 7), st.sampled_from([0.0, 10.0, 25.0, 40.0, 90.0]),
                          st.integers(1, 4)), max_size=14),
       st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16]),
                          st.sampled_from([5.0, 10.0, 30.0, 60.0, math.inf])), max_size=12))
def test_earliest_answers_as_the_plain_scan_of_every_node(sizes, running, jobs):
    # A cluster of mixed node sizes; jobs placed one after the other at their earliest start
    # (as the wait model reserves), each answer checked against the plain scan, copies included.
    free = list(sizes)
    ends = []
    for node, end, gpus in running:
        node %= len(sizes)
        gpus = min(gpus, free[node])
        if gpus:
            free[node] -= gpus
            ends.append((node, end, gpus))
    s = NodeSpace(sizes, free, ends, 0.0)
    for gpus, limit in jobs:
        expected = _reference_earliest(s, gpus, limit)
        assert s.earliest(gpus, limit) == expected
        copy = s.copy()
        if expected is not None:
            s.hold(expected[1], expected[0], limit)
        assert copy.earliest(gpus, limit) == expected  # (a copy is not changed by holds on s)
        before = ([list(t) for t in s.times], [list(f) for f in s.frees])
        other = copy.copy()
        if expected is not None:  # nor is s by holds on a copy of its copy
            other.hold(expected[1], expected[0], limit)
        assert (s.times, s.frees) == before
        for wide in (8, 16):  # the copies' kept windows follow their own holds
            assert other.earliest(wide, limit) == _reference_earliest(other, wide, limit)
            assert copy.earliest(wide, limit) == _reference_earliest(copy, wide, limit)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([-30, 0, 10, 25, 40, 90]),
                          st.integers(1, 4)), max_size=14),
       st.lists(st.tuples(st.sampled_from([1, 2, 3, 4, 8, 12, 16]),
                          st.sampled_from([5.0, 10.0, 30.0, 60.0, math.inf])), max_size=12),
       st.lists(st.booleans(), max_size=12))
def test_the_wait_models_space_built_with_its_windows_answers_as_the_plain_scan(
        running, jobs, copies):
    # The node wait model builds its space from the running jobs' releases with every widest
    # node's whole windows known up front (read from the steps when a hold first changes a
    # node): each answer, after holds and on copies, equals the plain scan.
    from datetime import UTC, datetime, timedelta

    from orchestrator.domain.snapshot import OnPremRelease, OnPremState, PoolQueue
    from orchestrator.planner import node_shape
    from orchestrator.planner.wait_nodes import _Space

    now = datetime(2026, 1, 1, tzinfo=UTC)
    free = [4] * 6
    releases = []
    for node, end, gpus in running:
        gpus = min(gpus, free[node])
        if gpus:
            free[node] -= gpus
            releases.append(OnPremRelease(gpus, now + timedelta(seconds=end), node))
    node_shape._last[0] = None
    queue = PoolQueue("p", OnPremState(24, sum(free), tuple(free)), (),
                      onprem_releases=tuple(releases))
    s = _Space(queue, (), now).fresh()
    for (gpus, limit), take_copy in zip(jobs, copies + [False] * len(jobs)):
        if take_copy:
            s = s.copy()
        expected = _reference_earliest(_loaded(s.copy()), gpus, limit)  # (s reads its own)
        assert s.earliest(gpus, limit) == expected
        if expected is not None:
            s.hold(expected[1], expected[0], limit)
