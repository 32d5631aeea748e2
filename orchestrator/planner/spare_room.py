"""Which jobs may take a burst node's spare room (``trigger.spare_room``).

The wait-aware rule (:mod:`.wait`) keeps a job queued for on-prem when it is predicted to start
there within ``wait_slo``: it needs no cloud node to meet its SLO. A burst node with GPUs free
(its other jobs done, or a launch bigger than the jobs it was for) takes any pending job that fits
it, and a job kept for on-prem is often the oldest there: on the ITP trace a sixth of the burst
GPU-hours were such jobs, long ones among them, each keeping a node billed for the hours or days
it ran after the node's other work had ended (``docs/performance.md``, issue 16, part 3). Such
a start buys nothing for the SLO; what it can buy is on-prem room for later work, worth at most
what that work would cost in the cloud.

With ``trigger.spare_room`` on, every job the split keeps for on-prem is listed as *kept*: the
burst dispatcher may start it on a burst node only where the node time it adds (how much longer
the node then runs than its running work needs: ``max(0, runtime - node busy for)``, per node it
takes) costs at most ``max_extension`` times the job's own GPU-hours at that node's per-GPU
price; that is, on a node of ``N`` GPUs, an addition of at most ``max_extension x gpus / N x
runtime``. With 0, only nodes whose work outlasts the job; with 1 (the default), no more than
bursting the job on a node of its own size would cost, the break-even if the on-prem room it
frees saves as much cloud time later. A job of unknown runtime adds an unknown time: it is kept
off every node. A job wider than one node takes whole free nodes for its whole runtime: it may
only where ``max_extension`` is 1 and the nodes hold exactly its GPUs.

The decision lists the kept jobs (at most :data:`MAX_KEPT`, in scheduling order: a job past
that is not kept) and records, for the first :data:`RECORDED` of them, why: the runtime, the node
time a node of each size may add for it, and on how many of the burst nodes that hold it (up,
or booting for other jobs) it may start when room frees there (their work lasts long enough). Jobs the split bursts
(due or waiting) are not touched: the rule changes which node a kept job may start on, never
which jobs are burst, so no job is predicted later than without it.

A job the planner would count as absorbed by a burst node's spare room never reaches the split;
so, with the rule on, absorption asks :class:`SpareAdmit` about each node: a job that would
lengthen the node beyond its share is not absorbed there, and the split decides about it (kept
if on-prem starts it within the SLO; else burst as any unmet job). A node still booting is busy
for the longest of the jobs it was launched for (they take it first when it is up).

Pure: ``now`` is an argument; the nodes and their runs come from the snapshot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.pending import JobsView
from orchestrator.domain.snapshot import BurstRun

INF = math.inf
MAX_KEPT = 1000  # kept jobs listed per decision (in scheduling order)
RECORDED = 20  # kept jobs recorded with their reasons per decision


def allowed_extension_s(gpus: int, runtime_s: float | None, node_gpus: int,
                        max_extension: float) -> float | None:
    """How much longer a node of ``node_gpus`` GPUs may run for a kept job (None: not at all,
    the job's runtime is unknown or it is wider than the node)."""
    if runtime_s is None or gpus > node_gpus or node_gpus <= 0:
        return None
    return max_extension * gpus / node_gpus * float(runtime_s)


def wide_allowed(gpus: int, nodes: int, node_gpus: int, max_extension: float) -> bool:
    """Whether a kept job wider than one node may take ``nodes`` whole free nodes of
    ``node_gpus`` GPUs: their whole runtime is added, at most ``max_extension`` x its GPU-hours."""
    return nodes * node_gpus <= max_extension * gpus


@dataclass(frozen=True, slots=True)
class Busy:
    """A burst node: its GPUs, and for how long its work keeps it busy from now (0: idle; inf:
    work of unknown duration)."""

    node: str
    gpus: int
    busy_for_s: float
    launched_for: frozenset[str] = frozenset()  # (booting) the jobs it was launched for


class SpareAdmit:
    """An admitter (as :class:`~.admission.NodeAdmitter` reads, for absorption) that refuses a
    job on a ready burst node it would lengthen beyond its share, and asks ``base`` (budgets,
    quotas; None: none) about the rest. Absorbed there, a job would count as covered and never
    reach the wait-aware split, so it could not be kept; refused, it is unmet and the split
    says whether it stays for on-prem (kept) or is burst. The verdict reads the job's width and
    runtime and the node, so absorption's cache of refusals by (project, width, runtime) holds."""

    quotas_only = False
    checks_wide = True  # absorption asks about each whole node a wide job would take

    def __init__(self, busy: dict[str, Busy], max_extension: float, base=None):
        self.busy = busy
        self.max_extension = max_extension
        self.base = base
        self.admission = base.admission if base is not None else None

    @property
    def loosened(self) -> int:
        return self.base.loosened if self.base is not None else 0

    def node_class(self, node_id: str | None) -> object:  # pragma: no cover - quotas_only off
        return node_id

    def __call__(self, job: Job, node_id: str | None) -> bool:
        node = self.busy.get(node_id) if node_id is not None else None
        if node is not None and job.id not in node.launched_for:
            if job.gpus > node.gpus:  # one of the whole nodes of a wide job
                nodes = -(-job.gpus // node.gpus)
                if not wide_allowed(job.gpus, nodes, node.gpus, self.max_extension):
                    return False
            elif not may_join(job, node, self.max_extension):
                return False
        if self.base is None:
            return True
        if job.gpus > node_gpus_of(node):
            return True  # (absorption never asked the base about wide jobs)
        return self.base(job, node_id)


@dataclass(frozen=True, slots=True)
class KeptOnPrem:
    """The jobs kept for on-prem and off spare burst room that would cost more than their share."""

    kept: tuple[str, ...]
    records: tuple[dict, ...]
    max_extension: float
    listed_all: bool = True  # False: more jobs were kept for on-prem than MAX_KEPT

    def inputs(self) -> dict:
        return {"max_extension": self.max_extension, "kept_jobs": len(self.kept),
                "kept": list(self.kept), "all_listed": self.listed_all,
                "records": list(self.records)}

    def text(self) -> str:
        return (f"{len(self.kept)} job(s) kept for on-prem may take a burst node's spare room "
                "only where they lengthen its bill by at most their share (trigger.spare_room)")


def busy_nodes(nodes: Iterable[Node], runs: Iterable[BurstRun], now: datetime,
               launched: Mapping[str, float | None] | None = None) -> list[Busy]:
    """The burst nodes up or on their way, and how long their work keeps them busy: a ready
    node's running jobs; a node still booting, the longest of the pending jobs it was launched
    for (``launched``: their runtimes by id; unknown: for ever), as those take it first."""
    busy: dict[str, float] = {}
    for run in runs:
        left = (INF if run.duration_s is None
                else (run.started_at - now).total_seconds() + float(run.duration_s))
        if left > busy.get(run.node_id, 0.0):
            busy[run.node_id] = left
    out = []
    for n in nodes:
        if n.state is NodeState.READY:
            out.append(Busy(n.id, n.gpus, busy.get(n.id, 0.0)))
        elif n.state.in_flight:
            longest = 0.0
            for job_id in n.launched_for:
                if launched is not None and job_id in launched:
                    runtime = launched[job_id]
                    longest = max(longest, INF if runtime is None else float(runtime))
            out.append(Busy(n.id, n.gpus, longest, frozenset(n.launched_for)))
    return out


def node_gpus_of(node: Busy | None) -> float:
    return INF if node is None else node.gpus


def may_join(job: Job, node: Busy, max_extension: float) -> bool:
    """Whether ``job`` may take room on ``node`` (if it had room): the node time it adds is
    within its share (module docstring)."""
    runtime = job.duration_s
    allowed = allowed_extension_s(job.gpus, runtime, node.gpus, max_extension)
    if allowed is None or runtime is None:
        return False
    return max(0.0, float(runtime) - node.busy_for_s) <= allowed


def _record(job: Job, busy: Sequence[Busy], max_extension: float) -> dict:
    """Why the job is kept: its runtime, how much node time a node of each size may add for
    it, and on how many of the ready burst nodes that hold it it may start (as room frees)."""
    runtime = None if job.duration_s is None else float(job.duration_s)
    sizes = sorted({b.gpus for b in busy if b.gpus >= job.gpus})
    allowed = {}
    for size in sizes:
        a = allowed_extension_s(job.gpus, runtime, size, max_extension)
        allowed[str(size)] = None if a is None else round(a, 1)
    holding = [b for b in busy if b.gpus >= job.gpus]
    return {"job": job.id, "gpus": job.gpus, "runtime_s": runtime,
            "reason": "predicted to start on-prem within wait_slo",
            "allowed_extension_s": allowed,
            "burst_nodes_allowed": sum(1 for b in holding if may_join(job, b, max_extension)),
            "burst_nodes": len(holding)}


def keep_onprem(deferred: Sequence[Job], nodes: Sequence[Node], runs: Sequence[BurstRun],
                max_extension: float, now: datetime) -> KeptOnPrem:
    """The kept jobs (``deferred``: those the split keeps queued for on-prem, in scheduling
    order) with the records of the first :data:`RECORDED`; see the module docstring."""
    listed = (deferred[:MAX_KEPT].ids() if isinstance(deferred, JobsView)
              else [j.id for j in deferred[:MAX_KEPT]])
    head = list(deferred[:RECORDED])
    busy = busy_nodes(nodes, runs, now) if head else []
    records = tuple(_record(job, busy, max_extension) for job in head)
    return KeptOnPrem(tuple(listed), records, max_extension,
                      listed_all=len(listed) == len(deferred))


__all__ = ["MAX_KEPT", "RECORDED", "Busy", "KeptOnPrem", "SpareAdmit", "allowed_extension_s", "busy_nodes",
           "keep_onprem", "may_join", "wide_allowed"]
