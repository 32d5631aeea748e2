"""The run history (``job_runs``) on real stores (SQLite and PostgreSQL), and the cost ledger that
reads it: built-in jobs open and close runs with their own state changes; the Slurm source records
the runs it observes on burst nodes from recorded ``squeue --json`` output (a real Slurm 22.05
listing, see ``tests/unit/test_slurm_source.py``); every write is idempotent; a job handed back
from one node and finished on another is billed on both; Slurm work on a burst node is billed to
its account and no longer shows as idle; the migration keeps the runs jobs already had.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from orchestrator.costs.ledger import roll_up
from orchestrator.domain import NodeState
from orchestrator.domain.costs import CostKind, CostLine
from orchestrator.domain.jobs import JobState
from orchestrator.sources.builtin import BuiltinQueue
from orchestrator.sources.slurm import SlurmQueue, observed_runs, slurm_scope
from orchestrator.store import Store
from orchestrator.store.jobruns import JobRun, RunOutcome, RunSource, slurm_run_key
from orchestrator.store.tables import UtcDateTime
from tests.builders import POOL, T0, make_policy
from tests.integration.test_ledger import launch, step, terminate
from tests.unit.test_slurm_source import slurm_policy

S = NodeState
H = timedelta(hours=1)
M = timedelta(minutes=1)
DATA = Path(__file__).parent.parent / "unit" / "data"
SQUEUE = json.loads((DATA / "slurm-squeue-22.05.json").read_text())["jobs"]
SINFO = json.loads((DATA / "slurm-sinfo-22.05.json").read_text())["nodes"]


def ready(store: Store, node_id: str, at: datetime, **launched: Any) -> None:
    launch(store, node_id, at, **launched)
    for state in (S.BOOTING, S.JOINING, S.READY):
        step(store, node_id, state, at)


def lines(store: Store, node_id: str, kind: CostKind) -> list[CostLine]:
    return [x for x in store.ledger_lines(node_id) if x.kind is kind]


def usage(store: Store, node_id: str) -> dict[str, tuple[float, int]]:
    """Per job: GPU-seconds and micro-dollars of its usage lines on the node."""
    out: dict[str, tuple[float, int]] = {}
    for x in lines(store, node_id, CostKind.USAGE):
        gpu_s, cost = out.get(x.job_id or "", (0.0, 0))
        out[x.job_id or ""] = (gpu_s + x.gpu_seconds, cost + x.cost_micros)
    return out


# -- the built-in queue ---------------------------------------------------------------------------


def test_job_handed_back_from_one_node_and_finished_on_another_is_billed_on_both(
        store: Store) -> None:
    queue = BuiltinQueue(store, [make_policy()])
    ready(store, "a", T0, project="nlp")
    ready(store, "b", T0, project="nlp")
    job = store.submit_job("nlp", POOL, 8, 0, None, None, T0)

    started = queue.claim_for_node(store.get_node("a"), 8, T0 + 10 * M)
    assert started is not None and started.id == job.id
    assert queue.finish(job.id, "a", "handed-back", None, T0 + 40 * M)  # a drain gave it back
    assert store.get_job(job.id).state is JobState.PENDING
    assert queue.claim_for_node(store.get_node("b"), 8, T0 + 45 * M) is not None
    assert queue.finish(job.id, "b", "done", 0, T0 + 75 * M)
    terminate(store, "a", T0 + H)
    terminate(store, "b", T0 + 2 * H)

    runs = store.job_runs(job_id=job.id)
    assert [(r.node_id, r.started_at, r.ended_at, r.outcome, r.source) for r in runs] == [
        ("a", T0 + 10 * M, T0 + 40 * M, RunOutcome.HANDED_BACK, RunSource.BUILTIN),
        ("b", T0 + 45 * M, T0 + 75 * M, "done", RunSource.BUILTIN)]

    roll_up(store, [make_policy()], T0 + 3 * H)
    # $36/h for 8 GPUs: a's 30 minutes of the job cost $18 and the other half hour is idle; b
    # ran it 15 minutes in each of two buckets.
    assert usage(store, "a") == {job.id: (8 * 30 * 60, 18_000_000)}
    assert sum(x.cost_micros for x in lines(store, "a", CostKind.IDLE)) == 18_000_000
    assert usage(store, "b") == {job.id: (8 * 30 * 60, 18_000_000)}
    assert [x.period_start for x in lines(store, "b", CostKind.USAGE)] == [T0, T0 + H]


def test_a_job_rerun_on_the_same_node_in_one_hour_is_one_usage_line(store: Store) -> None:
    ready(store, "a", T0)
    job = store.submit_job("nlp", POOL, 4, 0, None, None, T0)
    first = store.start_job(job, placement="burst", node_id="a", at=T0 + 5 * M)
    back = store.requeue_job(first, T0 + 15 * M)
    again = store.start_job(back, placement="burst", node_id="a", at=T0 + 20 * M)
    store.finish_job(again, state=JobState.FAILED, exit_code=3, at=T0 + 30 * M)
    assert [(r.started_at, r.ended_at, r.outcome) for r in store.job_runs(node_id="a")] == [
        (T0 + 5 * M, T0 + 15 * M, RunOutcome.REQUEUED), (T0 + 20 * M, T0 + 30 * M, "failed")]
    roll_up(store, [], T0 + 40 * M)
    assert usage(store, "a")[job.id][0] == 4 * 20 * 60  # both runs, one line (the key is unique)


def test_jobs_of_a_node_that_is_gone_end_their_runs_and_onprem_jobs_have_none(
        store: Store) -> None:
    queue = BuiltinQueue(store, [make_policy(pool={"onprem": {"nodes": 1}})])
    ready(store, "a", T0)
    onprem = store.submit_job("cv", POOL, 8, 0, 3600.0, None, T0)
    assert [j.id for j in queue.dispatch_onprem(T0)] == [onprem.id]  # on-prem first
    burst = store.submit_job("nlp", POOL, 8, 0, None, None, T0)
    assert queue.claim_for_node(store.get_node("a"), 8, T0 + M).id == burst.id
    assert queue.release_node("a", T0 + 20 * M) == 1
    assert [(r.job_id, r.ended_at, r.outcome) for r in store.job_runs()] == [
        (burst.id, T0 + 20 * M, RunOutcome.NODE_GONE)]


def test_builtin_runs_are_opened_and_closed_once(store: Store) -> None:
    queue = BuiltinQueue(store, [make_policy()])
    ready(store, "a", T0)
    job = store.submit_job("nlp", POOL, 2, 0, None, None, T0)
    started = store.start_job(job, placement="burst", node_id="a", at=T0 + M)
    assert started is not None
    assert store.start_job(job, placement="burst", node_id="a", at=T0 + 2 * M) is None  # lost
    assert queue.finish(job.id, "a", "done", 0, T0 + 5 * M)
    assert not queue.finish(job.id, "a", "done", 0, T0 + 6 * M)  # a re-delivered report
    assert store.finish_job(started, state=JobState.DONE, exit_code=0, at=T0 + 7 * M) is None
    assert [(r.run_key, r.started_at, r.ended_at) for r in store.job_runs()] == [
        (f"builtin:{job.id}:1", T0 + M, T0 + 5 * M)]


# -- Slurm -----------------------------------------------------------------------------------------


class RecordedSlurm:
    """The Slurm CLI as the queue source calls it, answering with a recorded listing."""

    def __init__(self, jobs: list[dict[str, Any]]):
        self.listing = jobs

    def jobs(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self.listing)

    def nodes(self) -> list[dict[str, Any]]:
        return copy.deepcopy(SINFO)


def epoch(job_id: int, field: str = "start_time") -> datetime:
    return datetime.fromtimestamp(next(j for j in SQUEUE if j["job_id"] == job_id)[field], UTC)


def test_slurm_jobs_on_a_burst_node_are_billed_and_shrink_its_idle(store: Store) -> None:
    policy = slurm_policy()
    scope = slurm_scope(policy)
    start = epoch(11)  # jobs 11 and 12 run on burst-1 (2 GPUs each) since then
    launched = start - 30 * M  # before job 9, which ran 5 s on burst-1 and was cancelled
    for node_id in ("b1", "twin"):  # twin: the same node, running nothing
        launch(store, node_id, launched, gpus=4, price=3.6, project="research",
               policy=policy.name)
    store.seed_fabric_slots(scope, ["burst-1", "burst-2"])
    assert store.claim_fabric_slot(scope, "b1", launched).name == "burst-1"
    slurm = RecordedSlurm(SQUEUE)
    queue = SlurmQueue(store, [policy], cli_factory=lambda conf: slurm)

    now = start + 10 * M
    pools = queue.observe(now)
    assert pools["gpu"].running_burst_jobs == 2  # the queue view is unchanged
    runs = {r.job_id: r for r in store.job_runs(source=RunSource.SLURM)}
    assert sorted(runs) == ["11", "12", "9"]  # 13 runs on-prem; the others never started here
    assert (runs["11"].node_id, runs["11"].gpus, runs["11"].project, runs["11"].user) == (
        "b1", 2, None, "root")  # no account nor QOS: no project, not the user's name
    assert (runs["11"].started_at, runs["11"].ended_at, runs["11"].outcome) == (start, None, None)
    assert (runs["9"].gpus, runs["9"].ended_at, runs["9"].outcome) == (
        4, epoch(9, "end_time"), "cancelled")
    assert queue.record_runs({None: slurm.jobs()}, now) == (0, 0)  # observed twice: once

    roll_up(store, [policy], now)
    assert usage(store, "twin") == {}
    b1 = usage(store, "b1")
    assert {job: gpu_s for job, (gpu_s, _) in b1.items()} == {
        "9": 4 * 5, "11": 2 * 600, "12": 2 * 600}
    idle = sum(x.cost_micros for x in lines(store, "b1", CostKind.IDLE))
    twin_idle = sum(x.cost_micros for x in lines(store, "twin", CostKind.IDLE))
    assert idle + sum(cost for _, cost in b1.values()) == twin_idle
    assert sum(x.gpu_seconds for x in lines(store, "b1", CostKind.IDLE)) == pytest.approx(
        4 * (now - launched).total_seconds() - (4 * 5 + 2 * 600 + 2 * 600))

    # Job 11 is gone from the listing; job 12 was requeued and started again.
    requeued = start + 20 * M
    listing = [j for j in copy.deepcopy(SQUEUE) if j["job_id"] != 11]
    next(j for j in listing if j["job_id"] == 12)["start_time"] = int(requeued.timestamp())
    slurm.listing = listing
    later = start + 25 * M
    queue.observe(later)
    got = [(r.job_id, r.started_at, r.ended_at, r.outcome)
           for r in store.job_runs(source=RunSource.SLURM)]
    assert got == [("9", epoch(9), epoch(9, "end_time"), "cancelled"),
                   ("11", start, later, RunOutcome.GONE),
                   ("12", start, requeued, RunOutcome.GONE),
                   ("12", requeued, None, None)]
    assert queue.record_runs({None: slurm.jobs()}, later) == (0, 0)


def test_observed_runs_split_multi_node_jobs_per_node() -> None:
    scope = "slurm:test"
    members = {"burst-1": "b1", "burst-2": "b2"}
    base = {"job_state": "RUNNING", "nodes": "burst-[1-2],onprem-1", "start_time": 1796018189,
            "account": "physics", "node_count": 3}
    per_node = observed_runs([{**base, "job_id": 1, "tres_per_node": "gres:gpu:4"}], scope,
                             members)
    assert [(r.node_id, r.gpus, r.project) for r in per_node] == [
        ("b1", 4, "physics"), ("b2", 4, "physics")]
    detail = observed_runs([{**base, "job_id": 2, "tres_per_job": "gres:gpu:5",
                             "gres_detail": ["gpu:3(IDX:0-2)", "gpu:1(IDX:0)", "gpu:1"]}],
                           scope, members)
    assert [(r.node_id, r.gpus) for r in detail] == [("b1", 3), ("b2", 1)]
    spread = observed_runs([{**base, "job_id": 3, "tres_per_job": "gres:gpu:5"}], scope, members)
    assert [r.gpus for r in spread] == [2, 2]  # 5 GPUs over 3 nodes: at most 2 each
    cpu_only = observed_runs([{**base, "job_id": 4}], scope, members)
    assert cpu_only == []
    assert per_node[0].run_key == slurm_run_key(scope, "1", "b1", per_node[0].started_at)


def test_observations_of_one_cluster_leave_other_clusters_runs_alone(store: Store) -> None:
    def run(scope: str, job: str, started: datetime) -> JobRun:
        return JobRun(slurm_run_key(scope, job, "n", started), job, "p", "n", 1, started,
                      source=RunSource.SLURM)

    mine, other = run("slurm:a", "1", T0), run("slurm:b", "1", T0)
    assert store.observe_slurm_runs("slurm:a", [mine], T0 + M) == (1, 0)
    assert store.observe_slurm_runs("slurm:b", [other], T0 + M) == (1, 0)
    assert store.observe_slurm_runs("slurm:a", [], T0 + 2 * M) == (0, 1)
    assert [(r.run_key, r.ended_at) for r in store.job_runs()] == [
        (mine.run_key, T0 + 2 * M), (other.run_key, None)]
    # A late observation from before a run started does not close it.
    late = run("slurm:b", "2", T0 + 5 * M)
    assert store.observe_slurm_runs("slurm:b", [other, late], T0 + 5 * M) == (1, 0)
    assert store.observe_slurm_runs("slurm:b", [other], T0 + 4 * M) == (0, 0)
    with pytest.raises(ValueError, match="not a Slurm run of scope slurm:a"):
        store.observe_slurm_runs("slurm:a", [other], T0)


# -- migration -------------------------------------------------------------------------------------


def test_upgrade_keeps_the_runs_jobs_already_had(store: Store) -> None:
    store.downgrade("0005")
    rows = [
        ("j-done", "burst", "a", "done", T0, T0 + H, 1),
        ("j-live", "burst", "b", "running", T0 + M, None, 2),
        ("j-prem", "onprem", "onprem:gpu:0", "done", T0, T0 + H, 1),
        ("j-wait", None, None, "pending", None, None, 1),  # requeued: its run was never kept
    ]
    jobs = sa.table("jobs", *(sa.column(c) for c in (
        "id", "project", "pool", "gpus", "priority", "state", "placement", "node_id",
        "attempts", "version")), *(sa.column(c, UtcDateTime()) for c in (
        "submitted_at", "started_at", "finished_at")))
    with store.engine.begin() as conn:
        for job_id, placement, node, state, started, finished, attempts in rows:
            conn.execute(sa.insert(jobs).values(
                id=job_id, project="nlp", pool=POOL, gpus=4, priority=0, state=state,
                placement=placement, node_id=node, submitted_at=T0, started_at=started,
                finished_at=finished,
                attempts=attempts, version=1))
    store.upgrade()
    assert [(r.run_key, r.node_id, r.started_at, r.ended_at, r.outcome)
            for r in store.job_runs()] == [
        ("builtin:j-done:1", "a", T0, T0 + H, "done"),
        ("builtin:j-live:2", "b", T0 + M, None, None)]
    # The running job's finish closes the run the migration copied.
    live = store.get_job("j-live")
    assert store.finish_job(live, state=JobState.DONE, exit_code=0, at=T0 + 2 * H)
    assert store.job_runs(job_id="j-live")[0].ended_at == T0 + 2 * H
