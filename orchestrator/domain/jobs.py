"""Jobs as the planner sees them: queued work with a GPU shape, a project and a priority."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum


class JobState(StrEnum):
    """Life of a job in a queue."""

    PENDING = "pending"  # waiting for GPUs
    RUNNING = "running"  # placed on-prem or on a burst node
    DONE = "done"  # finished successfully
    FAILED = "failed"  # finished with an error
    CANCELLED = "cancelled"  # withdrawn by a user


class Placement(StrEnum):
    """Where a job ran."""

    ONPREM = "onprem"
    BURST = "burst"


@dataclass(frozen=True, slots=True)
class Job:
    """A unit of queued work. ``duration_s`` is the expected runtime (time limit), if known;
    ``checkpoint_s`` how often it saves a checkpoint it can resume from (its annotation; None:
    the policy's default for its project)."""

    id: str
    project: str
    pool: str
    gpus: int
    submitted_at: datetime
    priority: int = 0
    duration_s: float | None = None
    state: JobState = JobState.PENDING
    checkpoint_s: float | None = None
