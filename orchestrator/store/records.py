"""Full records of the built-in queue, richer than the planner's view of a job.

``domain.Job`` carries what the planner needs; a ``JobRecord`` also carries what running the job
needs (command, placement, node, times, attempts) and the version its compare-and-set writes use.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from orchestrator.domain.jobs import Job, JobState, Placement


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One row of the built-in queue (a copy; change it through the Store)."""

    id: str
    project: str
    pool: str
    gpus: int
    priority: int
    duration_s: float | None
    command: str | None
    state: JobState
    placement: Placement | None
    node_id: str | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    exit_code: int | None
    attempts: int = 0
    version: int = 0
    user: str | None = None  # who submitted it; None: not recorded (jobs queued before users were)

    def to_domain(self) -> Job:
        return Job(
            id=self.id,
            project=self.project,
            pool=self.pool,
            gpus=self.gpus,
            submitted_at=self.submitted_at,
            priority=self.priority,
            duration_s=self.duration_s,
            state=self.state,
            user=self.user,
        )
