"""Operator operations on a wired Runtime: evaluate a policy now, pre-warm, drain, pause and
resume a pool, cancel jobs, and report spend.

Plain functions, shared by the public Celery tasks (:mod:`orchestrator.automation.public`) and the
``burst pool`` / ``burst spend`` commands, so both validate the same way and say the same things.
Arguments arrive raw (JSON from a task message, text from a command line) and go through the
strict pydantic models below (:func:`parse`); what needs the runtime to check (is there such a
pool, is the time in the future) is checked by the operation. Every refusal is an
:class:`InvalidArgument` whose message starts with the argument's name. Results are small dicts
of JSON values (times as ISO 8601 text, money as decimal text).

Spend is read from the cost ledger (:mod:`orchestrator.costs`), rolled up to now first: an
instance costs from ``launching`` (the provider accepted the launch) until ``terminated`` (the
provider confirmed it gone), or until now while it lives, at the price captured at launch, with
its provider's billing rule (per second, one-minute minimum by default) charged where it ends.
Lines are hour buckets, selected by their start, so windows that partition time add up to the
same total. Sums are integer micro-dollars: rows add up to the total exactly, and their cents
(largest-remainder rounding) add up to the total's cents.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from decimal import Decimal
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, ValidationError

from orchestrator.costs.report import allocate_cents
from orchestrator.costs.report import cents as cents_of
from orchestrator.domain.costs import NONE as NO_NODE
from orchestrator.domain.jobs import JobState
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.plan import ActionReason, Drain, Launch, Terminate
from orchestrator.policy.models import Policy
from orchestrator.policy.timefmt import TimeFormatError, parse_aware, parse_when
from orchestrator.store import Store
from orchestrator.store.ledger import CostSums
from orchestrator.leadership import Controller, Holder, lease_ttl, policy_scope
from orchestrator.tick import fenced_runtime_parts, planning_pass, record_tick, roll_up_costs
from orchestrator.wiring import Runtime

GROUP_KEYS = ("project", "provider", "instance_type", "pool", "day")
TIME_EXAMPLE = "2026-12-01T09:00:00Z"
MICRO = Decimal("0.000001")


class InvalidArgument(ValueError):
    """A refused argument. The message names the argument and what is wrong with it;
    ``argument`` is that name (taken from the message when not given)."""

    def __init__(self, message: str, argument: str | None = None) -> None:
        super().__init__(message)
        self.argument = argument if argument is not None else message.split(":", 1)[0]


# -- argument models ------------------------------------------------------------------------------


def parse_time(value: Any) -> datetime:
    """An ISO 8601 time with a timezone (``Z`` or an offset), as tz-aware UTC.

    Raises ValueError (pydantic turns only ValueErrors into validation errors), through the one
    time parser, :func:`orchestrator.policy.timefmt.parse_aware`.
    """
    try:
        return parse_aware(value, "time").astimezone(UTC)
    except TimeFormatError as exc:  # the caller names the argument
        raise ValueError(str(exc).removeprefix("time: ")) from None


def parse_group_by(value: Any) -> tuple[str, ...]:
    """``"project,provider"`` or ``["project", "provider"]``: keys of :data:`GROUP_KEYS`."""
    if isinstance(value, str):
        keys = [k.strip() for k in value.split(",")]
    elif isinstance(value, list | tuple) and all(isinstance(k, str) for k in value):
        keys = [k.strip() for k in value]
    else:
        raise ValueError("must be a comma-separated string or a list of strings")
    if not keys or any(not k for k in keys):
        raise ValueError(f"needs one or more of {', '.join(GROUP_KEYS)}, comma-separated")
    unknown = [k for k in keys if k not in GROUP_KEYS]
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(map(repr, unknown))}; "
                         f"choose from {', '.join(GROUP_KEYS)}")
    if len(set(keys)) != len(keys):
        raise ValueError("names a key twice")
    return tuple(keys)


Name = Annotated[StrictStr, Field(min_length=1, max_length=128)]
Reason = Annotated[StrictStr, Field(max_length=500)]
AwareTime = Annotated[datetime, BeforeValidator(parse_time)]


def parse_moment(value: Any) -> datetime:
    """A report-window moment as people write it: an ISO time with a timezone, a date (UTC
    midnight) or a span back from now (``7d``), through the one parser
    (:func:`orchestrator.policy.timefmt.parse_when`); ValueError otherwise."""
    try:
        return parse_when(value, "time", datetime.now(UTC))
    except TimeFormatError as exc:
        raise ValueError(str(exc).removeprefix("time: ")) from None


Moment = Annotated[datetime, BeforeValidator(parse_moment)]
GroupBy = Annotated[tuple[str, ...], BeforeValidator(parse_group_by)]


class _Args(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class EvaluateArgs(_Args):
    policy: Name


class PoolArgs(_Args):
    pool: Name


class PauseArgs(PoolArgs):
    reason: Reason = ""


class DrainArgs(PoolArgs):
    reason: Reason = ""


class PrewarmArgs(PoolArgs):
    gpus: Annotated[int, Field(ge=1, le=1_000_000)]
    until: AwareTime


class CancelArgs(_Args):
    jobs: Annotated[list[Name], Field(min_length=1, max_length=1000)]


class SpendArgs(_Args):
    since: Moment | None = None
    until: Moment | None = None
    group_by: GroupBy = ("project",)


M = TypeVar("M", bound=_Args)


def parse(model: type[M], **values: Any) -> M:
    """Validate raw arguments with ``model``; InvalidArgument naming each bad one otherwise."""
    try:
        return model(**values)
    except ValidationError as exc:
        problems: list[str] = []
        seen: list[str] = []
        # An unknown argument first: it is most often a misspelling of the missing one.
        errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")
        for error in errors:
            name = str(error["loc"][0]) if error["loc"] else "arguments"
            if name in seen:
                continue  # a union (since: time | None) reports one error per branch
            seen.append(name)
            if error["type"] == "missing":
                problem = "is required"
            elif error["type"] == "extra_forbidden":
                problem = "is not a known argument"
            else:
                problem = error["msg"].removeprefix("Value error, ")
                if "(got" not in problem and "got " not in problem:
                    problem += f" (got {_short(error.get('input'))})"
            problems.append(f"{name}: {problem}")
        raise InvalidArgument("; ".join(problems), seen[0] if seen else None) from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- lookups in the running policies --------------------------------------------------------------


def pools_of(rt: Runtime) -> dict[str, list[Policy]]:
    """Pool name -> the running policies that burst it."""
    pools: dict[str, list[Policy]] = {}
    for policy in rt.policies.values():
        pools.setdefault(policy.pool.name, []).append(policy)
    return pools


def _policy(rt: Runtime, name: str) -> Policy:
    policy = rt.policies.get(name)
    if policy is None:
        running = ", ".join(sorted(rt.policies)) or "none"
        raise InvalidArgument(f"policy: no running policy is named {name!r} (running: {running})",
                              "policy")
    return policy


def _pool(rt: Runtime, name: str) -> list[Policy]:
    pools = pools_of(rt)
    if name not in pools:
        known = ", ".join(sorted(pools)) or "none"
        raise InvalidArgument(f"pool: no running policy bursts a pool named {name!r} "
                              f"(pools: {known})", "pool")
    return pools[name]


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z") if moment else None


def _staying_gpus(nodes: Iterable[Node]) -> int:
    return sum(n.gpus for n in nodes if n.state.in_flight or n.state is NodeState.READY)


# -- operations -----------------------------------------------------------------------------------


def evaluate(rt: Runtime, policy: str, *, tick: Callable[[str], dict] | None = None) -> dict:
    """Plan one tick for ``policy`` now, instead of waiting for the next one.

    With ``tick`` (the Celery ``burst.loop.tick`` body: leader lease, fenced writes, provider
    calls handed to tasks) that runs it, so an evaluation never races the scheduled tick. Without,
    the embedded sequence of the control loop runs in this process: on-prem dispatch, observe,
    plan, execute.
    """
    _policy(rt, policy)
    if tick is not None:
        outcome = dict(tick(policy))
    else:
        now = rt.clock.now()
        started = time.perf_counter()
        # The pool's controller lease, as every driver takes it: never plan beside its leader.
        scope = policy_scope(policy)
        ctl = Controller(rt.store, Holder.this_process("evaluate"), lease_ttl(rt.settings.tick_s))
        claims = ctl.claim([scope], now)
        if not claims.leads(scope):
            return {"policy": policy, "leader": False,
                    "reason": f"{scope} is led by another live controller ({claims.skipped[scope]})",
                    "note": "another controller leads this policy; its decision is the one that counts"}
        executor, _ = fenced_runtime_parts(rt, ctl.view([scope]))
        try:
            done = planning_pass(rt, [rt.policies[policy]], now, executor.execute,
                                 store=executor.store, in_process=True)
        finally:
            ctl.release_all(rt.clock.now())
        result, report = done.plan, done.outcome
        outcome = {
            "policy": policy, "leader": True,
            "decisions": [d.id for d in result.decisions],
            "launch": sum(isinstance(a, Launch) for a in result.actions),
            "drain": sum(isinstance(a, Drain) for a in result.actions),
            "terminate": sum(isinstance(a, Terminate) for a in result.actions),
        }
        if report.errors or report.capacity_errors:
            outcome["errors"] = report.errors + [f"capacity: {k}" for k in report.capacity_errors]
        # The Celery tick records its own timing; this in-process evaluation is a tick too.
        record_tick(rt, [policy], now, started)
    decisions = outcome.pop("decisions", [])
    if not outcome.get("leader", False):
        outcome.setdefault("note", "another controller or worker leads this policy and is "
                                   "planning it; its decision is the one that counts")
    for did in decisions:
        decision = rt.store.get_decision(did)
        if decision is not None:
            outcome["decision"] = {"id": decision.id, "rule": str(decision.rule),
                                   "summary": decision.summary,
                                   "held_back_by": list(decision.held_back_by)}
    return outcome


def cancel_jobs(store: Store, job_ids: Iterable[str], now: datetime) -> list[dict]:
    """Cancel built-in queue jobs, pending or running; one result per id (each id once):
    ``{"id", "state", "result"}`` with result ``cancelled`` (now), ``already-cancelled``,
    ``finished`` (done or failed: left alone; state says which) or ``unknown``. Cancelling
    again is harmless: a redelivered task answers ``already-cancelled``. A job running on a
    burst node is stopped by the node's agent at its next heartbeat (``node`` names it)."""
    results = []
    for job_id in dict.fromkeys(job_ids):
        done = store.withdraw_job(job_id, now)
        job = done.job
        if job is None:
            results.append({"id": job_id, "state": None, "result": "unknown", "node": None})
            continue
        if job.state is not JobState.CANCELLED:
            result = "finished"
        else:
            result = "cancelled" if done.changed else "already-cancelled"
        results.append({"id": job_id, "state": str(job.state), "result": result,
                        "node": job.node_id if result == "cancelled" else None})
    return results


