"""The simulated cluster: jobs, the on-prem pool and its scheduler, and the burst nodes' fabric.

Scheduling is priority then FIFO with backfill. Jobs are taken in the planner's scheduling order
(project priority, job priority, submit time; :func:`orchestrator.planner.demand.scheduling_order`),
on-prem is always offered work first, and pending jobs that do not fit on-prem run on ready burst
nodes (a draining node takes no new work). Multi-GPU jobs need GPUs of one node; on-prem, jobs
wider than a node need whole nodes (:mod:`orchestrator.sim.pool`). On burst nodes what one job
may use is what the fabric can run (:mod:`orchestrator.sim.burstpool`): in a policy run whose
fabric is the built-in queue, one node; where the fabric spans nodes (Slurm, torch elastic),
whole free nodes of one offering for a job wider than one node, as the planner launches them (one
launch group); the baselines' burst nodes give a wide job any whole nodes. A job never mixes
on-prem and burst nodes. How a job that does not fit on-prem affects
the jobs behind it is the on-prem pool's :class:`Backfill` rule:

* ``easy`` (the default; what Slurm's backfill scheduler does for its top job): the first job in
  order that does not fit holds a *reservation*: the nodes that free up for it first (by the
  running jobs' time limits, here their trace durations) and the time ``S`` they are all free. A
  job behind it may start now only if it ends by ``S`` or uses none of the reserved nodes, so
  small jobs cannot overtake a wide job indefinitely.
* ``first-fit`` (the built-in queue's rule, :mod:`orchestrator.sources.builtin`): a job that does
  not fit is skipped and never delays smaller ones.

Burst nodes are always filled ``first-fit``. Doing either scan job by job would cost O(queue) per
event. Whether a job can start depends only on its width (and, under a reservation, on whether it
ends by ``S``), so the scan looks only at the first pending job of each width: the best such head
that can start is started, and that repeats, in O(widths) per start. Under a reservation this is
slightly stricter than a full scan: a job is not considered while an older job of its width waits.

The world is also the burst nodes' :class:`~orchestrator.domain.ports.Fabric`: a drain stops new
work and releases the node once it runs nothing; a node that is gone (a spot interruption) hands
its jobs back to the queue, as the built-in fabric's requeue does
(:meth:`orchestrator.fabric.builtin.BuiltinFabric.node_gone`). A job that checkpoints (its
interval: the policy's ``checkpoint_every_s`` for its project) resumes on its next node from its
last checkpoint: of the attempt's compute time (past its restart overhead) the whole intervals are
kept, the rest is lost, and the next attempt first spends ``spot.restart_overhead`` loading the
checkpoint. A job that does not checkpoint starts again from the beginning.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from enum import StrEnum

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.snapshot import BurstRun, OnPremRelease, OnPremState, PoolQueue
from orchestrator.planner.admission import Admission
from orchestrator.planner.backfill import (BackfillConfig, NodeSpace, PendingJob, backfill_pass)
from orchestrator.planner.staging import staging_of
from orchestrator.policy.models import Policy
from orchestrator.sim.burstpool import BurstPool
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.pool import Allocation, GpuPool
from orchestrator.sim.traces import TraceJob

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # virtual time zero
DEFAULT_PROJECT = "default"

PENDING, RUNNING, DONE = 0, 1, 2


class Backfill(StrEnum):
    """How the on-prem scheduler lets jobs start past one that does not fit (module docstring)."""

    EASY = "easy"
    FIRST_FIT = "first-fit"
    SLURM = "slurm"


def at(seconds: float) -> datetime:
    """Virtual seconds as the timezone-aware time the planner and executor see."""
    return EPOCH + timedelta(seconds=seconds)


def seconds(moment: datetime) -> float:
    return (moment - EPOCH).total_seconds()


class SimJob:
    """A trace job as it moves through the simulated cluster."""

    __slots__ = ("index", "trace", "gpus", "key", "state", "pending_since", "wait_s", "start_s",
                 "end_s", "where", "alloc", "attempt", "domain", "eligible", "burst_nodes",
                 "lost_gpu_s", "restarts", "burst_start_s", "remaining_s", "overhead_s",
                 "checkpoint_s", "max_loss_s", "stage_s")

    def __init__(self, index: int, trace: TraceJob, key: tuple, domain: Job):
        self.index = index
        self.trace = trace
        self.gpus = trace.gpus
        self.key = key
        self.state = PENDING
        self.pending_since = trace.submit_s
        self.wait_s = 0.0
        self.start_s: float | None = None
        self.end_s: float | None = None
        self.where: str | None = None  # "onprem" | "burst"
        self.alloc: Allocation = ()
        self.attempt = 0
        self.domain = domain
        self.eligible = False  # may run on burst nodes (after the controller's minimum wait)
        self.burst_nodes: tuple[str, ...] = ()
        self.lost_gpu_s = 0.0  # GPU-seconds of attempts cut short (node gone), redone later
        self.restarts = 0
        self.burst_start_s: float | None = None  # its first start on a burst node
        self.remaining_s = trace.duration_s  # work left (less after a resume from a checkpoint)
        self.overhead_s = 0.0  # restart overhead the current attempt pays before it computes
        self.checkpoint_s: float | None = None  # set by the world from the policy
        self.max_loss_s = 0.0  # most compute lost by one interruption (the checkpoint bound)
        self.stage_s = 0.0  # staging its data to the cloud before this burst attempt computes

    @property
    def run_s(self) -> float:
        """How long the current attempt runs: staging (burst), restart overhead, the work left."""
        return self.stage_s + self.overhead_s + self.remaining_s


def _head(heap: list) -> tuple | None:
    """The first live entry of a per-width queue, dropping stale ones (jobs started since, or
    requeued with a newer entry)."""
    while heap and (heap[0][2].state != PENDING or heap[0][1] != heap[0][2].attempt):
        heapq.heappop(heap)
    return heap[0] if heap else None


class World:
    """Jobs, the on-prem pool, the ready burst nodes, and the fabric port over them."""

    name = "sim"

    def __init__(self, policy: Policy, trace: tuple[TraceJob, ...], onprem_nodes: int,
                 gpus_per_node: int, store: SimStore, backfill: Backfill = Backfill.EASY,
                 slurm: BackfillConfig | None = None, bf_interval_s: float = 30.0):
        self.policy = policy
        self.backfill = Backfill(backfill)
        # ``slurm``: Slurm's main scheduler at every event, its backfill pass (the shared model,
        # orchestrator.planner.backfill) at most every ``bf_interval_s`` when something changed.
        self.slurm = slurm or BackfillConfig()
        self.bf_interval_s = bf_interval_s
        self._order: list[tuple[tuple, int]] = []  # pending (key, index), sorted (slurm only)
        self._widths: dict[int, int] = {}  # pending jobs by GPUs (slurm only)
        self._last_pass = -math.inf
        self._pass_version = -1  # the on-prem pool's version at the last pass
        self._pass_pending = -1
        self.bf_passes = 0
        self.backfill_due_at: float | None = None  # a pass held back by bf_interval is due then
        self.pool_name = policy.pool.name
        self.store = store
        self.onprem = GpuPool.uniform(onprem_nodes, gpus_per_node)
        # Ready burst nodes that take work (not draining), by offering; how one job may spread
        # over them (``burst.spread``) is set by the controller (orchestrator.sim.burstpool).
        self.burst = BurstPool()
        self._burst_index: dict[str, int] = {}
        self._burst_ids: dict[int, str] = {}
        self._next_index = 0
        self.node_jobs: dict[str, set[SimJob]] = {}
        self.node_busy_gpu_s: dict[str, float] = {}
        priorities = {p.name: p.priority for p in policy.projects}
        default = policy.default_project_priority
        self.jobs: list[SimJob] = []
        for index, t in enumerate(trace):
            project = t.project or DEFAULT_PROJECT
            submitted = at(t.submit_s)
            domain = Job(id=t.job_id, project=project, pool=self.pool_name, gpus=t.gpus,
                         submitted_at=submitted, priority=t.priority, duration_s=t.duration_s,
                         dataset_gb=t.dataset_gb)
            # The planner's scheduling order (orchestrator.planner.demand.scheduling_order).
            key = (-priorities.get(project, default), -t.priority, t.submit_s, t.job_id)
            job = SimJob(index, t, key, domain)
            job.checkpoint_s = policy.checkpoint_every_s(project)
            self.jobs.append(job)
        self.pending: dict[int, SimJob] = {}
        self.pending_gpus = 0
        self._pending_tuple: tuple[Job, ...] | None = ()
        self._all: dict[int, list] = {}  # width -> heap of (key, attempt, job): every pending job
        self._burst_q: dict[int, list] = {}  # width -> heap: pending jobs allowed on burst nodes
        self.running_onprem = 0
        self.running_burst = 0
        self.onprem_running: dict[int, SimJob] = {}  # jobs running on-prem, by index
        # On-prem node -> {job index: (expected end, GPUs used)}: what the reservation reads.
        self._node_runs: dict[int, dict[int, tuple[float, int]]] = {
            index: {} for index in self.onprem.size}
        self.finished = 0
        self.started: list[SimJob] = []  # filled by dispatch; the engine schedules their ends
        self._free_cache: tuple[int, tuple[int, ...]] = (-1, ())
        # Expected end of each on-prem running job (start + its duration, the trace's "time
        # limit"), for the wait-aware rule; kept per job so a snapshot only gathers them.
        # One release per node the job holds (the node index: the per-node wait model reads it).
        self._releases: dict[int, tuple[OnPremRelease, ...]] = {}
        self._releases_cache: tuple[int, tuple[OnPremRelease, ...]] = (-1, ())
        # Set by the engine: called when a burst node becomes idle (baselines time scale-down).
        self.on_node_idle: Callable[[str, float], None] | None = None
        self.onprem_gpu_s = 0.0
        self.burst_gpu_s = 0.0
        self.requeued = 0  # jobs handed back to the queue by a node that went away
        # Data staging of burst starts (policy storage, trace dataset_gb): egress in integer
        # micro-dollars (data in and checkpoints back), GB staged in, seconds spent staging.
        self.egress_micros = 0
        self.staged_gb = 0.0
        self.staging_s = 0.0
        # Set by a controller whose policy has budgets: the admission of starts on burst nodes at
        # an instant (orchestrator.planner.admission), as the built-in queue's dispatcher checks.
        self.admission: Callable[[float], Admission | None] | None = None
        # Set by a policy controller at every plan: jobs the decision keeps off burst nodes
        # (staging their data would outlast their on-prem wait); burst dispatch skips them.
        self.staging_held: frozenset[str] = frozenset()
        # Runs on burst nodes, for spend by work (whose job, on whose node, when):
        # [project, node id, GPUs, start s, end s or None]; open ones by job index.
        self.burst_runs: list[list] = []
        self._open_runs: dict[int, list[list]] = {}  # job index -> its runs (one per node)

    # -- jobs ------------------------------------------------------------------------------------

    def arrive(self, job: SimJob, now: float, eligible: bool) -> None:
        job.state = PENDING
        job.pending_since = now
        self.pending[job.index] = job
        self.pending_gpus += job.gpus
        self._pending_tuple = None
        entry = (job.key, job.attempt, job)
        if self.backfill is Backfill.SLURM:
            insort(self._order, (job.key, job.index))
            self._widths[job.gpus] = self._widths.get(job.gpus, 0) + 1
        else:
            heapq.heappush(self._all.setdefault(job.gpus, []), entry)
        job.eligible = eligible
        if eligible:
            heapq.heappush(self._burst_q.setdefault(job.gpus, []), entry)

    def make_eligible(self, job: SimJob) -> bool:
        """Let a pending job run on burst nodes (the controller's minimum wait is over)."""
        if job.state != PENDING or job.eligible:
            return False
        job.eligible = True
        heapq.heappush(self._burst_q.setdefault(job.gpus, []), (job.key, job.attempt, job))
        return True

    def dispatch(self, now: float) -> list[SimJob]:
        """Start what fits: on-prem first, then on ready burst nodes. Returns the started jobs."""
        started: list[SimJob] = []
        self.backfill_due_at = None  # (set again below if a pass is held back)
        if self.pending:
            if self.onprem.free_total:
                if self.backfill is Backfill.EASY:
                    self._fill_reserving(now, started)
                elif self.backfill is Backfill.SLURM:
                    self._fill_slurm(now, started)
                else:
                    self._fill(self.onprem, self._all, "onprem", now, started)
            if self.burst.free_total and self._burst_q:
                admission = self.admission(now) if self.admission is not None else None
                if admission is None:
                    self._fill(self.burst, self._burst_q, "burst", now, started)
                else:
                    self._fill_admitted(admission, now, started)
        return started

    def _fill(self, pool: GpuPool, queues: dict[int, list], where: str, now: float,
              started: list[SimJob]) -> None:
        burst = where == "burst"
        # Burst nodes: what one job may use is the pool's spread (one node, whole nodes of one
        # offering, any whole nodes; orchestrator.sim.burstpool).
        fits = pool.fits_job if burst else pool.fits
        while pool.free_total:
            best = None
            for width, heap in queues.items():
                head = self._burst_head(heap) if burst else _head(heap)
                if head is not None and (best is None or head[0] < best[0]) and fits(width):
                    best = head
            if best is None:
                return
            job = best[2]
            if queues[job.gpus][0] is best:
                heapq.heappop(queues[job.gpus])  # (else its entry goes stale: _head drops it)
            self._start(job, pool.place(job.gpus) if not burst else self._take_burst(job.gpus),
                        where, now)
            started.append(job)

    def _take_burst(self, gpus: int) -> Allocation:
        alloc = self.burst.find_job(gpus)
        self.burst.take(alloc)
        return alloc

    def _burst_head(self, heap: list) -> tuple | None:
        """The first live entry of a burst queue that the decision does not keep on-prem."""
        head = _head(heap)
        held = self.staging_held
        if head is None or not held or head[2].trace.job_id not in held:
            return head
        for entry in sorted(heap):
            job = entry[2]
            if job.state == PENDING and entry[1] == job.attempt and job.trace.job_id not in held:
                return entry
        return None

    def _fill_admitted(self, admission: Admission, now: float, started: list[SimJob]) -> None:
        """Fill burst nodes as :meth:`_fill` does (the best head of each width, one node per
        job), each job on the best-fit node that admits it under the budgets and quotas. A job no node
        admits waits; the next one in order (of its width, or another) may start, as the
        built-in queue's dispatcher and the planner's absorption take them."""
        pool = self.burst
        queues = self._burst_q
        store = self.store
        refused: set[int] = set()  # jobs no node admits at this instant

        def first(heap: list) -> tuple | None:
            head = self._burst_head(heap)
            if head is None or head[2].index not in refused:
                return head
            # The head was refused: the next job of its width in order (refusals are rare,
            # so sorting the width's queue here is cheap overall).
            for entry in sorted(heap):
                job = entry[2]
                if (job.state == PENDING and entry[1] == job.attempt and job.index not in refused
                        and job.trace.job_id not in self.staging_held):
                    return entry
            return None

        while pool.free_total:
            best = None
            for width, heap in queues.items():
                if width > pool.max_size or not pool.fits(width):
                    continue
                head = first(heap)
                if head is not None and (best is None or head[0] < best[0]):
                    best = head
            if best is None:
                return
            job = best[2]
            verdicts: dict[int, tuple] = {}

            def ok(index: int, job: SimJob = job, verdicts: dict = verdicts) -> bool:
                node = store.get_node(self._burst_ids[index])
                verdict = admission.check(job.domain, node)
                verdicts[index] = (node, verdict)
                return verdict.admitted

            alloc = pool.find(job.gpus, ok=ok)
            if alloc is None:
                refused.add(job.index)
                continue
            if queues[job.gpus][0] is best:
                heapq.heappop(queues[job.gpus])  # (else its entry goes stale: _head drops it)
            [(index, _)] = alloc
            node, verdict = verdicts[index]
            admission.take(job.domain, node, verdict)
            if verdict.extension_usd:
                store.set_usage(node.id, budget_commit_usd=float(
                    Decimal(repr(node.budget_commit_usd)) + verdict.extension_usd))
            pool.take(alloc)
            self._start(job, alloc, "burst", now)
            started.append(job)

    def _fill_reserving(self, now: float, started: list[SimJob]) -> None:
        """Fill on-prem under the ``easy`` rule (module docstring)."""
        pool = self.onprem
        queues = self._all
        blocked = None  # the first job in order that does not fit: (its key, S, reserved nodes)
        while pool.free_total:
            heads = [head for head in map(_head, queues.values()) if head is not None]
            if not heads:
                return
            if blocked is None:
                first = min(heads)
                job = first[2]
                alloc = pool.place(job.gpus)
                if alloc is not None:
                    heapq.heappop(queues[job.gpus])
                    self._start(job, alloc, "onprem", now)
                    started.append(job)
                    continue
                blocked = (first[0], *self._reservation(job, now))
            key, until, reserved = blocked
            best = None
            for entry in heads:
                job = entry[2]
                if (entry[0] == key or job.gpus > pool.free_total
                        or (best is not None and entry[0] >= best[0][0])):
                    continue
                ends_in_time = now + job.run_s <= until
                alloc = pool.find(job.gpus, frozenset() if ends_in_time else reserved)
                if alloc is not None:
                    best = (entry, alloc)
            if best is None:
                return
            entry, alloc = best
            job = entry[2]
            heapq.heappop(queues[job.gpus])
            pool.take(alloc)
            self._start(job, alloc, "onprem", now)
            started.append(job)

    def _fill_slurm(self, now: float, started: list[SimJob]) -> None:
        """Fill on-prem as Slurm does: the main scheduler (priority order, stopping at the first
        job that does not fit), then, at most every ``bf_interval_s`` and only when the pool or
        the queue changed since the last one, a backfill pass of the shared model."""
        pool = self.onprem
        order = self._order
        jobs = self.jobs
        while order and pool.free_total:
            job = jobs[order[0][1]]
            if job.gpus > pool.total:
                break  # never fits here (the backfill pass skips it)
            alloc = pool.place(job.gpus)
            if alloc is None:
                break
            self._start(job, alloc, "onprem", now)
            started.append(job)
        if (not order or not pool.free_total
                or (self._pass_version == pool.version and self._pass_pending == len(order))
                or not any(count and pool.fits(width) for width, count in self._widths.items())):
            return  # (no pending job fits the free GPUs now: a pass could start nothing)
        if now - self._last_pass < self.bf_interval_s:
            self.backfill_due_at = self._last_pass + self.bf_interval_s
            return
        self._last_pass = now
        self.bf_passes += 1
        runs = self._node_runs
        space = NodeSpace([pool.size[i] for i in range(len(runs))],
                          [pool.free[i] for i in range(len(runs))],
                          ((i, end, used) for i, on in runs.items() for end, used in on.values()),
                          now)
        depth = self.slurm.max_job_test
        tested = (PendingJob(index, jobs[index].gpus, jobs[index].trace.duration_s)
                  for _, index in order[:depth])
        result = backfill_pass(space, tested, self.slurm)
        for index, alloc in result.started:
            job = jobs[index]
            pool.take(alloc)
            self._start(job, alloc, "onprem", now)
            started.append(job)
        self._pass_version = pool.version
        self._pass_pending = len(order)

    def _reservation(self, job: SimJob, now: float) -> tuple[float, frozenset[int]]:
        """When and on which on-prem nodes ``job`` (which does not fit now) can start, from the
        running jobs' expected ends: (S, nodes); (inf, no nodes) if it can never fit on-prem."""
        pool = self.onprem
        runs = self._node_runs
        if job.gpus > pool.max_size:
            frees = sorted((max((end for end, _ in runs[i].values()), default=now), i)
                           for i in pool.size)
            chosen: list[int] = []
            covered = 0
            for until, index in frees:
                chosen.append(index)
                covered += pool.size[index]
                if covered >= job.gpus:
                    return until, frozenset(chosen)
            return math.inf, frozenset()
        best = (math.inf, -1)
        for index, on_node in runs.items():
            free = pool.free[index]
            if pool.size[index] < job.gpus:
                continue
            for end, used in sorted(on_node.values()):
                free += used
                if free >= job.gpus:
                    if (end, index) < best:
                        best = (end, index)
                    break
        return (best[0], frozenset((best[1],))) if best[1] >= 0 else (math.inf, frozenset())

    def _start(self, job: SimJob, alloc: Allocation, where: str, now: float) -> None:
        job.state = RUNNING
        job.wait_s += now - job.pending_since
        job.start_s = now
        job.where = where
        job.alloc = alloc
        del self.pending[job.index]
        self.pending_gpus -= job.gpus
        if self.backfill is Backfill.SLURM:
            order = self._order
            position = bisect_left(order, (job.key, job.index))
            del order[position]
            self._widths[job.gpus] -= 1
        self._pending_tuple = None
        job.stage_s = 0.0
        if where == "onprem":
            self.running_onprem += 1
            self.onprem_running[job.index] = job
            end = now + job.run_s
            ends = at(end)
            self._releases[job.index] = tuple(OnPremRelease(used, ends, index)
                                              for index, used in alloc)
            for index, used in alloc:
                self._node_runs[index][job.index] = (end, used)
            return
        self.running_burst += 1
        if job.burst_start_s is None:
            job.burst_start_s = now
        self._stage(job)
        ids = tuple(self._burst_ids[index] for index, _ in alloc)
        job.burst_nodes = ids
        for (index, used), node_id in zip(alloc, ids):
            run = [job.domain.project, node_id, used, now, None]
            self.burst_runs.append(run)
            self._open_runs.setdefault(job.index, []).append(run)
            jobs = self.node_jobs.setdefault(node_id, set())
            jobs.add(job)
            node = self.store.get_node(node_id)
            self.store.set_usage(node_id, gpus_busy=node.gpus_busy + used,
                                 running_jobs=len(jobs), idle_since=None)

    def _stage(self, job: SimJob) -> None:
        """A burst attempt first stages the job's data (and pays the egress of it and of the
        checkpoints it brings back): its run is longer by the staging time."""
        staging = staging_of(self.policy, job.domain)
        if staging is None:
            return
        job.stage_s = staging.staging_s
        self.staging_s += staging.staging_s
        self.staged_gb += staging.dataset_gb
        self.egress_micros += round(Decimal(str(staging.egress_usd)) * 1_000_000)

    def finish(self, job: SimJob, attempt: int, now: float) -> bool:
        """A job's run ends; False for a stale end (the job was handed back meanwhile)."""
        if job.state != RUNNING or job.attempt != attempt:
            return False
        job.state = DONE
        job.end_s = now
        self.finished += 1
        runtime = now - job.start_s
        if job.where == "onprem":
            self.running_onprem -= 1
            del self.onprem_running[job.index]
            self._releases.pop(job.index, None)
            for index, _ in job.alloc:
                self._node_runs[index].pop(job.index, None)
            self.onprem.release(job.alloc)
            self.onprem_gpu_s += job.gpus * runtime
        else:
            self.running_burst -= 1
            self.burst_gpu_s += job.gpus * runtime
            self._leave_burst_nodes(job, now)
        return True

    def _leave_burst_nodes(self, job: SimJob, now: float) -> None:
        runtime = now - job.start_s
        for run in self._open_runs.pop(job.index, ()):
            run[4] = now
        self.burst.release(job.alloc)
        for (_, used), node_id in zip(job.alloc, job.burst_nodes):
            self.node_busy_gpu_s[node_id] = self.node_busy_gpu_s.get(node_id, 0.0) + used * runtime
            jobs = self.node_jobs.get(node_id)
            if jobs is not None:
                jobs.discard(job)
            node = self.store.get_node(node_id)
            if node is None or node.state is NodeState.TERMINATED:
                continue
            changes: dict = {"gpus_busy": max(node.gpus_busy - used, 0),
                             "running_jobs": len(jobs or ())}
            if not jobs:
                changes["idle_since"] = at(now)
                if node.state is NodeState.DRAINING:
                    changes["released"] = True  # the fabric releases a drained node at once
            self.store.set_usage(node_id, **changes)
            if not jobs and node.state is NodeState.READY and self.on_node_idle is not None:
                self.on_node_idle(node_id, now)
        job.burst_nodes = ()

    # -- burst nodes -----------------------------------------------------------------------------

    def node_ready(self, node: Node, now: float) -> None:
        """A burst node joined: it takes work from now on, and is idle until it gets some."""
        index = self._next_index
        self._next_index += 1
        self._burst_index[node.id] = index
        self._burst_ids[index] = node.id
        self.burst.add_node(index, node.gpus, node.offering_key)
        self.node_jobs.setdefault(node.id, set())
        self.store.set_usage(node.id, idle_since=at(now), gpus_busy=0, running_jobs=0)
        if self.on_node_idle is not None:
            self.on_node_idle(node.id, now)

    def _stop_offering(self, node_id: str) -> None:
        index = self._burst_index.pop(node_id, None)
        if index is not None:
            self.burst.remove_node(index)

    # Fabric port ---------------------------------------------------------------------------------

    def request_release(self, node: Node, deadline: datetime) -> None:
        self._stop_offering(node.id)
        if not self.node_jobs.get(node.id):
            self.store.set_usage(node.id, released=True)

    def is_released(self, node: Node) -> bool:
        return node.released

    def node_gone(self, node: Node, moment: datetime) -> int:
        """Hand a gone node's jobs back to the queue (they start again from the beginning)."""
        self._stop_offering(node.id)
        now = seconds(moment)
        jobs = sorted(self.node_jobs.pop(node.id, set()), key=lambda j: j.index)
        for job in jobs:
            if job.state != RUNNING:
                continue
            self.running_burst -= 1
            self._keep_checkpoint(job, now - job.start_s)
            job.restarts += 1
            self._leave_burst_nodes(job, now)
            job.attempt += 1
            job.start_s = None
            job.where = None
            self.requeued += 1
            self.arrive(job, now, eligible=True)
        return len(jobs)

    def _keep_checkpoint(self, job: SimJob, ran_s: float) -> None:
        """An attempt of ``ran_s`` seconds was cut short: keep its last checkpoint (whole
        intervals of compute past the restart overhead), count the rest as lost, and make the
        next attempt pay the restart overhead first (nothing kept: from the beginning, no
        overhead)."""
        computed = min(max(ran_s - job.stage_s - job.overhead_s, 0.0), job.remaining_s)
        job.stage_s = 0.0  # the next attempt stages again where it lands (burst), or not at all
        interval = job.checkpoint_s
        kept = math.floor(computed / interval) * interval if interval else 0.0
        job.max_loss_s = max(job.max_loss_s, computed - kept)
        job.lost_gpu_s += job.gpus * (ran_s - kept)
        if kept > 0 or (interval and job.remaining_s < job.trace.duration_s):
            job.remaining_s -= kept
            job.overhead_s = self.policy.spot.restart_overhead.total_seconds()
        if job.remaining_s < job.trace.duration_s:
            # The planner sees what is left to run (the queue reports the job's new time limit).
            job.domain = replace(job.domain, duration_s=job.run_s)

    # -- the planner's view ----------------------------------------------------------------------

    def queue(self) -> PoolQueue:
        """The pool's queue as a queue source reports it (pending jobs, on-prem capacity)."""
        if self._pending_tuple is None:
            self._pending_tuple = tuple(j.domain for j in self.pending.values())
        version, free = self._free_cache
        if version != self.onprem.version:
            free = self.onprem.free_per_node()
            self._free_cache = (self.onprem.version, free)
        onprem = OnPremState(self.onprem.total, self.onprem.free_total, free)
        version, releases = self._releases_cache
        if version != self.onprem.version:
            releases = tuple(r for per_job in self._releases.values() for r in per_job)
            self._releases_cache = (self.onprem.version, releases)
        return PoolQueue(self.pool_name, onprem, self._pending_tuple,
                         running_onprem_jobs=self.running_onprem,
                         running_burst_jobs=self.running_burst,
                         onprem_releases=releases)

    def running_on_burst(self) -> tuple[BurstRun, ...]:
        """The jobs running on burst nodes now, as the planner's snapshot carries them."""
        out = []
        for index, runs in self._open_runs.items():
            job = self.jobs[index]
            for run in runs:  # one per node the job runs on (its GPUs there)
                out.append(BurstRun(job.trace.job_id, run[0], run[1], run[2], at(run[3]),
                                    job.run_s))
        return tuple(out)

    def quiescent(self) -> bool:
        """Nothing pending and no burst node alive: a planner can have nothing to do."""
        return not self.pending and not self.store.live_nodes()
