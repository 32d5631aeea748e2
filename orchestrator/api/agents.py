"""Agent endpoints of the controller API: registration, heartbeats, work, job outcomes.

Registration exchanges a single-use, node-bound, expiring join token (stored only as a hash) for a
per-node credential; every refused attempt is recorded with its reason. Joined nodes of the
built-in fabric are ready at once. Heartbeat answers carry the drain order, so a drain reaches the
agent within one heartbeat. The HTTP contract is written down in :mod:`orchestrator.fabric.agent`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Header, Request, Response
from fastapi import Path as PathParam
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from orchestrator.api.problems import Problem
from orchestrator.domain.jobs import JobState
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.plan import ActionReason, Drain
from orchestrator.domain.utilisation import GpuUse, node_reading
from orchestrator.fabric.slurm import FabricJoinError
from orchestrator.fabric.tokens import new_credential, token_hash
from orchestrator.sources.slurm_cli import SlurmError
from orchestrator.lifecycle import CAS_RETRIES, transition
from orchestrator.policy.bounds import MAX_GPUS_PER_NODE
from orchestrator.policy.models import UtilisationRules
from orchestrator.policy.timefmt import TimeFormatError, parse_aware
from orchestrator.wiring import Runtime

log = logging.getLogger(__name__)


# Ids the controller hands out (node and job ids) and free text an agent reports: bounded, and no
# control characters, so nothing a node sends can reach the database as a value it refuses (a NUL
# byte in PostgreSQL text) or as an integer past 64 bits: such a request is a 422, never a 500.
# The bodies are strict: a number is a JSON number, never a string or a boolean.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
NodeIdField = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]
JobIdField = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_PATTERN)]
TEXT_PATTERN = r"^[^\x00-\x08\x0b\x0c\x0e-\x1f\x7f]*$"
INT32_MAX = 2**31 - 1


def _text(max_length: int):
    return Field(default=None, max_length=max_length, pattern=TEXT_PATTERN)


class RegisterIn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # "gpus": "1" or true is a 422
    node_id: NodeIdField
    join_token: str = Field(min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$")
    gpus: int = Field(ge=0, le=MAX_GPUS_PER_NODE, default=0)
    gpu_model: str | None = _text(128)
    hostname: str | None = _text(255)
    pid: int | None = Field(default=None, ge=0, le=INT32_MAX)
    gpu_inventory: list[dict] | None = Field(default=None, max_length=256)
    gpu_source: str | None = _text(32)


MAX_MIB = 10**8  # 100 TiB: no GPU has more memory


class GpuReadingIn(BaseModel):
    """One GPU's reading in a heartbeat (null: the device did not say)."""

    model_config = ConfigDict(extra="ignore", strict=True)
    index: int = Field(ge=0, le=1023)
    utilisation_percent: float | None = Field(default=None, ge=0, le=100, allow_inf_nan=False)
    memory_used_mib: float | None = Field(default=None, ge=0, le=MAX_MIB, allow_inf_nan=False)
    memory_total_mib: float | None = Field(default=None, ge=0, le=MAX_MIB, allow_inf_nan=False)
    job_id: JobIdField | None = None  # the run holding this GPU (null: unallocated)


class GpuUsageIn(BaseModel):
    """A heartbeat's GPU readings (orchestrator.fabric.gpu_sampler); absent: unknown."""

    model_config = ConfigDict(extra="ignore", strict=True)
    source: str = Field(pattern="^(nvml|nvidia-smi)$")
    interval_s: float = Field(ge=0, le=300, allow_inf_nan=False)  # what each reading stands for
    gpus: list[GpuReadingIn] = Field(max_length=MAX_GPUS_PER_NODE)


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # "gpus": "1" or true is a 422
    node_id: NodeIdField
    status: str = Field(pattern="^(idle|busy|released)$")
    job_id: JobIdField | None = None
    fabric_state: str | None = Field(default=None, pattern="^(joining|joined|draining|released|failed)$")
    fabric_error: str | None = _text(2000)
    notice: dict | None = None  # {source, action, deadline}: a spot/preemption notice
    drain_report: dict | None = None
    gpu_usage: GpuUsageIn | None = None


