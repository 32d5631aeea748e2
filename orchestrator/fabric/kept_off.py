"""Slurm: keep the jobs burst keeps for on-prem off the burst nodes they would lengthen
(``trigger.spare_room``), or that are on their way for other jobs (``onprem_order``).

The wait-aware rule keeps some queued jobs for on-prem: they are predicted to start there within
``wait_slo`` and need no cloud node. Slurm does not know that: a burst node with GPUs free takes
the first pending job that fits, and under ``trigger.onprem_order: longest-first`` the kept jobs
are the first of all (their nice raised them), so a long kept job would take the room and keep
the node billed for hours after the work it was launched for ended. With ``trigger.spare_room``
each decision lists the kept jobs and, for each, the burst nodes it may still take (its share of
the node's time, :meth:`orchestrator.planner.spare_room.KeptOnPrem.allowed_nodes`); burst writes
the others into the job's ``ExcNodeList``, so Slurm's scheduler and backfill leave them alone
and the job keeps its place for on-prem.

Under ``trigger.onprem_order: longest-first`` alone the same is done with a looser allowance:
the raised kept jobs stay off only the burst nodes on their way for other jobs (booting or
joining, launched for them), so a node that joins goes to the job it was launched for
(:func:`orchestrator.planner.spare_room.keep_ordered`).

Which names: the policy's burst nodes as Slurm knows them: every slot (``join: slot``, State=FUTURE
nodes, which Slurm accepts in an exclusion before they join) and every CLOUD name (``join:
power-save``, so Slurm does not resume a cloud node for a kept job), and the dynamic nodes present
(``join: dynamic``). A dynamic node does not exist before its slurmd registers, so under
``spare_room`` it registers drained (``slurmd -Z --conf "... State=DRAIN"``; Slurm 22.05 keeps no
reason given there, and a drain without a reason is only ever this one); the next plan writes it
into the kept jobs' exclusions and then resumes it, so no kept job can take it in between. Its
join takes up to one tick longer for that.

A job's own exclusions are kept: burst only adds and removes its burst node names. A job no longer
kept gets them removed. It is stateless (what is burst's is read off the names), so a controller
restart loses nothing: the next plan writes the exclusions afresh. Jobs needing the same list are
updated in one ``scontrol update jobid=a,b,...``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.policy.models import OnPremOrder, Policy

JOINING_REASON = "burst-joining"  # a dynamic node held drained until the kept jobs exclude it


def exclusions(pending: Mapping[str, Mapping[str, Any]], burst: set[str],
               kept: Iterable[str], allowed: Mapping[str, Iterable[str]],
               expand) -> dict[tuple[str, ...], list[str]]:
    """The exclusion each pending job must get, only where it changes, grouped by the new list
    (sorted names -> job ids). ``pending``: the partition's pending jobs by id (their squeue
    records); ``burst``: the policy's burst node names Slurm knows; ``kept``: the kept jobs' ids
    (an array task's id names its array); ``allowed``: the burst names each kept job may take;
    ``expand``: a hostlist expression -> names."""
    kept_ids = {job_id.split("_", 1)[0] for job_id in kept}
    allowed_by_base: dict[str, set[str]] = {}
    for job_id, names in allowed.items():
        allowed_by_base.setdefault(job_id.split("_", 1)[0], set()).update(names)
    out: dict[tuple[str, ...], list[str]] = {}
    for job_id, record in pending.items():
        current = set(expand(record.get("excluded_nodes") or ""))
        own = current - burst
        want = own | (burst - allowed_by_base.get(job_id, set())) if job_id in kept_ids else own
        if want != current:
            out.setdefault(tuple(sorted(want)), []).append(job_id)
    return out


def keeps_jobs_off(policy: Policy) -> bool:
    """Whether the policy's decisions keep jobs off burst nodes (``trigger.spare_room``, or
    ``trigger.onprem_order: longest-first``, whose raised jobs stay off nodes on their way for
    other jobs): its dynamic nodes join held."""
    trigger = policy.trigger
    return trigger.spare_room.enabled or trigger.onprem_order is OnPremOrder.LONGEST_FIRST


def held_joining(node: Mapping[str, Any]) -> bool:
    """Whether a dynamic node (its ``sinfo --json`` record) is held drained as it registered:
    DRAIN with no reason. Slurm 22.05 keeps the drain of ``slurmd -Z --conf "State=DRAIN"`` but
    not its reason, and a drain by an operator, or by burst's own release, always has one
    (``scontrol`` refuses a drain without)."""
    flags = {str(f).upper() for f in node.get("state_flags") or ()}
    return "DRAIN" in flags and not (node.get("reason") or "").strip()


__all__ = ["JOINING_REASON", "exclusions", "held_joining", "keeps_jobs_off"]
