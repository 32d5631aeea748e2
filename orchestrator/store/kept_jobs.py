"""The jobs each policy keeps for on-prem (``trigger.spare_room``), for the built-in queue.

The planner decides which queued jobs stay for on-prem (they are predicted to start there within
``wait_slo``); the built-in queue's claim runs in whichever process an agent asks for work, so the
executor writes each plan's list here (:meth:`KeptJobs.keep_onprem`) and the claim reads it
(:meth:`KeptJobs.kept_onprem`). A list replaces the last one for the policy in one transaction:
only the rows that change are deleted or added, so a steady queue writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

import sqlalchemy as sa

from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase

MAX_ID = 64  # (tables.STR_ID) a job id longer than a stored id cannot be a built-in job


class KeptJobs(StoreBase):
    """The kept-for-on-prem methods of the Store."""

    def keep_onprem(self, policy: str, job_ids: Iterable[str]) -> int:
        """Make ``job_ids`` the policy's kept jobs; returns how many rows changed."""
        want = {j for j in job_ids if len(j) <= MAX_ID}
        c = T.kept_onprem.c
        with self._write() as conn:
            have = {r[0] for r in conn.execute(sa.select(c.job_id).where(c.policy == policy))}
            gone = sorted(have - want)
            new = sorted(want - have)
            for start in range(0, len(gone), 500):
                conn.execute(sa.delete(T.kept_onprem).where(
                    c.policy == policy, c.job_id.in_(gone[start:start + 500])))
            if new:
                conn.execute(sa.insert(T.kept_onprem),
                             [{"policy": policy, "job_id": j} for j in new])
        return len(gone) + len(new)

    def kept_onprem(self, policy: str) -> frozenset[str]:
        """The jobs the policy's last plan kept for on-prem (none: an empty set)."""
        c = T.kept_onprem.c
        with self._read() as conn:
            return frozenset(r[0] for r in conn.execute(
                sa.select(c.job_id).where(c.policy == policy)))


__all__ = ["KeptJobs"]
