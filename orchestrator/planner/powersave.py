"""Planning a Slurm power-save resume: Slurm names the nodes, the planner's rules decide what to buy.

Slurm's ResumeProgram (``burst slurm resume cloud-[1-2]``) says *which* ``State=CLOUD`` nodes it
wants up; burst decides *what* to launch for each: offering, market, budget and quota, with the
same :func:`orchestrator.planner.plan` every tick uses. The resume is fed to it as the demand it
already understands:

* one pending job per requested node name (id = the name, its GPUs = the node's ``Gres=gpu:N``,
  submitted at the request), in a queue with no free on-prem GPU: Slurm has already chosen a CLOUD
  node over the on-prem ones;
* the policy's live burst nodes are each bound to a name of their own, so none may absorb
  another name's demand, while all of them still count for ``limits.max_nodes``,
  ``max_concurrent_launches``, ``max_burst_gpus``, the hourly spend and the budgets: a ready node
  is shown with every GPU in use, and a node still in flight (whose GPUs absorption counts as
  coming capacity) is given a placeholder job of its size, ahead of the names in the scheduling
  order (id ``bound:<node id>``), which it absorbs;
* only offerings with exactly the node's GPU count: a CLOUD node is one instance of the size
  slurm.conf declares, and a larger one would pack two names onto one machine;
* the trigger, its hysteresis and the scale-up cooldown are Slurm's to decide (ResumeRate,
  SuspendTime): they are set to fire at once, and ``min_nodes``/pre-warm floors do not apply.

Everything else is the policy as written: a paused pool, an exhausted budget, a quota or a missing
offering holds the launch back, and the decision says so; the caller marks those names DOWN with
that reason. Each launch carries the name it is for in ``Launch.jobs``. Pure, like the planner.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.plan import Decision, Launch, Plan
from orchestrator.domain.snapshot import OnPremState, PoolQueue, Snapshot
from orchestrator.planner import plan
from orchestrator.policy.models import Policy

_IN_FLIGHT = frozenset(s for s in NodeState if s.in_flight)
BOUND = "bound:"  # id prefix of the placeholder job of a node in flight
_FIRST = 2**31 - 1  # placeholders are scheduled before any name


@dataclass(frozen=True, slots=True)
class ResumeRequest:
    """One node name Slurm asked to resume, and the GPUs slurm.conf gives it."""

    name: str
    gpus: int


@dataclass(frozen=True, slots=True)
class ResumePlan:
    """The plan for a resume: its launches by node name, and the names nothing launches for."""

    plan: Plan
    launches: dict[str, Launch]  # node name -> the launch bound to it
    refused: dict[str, str]  # node name -> why nothing is launched for it (the decision's text)

    @property
    def decision(self) -> Decision:
        return self.plan.decisions[0]


def resume_policy(policy: Policy, sizes: frozenset[int] | None = None) -> Policy:
    """The policy as a resume plans it: the trigger fires at once, no cooldown, no floor; with
    ``sizes``, only the offerings of those GPU counts (an offering whose size the catalogue
    gives is filtered with the catalogue, :func:`resume_snapshot`)."""
    trigger = policy.trigger.model_copy(update={
        "pending_gpus_above": 0, "oldest_wait_above": timedelta(0),
        "sustained_for": timedelta(0), "wait_slo": None})
    return policy.model_copy(update={
        "trigger": trigger,
        "cooldowns": policy.cooldowns.model_copy(update={"scale_up": timedelta(0)}),
        "limits": policy.limits.model_copy(update={"min_nodes": 0}),
        "offerings": [o for o in policy.offerings
                      if sizes is None or o.gpus is None or o.gpus in sizes],
    })


def _busy(node: Node) -> Node:
    """A ready node bound to its own name, with every GPU taken (absorbs nothing)."""
    if node.state is not NodeState.READY:
        return node
    return replace(node, gpus_busy=node.gpus, running_jobs=max(node.running_jobs, 1),
                   idle_since=None)


def resume_snapshot(snapshot: Snapshot, policy: Policy, requests: Sequence[ResumeRequest],
                    now: datetime) -> Snapshot:
    """``snapshot`` with the resume as the pool's only demand (see the module docstring)."""
    pool = policy.pool.name
    mine = [n for n in snapshot.nodes if n.policy == policy.name]
    # Larger placeholders first, so first-fit gives each in-flight node its own.
    flying = sorted((n for n in mine if n.state in _IN_FLIGHT), key=lambda n: -n.gpus)
    held = tuple(Job(id=f"{BOUND}{n.id}", project=None, pool=pool, gpus=n.gpus,
                     submitted_at=now - timedelta(microseconds=len(flying) - i), priority=_FIRST)
                 for i, n in enumerate(flying))
    # No project or user: Slurm names the nodes, not whose jobs wait for them (so the nodes get
    # no burst:user tag).
    jobs = held + tuple(Job(id=r.name, project=None, pool=pool, gpus=r.gpus, submitted_at=now)
                        for r in requests)
    sizes = {r.gpus for r in requests}
    queues = dict(snapshot.queues)
    queues[pool] = PoolQueue(pool, OnPremState(0, 0), pending=jobs)
    nodes = tuple(_busy(n) if n.policy == policy.name else n for n in snapshot.nodes)
    offerings = tuple(o for o in snapshot.offerings if o.gpus in sizes)
    return replace(snapshot, queues=queues, nodes=nodes, offerings=offerings,
                   prewarm={k: v for k, v in snapshot.prewarm.items() if k != pool})


def plan_resume(snapshot: Snapshot, policy: Policy, requests: Sequence[ResumeRequest],
                now: datetime) -> ResumePlan:
    """Plan the launches for ``requests`` under ``policy``'s rules; only launches are kept (a
    resume drains nothing: Slurm's SuspendProgram does)."""
    sizes = frozenset(r.gpus for r in requests)
    result = plan(resume_snapshot(snapshot, policy, requests, now),
                  [resume_policy(policy, sizes)], now)
    decision = result.decisions[0]
    launches: dict[str, Launch] = {}
    kept: list[Launch] = []
    wanted = {r.name for r in requests}
    for action in result.actions:
        if (isinstance(action, Launch) and action.jobs and action.jobs[0] in wanted
                and action.jobs[0] not in launches):
            launches[action.jobs[0]] = action
            kept.append(action)
    why = decision.summary or str(decision.rule)
    refused = {r.name: why for r in requests if r.name not in launches}
    names = ", ".join(r.name for r in requests)
    decision = replace(
        decision, summary=f"Slurm ResumeProgram asked for {names}: {decision.summary}",
        inputs={**decision.inputs, "slurm_power_save": {
            "resume": [r.name for r in requests], "gpus": {r.name: r.gpus for r in requests},
            "launched_for": {name: lc.node_id for name, lc in launches.items()},
            "refused": sorted(refused)}})
    return ResumePlan(replace(result, actions=tuple(kept), decisions=(decision,)), launches,
                      refused)


def requests_of(names: Sequence[str], gpus: Mapping[str, int], default_gpus: int) -> list[ResumeRequest]:
    """One request per name, with its GPUs from ``gpus`` (what Slurm says), else ``default_gpus``."""
    return [ResumeRequest(name, int(gpus.get(name, default_gpus))) for name in names]


__all__ = ["ResumePlan", "ResumeRequest", "plan_resume", "requests_of", "resume_policy",
           "resume_snapshot"]
