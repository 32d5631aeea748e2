"""The JSON form of a Snapshot (for ``burst plan --snapshot``) and of a Plan (for ``--json``).

The format is the domain dataclasses themselves, validated by pydantic: ``burst plan
--snapshot-schema`` prints its JSON Schema, so a scenario can be written by hand. Unknown keys are
rejected, and errors name the file and the path of the bad value.
"""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node
from orchestrator.domain.offerings import BillingRule, Offering
from orchestrator.domain.plan import Decision, Drain, Hold, Launch, OfferingOption, Plan, Terminate
from orchestrator.domain.snapshot import (
    BudgetSpend,
    CapacityBlock,
    OnPremRelease,
    OnPremState,
    PolicyMemory,
    PoolQueue,
    PrewarmRequest,
    Snapshot,
)

for _cls in (Job, Node, BillingRule, Offering, CapacityBlock, OnPremState, OnPremRelease,
             PolicyMemory, PoolQueue, PrewarmRequest, BudgetSpend, Snapshot):
    _cls.__pydantic_config__ = ConfigDict(extra="forbid")  # type: ignore[attr-defined]

_SNAPSHOT = TypeAdapter(Snapshot)


class SnapshotError(Exception):
    """A snapshot file failed to load; the message names the file and each bad path."""


def snapshot_json_schema() -> dict[str, Any]:
    schema = _SNAPSHOT.json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "burst-snapshot-v1"
    schema["description"] = (
        "World state for `burst plan`: queues per pool (pending jobs, on-prem capacity), burst "
        "nodes, the provider catalogue, the negative-capacity cache, the planner's memory and the "
        "spend observed per budget. "
        "Times are ISO 8601 with a timezone."
    )
    return schema


def load_snapshot_text(text: str, file: str = "<snapshot>") -> Snapshot:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{file}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    try:
        snapshot = _SNAPSHOT.validate_python(data)
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_url=False):
            path = ".".join(str(p) for p in error["loc"]) or "<snapshot>"
            lines.append(f"{file}: {path}: {error['msg']}")
        raise SnapshotError("\n".join(lines)) from None
    for name, moment in _times(snapshot):
        if moment.tzinfo is None:
            raise SnapshotError(f"{file}: {name}: times need a timezone (e.g. 2026-11-30T03:00:00Z)")
    short = [f"{file}: {name}: must be at least 1, got {gpus}" for name, gpus in _gpu_counts(snapshot)
             if gpus < 1]
    if short:  # a job of no GPUs is no GPU demand; the planner's packing divides by widths
        raise SnapshotError("\n".join(short))
    return snapshot


def _gpu_counts(snapshot: Snapshot):
    for pool, queue in snapshot.queues.items():
        for i, job in enumerate(queue.pending):
            yield f"queues.{pool}.pending.{i}.gpus", job.gpus
        for i, release in enumerate(queue.onprem_releases):
            yield f"queues.{pool}.onprem_releases.{i}.gpus", release.gpus


def _times(snapshot: Snapshot):
    yield "taken_at", snapshot.taken_at
    for pool, queue in snapshot.queues.items():
        for i, job in enumerate(queue.pending):
            yield f"queues.{pool}.pending.{i}.submitted_at", job.submitted_at
        for i, release in enumerate(queue.onprem_releases):
            yield f"queues.{pool}.onprem_releases.{i}.ends_at", release.ends_at
    for i, node in enumerate(snapshot.nodes):
        yield f"nodes.{i}.state_since", node.state_since
    for pool, request in snapshot.prewarm.items():
        yield f"prewarm.{pool}.until", request.until
    for key, spend in snapshot.budget_spend.items():
        for name in ("window_start", "window_end"):
            moment = getattr(spend, name)
            if moment is not None:
                yield f"budget_spend.{key}.{name}", moment


def load_snapshot(path: str | Path) -> Snapshot:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SnapshotError(f"{path}: cannot read: {exc.strerror}") from None
    return load_snapshot_text(text, str(path))


def snapshot_to_json(snapshot: Snapshot) -> dict[str, Any]:
    return _SNAPSHOT.dump_python(snapshot, mode="json")


_ACTION_TYPES = {Launch: "launch", Drain: "drain", Terminate: "terminate", Hold: "hold"}


def to_jsonable(value: Any) -> Any:
    """Dataclasses (actions, decisions) as JSON-ready dicts, with a ``type`` on actions."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        if type(value) in _ACTION_TYPES:
            out["type"] = _ACTION_TYPES[type(value)]
        for f in fields(value):
            out[f.name] = to_jsonable(getattr(value, f.name))
        return out
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, frozenset, set)):
        return [to_jsonable(v) for v in value]
    return TypeAdapter(type(value)).dump_python(value, mode="json") if value is not None and not isinstance(
        value, (str, int, float, bool)) else value


def plan_to_json(plan: Plan) -> dict[str, Any]:
    return to_jsonable(plan)


def decision_to_jsonable(decision: Decision) -> dict[str, Any]:
    """A decision as the CLI and the API serve it: ``repeats`` counts the ticks that decided the
    same in a row, the latest at ``last_seen_at`` (the decision's own time when made once)."""
    doc = to_jsonable(decision)
    doc["last_seen_at"] = to_jsonable(decision.last_seen)
    return doc


__all__ = ["OfferingOption", "SnapshotError", "decision_to_jsonable", "load_snapshot",
           "load_snapshot_text", "plan_to_json", "snapshot_json_schema", "snapshot_to_json"]
