"""Builders for the simulator's tests: hand-built traces and small policies a user could write."""

from __future__ import annotations

from typing import Any

import yaml

from orchestrator.policy import Policy, load_policy_text
from orchestrator.sim.replay import OnPremSizing, SimOptions, as_simulated, replay
from orchestrator.sim.traces import Trace, TraceJob
from tests.builders import deep_merge

# One sim offering of 8 GPUs at $8/h (a dollar per GPU-hour), on-prem 1 x 8 GPUs; "instant" trigger.
SIM_POLICY: dict[str, Any] = {
    "version": 1,
    "name": "simtest",
    "pool": {"name": "gpu", "onprem": {"nodes": 1, "gpus_per_node": 8}},
    "trigger": {"pending_gpus_above": 0, "oldest_wait_above": "5m", "sustained_for": "0s"},
    "offerings": [{"provider": "sim", "region": "r1", "instance_type": "s8", "gpus": 8,
                   "price_usd_hour": 8}],
    "limits": {"max_nodes": 20, "max_concurrent_launches": 20},
    "scale_down": {"idle_for": "10m", "drain_grace": "15m"},
    "cooldowns": {"scale_up": "0s", "scale_down": "0s"},
}
FIXED_BOOT = {"median_s": 100.0, "sigma": 0.0, "min_s": 100.0}  # every node is ready 100 s after launch


def sim_policy(**overrides: Any) -> Policy:
    return load_policy_text(yaml.safe_dump(deep_merge(SIM_POLICY, overrides), sort_keys=False),
                            "<test>")


def trace(*jobs: tuple, name: str = "hand") -> Trace:
    """Jobs as (id, submit_s, duration_s, gpus[, project[, priority]])."""
    return Trace(name, tuple(sorted((TraceJob(*j) for j in jobs), key=lambda j: j.submit_s)), name)


def options(**overrides: Any) -> SimOptions:
    values: dict[str, Any] = {"boot": dict(FIXED_BOOT), "onprem": "8", "node_gpus": 8}
    values.update(overrides)
    return SimOptions(**values)


def run_with(make_controller, policy: Policy, jobs: Trace, *, nodes: int = 1,
             gpus_per_node: int = 8, **option_overrides: Any):
    """Replay ``jobs`` with ``make_controller(simulated policy)`` deciding about burst nodes, on an
    on-prem pool of ``nodes`` x ``gpus_per_node``; returns the finished engine."""
    sizing = OnPremSizing(nodes, gpus_per_node, "test")
    sim = as_simulated(policy, sizing)
    return replay(make_controller(sim), policy, sim, jobs, sizing, options(**option_overrides))


def nodes_by_launch(engine) -> list:
    """Every node record of the run (terminated ones included), in launch order."""
    return engine.store.nodes(include_terminated=True)


def job(engine, job_id: str):
    return next(j for j in engine.world.jobs if j.trace.job_id == job_id)
