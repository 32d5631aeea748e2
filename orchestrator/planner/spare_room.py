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

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

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


class Busy(NamedTuple):
    """A burst node: its GPUs, and for how long its work keeps it busy from now (0: idle; inf:
    work of unknown duration). (A named tuple: a plan builds one per burst node, and a tuple is
    built in one C call where a frozen dataclass sets each field through Python.)"""

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
        # Seconds from now until the first job let onto a node would no longer be (the node's
        # work ends sooner as the clock moves, so the time the job adds grows): the answer's
        # bound for holds_until. A refusal never turns into a grant by the clock alone.
        self.turns_s = INF

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
            else:
                self.turns_s = min(self.turns_s, _turns_s(job, node, self.max_extension))
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
    # For the fabric (:meth:`allowed_nodes`): the kept jobs, and the burst nodes as the plan
    # read them (ready ones and those still booting; None: not read, no node holds room).
    jobs: Sequence[Job] = ()
    busy: tuple[Busy, ...] | None = None
    # ``trigger.onprem_order: longest-first`` without ``spare_room`` (:func:`keep_ordered`): the
    # kept jobs, raised first in Slurm, stay off only the nodes on their way for other jobs; the
    # nodes are read when the fabric asks (``source``: the plan's nodes, runs and now).
    only_launched: bool = False
    source: tuple | None = None

    def inputs(self) -> dict:
        return {"max_extension": self.max_extension, "kept_jobs": len(self.kept),
                "kept": list(self.kept), "all_listed": self.listed_all,
                "records": list(self.records)}

    def allowed_nodes(self) -> dict[str, frozenset[str]]:
        """The burst nodes each kept job may start on (its id -> node ids; a job not listed may
        start on none): those launched for it, and those it would lengthen by at most its share
        as their work stood at the plan (:func:`may_join`; a job wider than one node, whole
        nodes where :func:`wide_allowed`). What the fabric keeps the other nodes off for."""
        busy = self.busy
        if busy is None and self.source is not None:
            busy = tuple(busy_nodes(*self.source))
        busy = busy or ()
        out: dict[str, frozenset[str]] = {}
        if not busy:
            return out
        if self.only_launched:  # any node but one on its way for other jobs
            for job in self.jobs:
                ids = [n.node for n in busy if not n.launched_for or job.id in n.launched_for]
                if ids:
                    out[job.id] = frozenset(ids)
            return out
        for job in self.jobs:
            if job.duration_s is None and not any(job.id in b.launched_for for b in busy):
                continue  # an unknown runtime adds an unknown time: kept off every node
            ids = []
            for node in busy:
                if job.id in node.launched_for:
                    ids.append(node.node)
                elif job.gpus > node.gpus:
                    nodes = -(-job.gpus // node.gpus)
                    if wide_allowed(job.gpus, nodes, node.gpus, self.max_extension):
                        ids.append(node.node)
                elif may_join(job, node, self.max_extension):
                    ids.append(node.node)
            if ids:
                out[job.id] = frozenset(ids)
        return out

    def text(self) -> str:
        return (f"{len(self.kept)} job(s) kept for on-prem may take a burst node's spare room "
                "only where they lengthen its bill by at most their share (trigger.spare_room)")


def busy_nodes(nodes: Iterable[Node], runs: Sequence[BurstRun], now: datetime,
               launched: Mapping[str, float | None] | None = None) -> list[Busy]:
    """The burst nodes up or on their way, and how long their work keeps them busy: a ready
    node's running jobs; a node still booting, the longest of the pending jobs it was launched
    for (``launched``: their runtimes by id; unknown: for ever), as those take it first."""
    last = _last_runs(runs).get
    ready = NodeState.READY
    out = []
    for n in nodes:
        state = n.state
        if state is ready:
            run = last(n.id)
            if run is None:
                left = 0.0
            elif run.duration_s is None:
                left = INF
            else:
                left = (run.started_at - now).total_seconds() + float(run.duration_s)
                if left < 0.0:
                    left = 0.0
            out.append(Busy(n.id, n.gpus, left))
        elif state.in_flight:
            longest = 0.0
            for job_id in n.launched_for:
                if launched is not None and job_id in launched:
                    runtime = launched[job_id]
                    longest = max(longest, INF if runtime is None else float(runtime))
            out.append(Busy(n.id, n.gpus, longest, frozenset(n.launched_for)))
    return out


def _last_runs(runs: Sequence[BurstRun]) -> dict[str, BurstRun]:
    """Per burst node, the run on it that ends last (one of unknown runtime before any): which
    one that is does not move with the clock, so a plan reads only that run's time left.

    A pure memo keyed on the identity of the runs tuple (the entry keeps it alive, so its id is
    not reused while cached), as :func:`.order.ordered` keys the pending jobs: the simulator hands
    the same tuple for as long as no job starts or ends on a burst node. A list is never
    memoized."""
    if type(runs) is tuple:
        cached = _LAST_RUNS
        if cached[0] is runs:
            return cached[1]
    last: dict[str, BurstRun] = {}
    ends: dict[str, float] = {}
    for run in runs:
        end = (INF if run.duration_s is None
               else run.started_at.timestamp() + float(run.duration_s))
        if end > ends.get(run.node_id, -INF):
            ends[run.node_id] = end
            last[run.node_id] = run
    if type(runs) is tuple:
        _remember_runs(runs, last)
    return last


_LAST_RUNS: tuple[tuple | None, dict[str, BurstRun]] = (None, {})


def _remember_runs(runs: tuple, last: dict[str, BurstRun]) -> None:
    global _LAST_RUNS  # noqa: PLW0603 - one entry, replaced whole (a reader sees old or new)
    _LAST_RUNS = (runs, last)


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


def _turns_s(job: Job, node: Busy, max_extension: float) -> float:
    """Seconds from now until ``job``, allowed onto ``node`` now, adds more than its share
    there: the node's work ends ``busy_for_s`` from now, so the job adds ``runtime - busy``
    (inf: never, the work's end is unknown)."""
    allowed = allowed_extension_s(job.gpus, job.duration_s, node.gpus, max_extension)
    if allowed is None or job.duration_s is None or node.busy_for_s == INF:
        return INF
    return max(0.0, node.busy_for_s - (float(job.duration_s) - allowed))


class _Holding:
    """The burst nodes by size, each size's ``busy_for_s`` sorted, to count on how many of them
    a kept job may start (:func:`may_join` on each, by bisection: one job's allowance is a
    threshold on ``busy_for_s``)."""

    def __init__(self, busy: Sequence[Busy]):
        by_size: dict[int, list[float]] = {}
        for node in busy:
            by_size.setdefault(node.gpus, []).append(node.busy_for_s)
        self.sizes = sorted(by_size)
        self.busy = {size: sorted(times) for size, times in by_size.items()}

    def record(self, job: Job, max_extension: float) -> dict:
        """Why the job is kept: its runtime, how much node time a node of each size may add for
        it, and on how many of the burst nodes that hold it it may start (as room frees)."""
        runtime = None if job.duration_s is None else float(job.duration_s)
        allowed: dict[str, float | None] = {}
        holding = may = 0
        for size in self.sizes:
            if size < job.gpus:
                continue
            times = self.busy[size]
            holding += len(times)
            a = allowed_extension_s(job.gpus, runtime, size, max_extension)
            allowed[str(size)] = None if a is None else round(a, 1)
            if a is not None and runtime is not None:
                # may_join: runtime - busy <= a, i.e. busy >= runtime - a
                may += len(times) - bisect.bisect_left(times, runtime - a)
        return {"job": job.id, "gpus": job.gpus, "runtime_s": runtime,
                "reason": "predicted to start on-prem within wait_slo",
                "allowed_extension_s": allowed, "burst_nodes_allowed": may,
                "burst_nodes": holding}


def keep_ordered(order: tuple[str, ...], deferred: Sequence[Job], nodes: Sequence[Node],
                 runs: Sequence[BurstRun], now: datetime) -> KeptOnPrem:
    """``trigger.onprem_order: longest-first`` without ``spare_room``: the jobs kept in order,
    which Slurm raises above every pending job, so that a burst node on its way for other jobs
    (booting or joining, launched for them) is not taken by a kept job the moment it joins; any
    other burst node they may take, as the simulated dispatcher lets them. Nothing is read here
    (the fabric asks :meth:`KeptOnPrem.allowed_nodes`): the simulator plans on."""
    return KeptOnPrem(order, (), math.inf, jobs=deferred[:MAX_KEPT], only_launched=True,
                      source=(nodes, runs, now))


def keep_onprem(deferred: Sequence[Job], nodes: Sequence[Node], runs: Sequence[BurstRun],
                max_extension: float, now: datetime,
                busy: Sequence[Busy] | None = None) -> KeptOnPrem:
    """The kept jobs (``deferred``: those the split keeps queued for on-prem, in scheduling
    order) with the records of the first :data:`RECORDED`; see the module docstring.
    ``busy``: the burst nodes as :func:`busy_nodes` reads them, where already read."""
    listed = (deferred[:MAX_KEPT].ids() if isinstance(deferred, JobsView)
              else [j.id for j in deferred[:MAX_KEPT]])
    head = list(deferred[:RECORDED])
    records: tuple[dict, ...] = ()
    if head:
        if busy is None:
            busy = busy_nodes(nodes, runs, now)
        holding = _Holding(busy)
        records = tuple(holding.record(job, max_extension) for job in head)
    return KeptOnPrem(tuple(listed), records, max_extension,
                      listed_all=len(listed) == len(deferred), jobs=deferred[:MAX_KEPT],
                      busy=None if busy is None else tuple(busy))


__all__ = ["MAX_KEPT", "RECORDED", "Busy", "KeptOnPrem", "SpareAdmit", "allowed_extension_s", "busy_nodes",
           "keep_onprem", "keep_ordered", "may_join", "wide_allowed"]
