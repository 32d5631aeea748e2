"""Agent endpoints of the controller API: registration, heartbeats, work, job outcomes.

Registration exchanges a single-use, node-bound, expiring join token (stored only as a hash) for a
per-node credential; every refused attempt is recorded with its reason. Joined nodes of the
built-in fabric are ready at once. Heartbeat answers carry the drain order, so a drain reaches the
agent within one heartbeat. The HTTP contract is written down in :mod:`orchestrator.fabric.agent`.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from fastapi import APIRouter, Header, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.api.problems import Problem
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.fabric.tokens import new_credential, token_hash
from orchestrator.lifecycle import transition
from orchestrator.wiring import Runtime

_CAS_RETRIES = 8


class RegisterIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    node_id: str = Field(min_length=1, max_length=128)
    join_token: str = Field(min_length=1, max_length=256)
    gpus: int = Field(ge=0, default=0)
    gpu_model: str | None = None
    hostname: str | None = None
    pid: int | None = None


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    node_id: str
    status: str = Field(pattern="^(idle|busy|released)$")
    job_id: str | None = None


class NextIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    node_id: str
    free_gpus: int = Field(ge=0)


class FinishIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    node_id: str
    outcome: str = Field(pattern="^(done|failed|handed-back)$")
    exit_code: int | None = None


def _advance(runtime: Runtime, node_id: str, to: NodeState, reason: str, **changes) -> Node | None:
    """Move a node to ``to`` with field changes, retrying compare-and-set conflicts."""
    for _ in range(_CAS_RETRIES):
        node = runtime.store.get_node(node_id)
        if node is None:
            return None
        if node.state is to:
            return node
        changed = replace(node, **changes) if changes else node
        new, event = transition(changed, to, at=runtime.clock.now(), reason=reason)
        if runtime.store.save_transition(node, new, event):
            return new
    return None


def _touch(runtime: Runtime, node_id: str, **changes) -> Node | None:
    for _ in range(_CAS_RETRIES):
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


def router(runtime: Runtime) -> APIRouter:
    api = APIRouter(prefix="/v1/agent", tags=["agent"])

    @api.post("/register")
    def register(body: RegisterIn, request: Request) -> dict:
        now = runtime.clock.now()
        remote = request.client.host if request.client else None
        node = runtime.store.get_node(body.node_id)
        if node is not None and node.state is NodeState.REQUESTED:
            # The instance booted before its launch was recorded: ask the agent to retry, without
            # spending its single-use token.
            raise Problem(409, "node not launched yet", "retry registration shortly")
        result = runtime.store.consume_join_token(body.node_id, token_hash(body.join_token), now)
        if result == "ok" and (node is None or node.state not in (
                NodeState.LAUNCHING, NodeState.BOOTING, NodeState.JOINING)):
            result = f"node is {node.state if node else 'unknown'}"
        runtime.store.record_join_attempt(body.node_id, now, result == "ok", result, remote)
        if result != "ok":
            raise Problem(401, "join refused", f"join token refused: {result}")
        credential, credential_hash = new_credential()
        runtime.store.set_credential(body.node_id, credential_hash)
        if _advance(runtime, body.node_id, NodeState.JOINING, "agent registered") is None:
            raise Problem(409, "node changed state", "node is no longer joinable")
        ready = _advance(runtime, body.node_id, NodeState.READY, "joined the built-in fabric",
                         last_heartbeat=now, idle_since=now)
        if ready is None:
            raise Problem(409, "node changed state", "node is no longer joinable")
        return {"credential": credential, "heartbeat_s": 1.0 if runtime.settings.tick_s <= 2 else 5.0}

    @api.post("/heartbeat")
    def heartbeat(body: HeartbeatIn, authorization: str | None = Header(default=None)) -> dict:
        node = _authorised(runtime, body.node_id, authorization)
        now = runtime.clock.now()
        changes: dict = {"last_heartbeat": now}
        if body.status == "released" and node.state is NodeState.DRAINING:
            changes["released"] = True
        node = _touch(runtime, body.node_id, **changes) or node
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
        }

    @api.post("/jobs/next")
    def next_job(body: NextIn, authorization: str | None = Header(default=None)):
        node = _authorised(runtime, body.node_id, authorization)
        job = runtime.queue.claim_for_node(node, min(body.free_gpus, node.gpus), runtime.clock.now())
        if job is None:
            return Response(status_code=204)
        return {"job": {"id": job.id, "command": job.command, "duration_s": job.duration_s, "gpus": job.gpus}}

    @api.post("/jobs/{job_id}/finish")
    def finish(job_id: str, body: FinishIn, authorization: str | None = Header(default=None)) -> dict:
        _authorised(runtime, body.node_id, authorization)
        accepted = runtime.queue.finish(job_id, body.node_id, body.outcome, body.exit_code,
                                        runtime.clock.now())
        return {"accepted": accepted}

    return api
