"""Cost, budget and return routes: ``GET /v1/costs``, ``GET /v1/budgets`` and ``GET /v1/roi``.

Both read what the cost ledger holds (:mod:`orchestrator.costs.report`,
:mod:`orchestrator.costs.budgets`); neither computes money itself. Scoping:

* ``/v1/costs``: the ledger lines are filtered to the caller's projects *before* they are grouped
  and summed, so a project token's rows and total are its own projects' spend only, whatever the
  grouping (a ``group_by=provider`` report of a viewer is its projects' spend per provider; a
  ``group_by=user`` one lists the users of its projects only). ``user`` narrows to those users'
  lines within that scope: an unknown user is an empty report.
* ``/v1/budgets``: a project token sees the budgets of its projects; pool-wide budgets (no
  project) add up every project's spend, so only admins see them.

* ``/v1/usage``: GPU-hours allocated and measurably used per user, project, provider, pool or
  day (:mod:`orchestrator.costs.usage_report`), filtered to the caller's projects first;
* ``/v1/roi``: the return on burst spend per project and month (:mod:`orchestrator.costs.roi`),
  filtered to the caller's projects like ``/v1/costs``.

``/v1/costs``, ``/v1/usage`` and ``/v1/roi`` answer JSON, or CSV (``text/csv``) when the request's ``Accept``
prefers it or ``format=csv`` asks for it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from orchestrator.api.auth import Caller, invalid, parse_projects, parse_users, project_scope
from orchestrator.api.one_hop import OneHopRoute
from orchestrator.api.v1 import NAME_PATTERN, NameQuery, ProjectQuery, UserQuery, iso, parse_time
from orchestrator.wiring import Runtime

DEFAULT_GROUP_BY = "project"
CSV = "text/csv"


def month_start(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def wants_csv(request: Request) -> bool:
    """Does the ``Accept`` header prefer CSV to JSON (q-values honoured, JSON on a tie)?"""
    best: dict[str, float] = {}
    for part in request.headers.get("accept", "").split(","):
        media, *params = [p.strip() for p in part.split(";")]
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        media = media.lower()
        best[media] = max(best.get(media, 0.0), quality)
    csv = best.get(CSV, 0.0)
    json = max(best.get("application/json", 0.0), best.get("*/*", 0.0),
               best.get("application/*", 0.0))
    return csv > 0 and csv > json


def router(runtime: Runtime) -> APIRouter:
    api = APIRouter(prefix="/v1", tags=["costs"], route_class=OneHopRoute)

    @api.get("/costs", responses={200: {"content": {"application/json": {}, CSV: {}},
                                        "description": "The report, JSON or CSV."}})
    def costs(
        request: Request,
        token: Caller,
        since: Annotated[str | None, Query(alias="from", description="Start: ISO 8601 with a timezone, a date (UTC midnight) or a span back from now (7d); default: the start of this month, UTC.")] = None,
        until: Annotated[str | None, Query(alias="to", description="End: ISO 8601 with a timezone, a date (UTC midnight) or a span back from now (30m); default: now.")] = None,
        group_by: Annotated[str, Query(description="Comma-separated keys: project, pool, policy, provider, region, instance_type, market, node, job, kind, day, user.", max_length=200)] = DEFAULT_GROUP_BY,
        project: ProjectQuery = None,
        pool: NameQuery = None,
        user: UserQuery = None,
    ) -> Any:
        """Spend from the cost ledger between ``from`` and ``to``, grouped (viewers: their
        projects only)."""
        from orchestrator.costs.report import CostQuery, cost_report, parse_group_by

        scope = project_scope(token, parse_projects(project))
        users = parse_users(user)
        now = runtime.clock.now()
        end = parse_time(until, "to", now) if until is not None else now
        start = parse_time(since, "from", now) if since is not None else month_start(end)
        if since is None and start >= end:
            start = end - timedelta(days=1)  # "to" is the first instant of a month
        if start >= end:
            raise invalid("from", f"{iso(start)} must be before to ({iso(end)})")
        try:
            keys = parse_group_by(group_by)
        except ValueError as exc:
            raise invalid("group_by", str(exc)) from None
        report = cost_report(runtime.store, CostQuery(since=start, until=end, group_by=keys,
                                                      projects=scope, pool=pool, users=users))
        if wants_csv(request):
            return Response(report.as_csv(), media_type=f"{CSV}; charset=utf-8")
        return report.as_json()

    @api.get("/roi", responses={200: {"content": {"application/json": {}, CSV: {}},
                                      "description": "The return on burst spend, JSON or CSV."}})
    def roi(
        request: Request,
        token: Caller,
        since: Annotated[str | None, Query(alias="from", description="Start: ISO 8601 with a timezone, a date (UTC midnight) or a span back from now (90d); default: the start of this year, UTC.")] = None,
        until: Annotated[str | None, Query(alias="to", description="End: ISO 8601 with a timezone, a date or a span back from now; default: now.")] = None,
        project: ProjectQuery = None,
        format: Annotated[str | None, Query(pattern="^(json|csv)$", description="json or csv (default: by the Accept header).")] = None,
    ) -> Any:
        """Per project and month: burst spend, GPU-hours burst, researcher-hours of waiting
        avoided and dollars per hour avoided (viewers: their projects only)."""
        from orchestrator.costs.roi import roi_report

        scope = project_scope(token, parse_projects(project))
        now = runtime.clock.now()
        end = parse_time(until, "to", now) if until is not None else now
        start = (parse_time(since, "from", now) if since is not None
                 else month_start(end).replace(month=1))
        if start >= end:
            raise invalid("from", f"{iso(start)} must be before to ({iso(end)})")
        report = roi_report(runtime.store, since=start, until=end, projects=scope)
        if format == "csv" or (format is None and wants_csv(request)):
            return Response(report.as_csv(), media_type=f"{CSV}; charset=utf-8")
        return report.as_json()

    @api.get("/usage", responses={200: {"content": {"application/json": {}, CSV: {}},
                                        "description": "The usage report, JSON or CSV."}})
    def usage(
        request: Request,
        token: Caller,
        since: Annotated[str | None, Query(alias="from", description="Start: ISO 8601 with a timezone, a date (UTC midnight) or a span back from now (7d); default: the start of this month, UTC.")] = None,
        until: Annotated[str | None, Query(alias="to", description="End: as from; default: now.")] = None,
        group_by: Annotated[str, Query(description="Comma-separated keys: user, project, provider, pool, day.", max_length=200)] = DEFAULT_GROUP_BY,
        project: ProjectQuery = None,
        user: UserQuery = None,
        pool: NameQuery = None,
        format: Annotated[str | None, Query(pattern="^(json|csv)$", description="json or csv (default: by the Accept header).")] = None,
    ) -> Any:
        """GPU-hours allocated and measurably used, on-prem and burst, cost, queue wait and jobs
        per group (viewers: their projects only)."""
        from orchestrator.costs.usage_report import parse_usage_group_by, usage_report

        scope = project_scope(token, parse_projects(project))
        now = runtime.clock.now()
        end = parse_time(until, "to", now) if until is not None else now
        start = parse_time(since, "from", now) if since is not None else month_start(end)
        if since is None and start >= end:
            start = end - timedelta(days=1)
        if start >= end:
            raise invalid("from", f"{iso(start)} must be before to ({iso(end)})")
        try:
            keys = parse_usage_group_by(group_by)
        except ValueError as exc:
            raise invalid("group_by", str(exc)) from None
        report = usage_report(runtime.store, keys, since=start, until=end, projects=scope,
                              users=parse_users(user), pool=pool)
        if format == "csv" or (format is None and wants_csv(request)):
            return Response(report.as_csv(), media_type=f"{CSV}; charset=utf-8")
        return report.as_json()

    @api.get("/budgets")
    def budgets(
        token: Caller,
        project: ProjectQuery = None,
        policy: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)] = None,
    ) -> dict[str, Any]:
        """Every budget of the running policies: spent, committed, remaining, forecast to the
        window's end and grade (project tokens: their projects' budgets only)."""
        from orchestrator.costs.budgets import budget_statuses

        scope = project_scope(token, parse_projects(project))
        now = runtime.clock.now()
        statuses = budget_statuses(runtime.store, list(runtime.policies.values()), now)
        # A pool-wide budget (project None) is in no project scope: admins see it when they ask
        # for no project in particular.
        shown = [s for s in statuses
                 if (policy is None or s.policy == policy)
                 and (scope is None or s.project in scope)]
        return {"at": iso(now), "budgets": [s.as_json() for s in shown]}

    return api


__all__ = ["month_start", "router", "wants_csv"]
