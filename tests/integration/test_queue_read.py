"""One read of the built-in queue per tick: what on-prem dispatch leaves in its read is what a
fresh read of the store says, so observe may plan from it; the grouped figures `burst status`
shows agree with the jobs; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from orchestrator.domain.jobs import JobState, Placement
from orchestrator.sources.builtin import BuiltinQueue
from orchestrator.store import Store
from orchestrator.store import tables as T
from orchestrator.store.queueread import RunningJob
from tests.builders import POOL, T0, make_policy
from tests.integration.test_job_runs import ready

M = timedelta(minutes=1)


def _fill(store: Store) -> BuiltinQueue:
    """Two on-prem nodes of 8 GPUs (one job still running there, one whose time is up) and a
    queue of mixed widths and priorities, some of another pool."""
    queue = BuiltinQueue(store, [make_policy(pool={"onprem": {"nodes": 2, "gpus_per_node": 8}})])
    long = store.submit_job("cv", POOL, 8, 0, 7200.0, None, T0)
    short = store.submit_job("cv", POOL, 4, 0, 600.0, None, T0 + M)
    assert {j.id for j in queue.dispatch_onprem(T0 + M)} == {long.id, short.id}
    for i, (gpus, priority) in enumerate([(4, 0), (2, 5), (8, 0), (1, 0), (16, 0), (2, 5)]):
        store.submit_job(f"p{i % 3}", POOL, gpus, priority, 3600.0, f"run {i}", T0 + (i + 2) * M)
    store.submit_job("other", "elsewhere", 2, 0, None, None, T0, user="ana")
    return queue


def _rows(read) -> dict:
    """Per pool: every pending job with its version and attempts, as the read holds them."""
    return {pool: (tuple(rows.columns), rows.version.tolist(), rows.attempts.tolist())
            for pool, rows in read.pending.items()}


def test_dispatch_leaves_in_its_read_what_a_fresh_read_finds(store: Store) -> None:
    queue = _fill(store)
    now = T0 + 20 * M  # the short on-prem job is over: its 4 GPUs and the 4 still free serve
    read = queue.dispatch(now)
    assert read.started and all(j.state is JobState.RUNNING and j.placement is Placement.ONPREM
                                for j in read.started)
    assert {j.command for j in read.started} <= {f"run {i}" for i in range(6)}  # full records
    fresh = store.queue_read(now)
    assert _rows(read) == _rows(fresh)
    assert sorted(j.id for j in read.running) == sorted(j.id for j in fresh.running)
    assert queue.observe(now, read) == queue.observe(now)
    ids = [n for n in ("a", "b")]
    assert queue.node_usage(ids, read) == queue.node_usage(ids)
    assert queue.burst_runs(read) == queue.burst_runs()


def test_the_read_is_in_service_order_with_aware_times(store: Store) -> None:
    _fill(store)
    read = store.queue_read(T0)
    expected: dict[str, list[str]] = {}
    for record in store.jobs(states=[JobState.PENDING]):
        expected.setdefault(record.pool, []).append(record.id)
    assert {pool: list(rows.columns.ids) for pool, rows in read.pending.items()} == expected
    assert len(expected) == 2 and all(rows.columns.pool == pool
                                      for pool, rows in read.pending.items())
    jobs = [j for pool in read.pending_jobs().values() for j in pool]
    assert all(j.submitted_at.utcoffset() == timedelta(0) for j in jobs)
    records = {r.id: r for r in store.jobs(states=[JobState.PENDING])}
    assert {job_id: (int(rows.version[i]), int(rows.attempts[i]))
            for rows in read.pending.values() for i, job_id in enumerate(rows.columns.ids)} == {
        r.id: (r.version, r.attempts) for r in records.values()}
    assert {j.id: j for j in jobs} == {r.id: r.to_domain() for r in
                                       store.jobs(states=[JobState.PENDING])}


def test_grouped_figures_agree_with_the_jobs(store: Store) -> None:
    queue = _fill(store)
    ready(store, "a", T0)
    job = store.submit_job("nlp", POOL, 2, 0, None, None, T0)
    assert queue.claim_for_node(store.get_node("a"), 8, T0 + 2 * M).id == job.id
    [summary] = queue.summary()
    [pool] = queue.observe(T0 + 2 * M).values()
    assert (summary.pending_jobs, summary.pending_gpus) == (
        len(pool.pending), sum(j.gpus for j in pool.pending))
    assert (summary.running_onprem_jobs, summary.running_burst_jobs) == (
        pool.running_onprem_jobs, pool.running_burst_jobs)
    assert summary.running_burst_jobs == 1
    assert summary.onprem_free_gpus == pool.onprem.free_gpus


def test_a_node_running_nothing_knows_when_it_last_finished(store: Store) -> None:
    queue = BuiltinQueue(store, [make_policy()])
    ready(store, "a", T0)
    ready(store, "b", T0)
    for at in (T0 + M, T0 + 3 * M):
        job = store.submit_job("nlp", POOL, 2, 0, None, None, at)
        started = queue.claim_for_node(store.get_node("a"), 8, at)
        assert started is not None and started.id == job.id
        assert queue.finish(job.id, "a", "done", 0, at + M)
    usage = queue.node_usage(["a", "b"])
    assert usage["a"].last_busy_at == T0 + 4 * M and usage["a"].running_jobs == 0
    assert usage["b"].last_busy_at is None


def test_the_driver_reads_agree_with_the_typed_records(store: Store) -> None:
    """Nodes and running jobs read straight through the driver (``rawread``) are what the typed
    reads give: aware UTC times, enums, booleans, every field."""
    queue = _fill(store)
    ready(store, "a", T0, project="nlp")
    ready(store, "b", T0)
    node = store.get_node("b")
    assert node is not None
    store.update_node(node, released=True, idle_since=T0 + M, gpu_utilisation_percent=12.5,
                      low_utilisation_since=T0 + 2 * M, drain_deadline=T0 + 3 * M)
    job = store.submit_job("nlp", POOL, 2, 0, None, None, T0)
    assert queue.claim_for_node(store.get_node("a"), 8, T0 + 2 * M).id == job.id
    nodes = store.nodes()
    assert nodes == [store.get_node(n.id) for n in nodes] and len(nodes) == 2
    assert nodes[1].released is True and nodes[1].idle_since.utcoffset() == timedelta(0)
    read = store.queue_read(T0 + 2 * M)
    records = sorted(store.jobs(states=[JobState.RUNNING]), key=lambda r: r.id)
    assert read.running == [RunningJob.of(r) for r in records]
    assert {j.placement for j in read.running} == {Placement.ONPREM, Placement.BURST}
    assert all(j.started_at.utcoffset() == timedelta(0) for j in read.running)


def test_the_pending_read_needs_no_sort_and_its_index_migrates_both_ways(store: Store) -> None:
    """Migration 0018's index serves the read's filter and order: SQLite reads it without a
    sort of the queue; downgrading to 0017 and back leaves the schema as the models say."""
    _fill(store)
    if store.dialect == "sqlite":
        c = T.jobs.c
        query = (sa.select(c.id).where(c.state == JobState.PENDING.value)
                 .order_by(c.priority.desc(), c.submitted_at, c.id))
        with store.engine.connect() as conn:
            sql = str(query.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
            steps = " ".join(str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql))
        assert "ix_jobs_pending_order" in steps and "TEMP B-TREE" not in steps
    before = _rows(store.queue_read(T0))
    store.downgrade("0017")
    store.upgrade()
    indexes = {i["name"] for i in sa.inspect(store.engine).get_indexes("jobs")}
    assert "ix_jobs_pending_order" in indexes and "ix_jobs_state_pool_submitted_at" not in indexes
    assert _rows(store.queue_read(T0)) == before


def test_a_nodes_claim_reads_the_fitting_jobs_in_the_planners_order(store: Store) -> None:
    """``pending_that_fit``, page after page, is the planner's scheduling order of the pool's
    pending jobs narrowed to those that fit: project priorities from the policy (unlisted
    projects at the default), then job priority, then age, then id (ties in submit time)."""
    import random

    from orchestrator.planner.order import scheduling_order

    policy = make_policy(projects=[{"name": "p0", "priority": 2}, {"name": "p1", "priority": 0}],
                         default_project_priority=1)
    rng = random.Random(5)
    for i in range(60):
        at = T0 + rng.randrange(20) * M  # ties in submit time, broken by id
        store.submit_job(f"p{rng.randrange(3)}", POOL, rng.choice([1, 2, 4, 8]),
                         rng.randrange(2), None, None, at)
    store.submit_job("p0", "elsewhere", 1, 0, None, None, T0)
    pending = [r.to_domain() for r in store.jobs(states=[JobState.PENDING], pool=POOL)]
    priorities = {p.name: p.priority for p in policy.projects}
    for max_gpus, page in ((4, 7), (8, 100), (1, 3)):
        got, offset = [], 0
        while chunk := store.pending_that_fit(POOL, max_gpus, priorities,
                                              policy.default_project_priority,
                                              offset=offset, limit=page):
            got += [r.id for r in chunk]
            offset += len(chunk)
        assert got == [j.id for j in scheduling_order(pending, policy) if j.gpus <= max_gpus]
    assert store.pending_that_fit(POOL, 8, {}, 0, limit=500) == store.jobs(
        states=[JobState.PENDING], pool=POOL)


def test_submit_times_to_the_microsecond_read_as_submitted(store: Store) -> None:
    """The read's submit times (PostgreSQL: whole microseconds worked out by the server) are
    the submitted ones to the microsecond, far in the future and just after the epoch too."""
    from datetime import UTC, datetime

    moments = [T0 + timedelta(microseconds=123_457), T0 + timedelta(seconds=59, microseconds=999_999),
               datetime(2099, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
               datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC)]
    for i, at in enumerate(moments):
        store.submit_job("cv", POOL, 1 + i, 0, 60.0, None, at)
    jobs = [j for pool in store.queue_read(T0).pending_jobs().values() for j in pool]
    assert sorted(j.submitted_at for j in jobs) == sorted(moments)
    assert {j.id: j.submitted_at for j in jobs} == {
        r.id: r.submitted_at for r in store.jobs(states=[JobState.PENDING])}
