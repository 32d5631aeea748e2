"""The built-in job queue: burst's own queue and on-prem pool for the embedded mode.

``burst submit`` puts jobs here. Each pool's on-prem capacity is modelled from the policy
(``pool.onprem.nodes`` x ``gpus_per_node``): a job placed on-prem runs there for its duration
(the embedded mode has no real on-prem nodes to run it on; the Slurm source replaces this with a
real cluster). Jobs placed on burst nodes are pulled and really run by each node's agent.

Scheduling is priority-then-FIFO with backfill: jobs are taken in the same order the planner uses
(:func:`orchestrator.planner.demand.scheduling_order`), a job that does not fit is skipped, not
blocking smaller ones. On-prem is always offered work first; a burst node asking for work gets the
first pending job that fits it, that on-prem cannot start now, and that the budgets admit
(:mod:`orchestrator.planner.admission`, the rule the planner counts burst capacity with). The
jobs the node was launched for (``Node.launched_for``, the plan's ``Launch.jobs``) come first,
while they are still pending: the planner chose which jobs to burst (their wait, displacement,
staging), and handing their node to the oldest pending job instead would undo that choice and
leave the job it was for waiting for the next launch. Then the rest, in order, as before, but
for the jobs the policy's last plan kept for on-prem under ``trigger.spare_room``
(:mod:`orchestrator.store.kept_jobs`): such a job is handed a node only where it lengthens the
node's running work by at most its share (:func:`orchestrator.planner.spare_room.may_join`).

Every write is compare-and-set on the job's version, so the loop and the API thread (or several
processes) can dispatch at once without running a job twice. Each start on a burst node, and each
finish, hand-back or release of a job on one, also opens or closes the job's run in the store's
run history (the cost ledger's job usage), in the same transaction.
"""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from orchestrator.domain.jobs import Job, JobState, Placement
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.costs.spend import budget_spend
from orchestrator.domain.snapshot import BurstRun, OnPremRelease, OnPremState, PoolQueue, Snapshot
from orchestrator.kept import Kept
from orchestrator.planner.admission import Admission, held_gpus
from orchestrator.planner.budgets import BudgetBook, usd
from orchestrator.planner.demand import Bins, ordered, scheduling_order
from orchestrator.planner.spare_room import Busy, may_join
from orchestrator.policy.models import Policy
from orchestrator.store import JobRecord, Store
from orchestrator.store.jobruns import RunOutcome, builtin_run_key
from orchestrator.store.queueread import QueueRead, RunningJob

ONPREM_PREFIX = "onprem"
CLAIM_PAGE = 100  # pending jobs a burst node's claim reads at a time (claim_for_node)


def onprem_node_name(pool: str, index: int) -> str:
    return f"{ONPREM_PREFIX}:{pool}:{index}"


@dataclass(frozen=True, slots=True)
class NodeUsage:
    """What a burst node is running, as the queue sees it. ``last_busy_at`` (when it last
    finished a job) is read only for a node running nothing, the one case it matters in."""

    gpus_busy: int
    running_jobs: int
    last_busy_at: datetime | None


@dataclass(frozen=True, slots=True)
class PoolSummary:
    """A pool's queue in figures (``burst status``)."""

    pool: str
    onprem_gpus: int
    onprem_free_gpus: int
    pending_jobs: int
    pending_gpus: int
    running_onprem_jobs: int
    running_burst_jobs: int


