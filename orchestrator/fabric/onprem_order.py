"""Slurm: start the jobs burst keeps for on-prem in the order it kept them
(``trigger.onprem_order: longest-first``).

The wait-aware rule decides which queued jobs stay for on-prem and in which order they should
start there (:attr:`orchestrator.domain.plan.Decision.onprem_order`, longest first). Left to
itself Slurm would start them by its own priority (oldest first under ``priority/basic``): a
short job ahead would take the GPUs the long one was kept for, the long one would miss its SLO
and go to the cloud after all, and both bills would be paid. So burst raises the kept jobs'
priority with a negative ``nice`` (an operator's adjustment that every priority plugin honours,
``priority/basic`` included): the k-th of n kept jobs gets the priority ``top + n - k``, where
``top`` is the highest priority among the partition's pending jobs without any nice, so the kept
jobs come first, in the planner's order, and Slurm's backfill reserves for them in that order.

A new order replaces the last one: a job raised before and no longer listed (it became due for
the cloud, say) gets its nice back to 0. An empty order changes nothing (the planner kept no job
this tick; what it raised before stays raised until those jobs start). Only the jobs whose nice
must change are updated (one ``scontrol update`` each). A job array's tasks share its nice (the
order names the array's id once, at its first task). Which jobs burst raised is kept in memory:
after a controller restart, jobs raised before it keep their nice until they start or a new
order lists them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

log = logging.getLogger(__name__)

_NICE_WRAP = 1 << 32  # squeue --json reports a negative nice as its unsigned 32-bit value


def signed_nice(value: Any) -> int:
    """A job's nice as squeue --json reports it (None, or a negative one wrapped), signed."""
    if not isinstance(value, int):
        return 0
    return value - _NICE_WRAP if value >= 1 << 31 else value


def base_id(job_id: str) -> str:
    """The Slurm job id an order's id names (an array task's ``<id>_<index>``: the array)."""
    return job_id.split("_", 1)[0]


def nice_values(pending: Mapping[str, Mapping[str, Any]], order: Iterable[str],
                raised: Iterable[str] = ()) -> dict[str, int]:
    """The nice each job must be given (only those that change): ``pending`` maps the
    partition's pending job ids to their squeue records, ``order`` the kept jobs' ids (first to
    start first), ``raised`` the jobs raised by the last order (set back to 0 if not listed)."""
    listed: list[str] = []
    seen: set[str] = set()
    for job_id in order:
        key = base_id(job_id)
        if key in pending and key not in seen:
            seen.add(key)
            listed.append(key)
    if not listed:
        return {}

    def plain(record: Mapping[str, Any]) -> int:  # its priority without any nice
        return int(record.get("priority") or 0) + signed_nice(record.get("nice"))

    top = max(plain(record) for record in pending.values())
    count = len(listed)
    out: dict[str, int] = {}
    for rank, key in enumerate(listed):
        record = pending[key]
        want = plain(record) - (top + count - rank)  # priority = plain - nice = top + n - rank
        if signed_nice(record.get("nice")) != want:
            out[key] = want
    for key in raised:
        if key not in seen and key in pending and signed_nice(pending[key].get("nice")) != 0:
            out[key] = 0
    return out


__all__ = ["base_id", "nice_values", "signed_nice"]
