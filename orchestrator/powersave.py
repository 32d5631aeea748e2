"""Slurm power save, carried out: what ``burst slurm resume / suspend / resume-fail`` do.

slurmctld runs these programs for ``State=CLOUD`` nodes (slurm.conf ``ResumeProgram``,
``SuspendProgram``, ``ResumeFailProgram``) with a hostlist; docs/slurm-power-save.md.

* **resume**: the names are routed to the power-save policy listing them in
  ``fabric.slurm.slots``; the planner's own rules decide what to launch for each
  (:mod:`orchestrator.planner.powersave`); each launch is bound to its name in the store (a
  ``cloud`` fabric member) after its intent is recorded and before the provider is called, so
  the node's agent joins as that name (``slurmd -b -N <name>``). A name nothing is launched for
  (budget, quota, paused pool, no offering, a failed launch) is marked DOWN in Slurm with burst's
  reason, ``burst: ...``, which ``sinfo -R`` shows, and its jobs go back to the queue (Slurm
  requeues them).
* **suspend** / **resume-fail**: the burst node bound to each name is terminated through the
  executor (recorded ``terminating`` with reason ``slurm-suspend`` / ``slurm-resume-fail``, then
  the provider call); the name is freed. Slurm has powered the node down already, so nothing is
  asked of Slurm.

Passes are serialised by a lock file in the state directory: slurmctld may start a resume while
another one plans, and each must see the other's launches against ``limits.max_nodes``. The
ResumeProgram runs on the slurmctld host only, so a host lock is enough.
"""

from __future__ import annotations

import fcntl
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.plan import ActionReason, Terminate
from orchestrator.planner.powersave import plan_resume, requests_of
from orchestrator.policy.models import Policy
from orchestrator.sources.slurm import slurm_scope
from orchestrator.sources.slurm_cli import SlurmCli, SlurmError
from orchestrator.store.slots import CLOUD
from orchestrator.wiring import Runtime

log = logging.getLogger("burst.slurm.powersave")

LOCK_NAME = "slurm-powersave.lock"
REASON_MAX = 120  # Slurm keeps a reason of any length; sinfo -R is read in a terminal
_GONE = frozenset({NodeState.TERMINATING, NodeState.TERMINATED, NodeState.FAILED})


class PowerSaveError(Exception):
    """A power-save request names nodes burst cannot act for; the message says which and why."""


@dataclass(slots=True)
class Outcome:
    """What one pass did, by node name."""

    launched: dict[str, str] = field(default_factory=dict)  # name -> burst node id
    refused: dict[str, str] = field(default_factory=dict)  # name -> reason given to Slurm
    terminated: dict[str, str] = field(default_factory=dict)  # name -> burst node id
    unbound: list[str] = field(default_factory=list)  # names no burst node held
    decision_id: str | None = None

    def as_dict(self) -> dict:
        return {"launched": self.launched, "refused": self.refused,
                "terminated": self.terminated, "unbound": self.unbound,
                "decision": self.decision_id}


def route(policies: Sequence[Policy], names: Sequence[str]) -> dict[str, list[str]]:
    """Policy name -> the requested names it lists; PowerSaveError naming any name no
    power-save policy lists."""
    routed: dict[str, list[str]] = {}
    unknown = []
    owners = {n: p.name for p in policies if p.power_saved for n in p.fabric.slurm.slot_names()}
    for name in names:
        if name in owners:
            routed.setdefault(owners[name], []).append(name)
        else:
            unknown.append(name)
    if unknown:
        listed = sorted({p.name for p in policies if p.power_saved})
        raise PowerSaveError(
            f"no power-save policy lists {', '.join(unknown)} in fabric.slurm.slots "
            f"(power-save policies: {', '.join(listed) or 'none'}; they need "
            "fabric.slurm.join: power-save)")
    return routed