class NextIn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # "gpus": "1" or true is a 422
    node_id: NodeIdField
    free_gpus: int = Field(ge=0, le=MAX_GPUS_PER_NODE)


class FinishIn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)  # "gpus": "1" or true is a 422
    node_id: NodeIdField
    outcome: str = Field(pattern="^(done|failed|handed-back)$")
    exit_code: int | None = Field(default=None, ge=-INT32_MAX, le=INT32_MAX)
    # The run id jobs/next handed out: with it, a run that finished while the controller thought
    # its node gone is still recorded from this report (never re-run). Absent: older agents.
    attempt: int | None = Field(default=None, ge=1, le=INT32_MAX)
    # When the run ended, by the node's clock: ISO 8601 text in JSON, so not strict (strict
    # takes only datetime objects), but still only with a timezone.
    ended_at: AwareDatetime | None = Field(default=None, strict=False)


def _advance(runtime: Runtime, node_id: str, to: NodeState, reason: str,
             details: dict | None = None, **changes) -> Node | None:
    """Move a node to ``to`` with field changes, retrying compare-and-set conflicts."""
    for _ in range(CAS_RETRIES):
        node = runtime.store.get_node(node_id)
        if node is None:
            return None
        if node.state is to:
            return node
        changed = replace(node, **changes) if changes else node
        new, event = transition(changed, to, at=runtime.clock.now(), reason=reason,
                                **(details or {}))
        if runtime.store.save_transition(node, new, event):
            return new
    return None


def _touch(runtime: Runtime, node_id: str, **changes) -> Node | None:
    for _ in range(CAS_RETRIES):
        node = runtime.store.get_node(node_id)
        if node is None:
            return None
        updated = runtime.store.update_node(node, **changes)
        if updated is not None:
            return updated
    return None


def _authorised(runtime: Runtime, node_id: str, authorization: str | None) -> Node:
    if not authorization or not authorization.lower().startswith("bearer "):
        raise Problem(401, "missing credential", "send Authorization: Bearer <node credential>")
    credential = authorization.split(" ", 1)[1].strip()
    if not runtime.store.check_credential(node_id, token_hash(credential)):
        raise Problem(401, "bad credential", f"the credential is not valid for node {node_id}")
    node = runtime.store.get_node(node_id)
    if node is None:
        raise Problem(404, "unknown node", f"no node {node_id}")
    return node


def _fabric_events(runtime: Runtime, node: Node, body: HeartbeatIn, now: datetime) -> Node | None:
    """What a heartbeat says about the node's fabric: joined, failed, or a spot notice."""
    confirm = getattr(runtime.fabric, "confirm_joined", None)
    if body.fabric_state == "joined" and node.state is NodeState.JOINING:
        if confirm is None or confirm(node):
            kind = getattr(runtime.fabric.for_node(node), "name", "fabric") if hasattr(
                runtime.fabric, "for_node") else "fabric"
            return _advance(runtime, node.id, NodeState.READY, f"joined the {kind} fabric",
                            last_heartbeat=now, idle_since=now)
    elif body.fabric_state == "failed" and node.state in (
            NodeState.JOINING, NodeState.READY, NodeState.DRAINING):
        return _advance(runtime, node.id, NodeState.FAILED,
                        f"fabric member failed: {body.fabric_error or 'no detail'}")
    if body.notice and node.state is NodeState.READY:
        deadline = _parse_time(body.notice.get("deadline")) or now
        log.warning("node %s: %s notice (%s), draining by %s", node.id,
                    body.notice.get("source"), body.notice.get("action"), deadline.isoformat())
        runtime.executor.run([Drain(node.id, ActionReason.SPOT_NOTICE, deadline)])
        return runtime.store.get_node(node.id)
    return None


