"""The simulated cluster: jobs, the on-prem pool and its scheduler, and the burst nodes' fabric.

Scheduling is the built-in queue's (:mod:`orchestrator.sources.builtin`): priority then FIFO with
backfill. Jobs are taken in the planner's scheduling order (project priority, job priority, submit
time; :func:`orchestrator.planner.demand.scheduling_order`), a job that does not fit is skipped
rather than blocking smaller ones, on-prem is always offered work first, and pending jobs that do
not fit on-prem run on ready burst nodes (a draining node takes no new work). Multi-GPU jobs need
GPUs of one node; jobs wider than a node need whole nodes (:mod:`orchestrator.sim.pool`).

Doing that scan job by job would cost O(queue) per event. Because whether a job fits depends only
on its width, the first job (in scheduling order) that fits is the best head of the per-width
queues whose width fits; repeating that gives exactly the scan's result, in O(widths) per start.

The world is also the burst nodes' :class:`~orchestrator.domain.ports.Fabric`: a drain stops new
work and releases the node once it runs nothing; a node that is gone hands its jobs back to the
queue (they restart from the beginning: the simulator assumes no checkpoint).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.snapshot import OnPremRelease, OnPremState, PoolQueue
from orchestrator.policy.models import Policy
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.pool import Allocation, GpuPool
from orchestrator.sim.traces import TraceJob

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)  # virtual time zero
DEFAULT_PROJECT = "default"

PENDING, RUNNING, DONE = 0, 1, 2


def at(seconds: float) -> datetime:
    """Virtual seconds as the timezone-aware time the planner and executor see."""
    return EPOCH + timedelta(seconds=seconds)


def seconds(moment: datetime) -> float:
    return (moment - EPOCH).total_seconds()


class SimJob:
    """A trace job as it moves through the simulated cluster."""

    __slots__ = ("index", "trace", "gpus", "key", "state", "pending_since", "wait_s", "start_s",
                 "end_s", "where", "alloc", "attempt", "domain", "eligible", "burst_nodes",
                 "lost_gpu_s", "restarts")

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


class World:
    """Jobs, the on-prem pool, the ready burst nodes, and the fabric port over them."""

    name = "sim"

    def __init__(self, policy: Policy, trace: tuple[TraceJob, ...], onprem_nodes: int,
                 gpus_per_node: int, store: SimStore):
        self.policy = policy
        self.pool_name = policy.pool.name
        self.store = store
        self.onprem = GpuPool.uniform(onprem_nodes, gpus_per_node)
        self.burst = GpuPool()  # ready burst nodes that take work (not draining)
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
                         submitted_at=submitted, priority=t.priority, duration_s=t.duration_s)
            # The planner's scheduling order (orchestrator.planner.demand.scheduling_order).
            key = (-priorities.get(project, default), -t.priority, t.submit_s, t.job_id)
            self.jobs.append(SimJob(index, t, key, domain))
        self.pending: dict[int, SimJob] = {}
        self.pending_gpus = 0
        self._pending_tuple: tuple[Job, ...] | None = ()
        self._all: dict[int, list] = {}  # width -> heap of (key, attempt, job): every pending job
        self._burst_q: dict[int, list] = {}  # width -> heap: pending jobs allowed on burst nodes
        self.running_onprem = 0
        self.running_burst = 0
        self.onprem_running: dict[int, SimJob] = {}  # jobs running on-prem, by index
        self.finished = 0
        self.started: list[SimJob] = []  # filled by dispatch; the engine schedules their ends
        self._free_cache: tuple[int, tuple[int, ...]] = (-1, ())
        # Expected end of each on-prem running job (start + its duration, the trace's "time
        # limit"), for the wait-aware rule; kept per job so a snapshot only gathers them.
        self._releases: dict[int, OnPremRelease] = {}
        self._releases_cache: tuple[int, tuple[OnPremRelease, ...]] = (-1, ())
        # Set by the engine: called when a burst node becomes idle (baselines time scale-down).
        self.on_node_idle: Callable[[str, float], None] | None = None
        self.onprem_gpu_s = 0.0
        self.burst_gpu_s = 0.0
        self.requeued = 0  # jobs handed back to the queue by a node that went away

    # -- jobs ------------------------------------------------------------------------------------

    def arrive(self, job: SimJob, now: float, eligible: bool) -> None:
        job.state = PENDING
        job.pending_since = now
        self.pending[job.index] = job
        self.pending_gpus += job.gpus
        self._pending_tuple = None
        entry = (job.key, job.attempt, job)
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
        if self.pending:
            if self.onprem.free_total:
                self._fill(self.onprem, self._all, "onprem", now, started)
            if self.burst.free_total and self._burst_q:
                self._fill(self.burst, self._burst_q, "burst", now, started)
        return started

    def _fill(self, pool: GpuPool, queues: dict[int, list], where: str, now: float,
              started: list[SimJob]) -> None:
        while pool.free_total:
            best = None
            for width, heap in queues.items():
                while heap and (heap[0][2].state != PENDING or heap[0][1] != heap[0][2].attempt):
                    heapq.heappop(heap)  # started, or requeued with a newer entry
                if heap and (best is None or heap[0][0] < best[0]) and pool.fits(width):
                    best = heap[0]
            if best is None:
                return
            job = best[2]
            heapq.heappop(queues[job.gpus])
            self._start(job, pool.place(job.gpus), where, now)
            started.append(job)

    def _start(self, job: SimJob, alloc: Allocation, where: str, now: float) -> None:
        job.state = RUNNING
        job.wait_s += now - job.pending_since
        job.start_s = now
        job.where = where
        job.alloc = alloc
        del self.pending[job.index]
        self.pending_gpus -= job.gpus
        self._pending_tuple = None
        if where == "onprem":
            self.running_onprem += 1
            self.onprem_running[job.index] = job
            self._releases[job.index] = OnPremRelease(job.gpus, at(now + job.trace.duration_s))
            return
        self.running_burst += 1
        ids = tuple(self._burst_ids[index] for index, _ in alloc)
        job.burst_nodes = ids
        for (index, used), node_id in zip(alloc, ids):
            jobs = self.node_jobs.setdefault(node_id, set())
            jobs.add(job)
            node = self.store.get_node(node_id)
            self.store.set_usage(node_id, gpus_busy=node.gpus_busy + used,
                                 running_jobs=len(jobs), idle_since=None)

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
            self.onprem.release(job.alloc)
            self.onprem_gpu_s += job.gpus * runtime
        else:
            self.running_burst -= 1
            self.burst_gpu_s += job.gpus * runtime
            self._leave_burst_nodes(job, now)
        return True

    def _leave_burst_nodes(self, job: SimJob, now: float) -> None:
        runtime = now - job.start_s
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
        self.burst.add_node(index, node.gpus)
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
            job.lost_gpu_s += job.gpus * (now - job.start_s)
            job.restarts += 1
            self._leave_burst_nodes(job, now)
            job.attempt += 1
            job.start_s = None
            job.where = None
            self.requeued += 1
            self.arrive(job, now, eligible=True)
        return len(jobs)

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
            releases = tuple(self._releases.values())
            self._releases_cache = (self.onprem.version, releases)
        return PoolQueue(self.pool_name, onprem, self._pending_tuple,
                         running_onprem_jobs=self.running_onprem,
                         running_burst_jobs=self.running_burst,
                         onprem_releases=releases)

    def quiescent(self) -> bool:
        """Nothing pending and no burst node alive: a planner can have nothing to do."""
        return not self.pending and not self.store.live_nodes()
