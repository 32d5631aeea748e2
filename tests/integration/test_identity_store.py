"""Users on jobs, job runs and cost lines, on real stores (SQLite and PostgreSQL).

A built-in job keeps the user it was submitted with; its runs on burst nodes and its usage lines
carry that user beside its project, as do the on-prem lines of work that ran on-prem. A Slurm run
of no project (neither account nor QOS) is recorded with project None and its user, never under
the user's name. Rows written before the ``0009`` migration keep NULL (not known) and a job of no
project survives a downgrade as the ledger's "-" (no owner).
"""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from orchestrator.costs.ledger import roll_up
from orchestrator.domain.costs import CostKind
from orchestrator.sources.builtin import BuiltinQueue
from orchestrator.store import Store
from orchestrator.store.jobruns import JobRun, RunSource, slurm_run_key
from orchestrator.store.tables import UtcDateTime
from tests.builders import POOL, T0, make_policy
from tests.integration.test_job_runs import ready
from tests.integration.test_ledger import onprem_policy, terminate

H = timedelta(hours=1)
M = timedelta(minutes=1)


def test_a_jobs_user_reaches_its_runs_and_its_usage_lines(store: Store) -> None:
    policy = onprem_policy()
    queue = BuiltinQueue(store, [make_policy()])
    ready(store, "a", T0, project="nlp")
    job = store.submit_job("nlp", POOL, 4, 0, None, None, T0, user="ada")
    other = store.submit_job("nlp", POOL, 4, 0, None, None, T0)  # no user given: not known
    assert store.get_job(job.id).user == "ada" and store.get_job(other.id).user is None
    assert store.get_job(job.id).to_domain().user == "ada"

    claimed = {queue.claim_for_node(store.get_node("a"), free, T0 + 10 * M).id
               for free in (8, 4)}
    assert claimed == {job.id, other.id}
    assert queue.finish(job.id, "a", "done", 0, T0 + 40 * M)
    assert queue.finish(other.id, "a", "done", 0, T0 + 40 * M)
    onprem = store.submit_job("nlp", POOL, 2, 0, None, None, T0, user="bob")
    assert store.start_job(onprem, placement="onprem", node_id=None, at=T0 + 5 * M)
    terminate(store, "a", T0 + H)

    assert {r.job_id: (r.project, r.user) for r in store.job_runs(node_id="a")} == {
        job.id: ("nlp", "ada"), other.id: ("nlp", None)}
    roll_up(store, [policy], T0 + 2 * H)
    lines = store.ledger_lines()
    usage = {x.job_id: (x.project, x.user) for x in lines if x.kind is CostKind.USAGE}
    assert usage == {job.id: ("nlp", "ada"), other.id: ("nlp", None)}
    assert {(x.project, x.user) for x in lines if x.kind is CostKind.ONPREM} == {("nlp", "bob")}
    assert all(x.user is None for x in lines if x.kind is CostKind.IDLE)


def test_a_slurm_run_of_no_project_is_billed_to_no_project_not_to_its_user(store: Store) -> None:
    policy = make_policy()
    ready(store, "b", T0, project=None)
    run = JobRun(run_key=slurm_run_key("slurm:x", "7", "b", T0 + M), job_id="7", project=None,
                 user="carol", node_id="b", gpus=8, started_at=T0 + M, ended_at=T0 + 31 * M,
                 outcome="completed", source=RunSource.SLURM)
    assert store.observe_slurm_runs("slurm:x", [run], T0 + H) == (1, 0)
    assert store.job_run(run.run_key) == run
    terminate(store, "b", T0 + H)
    roll_up(store, [policy], T0 + 2 * H)
    usage = [x for x in store.ledger_lines("b") if x.kind is CostKind.USAGE]
    assert [(x.job_id, x.project, x.user) for x in usage] == [("7", None, "carol")]
    # Grouped by project, it is its own (null) bucket, after the named ones; by user, carol's.
    sums = store.cost_sums(["project", "user", "kind"])
    assert [s.keys for s in sums] == [("-", None, "idle"), (None, "carol", "usage")]
    assert [s.keys for s in store.cost_sums(["project"], users=["carol"])] == [(None,)]
    assert store.cost_sums(["project"], users=["nobody"]) == []


def test_rows_from_before_users_keep_null_and_no_project_survives_a_downgrade(
        store: Store) -> None:
    store.downgrade("0008")
    jobs = sa.table("jobs", *(sa.column(c) for c in (
        "id", "project", "pool", "gpus", "priority", "state", "attempts", "version")),
        sa.column("submitted_at", UtcDateTime()))
    with store.engine.begin() as conn:
        conn.execute(sa.insert(jobs).values(id="j-old", project="nlp", pool=POOL, gpus=1,
                                            priority=0, state="pending", attempts=0, version=0,
                                            submitted_at=T0))
    store.upgrade()
    assert store.get_job("j-old").user is None

    run = JobRun(run_key=slurm_run_key("slurm:x", "8", "n", T0), job_id="8", project=None,
                 user="dan", node_id="n", gpus=1, started_at=T0, source=RunSource.SLURM)
    assert store.observe_slurm_runs("slurm:x", [run], T0) == (1, 0)
    store.downgrade("0008")
    with store.engine.connect() as conn:
        projects = conn.execute(sa.text("SELECT project FROM job_runs")).scalars().all()
    assert projects == ["-"]
    store.upgrade()
