"""The JSON form of a Snapshot (for ``burst plan --snapshot``) and of a Plan (for ``--json``).

The format is the domain dataclasses themselves, validated strictly by pydantic: ``burst plan
--snapshot-schema`` prints its JSON Schema, so a scenario can be written by hand. Unknown keys are
rejected, and errors name the file and the path of the bad value. The file is read within the
input limits of :mod:`orchestrator.policy.reading`; every time, number and name is then checked
(timezone, :mod:`orchestrator.policy.bounds`).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, TypeAdapter, ValidationError

from orchestrator.policy import bounds
from orchestrator.policy.reading import InputError, InputKind, load_json, read_input
from orchestrator.policy.timefmt import TimeFormatError, require_aware
from orchestrator.policy.units import MAX_DURATION_S

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node
from orchestrator.domain.offerings import BillingRule, Offering
from orchestrator.domain.plan import Decision, Drain, Hold, Launch, OfferingOption, Plan, Terminate
from orchestrator.domain.snapshot import (
    BootEstimate,
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
             PolicyMemory, PoolQueue, PrewarmRequest, BudgetSpend, BootEstimate, Snapshot):
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
        "Times are ISO 8601 with a timezone. Types are strict (\"1\" is not a number). Limits: "
        "64 MiB of UTF-8, no NUL, nesting of at most 32 levels, numbers of at most 40 characters; "
        "GPU counts, prices and names are bounded (see docs/snapshot-format.md)."
    )
    return schema


def load_snapshot_text(text: str, file: str = "<snapshot>") -> Snapshot:
    """Validate snapshot JSON text; :class:`SnapshotError` lists every problem, never a traceback.

    The text is read within the input limits (:mod:`orchestrator.policy.reading`), validated
    strictly (``"gpus": "1"`` is not a number), then every time is checked for a timezone and
    every number and name against :mod:`orchestrator.policy.bounds`.
    """
    try:
        load_json(text, file)  # the limits: depth, number length, NUL, NaN
    except InputError as exc:
        raise SnapshotError(str(exc)) from None
    try:
        snapshot = _SNAPSHOT.validate_json(text, strict=True)
    except ValidationError as exc:
        lines = []
        for error in exc.errors(include_url=False):
            path = ".".join(str(p) for p in error["loc"]) or "<snapshot>"
            lines.append(f"{file}: {path}: {error['msg']}")
        raise SnapshotError("\n".join(lines)) from None
    except ValueError as exc:  # pragma: no cover - load_json refused the text already
        raise SnapshotError(f"{file}: invalid JSON: {exc}") from None
    problems = [f"{file}: {path}: {message}" for path, message in _check(snapshot, "")]
    if problems:
        raise SnapshotError("\n".join(problems))
    return snapshot


# Bounds of the numbers of a snapshot, by (class, field): (least, most). GPU counts of jobs and
# releases are at least 1: a job of no GPUs is no GPU demand, and the planner's packing divides
# by widths.
_BOUNDS: dict[tuple[type, str], tuple[float, float]] = {
    (Job, "gpus"): (1, bounds.MAX_JOB_GPUS),
    (Job, "priority"): (-bounds.MAX_PRIORITY, bounds.MAX_PRIORITY),
    (Job, "duration_s"): (0, MAX_DURATION_S),
    (Job, "dataset_gb"): (0, 10_000_000),  # 10 PB, as pool.storage.datasets[].size_gb
    (OnPremRelease, "gpus"): (1, bounds.MAX_JOB_GPUS),
    (OnPremRelease, "node"): (0, bounds.MAX_COUNT),
    (BootEstimate, "boot_s"): (0, MAX_DURATION_S),
    (BootEstimate, "samples"): (0, bounds.MAX_COUNT),
    (BootEstimate, "percentile"): (0, 1),
    (OnPremState, "total_gpus"): (0, bounds.MAX_POOL_GPUS),
    (OnPremState, "free_gpus"): (0, bounds.MAX_POOL_GPUS),
    (OnPremState, "free_per_node"): (0, bounds.MAX_GPUS_PER_NODE),
    (PoolQueue, "running_onprem_jobs"): (0, bounds.MAX_COUNT),
    (PoolQueue, "running_burst_jobs"): (0, bounds.MAX_COUNT),
    (Node, "gpus"): (0, bounds.MAX_GPUS_PER_NODE),
    (Node, "gpus_busy"): (0, bounds.MAX_GPUS_PER_NODE),
    (Node, "gpu_utilisation_percent"): (0, 100),
    (Node, "price_usd_hour"): (0, bounds.MAX_PRICE_USD_HOUR),
    (Node, "running_jobs"): (0, bounds.MAX_COUNT),
    (Node, "launch_attempts"): (0, bounds.MAX_COUNT),
    (Node, "version"): (0, 2**63 - 1),
    (Node, "budget_commit_usd"): (0, bounds.MAX_USD),
    (Offering, "gpus"): (1, bounds.MAX_GPUS_PER_NODE),
    (Offering, "price_usd_hour"): (0, bounds.MAX_PRICE_USD_HOUR),
    (Offering, "vcpus"): (0, bounds.MAX_COUNT),
    (Offering, "memory_gib"): (0, bounds.MAX_COUNT),
    (Offering, "interconnect_gbps"): (0, bounds.MAX_COUNT),
    (BillingRule, "minimum_s"): (0, 86_400),
    (BillingRule, "increment_s"): (1, 86_400),
    (PrewarmRequest, "gpus"): (1, bounds.MAX_POOL_GPUS),
    (BudgetSpend, "spent_usd"): (0, bounds.MAX_USD),
    (BudgetSpend, "burn_usd_hour"): (0, bounds.MAX_USD),
}
_CLOUD_NAMES = {"region", "zone", "instance_type"}
_TEXT = {"gpu_model", "reason"}  # free text; every other string is an identifier


def _check(value: Any, path: str):
    """(path, message) of every time without a timezone, number out of bounds and unsafe name."""
    if is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            yield from _check_field(type(value), f.name, getattr(value, f.name),
                                    f"{path}.{f.name}" if path else f.name)
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}"
            if isinstance(key, str) and (message := bounds.name_problem(key, bounds.ID_RE)):
                yield f"{where} (key)", message
            yield from _check(item, where)
    elif isinstance(value, (tuple, list, frozenset)):
        for index, item in enumerate(sorted(value) if isinstance(value, frozenset) else value):
            yield from _check(item, f"{path}.{index}")


def _check_field(cls: type, name: str, value: Any, path: str):
    if isinstance(value, datetime):
        try:
            require_aware(value, path)
        except TimeFormatError as exc:
            yield path, str(exc).removeprefix(f"{path}: ")
        return
    limits = _BOUNDS.get((cls, name))
    if limits is not None:
        items = value if isinstance(value, tuple) else (value,)
        for index, number in enumerate(items):
            if number is None or limits[0] <= number <= limits[1]:
                continue
            where = f"{path}.{index}" if isinstance(value, tuple) else path
            if number < limits[0]:
                yield where, f"must be at least {limits[0]:g}, got {number}"
            else:
                yield where, f"must be at most {limits[1]:g}, got {number}"
        return
    if isinstance(value, str) and not isinstance(value, Enum):
        pattern = (bounds.CLOUD_NAME_RE if name in _CLOUD_NAMES
                   else bounds.TEXT_RE if name in _TEXT else bounds.ID_RE)
        if name in _TEXT and value == "":
            return
        if message := bounds.name_problem(value, pattern):
            yield path, message
        return
    yield from _check(value, path)


def load_snapshot(path: str | Path) -> Snapshot:
    """Load one snapshot file within the input limits; :class:`SnapshotError` names the file."""
    try:
        text = read_input(path, InputKind.SNAPSHOT)
    except InputError as exc:
        raise SnapshotError(str(exc)) from None
    return load_snapshot_text(text, str(Path(path)))


def snapshot_to_json(snapshot: Snapshot) -> dict[str, Any]:
    """The snapshot in the ``--snapshot`` format. A live queue carries its pending jobs as
    columns (:class:`~orchestrator.domain.pending.PendingColumns`); the file lists them as jobs."""
    queues = {pool: queue if isinstance(queue.pending, tuple)
              else replace(queue, pending=tuple(queue.pending))
              for pool, queue in snapshot.queues.items()}
    return _SNAPSHOT.dump_python(replace(snapshot, queues=queues), mode="json")


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