def _record_gpu_usage(runtime: Runtime, node: Node, usage: GpuUsageIn | None,
                      now: datetime) -> dict:
    """Fold a heartbeat's GPU readings into the usage aggregates; the node's new utilisation
    fields. No readings: the node's use is unknown now (None), never 0, and not low."""
    if usage is None:
        return {"gpu_utilisation_percent": None, "low_utilisation_since": None}
    policy = runtime.policies.get(node.policy)
    below = policy.utilisation.idle_below_percent if policy else UtilisationRules().idle_below_percent
    uses = [GpuUse(g.index, g.utilisation_percent, g.memory_used_mib, g.memory_total_mib,
                   g.job_id) for g in usage.gpus]
    runtime.store.record_gpu_readings(node, now, usage.interval_s, uses, below_percent=below)
    current, low_since = node_reading(uses, below, node.low_utilisation_since, now)
    return {"gpu_utilisation_percent": current, "low_utilisation_since": low_since}


def _parse_time(value: object) -> datetime | None:
    """A notice's deadline, or None (then the drain is due now) if it is not an aware time."""
    try:
        return parse_aware(value, "notice.deadline")
    except TimeFormatError:
        return None


# One answer for a node id that does not exist and for a wrong token, so an anonymous caller
# learns nothing about which node ids exist; the audit log keeps the real reason.
_NOT_VALID = "the join token is not valid for this node"


def _refused(result: str) -> Problem:
    """The 401 for a refused registration. Only a caller holding the right token learns more
    (the token expired or was used, or the node is past joining)."""
    detail = _NOT_VALID if result in ("unknown-node", "wrong-token") else (
        f"the join token was refused: {result}")
    return Problem(401, "join refused", detail)


_ENDED = frozenset({JobState.DONE, JobState.FAILED, JobState.CANCELLED})


def _job_to_stop(runtime: Runtime, node: Node, job_id: str | None) -> str | None:
    """The job a node runs for nothing: a user cancelled it, or it has ended meanwhile through
    another node's run (a late report of an earlier run that finished while the controller
    thought its node gone)."""
    if job_id is None:
        return None
    job = runtime.store.get_job(job_id)
    if job is not None and job.state is JobState.CANCELLED:
        # A user cancelled it (burst cancel, DELETE /v1/jobs/{id}): stop it wherever it runs.
        log.info("node %s: telling it to stop job %s, cancelled", node.id, job_id)
        return job_id
    if job is None or job.state not in _ENDED or job.node_id == node.id:
        return None
    log.info("node %s: telling it to stop job %s, %s by another run", node.id, job_id, job.state)
    return job_id