class BuiltinQueue:
    """Queue source and dispatcher of the embedded mode (see module docstring)."""

    def __init__(self, store: Store, policies: list[Policy]):
        self.store = store
        self.pools = {p.pool.name: p for p in policies}
        self._lock = threading.Lock()
        # The last burst_runs' BurstRuns, by job, each with the running job it was made from.
        self._runs: Kept[BurstRun] = Kept()

    def writing_to(self, store: Store) -> BuiltinQueue:
        """This queue writing through ``store`` (a fenced view of its own), sharing its lock, so
        a leader's dispatch is fenced and still serialised with the API's."""
        view = copy.copy(self)
        view.store = store
        return view

    # -- observing -------------------------------------------------------------------------
    def read(self, now: datetime) -> QueueRead:
        """The queue now, in one read (:meth:`Store.queue_read`)."""
        return self.store.queue_read(now)

    def observe(self, now: datetime, read: QueueRead | None = None) -> dict[str, PoolQueue]:
        """Pending jobs and on-prem capacity of every pool, from ``read`` (the tick's one read
        of the queue, as :meth:`dispatch` left it) or a fresh read."""
        read = read or self.read(now)
        running = read.running
        pending = read.pending_jobs()
        queues: dict[str, PoolQueue] = {}
        for pool, policy in self.pools.items():
            free = self._onprem_free(policy, running)
            queues[pool] = PoolQueue(
                pool=pool,
                onprem=OnPremState(policy.pool.onprem.total_gpus, sum(free), tuple(free)),
                pending=pending.get(pool, ()),
                running_onprem_jobs=sum(1 for j in running if j.pool == pool and j.placement is Placement.ONPREM),
                running_burst_jobs=sum(1 for j in running if j.pool == pool and j.placement is Placement.BURST),
                onprem_releases=_releases(pool, running),
            )
        return queues

    def summary(self, running: Sequence[RunningJob] | None = None) -> list[PoolSummary]:
        """Every pool's on-prem use and its pending and running counts, from grouped counts and
        the running jobs (``running``, as :meth:`Store.running_jobs` read them, or a fresh
        read): the pending jobs are not read (``burst status``)."""
        counts = self.store.queue_counts()
        running = self.store.running_jobs() if running is None else running
        summaries = []
        for pool, policy in self.pools.items():
            free = self._onprem_free(policy, running)
            jobs, gpus = counts.get((pool, JobState.PENDING, None), (0, 0))
            summaries.append(PoolSummary(
                pool, policy.pool.onprem.total_gpus, sum(free), jobs, gpus,
                counts.get((pool, JobState.RUNNING, Placement.ONPREM), (0, 0))[0],
                counts.get((pool, JobState.RUNNING, Placement.BURST), (0, 0))[0]))
        return summaries

    def node_usage(self, node_ids: list[str], read: QueueRead | None = None) -> dict[str, NodeUsage]:
        """Per burst node: GPUs and jobs running now (from ``read``'s running jobs, or a fresh
        read of them), and, for a node running nothing, when it last finished something (one
        grouped query for all of them)."""
        running = read.running if read is not None else self.store.running_jobs()
        wanted = set(node_ids)
        busy: dict[str, list[int]] = {}
        for job in running:
            if job.node_id in wanted:
                tally = busy.setdefault(job.node_id, [0, 0])
                tally[0] += job.gpus
                tally[1] += 1
        last = self.store.last_finished_by_node([n for n in node_ids if n not in busy])
        usage: dict[str, NodeUsage] = {}
        for node_id in node_ids:
            gpus, jobs = busy.get(node_id, (0, 0))
            usage[node_id] = NodeUsage(gpus, jobs, last.get(node_id))
        return usage

    def _onprem_free(self, policy: Policy, running: Sequence[RunningJob | JobRecord]
                     ) -> list[int]:
        onprem = policy.pool.onprem
        free = [onprem.gpus_per_node] * onprem.nodes
        index = {onprem_node_name(policy.pool.name, i): i for i in range(onprem.nodes)}
        for job in running:
            if job.pool != policy.pool.name or job.placement is not Placement.ONPREM:
                continue
            for name in (job.node_id or "").split(","):
                if name in index:
                    used = min(job.gpus, onprem.gpus_per_node)
                    free[index[name]] = max(free[index[name]] - used, 0)
        return free

    # -- dispatching -----------------------------------------------------------------------
    def dispatch_onprem(self, now: datetime) -> list[JobRecord]:
        """Finish on-prem jobs whose time is up, then start what fits on-prem. Returns started."""
        return self.dispatch(now).started

    def dispatch(self, now: datetime) -> QueueRead:
        """:meth:`dispatch_onprem` on one read of the queue, returned as dispatch left it (the
        jobs it started running, those it finished gone): what :meth:`observe` then reads."""
        with self._lock:
            read = self.read(now)
            ended: set[str] = set()
            due = [job.id for job in read.running
                   if job.placement is Placement.ONPREM and job.started_at is not None
                   and now >= job.started_at + timedelta(seconds=job.duration_s or 0)]
            # The read's running jobs are light rows: those whose time is up are read again as
            # full records, which finishing them compare-and-sets (a few a tick).
            for job in sorted(self.store.jobs_by_id(due), key=_job_id) if due else ():
                if (job.state is JobState.RUNNING
                        and self.store.finish_job(job, state=JobState.DONE, exit_code=0, at=now)):
                    ended.add(job.id)
            running = [j for j in read.running if j.id not in ended]
            started: list[str] = []
            for pool, policy in self.pools.items():
                rows = read.pending.get(pool)
                if rows is None:
                    continue
                free = self._onprem_free(policy, running)
                names = [onprem_node_name(pool, i) for i in range(len(free))]
                bins = Bins(free, list(names), node_size=policy.pool.onprem.gpus_per_node)
                if bins.total == 0:
                    continue  # on-prem is full: nothing to order
                # The pool's columns, as the planner will see them if nothing starts: their
                # order is memoized, so a tick that starts nothing on-prem orders them once.
                # Only GPUs are read per row until a job fits: no Job is made.
                order = ordered(rows.columns, policy)
                ids = rows.columns.ids
                for row, gpus in zip(order.order.tolist(), order.gpus_in_order()):
                    if bins.total == 0:
                        break
                    used = bins.place(gpus)
                    if used is None:
                        continue
                    node_id = ",".join(bins.owners[i] or "" for i in used)
                    if self.store.start_onprem(ids[row], int(rows.version[row]),
                                               int(rows.attempts[row]), node_id, now):
                        started.append(ids[row])
            records = self.store.jobs_by_id(started) if started else []
            order = {job_id: i for i, job_id in enumerate(started)}
            records.sort(key=lambda r: order[r.id])
            read.take(set(started), records, ended)
            return read

    def claim_for_node(self, node: Node, free_gpus: int, now: datetime) -> JobRecord | None:
        """Give a ready burst node the first pending job of its pool that fits, that on-prem
        can't take, and that every budget covering the job or the node admits
        (:mod:`orchestrator.planner.admission`: whoever's node it is, the job's run is its
        project's spend). An admitted start's extension of the node's life is added to the node's
        commitment before the job starts."""
        if node.state is not NodeState.READY or free_gpus <= 0:
            return None
        self.dispatch_onprem(now)
        policy = self.pools.get(node.pool)
        if policy is None:
            return None
        with self._lock:
            if free_gpus >= node.gpus:
                # An agent asks for work only when it runs nothing and owes no report
                # (agent_contract), so a job still recorded running on its node is one whose
                # hand-out never reached it: the controller died between recording the claim and
                # answering. Offer that same run again, rather than leave it running nowhere.
                lost = self.store.jobs(states=[JobState.RUNNING], node_id=node.id)
                if lost:
                    return lost[0]
            # The pool's pending jobs that fit, in the planner's scheduling order, those the
            # node was launched for first: read a page at a time, since the first that fits and
            # is admitted is usually on the first page, so a claim does not read the whole
            # queue. (A job started elsewhere meanwhile shifts the pages by one: at worst this
            # claim passes over a job the next claim is offered.)
            admission: Admission | None = None
            for index, pending in enumerate(self._claimable(node, policy, free_gpus, now)):
                if index == 0:
                    admission = self._admission(policy, now)
                job = pending.to_domain()
                if admission is not None:
                    current = self.store.get_node(node.id) or node
                    verdict = admission.check(job, current)
                    if not verdict.admitted:
                        continue  # its budgets cannot pay for it here: the next job's turn
                    if verdict.extension_usd and not self._extend(current, verdict.extension_usd):
                        continue
                    admission.take(job, current, verdict)
                record = self.store.start_job(pending, placement=Placement.BURST,
                                              node_id=node.id, at=now)
                if record is not None:
                    return record
        return None

    def _claimable(self, node: Node, policy: Policy, free_gpus: int,
                   now: datetime) -> Iterator[JobRecord]:
        """The pending jobs of the node's pool of at most ``free_gpus`` GPUs that the node may
        be given, in the order it is offered them: those it was launched for (module
        docstring), then the rest, each part in scheduling order; the rest read a page of
        :data:`CLAIM_PAGE` at a time (:meth:`Store.pending_that_fit`)."""
        intended = frozenset(node.launched_for)
        if intended:
            mine = {r.id: r for r in self.store.jobs_by_id(sorted(intended))
                    if r.state is JobState.PENDING and r.pool == node.pool
                    and r.gpus <= free_gpus}
            for job in scheduling_order([r.to_domain() for r in mine.values()], policy):
                yield mine[job.id]
        priorities = {p.name: p.priority for p in policy.projects}
        spare = self._spare_room(node, policy, now)
        offset = 0
        while True:
            page = self.store.pending_that_fit(node.pool, free_gpus, priorities,
                                               policy.default_project_priority,
                                               offset=offset, limit=CLAIM_PAGE)
            yield from (r for r in page if r.id not in intended
                        and (spare is None or spare(r.to_domain())))
            if len(page) < CLAIM_PAGE:
                return
            offset += len(page)

    def _spare_room(self, node: Node, policy: Policy, now: datetime
                    ) -> Callable[[Job], bool] | None:
        """Under ``trigger.spare_room``: whether a pending job may take this node's room. A job
        the policy's last plan kept for on-prem may only where it lengthens the node by at most
        its share, as the node's running work stands now (:func:`~orchestrator.planner.
        spare_room.may_join`); the rest may. None: the rule is off, or nothing is kept."""
        rule = policy.trigger.spare_room
        if not rule.enabled:
            return None
        kept = self.store.kept_onprem(policy.name)
        if not kept:
            return None
        busy = 0.0
        for run in self.store.jobs(states=[JobState.RUNNING], node_id=node.id):
            if run.duration_s is None or run.started_at is None:
                busy = math.inf
                break
            busy = max(busy, (run.started_at - now).total_seconds() + float(run.duration_s))
        room = Busy(node.id, node.gpus, busy)
        return lambda job: job.id not in kept or may_join(job, room, rule.max_extension)

    def _admission(self, policy: Policy, now: datetime) -> Admission | None:
        """The policy's budgets now, as the planner sees them: spend from the cost ledger, the
        live nodes' commitments and what running jobs on others' nodes still owe; and the burst
        GPUs each project's work holds, for the quotas."""
        quotas = any(p.max_burst_gpus is not None for p in policy.projects)
        if not policy.budgets and not quotas:
            return None
        nodes = tuple(self.store.nodes())
        runs = self.burst_runs()
        book = None
        if policy.budgets:
            snapshot = Snapshot(taken_at=now, nodes=nodes,
                                budget_spend=budget_spend(self.store, [policy], now),
                                burst_runs=runs)
            book = BudgetBook.build(policy, snapshot, now)
        return Admission(policy, book, now, held_gpus(nodes, runs))

    def _extend(self, node: Node, extra: Decimal) -> bool:
        """Add ``extra`` to the node's budget commitment (compare-and-set, re-read on a race)."""
        for _ in range(8):
            new = self.store.update_node(
                node, budget_commit_usd=float(usd(node.budget_commit_usd) + extra))
            if new is not None:
                return True
            fresh = self.store.get_node(node.id)
            if fresh is None:
                return False
            node = fresh
        return False

    def burst_runs(self, read: QueueRead | None = None) -> tuple[BurstRun, ...]:
        """Jobs running on burst nodes now (from ``read``, or a fresh read of the running jobs):
        whose, where, since when, declared for how long."""
        running = read.running if read is not None else self.store.running_jobs()
        # A running job read as it was last time (the same RunningJob: Store.queue_read keeps
        # them) has the same BurstRun: frozen, so the last one serves.
        kept = self._runs
        kept.round()
        get, put = kept.get, kept.put
        out = []
        for j in running:
            if (j.placement is Placement.BURST and j.node_id is not None
                    and j.started_at is not None):
                run = get(j.id, j)
                out.append(run if run is not None else put(j.id, j, BurstRun(
                    j.id, j.project, j.node_id, j.gpus, j.started_at, j.duration_s)))
        return tuple(out)

    def finish(self, job_id: str, node_id: str, outcome: str, exit_code: int | None,
               now: datetime, attempt: int | None = None,
               ended_at: datetime | None = None) -> bool:
        """Record what a node reported about a job: done, failed, or handed back to the queue.

        ``attempt`` (the run id ``jobs/next`` handed out) lets a late report count: a run that
        finished while the controller thought its node gone is recorded from the node's report
        (see :meth:`_settle_late`), as ended at ``ended_at`` (the node's clock, kept between the
        run's start and ``now``). False: the report changed nothing (stale or repeated).
        """
        job = self.store.get_job(job_id)
        if job is None:
            return False
        if attempt is not None and not (job.state is JobState.RUNNING and job.attempts == attempt):
            return self._settle_late(job, node_id, outcome, exit_code, now, attempt, ended_at)
        if job.state is not JobState.RUNNING or job.node_id != node_id:
            return False  # a stale or duplicate report: the job moved on already
        if outcome == "handed-back":
            return self.store.requeue_job(job, now, RunOutcome.HANDED_BACK) is not None
        state = JobState.DONE if outcome == "done" else JobState.FAILED
        return self.store.finish_job(job, state=state, exit_code=exit_code, at=now) is not None

    def _settle_late(self, job: JobRecord, node_id: str, outcome: str, exit_code: int | None,
                     now: datetime, attempt: int, ended_at: datetime | None = None) -> bool:
        """A report of run ``attempt``, which the job has left (its node was declared gone).

        The job was put back in the queue, and may be running again as a later attempt. A run
        that succeeded is never re-run: "done" ends the job, whatever later attempt is under way
        (that one is superseded; its node is told to stop it). A failure ends the job only if no
        later attempt started (the job is waiting to be re-run after exactly that run); a
        hand-back, a report of a run that was not on ``node_id``, or of a job already ended,
        changes nothing.
        """
        if outcome not in ("done", "failed") or attempt > job.attempts:
            return False
        if job.state not in (JobState.PENDING, JobState.RUNNING):
            return False  # ended already (by another attempt, or cancelled)
        if outcome == "failed" and not (job.state is JobState.PENDING and job.attempts == attempt):
            return False
        run = self.store.job_run(builtin_run_key(job.id, attempt))
        if run is None or run.node_id != node_id:
            return False
        state = JobState.DONE if outcome == "done" else JobState.FAILED
        at = now if ended_at is None else max(min(ended_at, now), run.started_at)
        with self._lock:
            return self.store.settle_late_run(job, run, attempt, state=state,
                                              exit_code=exit_code, at=at) is not None

    def release_node(self, node_id: str, now: datetime) -> int:
        """Put every job still running on a node that is gone back in the queue."""
        count = 0
        for job in self.store.jobs(states=[JobState.RUNNING], node_id=node_id):
            if self.store.requeue_job(job, now, RunOutcome.NODE_GONE) is not None:
                count += 1
        return count


def _job_id(job: JobRecord) -> str:
    return job.id


def _releases(pool: str, running: Sequence[RunningJob | JobRecord]
              ) -> tuple[OnPremRelease, ...]:
    """The pool's running on-prem jobs with a known expected end (start + time limit)."""
    return tuple(
        OnPremRelease(j.gpus, j.started_at + timedelta(seconds=j.duration_s))
        for j in running
        if j.pool == pool and j.placement is Placement.ONPREM
        and j.started_at is not None and j.duration_s is not None
    )