@contextmanager
def serialised(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cli(policy: Policy) -> SlurmCli:
    return SlurmCli(policy.queue.slurm_conf)


def _default_gpus(policy: Policy) -> int:
    sized = [o.gpus for o in policy.offerings if getattr(o, "gpus", None)]
    return min(sized) if sized else policy.pool.onprem.gpus_per_node


def resume(rt: Runtime, policy: Policy, names: Sequence[str]) -> Outcome:
    """Plan and launch burst nodes for ``names`` (see the module docstring)."""
    cli = _cli(policy)
    scope = slurm_scope(policy)
    outcome = Outcome()
    with serialised(rt.settings.state_dir):
        # A name still bound to a live node: Slurm lost that node (it resumes only powered-down
        # names), so the old one goes before a new one is launched for the name.
        stale = [m for m in rt.store.fabric_members(scope) if m.name in names and m.node_id]
        if stale:
            _terminate(rt, stale, ActionReason.SLURM_RESUME_FAIL, outcome)
            outcome.terminated.clear()
        gpus = {}
        for name in names:
            try:
                found = cli.node_gpus(name)
            except SlurmError:
                found = None
            if found:
                gpus[name] = found
        now = rt.clock.now()
        requests = requests_of(names, gpus, _default_gpus(policy))
        # Slurm has decided already: its queue is not read (nor needed to be up).
        snapshot = rt.observer.snapshot(now, policies=[policy], read_queues=False)
        planned = plan_resume(snapshot, policy, requests, now)
        outcome.decision_id = planned.decision.id
        rt.executor.execute(replace(planned.plan, actions=()))  # the decision and memory first
        errors: list[str] = []
        for name, launch in planned.launches.items():
            # Intent, then the name, then the provider call: the agent's registration asks which
            # name it is, and a name whose node has no record yet would be freed by the
            # reconciler's clean-up of names held by gone nodes.
            if rt.executor.record_launch(launch) is not None:
                rt.store.add_fabric_member(scope, name, launch.node_id, now, kind=CLOUD)
                errors += rt.executor.launch_recorded(launch.node_id).errors
        refused = dict(planned.refused)
        for name, launch in planned.launches.items():
            node = rt.store.get_node(launch.node_id)
            if node is None or node.state in _GONE:
                refused[name] = f"launch failed: {'; '.join(errors) or 'see burst explain'}"
                rt.store.release_fabric_member(launch.node_id)
            else:
                outcome.launched[name] = launch.node_id
        for name, why in refused.items():
            reason = f"burst: {why} ({planned.decision.id})"
            if len(reason) > REASON_MAX:
                reason = f"burst: {why[:REASON_MAX - 30]}... ({planned.decision.id})"
            outcome.refused[name] = reason
            try:
                cli.set_down(name, reason)
            except SlurmError as exc:
                log.error("could not mark %s down in Slurm: %s", name, exc)
    log.info("resume %s: %s", ", ".join(names), outcome.as_dict())
    return outcome


def power_down(rt: Runtime, policy: Policy, names: Sequence[str], reason: ActionReason) -> Outcome:
    """Terminate the burst nodes bound to ``names`` (suspend, or a resume that failed)."""
    outcome = Outcome()
    with serialised(rt.settings.state_dir):
        members = {m.name: m for m in rt.store.fabric_members(slurm_scope(policy))
                   if m.kind == CLOUD and m.node_id}
        outcome.unbound = [n for n in names if n not in members]
        _terminate(rt, [members[n] for n in names if n in members], reason, outcome)
    log.info("%s %s: %s", reason, ", ".join(names), outcome.as_dict())
    return outcome


def _terminate(rt: Runtime, members: list, reason: ActionReason, outcome: Outcome) -> None:
    actions = [Terminate(m.node_id, reason) for m in members]
    report = rt.executor.run(actions)
    for member in members:
        node = rt.store.get_node(member.node_id)
        if node is None or node.state in _GONE:
            rt.store.release_fabric_member(member.node_id)  # no-op once node_gone freed it
            outcome.terminated[member.name] = member.node_id
    if report.errors:
        log.warning("%s: %s", reason, "; ".join(report.errors))


__all__ = ["Outcome", "PowerSaveError", "power_down", "resume", "route"]