def prewarm(rt: Runtime, pool: str, gpus: int, until: datetime) -> dict:
    """Keep at least ``gpus`` burst GPUs (ready or starting) for ``pool`` until ``until``.

    Replaces any earlier pre-warm of the pool. The planner launches what is missing at its next
    tick, within every limit, and keeps those nodes from idle scale-down until ``until``.
    """
    policies = _pool(rt, pool)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise InvalidArgument(f"gpus: must be a whole number of at least 1 (got {gpus!r})", "gpus")
    until = parse_time(until) if not isinstance(until, datetime) else until
    if until.tzinfo is None:
        raise InvalidArgument(f"until: needs a timezone, e.g. {TIME_EXAMPLE}", "until")
    now = rt.clock.now()
    if until <= now:
        raise InvalidArgument(f"until: {_iso(until)} is not in the future (now: {_iso(now)})",
                              "until")
    control = rt.store.set_prewarm(pool, gpus, until, now)
    have = _staying_gpus(n for n in rt.store.nodes() if n.pool == pool)
    result = {"pool": pool, "gpus": gpus, "until": _iso(until), "have_gpus": have,
              "paused": control.paused,
              "note": (f"the planner launches the {max(gpus - have, 0)} GPU(s) missing at its next "
                       "tick (or run burst.policy.evaluate), within every limit")}
    caps = [p.limits.max_burst_gpus for p in policies if p.limits.max_burst_gpus is not None]
    if caps and gpus > sum(caps):
        result["note"] += f"; limits.max_burst_gpus ({sum(caps)}) keeps it below {gpus}"
    if control.paused:
        result["note"] = ("the pool is paused: nothing is launched for the pre-warm until it is "
                          "resumed (burst.pool.resume)")
    return result