def router(runtime: Runtime) -> APIRouter:
    api = APIRouter(prefix="/v1/agent", tags=["agent"])

    @api.post("/register")
    def register(body: RegisterIn, request: Request) -> dict:
        now = runtime.clock.now()
        remote = request.client.host if request.client else None
        credential, credential_hash = new_credential()
        inventory = {"gpus": body.gpus, "gpu_model": body.gpu_model, "gpu_source": body.gpu_source}
        # One transaction: a controller killed inside it spent nothing; one killed after it
        # (the answer lost) is completed again by the agent's retry with the same token.
        registration = runtime.store.register_node(
            body.node_id, token_hash(body.join_token), credential_hash, now, remote=remote,
            details=inventory)
        if registration.result == "not-launched":
            # The instance booted before its launch was recorded: the agent retries shortly.
            raise Problem(409, "node not launched yet", "retry registration shortly")
        if not registration.ok or registration.node is None:
            raise _refused(registration.result)
        joining = registration.node
        heartbeat_s = 1.0 if runtime.settings.tick_s <= 2 else 5.0
        policy = runtime.policies.get(joining.policy)
        # The node's dead-man switch (the bootstrap has it too; this is the policy of now).
        lease_s = policy.timeouts.controller_lease.total_seconds() if policy else None
        notice = None
        if policy is not None and policy.fabric.spot_notice is not None:
            config = policy.fabric.spot_notice
            notice = {"kind": str(config.kind), "url": config.endpoint,
                      "poll_s": config.poll.total_seconds(),
                      "deadline_s": config.deadline.total_seconds()}
        try:
            spec = runtime.fabric.join_spec(joining, body.gpus) if hasattr(
                runtime.fabric, "join_spec") else None
        except (FabricJoinError, SlurmError, ValueError) as exc:
            _advance(runtime, body.node_id, NodeState.FAILED, f"cannot join the fabric: {exc}")
            raise Problem(503, "cannot join the fabric", str(exc)) from None
        except Exception as exc:
            # The node is JOINING: a fabric that cannot take it would leave it there, billing
            # until the join timeout, however often its agent retries. Fail it now so the
            # reconciler terminates and replaces it.
            log.exception("node %s: fabric join failed", body.node_id)
            _advance(runtime, body.node_id, NodeState.FAILED,
                     f"cannot join the fabric: {type(exc).__name__}: {exc}")
            raise Problem(503, "cannot join the fabric",
                          f"the fabric could not take the node ({type(exc).__name__})") from None
        if spec is not None:
            # Ready once the fabric shows the node usable (the agent reports "joined").
            return {"credential": credential, "heartbeat_s": heartbeat_s, "fabric": spec,
                    "notice": notice, "controller_lease_s": lease_s}
        ready = _advance(runtime, body.node_id, NodeState.READY, "joined the built-in fabric",
                         last_heartbeat=now, idle_since=now)
        if ready is None:
            raise Problem(409, "node changed state", "node is no longer joinable")
        return {"credential": credential, "heartbeat_s": heartbeat_s, "fabric": None,
                "notice": notice, "controller_lease_s": lease_s}

    @api.post("/heartbeat")
    def heartbeat(body: HeartbeatIn, authorization: str | None = Header(default=None)) -> dict:
        node = _authorised(runtime, body.node_id, authorization)
        now = runtime.clock.now()
        changes: dict = {"last_heartbeat": now}
        changes.update(_record_gpu_usage(runtime, node, body.gpu_usage, now))
        if body.status == "released" and node.state is NodeState.DRAINING:
            changes["released"] = True
            if body.drain_report:
                log.info("node %s drained out of its fabric: %s", node.id, body.drain_report)
        node = _touch(runtime, body.node_id, **changes) or node
        node = _fabric_events(runtime, node, body, now) or node
        policy = runtime.policies.get(node.policy)
        leaving = node.state in (NodeState.DRAINING, NodeState.TERMINATING, NodeState.FAILED,
                                 NodeState.TERMINATED)
        deadline: datetime | None = node.drain_deadline if node.state is NodeState.DRAINING else (
            now if leaving else None)
        return {
            "drain": leaving,
            "deadline": deadline.isoformat() if deadline else None,
            "respect_running_jobs": bool(policy.scale_down.respect_running_jobs if policy else True)
            and node.state is NodeState.DRAINING,
            "stop_job": _job_to_stop(runtime, node, body.job_id),
        }

    @api.post("/jobs/next")
    def next_job(body: NextIn, authorization: str | None = Header(default=None)):
        node = _authorised(runtime, body.node_id, authorization)
        job = runtime.queue.claim_for_node(node, min(body.free_gpus, node.gpus), runtime.clock.now())
        if job is None:
            return Response(status_code=204)
        return {"job": {"id": job.id, "command": job.command, "duration_s": job.duration_s,
                        "gpus": job.gpus, "attempt": job.attempts}}

    @api.post("/jobs/{job_id}/finish")
    def finish(job_id: Annotated[str, PathParam(max_length=128, pattern=ID_PATTERN)], body: FinishIn, authorization: str | None = Header(default=None)) -> dict:
        _authorised(runtime, body.node_id, authorization)
        now = runtime.clock.now()
        accepted = runtime.queue.finish(job_id, body.node_id, body.outcome, body.exit_code, now,
                                        attempt=body.attempt, ended_at=body.ended_at)
        if body.attempt is not None and not accepted:
            log.info("job %s: report of run %d from node %s acknowledged, changed nothing "
                     "(stale or repeated)", job_id, body.attempt, body.node_id)
        return {"accepted": accepted}

    return api
