"""The built-in queue's jobs in the store: submit, claim, finish, requeue, cancel.

Each state change is compare-and-set on the record's version *and* its expected state, so two
schedulers claiming the same pending job cannot both start it: the loser gets ``None`` and
re-reads. Order of service is priority (highest first), then submission time, then id.

A job's runs on burst nodes are kept in ``job_runs`` (see :mod:`orchestrator.store.jobruns`):
starting a job on a burst node opens its run, and finishing or requeueing it closes that run, in
the same transaction as the job's compare-and-set, so the run history and the jobs never disagree.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from orchestrator.domain.jobs import JobState, Placement
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.jobruns import (
    JobRun,
    RunOutcome,
    amend_presumed_end,
    builtin_run_key,
    close_run,
    open_run,
)
from orchestrator.store.records import JobRecord

JOB_ID_PREFIX = "j-"
_FINAL_STATES = frozenset({JobState.DONE, JobState.FAILED})


class JobIdConflict(ValueError):
    """An idempotent submission reused a job id for a different job."""


class JobExists(Exception):  # noqa: N818 - an outcome, not a failure
    """An idempotent submission repeated: the job queued the first time is ``job``."""

    def __init__(self, job: JobRecord):
        super().__init__(f"job {job.id} exists")
        self.job = job


@dataclass(frozen=True, slots=True)
class Withdrawal:
    """What ``withdraw_job`` found or did: the job as it now is, and whether this call
    cancelled it (False: cancelled before, finished, or unknown when ``job`` is None)."""

    job: JobRecord | None
    changed: bool


def new_job_id() -> str:
    return JOB_ID_PREFIX + secrets.token_hex(5)


def job_from_row(row: sa.Row[Any]) -> JobRecord:
    m = row._mapping
    return JobRecord(
        id=m["id"],
        project=m["project"],
        pool=m["pool"],
        gpus=m["gpus"],
        priority=m["priority"],
        duration_s=m["duration_s"],
        command=m["command"],
        state=JobState(m["state"]),
        placement=Placement(m["placement"]) if m["placement"] is not None else None,
        node_id=m["node_id"],
        submitted_at=m["submitted_at"],
        started_at=m["started_at"],
        finished_at=m["finished_at"],
        exit_code=m["exit_code"],
        attempts=m["attempts"],
        version=m["version"],
        user=m["user"],
    )


class JobQueue(StoreBase):
    """Job methods of the Store."""

    def submit_job(
        self,
        project: str,
        pool: str,
        gpus: int,
        priority: int,
        duration_s: float | None,
        command: str | None,
        submitted_at: datetime,
        job_id: str | None = None,
        user: str | None = None,
    ) -> JobRecord:
        """Queue a new job (PENDING) and return its record with a fresh id.

        With ``job_id`` (a client's idempotency key made into an id) the submission is
        idempotent: if that job exists already with the same fields it is returned as it is now
        (``JobExists``'s job), and with other fields :class:`JobIdConflict` is raised.
        ``user``: who submits it (None: not known).
        """
        if gpus < 1:
            raise ValueError(f"a job needs at least one GPU, got {gpus}")
        require_aware(submitted_at, "submitted_at")
        if job_id is not None:
            record = JobRecord(
                id=job_id, project=project, pool=pool, gpus=gpus, priority=priority,
                duration_s=duration_s, command=command, state=JobState.PENDING, placement=None,
                node_id=None, submitted_at=submitted_at, started_at=None, finished_at=None,
                exit_code=None, attempts=0, version=0, user=user,
            )
            with self._write() as conn:
                stmt = self._insert(T.jobs).values(**job_values(record)).on_conflict_do_nothing()
                if conn.execute(stmt).rowcount == 1:
                    return record
                row = conn.execute(sa.select(T.jobs).where(T.jobs.c.id == job_id)).first()
            existing = job_from_row(row)
            same = (existing.project, existing.pool, existing.gpus, existing.priority,
                    existing.duration_s, existing.command, existing.user) == (
                    project, pool, gpus, priority, duration_s, command, user)
            if not same:
                raise JobIdConflict(f"job {job_id} exists with other fields")
            raise JobExists(existing)
        with self._write() as conn:
            # 40 random bits make a collision unlikely, not impossible: retry on the rare clash
            # rather than fail the submission.
            for _ in range(8):
                record = JobRecord(
                    id=new_job_id(), project=project, pool=pool, gpus=gpus, priority=priority,
                    duration_s=duration_s, command=command, state=JobState.PENDING,
                    placement=None, node_id=None, submitted_at=submitted_at, started_at=None,
                    finished_at=None, exit_code=None, attempts=0, version=0, user=user,
                )
                stmt = self._insert(T.jobs).values(**job_values(record)).on_conflict_do_nothing()
                if conn.execute(stmt).rowcount == 1:
                    return record
        raise RuntimeError("could not allocate a unique job id")

    def get_job(self, job_id: str) -> JobRecord | None:
        with self._read() as conn:
            row = conn.execute(sa.select(T.jobs).where(T.jobs.c.id == job_id)).first()
        return job_from_row(row) if row is not None else None

    def jobs(
        self,
        states: Iterable[JobState] | None = None,
        pool: str | None = None,
        node_id: str | None = None,
        limit: int | None = None,
    ) -> list[JobRecord]:
        """Jobs in service order: priority (highest first), then submission time, then id."""
        c = T.jobs.c
        query = sa.select(T.jobs).order_by(c.priority.desc(), c.submitted_at, c.id)
        if states is not None:
            query = query.where(c.state.in_([JobState(s).value for s in states]))
        if pool is not None:
            query = query.where(c.pool == pool)
        if node_id is not None:
            query = query.where(c.node_id == node_id)
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return [job_from_row(r) for r in conn.execute(query)]

    def gpus_busy_by_node(self) -> dict[str, int]:
        """GPUs of running built-in jobs on each burst node: the one count `burst status` and the
        API's /v1/nodes both show."""
        c = T.jobs.c
        query = (sa.select(c.node_id, sa.func.sum(c.gpus))
                 .where(c.state == JobState.RUNNING.value, c.node_id.is_not(None))
                 .group_by(c.node_id))
        with self._read() as conn:
            return {node_id: int(gpus) for node_id, gpus in conn.execute(query)}

    def start_job(
        self, job: JobRecord, *, placement: str, node_id: str | None, at: datetime
    ) -> JobRecord | None:
        """PENDING -> RUNNING on ``placement``; None if someone else changed the job first."""
        require_aware(at, "at")
        new = replace(
            job, state=JobState.RUNNING, placement=Placement(placement), node_id=node_id,
            started_at=at, finished_at=None, exit_code=None, attempts=job.attempts + 1,
            version=job.version + 1,
        )
        return self._cas_job(job, JobState.PENDING, new)

    def finish_job(
        self, job: JobRecord, *, state: JobState, exit_code: int | None, at: datetime
    ) -> JobRecord | None:
        """RUNNING -> DONE or FAILED; None if the job was not in the state ``job`` says."""
        state = JobState(state)
        if state not in _FINAL_STATES:
            raise ValueError(f"finish_job ends a job as done or failed, not {state}")
        require_aware(at, "at")
        new = replace(job, state=state, exit_code=exit_code, finished_at=at,
                      version=job.version + 1)
        return self._cas_job(job, JobState.RUNNING, new, ended=(at, state.value))

    def settle_late_run(
        self, job: JobRecord, run: JobRun, attempt: int, *, state: JobState,
        exit_code: int | None, at: datetime,
    ) -> JobRecord | None:
        """End ``job`` as done or failed from the late report of its earlier run ``run``.

        The run (attempt ``attempt``, on ``run.node_id``) finished while the controller thought
        its node gone, so the job was put back: PENDING, or RUNNING again as a later attempt.
        In one transaction: the job ends (compare-and-set on its version and state), the run's
        presumed end (node-gone) becomes the reported one, and a later attempt still running is
        closed as superseded. None if the job changed first.
        """
        state = JobState(state)
        if state not in _FINAL_STATES:
            raise ValueError(f"settle_late_run ends a job as done or failed, not {state}")
        if job.state not in (JobState.PENDING, JobState.RUNNING):
            return None
        require_aware(at, "at")
        new = replace(job, state=state, placement=Placement.BURST, node_id=run.node_id,
                      started_at=run.started_at, exit_code=exit_code, finished_at=at,
                      version=job.version + 1)
        values = job_values(new)
        del values["id"]
        c = T.jobs.c
        stmt = (sa.update(T.jobs)
                .where(c.id == job.id, c.version == job.version, c.state == job.state.value)
                .values(**values))
        with self._write() as conn:
            if conn.execute(stmt).rowcount != 1:
                return None
            amend_presumed_end(conn, builtin_run_key(job.id, attempt), state.value)
            if job.state is JobState.RUNNING and _on_burst_node(job):
                close_run(conn, builtin_run_key(job.id, job.attempts), at, RunOutcome.SUPERSEDED)
        return new

    def requeue_job(self, job: JobRecord, at: datetime,
                    outcome: str = RunOutcome.REQUEUED) -> JobRecord | None:
        """RUNNING -> PENDING (preempted or drained away); keeps its place and attempt count.

        The job row keeps no requeue time (the submission time is kept so the job does not lose
        its turn); ``at`` and ``outcome`` (handed-back, node-gone, ...) end its run on a burst
        node in ``job_runs``.
        """
        require_aware(at, "at")
        new = replace(job, state=JobState.PENDING, placement=None, node_id=None, started_at=None,
                      version=job.version + 1)
        return self._cas_job(job, JobState.RUNNING, new, ended=(at, str(outcome)))

    def cancel_job(self, job_id: str) -> bool:
        """Withdraw a PENDING job; False if it is unknown or no longer pending."""
        c = T.jobs.c
        with self._write() as conn:
            result = conn.execute(
                sa.update(T.jobs)
                .where(c.id == job_id, c.state == JobState.PENDING.value)
                .values(state=JobState.CANCELLED.value, version=c.version + 1)
            )
            return result.rowcount == 1

    def withdraw_job(self, job_id: str, at: datetime) -> Withdrawal:
        """Cancel a job, pending or running (``burst cancel``, ``DELETE /v1/jobs/{id}``).

        A pending or running job becomes CANCELLED at ``at``; a running one keeps its node, so
        the node's agent learns from its next heartbeat answer to stop it, and its run on a
        burst node ends here (outcome ``cancelled``). A job cancelled before is returned as it
        is (``changed`` False), and so is a finished one: the caller tells them apart by state.
        ``job`` is None for an unknown id."""
        require_aware(at, "at")
        for _ in range(8):  # a concurrent change (the job started meanwhile): read and try again
            job = self.get_job(job_id)
            if job is None or job.state not in (JobState.PENDING, JobState.RUNNING):
                return Withdrawal(job, changed=False)
            new = replace(job, state=JobState.CANCELLED, finished_at=at, version=job.version + 1)
            ended = (at, RunOutcome.CANCELLED.value) if job.state is JobState.RUNNING else None
            if self._cas_job(job, job.state, new, ended=ended) is not None:
                return Withdrawal(new, changed=True)
        raise RuntimeError(f"job {job_id} kept changing; could not cancel it")

    def _cas_job(self, old: JobRecord, expected: JobState, new: JobRecord,
                 ended: tuple[datetime, str] | None = None) -> JobRecord | None:
        """Write ``new`` if the job is still ``old`` in state ``expected``; in the same
        transaction, open the run of a job now running on a burst node and close (at ``ended``'s
        time, with its outcome) the run of a job leaving one."""
        if old.state is not expected:
            return None
        values = job_values(new)
        del values["id"]
        c = T.jobs.c
        stmt = (
            sa.update(T.jobs)
            .where(c.id == old.id, c.version == old.version, c.state == expected.value)
            .values(**values)
        )
        with self._write() as conn:
            won = conn.execute(stmt).rowcount == 1
            if won and ended is not None and _on_burst_node(old):
                close_run(conn, builtin_run_key(old.id, old.attempts), *ended)
            if won and new.state is JobState.RUNNING and _on_burst_node(new):
                assert new.node_id is not None and new.started_at is not None
                open_run(conn, self._insert(T.job_runs), JobRun(
                    run_key=builtin_run_key(new.id, new.attempts), job_id=new.id,
                    project=new.project, user=new.user, node_id=new.node_id, gpus=new.gpus,
                    started_at=new.started_at))
        return new if won else None


def _on_burst_node(record: JobRecord) -> bool:
    return record.placement == Placement.BURST and record.node_id is not None


def job_values(record: JobRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "project": record.project,
        "user": record.user,
        "pool": record.pool,
        "gpus": record.gpus,
        "priority": record.priority,
        "duration_s": record.duration_s,
        "command": record.command,
        "state": JobState(record.state).value,
        "placement": Placement(record.placement).value if record.placement is not None else None,
        "node_id": record.node_id,
        "submitted_at": record.submitted_at,
        "started_at": record.started_at,
        "finished_at": record.finished_at,
        "exit_code": record.exit_code,
        "attempts": record.attempts,
        "version": record.version,
    }