def pause(rt: Runtime, pool: str, reason: str = "") -> dict:
    """Stop launches for ``pool``; running nodes stay and drains go on. Idempotent."""
    _pool(rt, pool)
    before = rt.store.pool_control(pool)
    control = rt.store.pause_pool(pool, reason, rt.clock.now())
    return {"pool": pool, "paused": True, "was_paused": before.paused,
            "reason": control.paused_reason, "paused_at": _iso(control.paused_at)}


def resume(rt: Runtime, pool: str) -> dict:
    """Let the planner launch for ``pool`` again. Idempotent."""
    _pool(rt, pool)
    before = rt.store.pool_control(pool)
    rt.store.resume_pool(pool, rt.clock.now())
    return {"pool": pool, "paused": False, "was_paused": before.paused,
            "paused_since": _iso(before.paused_at)}


def drain_pool(rt: Runtime, pool: str, reason: str = "") -> dict:
    """Drain every ready node of ``pool`` now (deadline: now + its policy's drain grace).

    The pool is paused first, and its pre-warm cleared, so the planner does not launch the
    capacity again; ``resume`` undoes the pause. Nodes still starting are left to finish and are
    drained by the idle rule once they have run nothing for ``idle_for``.
    """
    policies = _pool(rt, pool)
    by_name = {p.name: p for p in policies}
    now = rt.clock.now()
    had_prewarm = rt.store.pool_control(pool).prewarm(now) is not None
    rt.store.pause_pool(pool, f"drained{': ' + reason if reason else ''}", now)
    if had_prewarm:
        rt.store.clear_prewarm(pool, now)
    nodes = [n for n in rt.store.nodes() if n.pool == pool]
    actions = []
    for node in nodes:
        if node.state is NodeState.READY:
            policy = by_name.get(node.policy) or rt.policies.get(node.policy) or policies[0]
            actions.append(Drain(node.id, ActionReason.OPERATOR, now + policy.scale_down.drain_grace))
    report = rt.executor.run(actions)
    deadlines = [a.deadline for a in actions if a.node_id in report.drained]
    return {
        "pool": pool, "drained": list(report.drained),
        "deadline": _iso(max(deadlines)) if deadlines else None,
        "starting": [n.id for n in nodes if n.state.in_flight],
        "paused": True, "prewarm_cleared": had_prewarm,
        "note": ("the pool is now paused so the planner does not launch again; "
                 "resume it with burst.pool.resume when it should burst again"),
    }


