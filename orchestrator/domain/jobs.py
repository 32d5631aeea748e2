"""Jobs as the planner sees them: queued work with a GPU shape, a project, a user and a priority.

``project`` is who the GPUs are accounted to (quotas, budgets, the ledger); ``user`` is who
submitted the job. Either may be None: ``project`` None is a job of no project (a Slurm job with
neither account nor QOS), counted under its own ``null`` bucket, never under the user's name;
``user`` None is a job whose submitter is not known (recorded before burst kept users, or a queue
that does not say).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

#: How tables and texts name the bucket of jobs of no project (JSON says ``null``).
NO_PROJECT_LABEL = "(no project)"
#: How tables and texts name the bucket of jobs of no known user (JSON says ``null``).
NO_USER_LABEL = "(no user)"

# A user name as burst records it: what POSIX, Slurm and most identity providers allow (an e-mail
# address too), at most 128 characters; no whitespace or commas (API filters are comma lists).
USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@+-]{0,127}$")


def check_user(name: str) -> str:
    """``name`` if it is a user name, else ValueError saying what one is."""
    if not isinstance(name, str) or not USER_RE.match(name):
        raise ValueError(f"{name!r} is not a user name (letters, digits, '.', '_', '@', '+', "
                         "'-'; at most 128 characters)")
    return name


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
    the policy's default for its project); ``dataset_gb`` the GB of data a burst must stage
    for it (its annotation; None: its project's or pool's ``storage``); ``ran_s`` how long it
    ran in earlier attempts (a job requeued after its node went away; 0 where the queue does not
    say), so that its wait so far is ``now - submitted_at - ran_s``."""

    id: str
    project: str | None
    pool: str
    gpus: int
    submitted_at: datetime
    priority: int = 0
    duration_s: float | None = None
    state: JobState = JobState.PENDING
    checkpoint_s: float | None = None
    user: str | None = None
    dataset_gb: float | None = None
    ran_s: float = 0.0
