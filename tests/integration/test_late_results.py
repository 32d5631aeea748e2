"""Late job reports on real stores (SQLite and PostgreSQL): a run that finished while the
controller thought its node gone is recorded from the node's report, never run again.

Issue 13, finding 1: over 60 random controller kills, 8 of 42 jobs whose run had finished with exit
0 were recorded ``node-gone`` and executed a second time. The node's report carries the run's
attempt (the run id ``jobs/next`` handed out), so the controller can tell a late report of a run
from a stale one.
"""

from __future__ import annotations

from datetime import timedelta

from orchestrator.domain import NodeState
from orchestrator.domain.jobs import JobState
from orchestrator.sources.builtin import BuiltinQueue
from orchestrator.store import Store
from orchestrator.store.jobruns import builtin_run_key
from tests.builders import POOL, T0, make_policy
from tests.integration.test_job_runs import ready

M = timedelta(minutes=1)


def setup(store: Store):
    queue = BuiltinQueue(store, [make_policy()])
    for node in ("a", "b"):
        ready(store, node, T0, project="nlp")
    job = store.submit_job("nlp", POOL, 8, 0, None, "train.sh", T0)
    started = queue.claim_for_node(store.get_node("a"), 8, T0 + M)
    assert started is not None and started.attempts == 1
    return queue, job.id


def runs(store: Store, job_id: str) -> list[tuple[str, str | None]]:
    return [(r.node_id, r.outcome) for r in store.job_runs(job_id=job_id)]


def test_a_run_that_finished_during_an_outage_is_recorded_done_not_rerun(store: Store) -> None:
    # The finding-1 case: the run ends with exit 0 while the controller is away; the restarted
    # controller declares node a gone and puts the job back; then a's report arrives.
    queue, job_id = setup(store)
    assert queue.release_node("a", T0 + 10 * M) == 1
    assert store.get_job(job_id).state is JobState.PENDING
    assert queue.finish(job_id, "a", "done", 0, T0 + 11 * M, attempt=1)
    job = store.get_job(job_id)
    assert (job.state, job.exit_code, job.node_id, job.attempts) == (JobState.DONE, 0, "a", 1)
    assert queue.claim_for_node(store.get_node("b"), 8, T0 + 12 * M) is None  # not run again
    assert runs(store, job_id) == [("a", "done")]
    # The same report again (the node resends until it sees the acknowledgement): no change.
    assert not queue.finish(job_id, "a", "done", 0, T0 + 13 * M, attempt=1)
    assert store.get_job(job_id).version == job.version


def test_a_late_done_ends_the_job_even_when_another_attempt_has_started(store: Store) -> None:
    queue, job_id = setup(store)
    queue.release_node("a", T0 + 10 * M)
    again = queue.claim_for_node(store.get_node("b"), 8, T0 + 11 * M)
    assert again is not None and again.attempts == 2
    assert queue.finish(job_id, "a", "done", 0, T0 + 12 * M, attempt=1)
    job = store.get_job(job_id)
    assert (job.state, job.node_id) == (JobState.DONE, "a")
    assert runs(store, job_id) == [("a", "done"), ("b", "superseded")]
    # b's own report of the superseded attempt is acknowledged and changes nothing.
    assert not queue.finish(job_id, "b", "done", 0, T0 + 20 * M, attempt=2)
    assert not queue.finish(job_id, "b", "handed-back", None, T0 + 20 * M, attempt=2)
    assert store.get_job(job_id).state is JobState.DONE


def test_stale_reports_change_nothing(store: Store) -> None:
    queue, job_id = setup(store)
    queue.release_node("a", T0 + 10 * M)
    # A hand-back of a run the job has left: it is pending already.
    assert not queue.finish(job_id, "a", "handed-back", None, T0 + 11 * M, attempt=1)
    # A report naming a run that was not on that node, or an attempt never handed out.
    assert not queue.finish(job_id, "b", "done", 0, T0 + 11 * M, attempt=1)
    assert not queue.finish(job_id, "a", "done", 0, T0 + 11 * M, attempt=7)
    assert store.get_job(job_id).state is JobState.PENDING
    queue.claim_for_node(store.get_node("b"), 8, T0 + 12 * M)
    # A failure of the old run does not stop the new attempt, which may well succeed.
    assert not queue.finish(job_id, "a", "failed", 1, T0 + 13 * M, attempt=1)
    job = store.get_job(job_id)
    assert (job.state, job.node_id, job.attempts) == (JobState.RUNNING, "b", 2)
    assert queue.finish(job_id, "b", "done", 0, T0 + 14 * M, attempt=2)
    assert runs(store, job_id) == [("a", "node-gone"), ("b", "done")]


def test_a_late_failure_is_recorded_when_no_other_attempt_started(store: Store) -> None:
    queue, job_id = setup(store)
    queue.release_node("a", T0 + 10 * M)
    assert queue.finish(job_id, "a", "failed", 3, T0 + 11 * M, attempt=1)
    job = store.get_job(job_id)
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
    assert runs(store, job_id) == [("a", "failed")]


def test_reports_without_an_attempt_keep_the_old_rule(store: Store) -> None:
    # An agent of an older release sends no attempt: only a report of the job's current run counts.
    queue, job_id = setup(store)
    queue.release_node("a", T0 + 10 * M)
    assert not queue.finish(job_id, "a", "done", 0, T0 + 11 * M)
    assert store.get_job(job_id).state is JobState.PENDING
    assert store.get_node("a").state is NodeState.READY
    assert queue.claim_for_node(store.get_node("a"), 8, T0 + 12 * M) is not None
    assert queue.finish(job_id, "a", "done", 0, T0 + 13 * M)
    assert store.job_run(builtin_run_key(job_id, 2)).outcome == "done"


def test_a_hand_out_the_node_never_received_is_offered_again(store: Store) -> None:
    """Chaos finding: the controller recorded a claim (job running on node a) and was killed
    before answering ``jobs/next``. The agent asks again when idle with nothing to report: it gets
    the same run (same attempt) instead of a new job, and the run is not lost."""
    queue, job_id = setup(store)
    other = store.submit_job("nlp", POOL, 8, 0, None, "other.sh", T0)
    again = queue.claim_for_node(store.get_node("a"), 8, T0 + 2 * M)
    assert again is not None and (again.id, again.attempts) == (job_id, 1)
    assert store.get_job(other.id).state is JobState.PENDING
    # A node with GPUs still busy is not idle: it gets other work, never its running job again.
    assert queue.claim_for_node(store.get_node("a"), 4, T0 + 2 * M) is None
    assert queue.finish(job_id, "a", "done", 0, T0 + 3 * M, attempt=1)
    assert runs(store, job_id) == [("a", "done")]
    assert queue.claim_for_node(store.get_node("a"), 8, T0 + 4 * M).id == other.id
