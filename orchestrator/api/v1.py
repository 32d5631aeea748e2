"""Read and submit routes of the API: nodes, decisions, the built-in queue, job submission.

Every route needs a bearer token (:mod:`orchestrator.api.auth`) and answers only within the
token's projects:

* ``GET /v1/nodes``: burst nodes, scoped by the project whose demand launched each node; nodes of
  no project (``min_nodes``, pre-warm) are listed to admins only.
* ``GET /v1/decisions`` and ``/v1/decisions/{id}``: admin only. A decision is pool-level: its
  inputs and summary carry every project's pending GPUs and the pool's spend, which a redaction
  could not make safe without emptying it, so project tokens get 403.
* ``GET /v1/queue``: pending and running jobs of the caller's projects, with their wait, and
  per-pool depth and wait computed over those jobs only.
* ``POST /v1/jobs``: a submitter (for its projects) or an admin queues a job, validated like
  ``burst submit``. The job's user is the token's subject (``burst token create --user``); a
  body's ``user`` must be that subject unless the token is an admin's (403 naming ``user``). A list of up to
  ``MAX_API_BATCH`` jobs is queued in one transaction (all or none; the Idempotency-Key then covers
  the whole list; a longer list is a 413).
* ``DELETE /v1/jobs/{id}``: the same roles cancel a pending or running job (``burst cancel``).
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Path, Query, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from orchestrator.api.auth import (
    Caller,
    invalid,
    parse_projects,
    parse_users,
    project_scope,
    require_role,
)
from orchestrator.api.one_hop import OneHopRoute
from orchestrator.api.problems import Problem
from orchestrator.api.usage_metrics import job_flagged, node_flagged
from orchestrator.domain.jobs import USER_RE, JobState
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.snapshot_json import decision_to_jsonable
from orchestrator.policy import bounds, parse_duration
from orchestrator.policy.timefmt import EARLIEST, LATEST, TimeFormatError, parse_aware, parse_when
from orchestrator.store.bulk import BatchExists, JobSpec
from orchestrator.store.jobqueue import JobExists, JobIdConflict
from orchestrator.store.records import JobRecord
from orchestrator.store.tokens import PROJECT_RE, ApiToken, Role
from orchestrator.store.usage import JobUtilisation
from orchestrator.wiring import Runtime

# Pool, policy and provider names in queries: policies name them with lower-case letters, digits
# and '-'; a little more is accepted so an odd name is a miss, not an error.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:-]{0,127}$"
NameQuery = Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=128)]
ProjectQuery = Annotated[list[str] | None, Query(
    description="Only these projects (repeat the parameter or comma-separate); a project "
                "outside the token's scope is refused with 403.")]
UserQuery = Annotated[list[str] | None, Query(
    description="Only these users' jobs (repeat the parameter or comma-separate); within the "
                "token's projects, so a user unknown there is an empty answer, not an error.")]
MAX_PRIORITY = bounds.MAX_PRIORITY
MAX_GPUS = bounds.MAX_JOB_GPUS
MAX_COMMAND = 10_000
MAX_API_BATCH = 1_000  # jobs per POST /v1/jobs list (the 1 MiB body limit holds ~10k small ones)


def iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


class QueueState(StrEnum):
    """The job states ``GET /v1/queue`` lists."""

    PENDING = "pending"
    RUNNING = "running"


# -- response and request models ------------------------------------------------------------------


class NodeOut(BaseModel):
    id: str
    policy: str
    pool: str
    project: str | None
    provider: str
    offering: str
    instance_type: str
    market: str
    gpus: int
    gpus_busy: int
    price_usd_hour: float
    state: NodeState
    state_since: str
    created_at: str
    age_s: float
    instance_id: str | None
    gpu_utilisation_percent: float | None = Field(
        default=None, description="Mean measured GPU utilisation of its last reading (the GPUs "
        "jobs hold, else all); null: unknown (nothing measurable), never 0.")
    low_utilisation_since: str | None = Field(
        default=None, description="Since when its jobs' GPUs sit under "
        "utilisation.idle_below_percent (null: not low, or unknown).")
    low_utilisation: bool = Field(
        default=False, description="Flagged: under the threshold for utilisation.idle_for.")

    @classmethod
    def of(cls, node: Node, now: datetime, gpus_busy: int | None = None,
           flagged: bool = False) -> NodeOut:
        return cls(
            id=node.id, policy=node.policy, pool=node.pool, project=node.project,
            provider=node.provider, offering=node.offering_key, instance_type=node.instance_type,
            market=str(node.market), gpus=node.gpus,
            gpus_busy=node.gpus_busy if gpus_busy is None else gpus_busy,
            price_usd_hour=node.price_usd_hour, state=node.state,
            state_since=iso(node.state_since) or "", created_at=iso(node.created_at) or "",
            age_s=round((now - node.created_at).total_seconds(), 1), instance_id=node.instance_id,
            gpu_utilisation_percent=node.gpu_utilisation_percent,
            low_utilisation_since=iso(node.low_utilisation_since), low_utilisation=flagged,
        )


class NodesOut(BaseModel):
    at: str
    nodes: list[NodeOut]


class JobOut(BaseModel):
    id: str
    project: str
    user: str | None = Field(description="Who submitted it (null: not known).")
    pool: str
    gpus: int
    priority: int
    duration_s: float | None
    command: str | None
    state: JobState
    placement: str | None
    node_id: str | None
    submitted_at: str
    started_at: str | None
    finished_at: str | None = Field(default=None, description="When it finished or was cancelled.")
    wait_s: float = Field(description="Seconds waited: until now while pending, until the start "
                                      "once running (until the cancel if cancelled unstarted).")
    gpu_utilisation_percent: float | None = Field(
        default=None, description="Time-weighted mean measured utilisation of its GPUs so far; "
        "null: unknown (not measured), never 0.")
    measured_gpu_s: float | None = Field(
        default=None, description="GPU-seconds of it that were measured (null: no reading).")
    low_utilisation: bool = Field(
        default=False, description="Running, its GPUs measured under "
        "utilisation.idle_below_percent for utilisation.idle_for.")

    @classmethod
    def of(cls, job: JobRecord, now: datetime, use: JobUtilisation | None = None,
           flagged: bool = False) -> JobOut:
        return cls(
            id=job.id, project=job.project, user=job.user, pool=job.pool, gpus=job.gpus,
            priority=job.priority,
            duration_s=job.duration_s, command=job.command, state=job.state,
            placement=str(job.placement) if job.placement is not None else None,
            node_id=job.node_id, submitted_at=iso(job.submitted_at) or "",
            started_at=iso(job.started_at), finished_at=iso(job.finished_at),
            wait_s=_wait(job, now),
            gpu_utilisation_percent=use.mean_utilisation_percent if use else None,
            measured_gpu_s=round(use.measured_gpu_s, 1) if use else None,
            low_utilisation=flagged,
        )


class PoolQueueOut(BaseModel):
    pool: str
    pending_jobs: int
    pending_gpus: int
    running_jobs: int
    oldest_wait_s: float
    mean_wait_s: float


class QueueOut(BaseModel):
    at: str
    pools: list[PoolQueueOut]
    jobs: list[JobOut]


class JobIn(BaseModel):
    """A job for the built-in queue (the fields of ``burst submit``)."""

    model_config = ConfigDict(extra="forbid", strict=True)  # "gpus": "1" or true is a 422

    project: str = Field(pattern=PROJECT_RE.pattern, description="Project the job belongs to.")
    gpus: int = Field(ge=1, le=MAX_GPUS, description="GPUs the job needs.")
    duration: str = Field(max_length=32, description="Expected runtime, e.g. 10m or 1h30m.",
                          examples=["30m"])
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY,
                          description="Higher runs first.")
    command: str | None = Field(default=None, max_length=MAX_COMMAND,
                                description="Shell command (default: sleep for the duration).")
    pool: str | None = Field(default=None, pattern=NAME_PATTERN,
                             description="Pool (default: the first running policy's pool).")
    user: str | None = Field(default=None, pattern=USER_RE.pattern, max_length=128,
                             description="Who the job is for (default: the token's user). Only "
                                         "an admin's token may name another user than its own.")

    @field_validator("duration")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)  # ValueError: a 422 naming body.duration
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("must not contain NUL characters")
        return value


# -- routes ---------------------------------------------------------------------------------------


def router(runtime: Runtime) -> APIRouter:
    api = APIRouter(prefix="/v1", route_class=OneHopRoute)

    @api.get("/nodes", tags=["nodes"], response_model=NodesOut)
    def list_nodes(
        token: Caller,
        state: Annotated[list[NodeState] | None, Query(description="Only nodes in these states (repeatable).")] = None,
        pool: NameQuery = None,
        provider: NameQuery = None,
        project: ProjectQuery = None,
        include_terminated: bool = False,
        limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    ) -> NodesOut:
        """Burst nodes (newest last) of the caller's projects."""
        scope = project_scope(token, parse_projects(project))
        now = runtime.clock.now()
        found = runtime.store.nodes(states=state, include_terminated=include_terminated)
        nodes = [n for n in found
                 if (scope is None or n.project in scope)
                 and (pool is None or n.pool == pool)
                 and (provider is None or n.provider == provider)]
        # The stored row's gpus_busy is not kept current; the running jobs are (as in `status`).
        busy = runtime.store.gpus_busy_by_node()
        return NodesOut(at=iso(now) or "", nodes=[
            NodeOut.of(n, now, busy.get(n.id, 0), node_flagged(runtime, n, now))
            for n in nodes[-limit:]])

    @api.get("/decisions", tags=["decisions"])
    def list_decisions(
        token: Caller,
        policy: NameQuery = None,
        since: Annotated[str | None, Query(description="ISO 8601 time with a timezone.")] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    ) -> list[dict[str, Any]]:
        """The latest planner decisions, newest first (admin only)."""
        require_role(token)
        after = parse_time(since, "since") if since is not None else None
        found = runtime.store.decisions(policy=policy, limit=limit)
        # Newest (last made) first: those made at or after ``since`` are a prefix of the newest
        # ``limit``; a repeated decision counts as made when it was last made.
        return [decision_to_jsonable(d) for d in found if after is None or d.last_seen >= after]

    @api.get("/decisions/{decision_id}", tags=["decisions"])
    def get_decision(
        token: Caller,
        decision_id: Annotated[str, Path(max_length=64, pattern=NAME_PATTERN)],
    ) -> dict[str, Any]:
        """One decision: inputs, rule, offerings weighed, actions (admin only)."""
        require_role(token)
        decision = runtime.store.get_decision(decision_id)
        if decision is None:
            raise Problem(404, "no such decision", f"no decision {decision_id!r}")
        return decision_to_jsonable(decision)

    @api.get("/queue", tags=["queue"], response_model=QueueOut)
    def queue(
        token: Caller,
        pool: NameQuery = None,
        project: ProjectQuery = None,
        state: Annotated[list[QueueState] | None, Query(description="pending and/or running (default both).")] = None,
        limit: Annotated[int, Query(ge=1, le=5000)] = 500,
        user: UserQuery = None,
    ) -> QueueOut:
        """Pending and running jobs of the built-in queue, in service order, with their wait."""
        scope = project_scope(token, parse_projects(project))
        users = parse_users(user)
        now = runtime.clock.now()
        states = [JobState(s) for s in (state or list(QueueState))]
        jobs = [j for j in runtime.store.jobs(states=states, pool=pool)
                if (scope is None or j.project in scope) and (users is None or j.user in users)]
        pools = sorted({j.pool for j in jobs} | ({pool} if pool else set(_pools(runtime))))
        summary = []
        for name in pools:
            pending = [j for j in jobs if j.pool == name and j.state is JobState.PENDING]
            waits = [_wait(j, now) for j in pending]
            summary.append(PoolQueueOut(
                pool=name, pending_jobs=len(pending), pending_gpus=sum(j.gpus for j in pending),
                running_jobs=sum(1 for j in jobs if j.pool == name and j.state is JobState.RUNNING),
                oldest_wait_s=max(waits, default=0.0),
                mean_wait_s=round(sum(waits) / len(waits), 1) if waits else 0.0))
        shown = jobs[:limit]
        uses = {u.job_id: u for u in runtime.store.job_utilisation(
            [j.id for j in shown if j.state is JobState.RUNNING])}
        policy_of = {n.id: n.policy for n in runtime.store.nodes()} if uses else {}
        return QueueOut(at=iso(now) or "", pools=summary, jobs=[
            JobOut.of(j, now, uses.get(j.id), j.state is JobState.RUNNING and job_flagged(
                runtime, uses.get(j.id), policy_of.get(j.node_id or ""), now))
            for j in shown])

    @api.post("/jobs", tags=["queue"], status_code=201, response_model=JobOut | list[JobOut],
              openapi_extra={"requestBody": _JOBS_BODY},
              responses={200: {"description": "a repeat of an earlier submission with the same "
                                              "Idempotency-Key: the job(s) queued then"},
                         409: {"description": "the Idempotency-Key was used for another job "
                                              "(or batch)"},
                         413: {"description": f"a list of more than {MAX_API_BATCH} jobs"}})
    def submit_job(token: Caller, raw: Annotated[Any, Body(alias="body")],
                   response: Response,
                   idempotency_key: Annotated[str | None, Header(
                       max_length=128, pattern=r"^[\x21-\x7e]+$",
                       description="Makes a retried submission queue the job (or the whole "
                                   "list) once: the same key (per token) returns what was "
                                   "queued the first time.")
                   ] = None) -> JobOut | list[JobOut]:
        """Queue a job, or a list of jobs in one transaction (at most ``MAX_API_BATCH``: all or
        none), in the built-in queue (submitter of the jobs' projects, or admin)."""
        body = _jobs_in(raw)
        require_role(token, Role.SUBMITTER)
        batch = body if isinstance(body, list) else [body]
        if isinstance(body, list) and not body:
            raise RequestValidationError([{"loc": ("body",), "type": "value_error",
                                           "msg": "an empty list queues nothing; send at least "
                                                  "one job"}])
        if len(batch) > MAX_API_BATCH:
            raise Problem(413, "too many jobs", f"a submission holds at most {MAX_API_BATCH} "
                                                f"jobs, got {len(batch)}; split the list")
        for job in batch:
            if not token.sees(job.project):
                raise Problem(403, "forbidden", f"token {token.id} may not submit jobs for "
                                                f"project {job.project}")
        users = {job.user for job in batch}
        user = {asked: submitting_user(token, asked) for asked in users}
        pools = _pools(runtime)
        if not pools:
            raise Problem(409, "no pool", "the controller runs no policy, so no pool takes jobs")
        for i, job in enumerate(batch):
            if (job.pool or pools[0]) not in pools:
                loc = ("body", i, "pool") if isinstance(body, list) else ("body", "pool")
                raise RequestValidationError([{
                    "loc": loc, "type": "value_error",
                    "msg": f"unknown pool {job.pool!r}; the policies define {', '.join(pools)}"}])
        now = runtime.clock.now()
        digest = None
        if idempotency_key is not None:
            # Scoped to the token: one tenant's keys can neither collide with nor reveal another's.
            digest = hashlib.sha256(f"{token.id}\n{idempotency_key}".encode()).hexdigest()
        if isinstance(body, list):
            specs = [JobSpec(project=j.project, pool=j.pool or pools[0], gpus=j.gpus,
                             priority=j.priority,
                             duration_s=parse_duration(j.duration).total_seconds(),
                             command=j.command, user=user[j.user]) for j in body]
            try:
                queued = runtime.store.submit_jobs(specs, submitted_at=now, key=digest)
            except BatchExists as repeat:
                response.status_code = 200
                queued = repeat.jobs
            except JobIdConflict:
                raise Problem(409, "idempotency key reused",
                              "this Idempotency-Key was used for a different batch; use a new "
                              "key for a new batch") from None
            return [JobOut.of(j, now) for j in queued]
        job_id = None if digest is None else "j-k" + digest[:20]  # "j-" ids, "k" for keyed
        try:
            record = runtime.store.submit_job(
                project=body.project, pool=body.pool or pools[0], gpus=body.gpus,
                priority=body.priority, duration_s=parse_duration(body.duration).total_seconds(),
                command=body.command, submitted_at=now, job_id=job_id, user=user[body.user])
        except JobExists as repeat:
            response.status_code = 200
            return JobOut.of(repeat.job, now)
        except JobIdConflict:
            raise Problem(409, "idempotency key reused",
                          "this Idempotency-Key was used for a different job; use a new key "
                          "for a new job") from None
        return JobOut.of(record, now)

    @api.delete("/jobs/{job_id}", tags=["queue"], response_model=JobOut,
                responses={404: {"description": "no such job (or not one of the token's projects)"},
                           409: {"description": "the job had finished already; `state` says how"}})
    def cancel_job(token: Caller,
                   job_id: Annotated[str, Path(max_length=64, pattern=NAME_PATTERN)]) -> JobOut:
        """Cancel a pending or running job of the built-in queue (submitter of its project, or
        admin). Idempotent: cancelling it again answers 200 with the same body. A job running on
        a burst node is stopped by the node's agent at its next heartbeat."""
        require_role(token, Role.SUBMITTER)
        job = runtime.store.get_job(job_id)
        if job is None or not token.sees(job.project):
            # Another project's job answers as an unknown one: its id reveals nothing.
            raise Problem(404, "no such job", f"no job {job_id!r}")
        now = runtime.clock.now()
        done = runtime.store.withdraw_job(job_id, now)
        assert done.job is not None  # jobs are never deleted
        if done.job.state is not JobState.CANCELLED:
            raise Problem(409, "job finished", f"job {job_id} has finished ({done.job.state}); "
                                               "only pending or running jobs can be cancelled",
                          state=str(done.job.state))
        return JobOut.of(done.job, now)

    return api


