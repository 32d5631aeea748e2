"""The reads behind the usage report (``burst report --usage``, ``GET /v1/usage``,
:mod:`orchestrator.costs.usage_report`): allocation and cost per group and job from the cost
ledger, and the queue waits of the built-in queue's jobs.

* :meth:`UsageReads.allocation_by_job`: GPU-seconds and micro-dollars of the ledger's lines whose
  hour bucket starts in the window, grouped by the report's keys, the job and whether the line is
  on-prem work (SQL ``GROUP BY``); idle and minimum lines (no job) carry cost, not allocation;
* :meth:`UsageReads.job_starts`: per job of the built-in queue started in the window, its keys
  (user, project, pool, provider: ``onprem`` or its burst node's, day: the UTC date it started)
  and its queue wait. Jobs of other queues (Slurm) have no submit time here: they are not in it.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from orchestrator.domain.costs import ONPREM_PROVIDER, CostKind
from orchestrator.store import tables as T
from orchestrator.store.base import StoreBase, require_aware
from orchestrator.store.ledger import GROUP_COLUMNS, _window

USAGE_KEYS = ("user", "project", "provider", "pool", "day")  # what the usage report groups by
_c = T.cost_lines.c


@dataclass(frozen=True, slots=True)
class JobAllocation:
    """Ledger sums of one group and job (``job_id`` None: idle and minimum lines)."""

    keys: tuple[str | None, ...]
    job_id: str | None
    onprem: bool
    gpu_seconds: float
    cost_micros: int


@dataclass(frozen=True, slots=True)
class JobStart:
    """A started job of the built-in queue, by the usage report's keys."""

    job_id: str
    keys: tuple[str | None, ...]
    wait_s: float


class UsageReads(StoreBase):
    """Usage-report reads of the Store."""

    def allocation_by_job(self, group_by: Sequence[str], *, since: datetime | None = None,
                          until: datetime | None = None, projects: Collection[str] | None = None,
                          users: Collection[str] | None = None, pool: str | None = None
                          ) -> list[JobAllocation]:
        if (projects is not None and not projects) or (users is not None and not users):
            return []
        onprem = _c.kind == CostKind.ONPREM.value
        usage = _c.kind.in_([CostKind.USAGE.value, CostKind.ONPREM.value])
        keys = [GROUP_COLUMNS[k].label(f"k{i}") for i, k in enumerate(group_by)]
        flag = sa.case((onprem, 1), else_=0).label("onprem")
        query = sa.select(
            *keys, _c.job_id.label("job"), flag,
            sa.func.sum(sa.case((usage, _c.gpu_seconds), else_=0.0)).label("gpu_s"),
            sa.func.sum(_c.cost_micros).label("cost"))
        query = _window(query, since, until, projects, pool)
        if users is not None:
            query = query.where(_c.user.in_(sorted(users)))
        width = len(keys) + 2
        query = query.group_by(*[sa.literal_column(str(i + 1)) for i in range(width)])
        with self._read() as conn:
            rows = conn.execute(query).all()
        return [JobAllocation(tuple(None if r[i] is None else str(r[i]) for i in range(len(keys))),
                              r.job, bool(r.onprem), float(r.gpu_s or 0.0), int(r.cost or 0))
                for r in rows]

    def job_starts(self, group_by: Sequence[str], *, since: datetime | None = None,
                   until: datetime | None = None, projects: Collection[str] | None = None,
                   users: Collection[str] | None = None, pool: str | None = None
                   ) -> list[JobStart]:
        if (projects is not None and not projects) or (users is not None and not users):
            return []
        j, n = T.jobs.c, T.nodes.c
        query = (sa.select(j.id, j.user, j.project, j.pool, j.placement, j.submitted_at,
                           j.started_at, n.provider)
                 .select_from(T.jobs.outerjoin(T.nodes, n.id == j.node_id))
                 .where(j.started_at.is_not(None)))
        if since is not None:
            query = query.where(j.started_at >= require_aware(since, "since"))
        if until is not None:
            query = query.where(j.started_at < require_aware(until, "until"))
        if projects is not None:
            query = query.where(j.project.in_(sorted(projects)))
        if users is not None:
            query = query.where(j.user.in_(sorted(users)))
        if pool is not None:
            query = query.where(j.pool == pool)
        out = []
        with self._read() as conn:
            for r in conn.execute(query):
                values: dict[str, Any] = {
                    "user": r.user, "project": r.project, "pool": r.pool,
                    "provider": ONPREM_PROVIDER if r.placement != "burst" else (r.provider or "-"),
                    "day": r.started_at.date().isoformat(),
                }
                wait = max((r.started_at - r.submitted_at).total_seconds(), 0.0)
                out.append(JobStart(r.id, tuple(values[k] for k in group_by), wait))
        return out


__all__ = ["USAGE_KEYS", "JobAllocation", "JobStart", "UsageReads"]