def spend_report(rt: Runtime, since: datetime | None = None, until: datetime | None = None,
                 group_by: str | Iterable[str] = ("project",)) -> dict:
    """Burst spend between ``since`` (default: the beginning) and ``until`` (default: now),
    grouped by ``group_by`` (any of :data:`GROUP_KEYS`, in that order of columns), from the cost
    ledger (rolled up to now first). A line counts when its hour bucket starts in the window."""
    try:
        keys = parse_group_by(group_by if isinstance(group_by, str) else list(group_by))
    except ValueError as exc:
        raise InvalidArgument(f"group_by: {exc}", "group_by") from None
    now = rt.clock.now()
    end = until or now
    if since is not None and since >= end:
        raise InvalidArgument(f"since: {_iso(since)} must be before until ({_iso(end)})", "since")
    roll_up_costs(rt, now, strict=True)  # a report must include everything up to now
    rows: dict[tuple[str, ...], _Row] = {}
    total = _Row()
    # Grouped by node too, to count distinct nodes; on-prem lines (no node) are not burst spend.
    for sums in rt.store.cost_sums([*keys, "node"], since=since, until=end):
        *key, node = sums.keys
        if node == NO_NODE:
            continue
        for r in (rows.setdefault(tuple(key), _Row()), total):
            r.add(node, sums)
    ordered = sorted(rows.items())
    cents = allocate_cents([r.micros for _, r in ordered], total.micros)
    return {
        "since": _iso(since), "until": _iso(end), "group_by": list(keys), "currency": "USD",
        "rows": [{**dict(zip(keys, key, strict=True)), **row.as_json(c)}
                 for (key, row), c in zip(ordered, cents, strict=True)],
        "total": total.as_json(cents_of(total.micros)),
    }


class _Row:
    """Sums of one group of the spend report: distinct nodes, hours, micro-dollars."""

    __slots__ = ("gpu_seconds", "micros", "nodes", "seconds")

    def __init__(self) -> None:
        self.nodes: set[str] = set()
        self.seconds = 0.0
        self.gpu_seconds = 0.0
        self.micros = 0

    def add(self, node: str, sums: CostSums) -> None:
        self.nodes.add(node)
        self.seconds += sums.instance_seconds
        self.gpu_seconds += sums.gpu_seconds
        self.micros += sums.cost_micros

    def as_json(self, cents: Decimal) -> dict:
        return {
            "nodes": len(self.nodes),
            "instance_hours": round(self.seconds / 3600, 4),
            "gpu_hours": round(self.gpu_seconds / 3600, 4),
            "cost_usd": str(cents),
            "cost_usd_exact": str((Decimal(self.micros) / 1_000_000).quantize(MICRO)),
        }


__all__ = [
    "GROUP_KEYS", "DrainArgs", "EvaluateArgs", "InvalidArgument", "PauseArgs", "PoolArgs",
    "PrewarmArgs", "SpendArgs", "drain_pool", "evaluate", "parse", "parse_group_by", "parse_time",
    "pause", "pools_of", "prewarm", "resume", "spend_report",
]
