"""A trace job as it moves through the simulated cluster, and the simulator's virtual clock.

:class:`SimJob` is the mutable record the world (:mod:`orchestrator.sim.world`) and its fills keep
per trace job: its state, where and since when it runs, what a cut-short attempt kept
(:mod:`orchestrator.sim.attempts`). Virtual seconds count from :data:`EPOCH`; :func:`at` turns
them into the timezone-aware times the planner and executor see.
"""

from __future__ import annotations

import heapq
from datetime import UTC, datetime, timedelta

from orchestrator.domain.jobs import Job
from orchestrator.sim.pool import Allocation
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


def live_head(heap: list) -> tuple | None:
    """The first live entry of a per-width queue, dropping stale ones (jobs started since, or
    requeued with a newer entry)."""
    while heap and (heap[0][2].state != PENDING or heap[0][1] != heap[0][2].attempt):
        heapq.heappop(heap)
    return heap[0] if heap else None
