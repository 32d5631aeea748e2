"""The simulated cluster: jobs, the on-prem pool and its scheduler, and the burst nodes' fabric.

Scheduling is priority then FIFO with backfill (:mod:`orchestrator.sim.onprem_fill`). On-prem is
always offered work first, and pending jobs that do not fit on-prem run on ready burst nodes (a
draining node takes no new work; :mod:`orchestrator.sim.burstfill`). On burst nodes what one job
may use is what the fabric can run (:mod:`orchestrator.sim.burstpool`): in a policy run whose
fabric is the built-in queue, one node; where the fabric spans nodes (Slurm, torch elastic),
whole free nodes of one offering for a job wider than one node, as the planner launches them (one
launch group); the baselines' burst nodes give a wide job any whole nodes. A job never mixes
on-prem and burst nodes.

The world is also the burst nodes' :class:`~orchestrator.domain.ports.Fabric`: a drain stops new
work and releases the node once it runs nothing; a node that is gone (a spot interruption) hands
its jobs back to the queue, as the built-in fabric's requeue does
(:meth:`orchestrator.fabric.builtin.BuiltinFabric.node_gone`). What a burst attempt stages first
and what a cut-short attempt keeps (its last checkpoint) is :mod:`orchestrator.sim.attempts`.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from decimal import Decimal
from itertools import chain

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.snapshot import BurstRun, OnPremRelease, OnPremState, PoolQueue
from orchestrator.planner.admission import Admission
from orchestrator.planner.backfill import BackfillConfig
from orchestrator.policy.models import Policy
from orchestrator.sim.attempts import keep_checkpoint, stage_attempt
from orchestrator.sim.burstfill import BurstFill
from orchestrator.sim.burstpool import BurstPool
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.onprem_fill import Backfill, OnPremFill
from orchestrator.sim.pendingcols import QueueColumns
from orchestrator.sim.pool import Allocation, GpuPool
from orchestrator.sim.simjob import (
    DEFAULT_PROJECT,
    DONE,
    EPOCH,
    PENDING,
    RUNNING,
    SimJob,
    at,
    seconds,
)
from orchestrator.sim.sparefill import SpareFill
from orchestrator.sim.traces import TraceJob

# (Re-exported: the engine, the replay, the benches and tests import these from here.)
__all__ = ["DEFAULT_PROJECT", "DONE", "EPOCH", "PENDING", "RUNNING", "Backfill", "SimJob", "World",
           "at", "seconds"]


class World(OnPremFill, BurstFill, SpareFill):
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
        self._columns = QueueColumns(self.pool_name, self.jobs)  # the planner's view of them
        self.changes = 0  # bumped when a job arrives, starts or ends (orchestrator.sim.idletick)
        self.pending_gpus = 0
        self._pending_tuple: Sequence[Job] | None = ()
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
        self._reserve_cache: tuple = (None, None)  # the last easy reservation (onprem_fill)
        # On-prem node -> the latest expected end of its runs (busy nodes only), kept as runs
        # start and end: when a wide job's reservation can have the node.
        self._last_end: dict[int, float] = {}
        self._wide_cache: tuple = (-1, [], [])  # on-prem nodes' free times (onprem_fill)
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
        # Set by a policy controller at every plan (trigger.spare_room, keep_spare): jobs kept
        # for on-prem, which start on burst nodes only where they lengthen a node's bill by
        # little (orchestrator.sim.sparefill), and when that plan was; how many times a kept job
        # was passed over for that.
        # (Set by the policy controller that plans with the rule: a baseline replayed on the
        # same policy's world keeps no job, so its dispatch is the plain one.)
        self.spare_on = False
        self.spare_kept: frozenset[str] = frozenset()
        self.spare_planned_at = -math.inf
        self.spare_passed_over = 0
        # Runs on burst nodes, for spend by work (whose job, on whose node, when):
        # [project, node id, GPUs, start s, end s or None]; open ones by job index.
        self.burst_runs: list[list] = []
        self._open_runs: dict[int, list[list]] = {}  # job index -> its runs (one per node)
        # The same open runs as the snapshot carries them, built once per start (a run's fields
        # do not change while it runs), and their tuple until a run starts or ends: the planner
        # reads them at every tick, and rebuilding them was a fifth of a replay.
        self._open_views: dict[int, list[BurstRun]] = {}
        self._runs_view: tuple[BurstRun, ...] | None = ()
        # Ready burst nodes launched for pending jobs (Node.launched_for): node index -> those jobs
        # still pending, in scheduling order; burst dispatch hands the node to them first
        # (orchestrator.sim.burstfill). Trace job ids -> jobs, to read the launch's ids.
        self._claims: dict[int, tuple[SimJob, ...]] = {}
        # trigger.onprem_order: the last plan's order of the jobs it kept for on-prem, as a heap
        # of the on-prem fill (orchestrator.sim.onprem_fill.OnPremFill.keep_onprem), and its ids
        self._order_heap: list = []
        self._order_ids: tuple[str, ...] = ()
        self._by_id: dict[str, SimJob] = {job.trace.job_id: job for job in self.jobs}
        self.claimed_starts = 0  # starts on a node launched for the job (the rest: oldest fits)

    # -- jobs ------------------------------------------------------------------------------------

    def arrive(self, job: SimJob, now: float, eligible: bool) -> None:
        self.changes += 1
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
                reserved = self._fill_launched_for(admission, now, started) if self._claims else ()
                if reserved:
                    self.burst.take(reserved)  # kept for a launch group still booting
                if admission is None and self.spare_on:
                    self._fill_sparing(now, started)
                elif admission is None:
                    self._fill(self.burst, self._burst_q, "burst", now, started)
                else:
                    self._fill_admitted(admission, now, started)
                if reserved:
                    self.burst.release(reserved)
        return started

    def _start(self, job: SimJob, alloc: Allocation, where: str, now: float) -> None:
        self.changes += 1
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
            last = self._last_end
            for index, used in alloc:
                self._node_runs[index][job.index] = (end, used)
                if end > last.get(index, -math.inf):
                    last[index] = end
            return
        self.running_burst += 1
        if job.burst_start_s is None:
            job.burst_start_s = now
        self._stage(job)
        ids = tuple(self._burst_ids[index] for index, _ in alloc)
        job.burst_nodes = ids
        started_at = at(now)
        run_s = job.run_s
        self._runs_view = None
        for (index, used), node_id in zip(alloc, ids):
            run = [job.domain.project, node_id, used, now, None]
            self.burst_runs.append(run)
            self._open_runs.setdefault(job.index, []).append(run)
            self._open_views.setdefault(job.index, []).append(
                BurstRun(job.trace.job_id, job.domain.project, node_id, used, started_at, run_s))
            jobs = self.node_jobs.setdefault(node_id, set())
            jobs.add(job)
            node = self.store.get_node(node_id)
            self.store.set_usage(node_id, gpus_busy=node.gpus_busy + used,
                                 running_jobs=len(jobs), idle_since=None)

    def _stage(self, job: SimJob) -> None:
        """Stage the burst attempt's data first (orchestrator.sim.attempts); tally its egress."""
        staging = stage_attempt(self.policy, job)
        if staging is None:
            return
        self.staging_s += staging.staging_s
        self.staged_gb += staging.dataset_gb
        self.egress_micros += round(Decimal(str(staging.egress_usd)) * 1_000_000)

    def finish(self, job: SimJob, attempt: int, now: float) -> bool:
        """A job's run ends; False for a stale end (the job was handed back meanwhile)."""
        if job.state != RUNNING or job.attempt != attempt:
            return False
        self.changes += 1
        job.state = DONE
        job.end_s = now
        self.finished += 1
        runtime = now - job.start_s
        if job.where == "onprem":
            self.running_onprem -= 1
            del self.onprem_running[job.index]
            self._releases.pop(job.index, None)
            last = self._last_end
            for index, _ in job.alloc:
                on_node = self._node_runs[index]
                ended = on_node.pop(job.index, None)
                if ended is not None and ended[0] >= last[index]:  # (its last run ended)
                    if on_node:
                        last[index] = max(end for end, _ in on_node.values())
                    else:
                        del last[index]
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
        if self._open_views.pop(job.index, None) is not None:
            self._runs_view = None
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
        claimed = [self._by_id[job_id] for job_id in node.launched_for if job_id in self._by_id]
        if claimed:
            self._claims[index] = tuple(sorted(claimed, key=lambda job: job.key))
        self.node_jobs.setdefault(node.id, set())
        self.store.set_usage(node.id, idle_since=at(now), gpus_busy=0, running_jobs=0)
        if self.on_node_idle is not None:
            self.on_node_idle(node.id, now)

    def _stop_offering(self, node_id: str) -> None:
        index = self._burst_index.pop(node_id, None)
        if index is not None:
            self.burst.remove_node(index)
            self._claims.pop(index, None)

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
            keep_checkpoint(job, now - job.start_s,
                            self.policy.spot.restart_overhead.total_seconds())
            # The queue reports how long the job ran before: its wait so far excludes it.
            job.domain = replace(job.domain, ran_s=job.domain.ran_s + now - job.start_s)
            self._columns.changed()  # (and keep_checkpoint's new time limit)
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
        if self._pending_tuple is None:  # as columns, as a queue source hands them over
            self._pending_tuple = self._columns.pending(self.pending)
        version, free = self._free_cache
        if version != self.onprem.version:
            free = self.onprem.free_per_node()
            self._free_cache = (self.onprem.version, free)
        onprem = OnPremState(self.onprem.total, self.onprem.free_total, free)
        version, releases = self._releases_cache
        if version != self.onprem.version:
            releases = tuple(chain.from_iterable(self._releases.values()))  # (C-level)
            self._releases_cache = (self.onprem.version, releases)
        return PoolQueue(self.pool_name, onprem, self._pending_tuple,
                         running_onprem_jobs=self.running_onprem,
                         running_burst_jobs=self.running_burst,
                         onprem_releases=releases)

    def running_on_burst(self) -> tuple[BurstRun, ...]:
        """The jobs running on burst nodes now, as the planner's snapshot carries them."""
        if self._runs_view is None:  # one per node each job runs on (its GPUs there)
            self._runs_view = tuple(run for runs in self._open_views.values() for run in runs)
        return self._runs_view

    def quiescent(self) -> bool:
        """Nothing pending and no burst node alive: a planner can have nothing to do."""
        return not self.pending and not self.store.live_nodes()