def submitting_user(token: ApiToken, asked: str | None) -> str | None:
    """The user a job submitted with ``token`` is for: the body's ``user`` (``asked``) if the
    token may submit for it, else the token's subject (None: a token of no subject). Only an
    admin's token may submit for a user other than its own subject: 403 naming ``user``."""
    if asked is None or asked == token.subject:
        return token.subject
    if token.role is Role.ADMIN:
        return asked
    whose = (f"its user is {token.subject}" if token.subject
             else "it names no user (create it with --user)")
    raise Problem(403, "forbidden", f"body.user: token {token.id} may not submit jobs for user "
                                    f"{asked} ({whose}); only an admin's token may",
                  field="body.user")


_JOB_LIST = TypeAdapter(list[JobIn])
_JOB_SCHEMA = JobIn.model_json_schema()
# The body is validated by _jobs_in (a union of the two shapes would name its members in every
# error's location), so its schema is declared here: one job, or a list of them.
_JOBS_BODY = {"required": True, "content": {"application/json": {"schema": {"anyOf": [
    _JOB_SCHEMA, {"type": "array", "items": _JOB_SCHEMA, "minItems": 1}]}}}}


def _jobs_in(raw: Any) -> JobIn | list[JobIn]:
    """The body of ``POST /v1/jobs`` as one job or a list; a 422 naming ``body.FIELD`` (or
    ``body.INDEX.FIELD`` in a list) otherwise."""
    try:
        return _JOB_LIST.validate_python(raw) if isinstance(raw, list) else JobIn.model_validate(raw)
    except ValidationError as exc:
        raise RequestValidationError([{"loc": ("body", *e["loc"]), "msg": e["msg"],
                                       "type": e["type"]} for e in exc.errors()]) from None


def _pools(runtime: Runtime) -> list[str]:
    """Pools of the running policies, in policy order, each once."""
    return list(dict.fromkeys(p.pool.name for p in runtime.policies.values()))


def _wait(job: JobRecord, now: datetime) -> float:
    # A job cancelled before it started waited until the cancel, so its answer never changes.
    end = job.started_at or job.finished_at or now
    return round(max((end - job.submitted_at).total_seconds(), 0.0), 1)


def parse_time(value: str, parameter: str, now: datetime | None = None) -> datetime:
    """An ISO 8601 time with a timezone — or, given ``now``, also a date (UTC midnight) or a span
    back from now (``7d``), as :func:`~orchestrator.policy.timefmt.parse_when` reads them; a 422
    naming ``parameter`` and the accepted forms otherwise."""
    try:  # between EARLIEST and LATEST: the routes' date arithmetic cannot overflow
        if now is not None:
            return parse_when(value, parameter, now)
        return parse_aware(value, parameter).astimezone(UTC)
    except TimeFormatError as exc:
        reason = str(exc).removeprefix(f"{parameter}: ")
        if "got " not in reason:
            reason = f"{reason} (got {value[:60]!r})"
        raise invalid(parameter, reason) from None


__all__ = ["JobIn", "JobOut", "NodeOut", "QueueOut", "iso", "parse_time", "router"]
