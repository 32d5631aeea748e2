"""Admission: may this job start on this burst node now, within every budget that covers it.

Pure (no store, no clock), shared by the three places that put work on burst nodes or count on
them doing so: the planner's absorption (a ready node counts as covering a pending job only if it
would be admitted there), the built-in queue's dispatcher (``POST /v1/agent/jobs/next``) and the
simulator's dispatcher. The rule, also in ``docs/budgets.md``:

* **Who pays.** Work of project A on project B's node is A's spend (the ledger books its usage to
  A, :mod:`orchestrator.costs.attribution`); the node's idle time is its owner's. So a start is
  checked against the budgets of the job's scope (A's and the pool's) *and* of the node's scope
  (B's and the pool's).
* **Grades.** A budget of either scope at ``no-new-launches`` or worse stops the start.
* **The node's horizon.** A node's ``budget_commit_usd`` pays for it until ``created_at +
  commit / price``. A job expected to end at ``now + runtime`` keeps the node until that plus
  the idle tail (``scale_down.idle_for + cooldowns.scale_down``); what lies past the horizon is
  an *extension* (price x time, rounded up to the micro-dollar), committed to the budgets of the
  node's scope, and added to the node's commitment once the job starts.
* **The run.** A job on a node outside its project's budget scope commits its share of the node
  for its expected run (price x gpus / node GPUs x runtime) to that budget; the share still owed
  by a running one is :func:`run_outstanding_usd` (its budget counts it as committed).
* A start is admitted only if every one of those budgets fits what it commits
  (:meth:`~orchestrator.planner.budgets.BudgetState.fits`); a policy without budgets admits
  everything that fits on the node.
* **Quotas** count work too (:func:`held_gpus`): a project's job on another project's node adds
  its GPUs to its project's ``max_burst_gpus`` count (and takes them off the node owner's), so a
  job is admitted on a foreign node only within its project's quota.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, Decimal

from orchestrator.domain.jobs import Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.snapshot import BurstRun
from orchestrator.planner.budgets import (
    MICRO,
    BudgetBook,
    in_scope,
    job_runtime_s,
    run_usd,
    usd,
)
from orchestrator.policy.models import BudgetAction, Policy

_HOUR = Decimal(3600)
_ZERO = Decimal(0)


def idle_tail_s(policy: Policy) -> float:
    """How long an idle node a budget covers may stay up before it is drained."""
    return (policy.scale_down.idle_for + policy.cooldowns.scale_down).total_seconds()


def extension_usd(policy: Policy, node: Node, runtime_s: float, now: datetime,
                  extra_commit: Decimal = _ZERO) -> Decimal:
    """What keeping ``node`` up for a job of ``runtime_s`` from ``now`` commits beyond what the
    node has committed already (``extra_commit``: extensions taken this tick)."""
    price = usd(node.price_usd_hour)
    if price <= 0:
        return _ZERO
    paid_s = (usd(node.budget_commit_usd) + extra_commit) * _HOUR / price
    needed_s = usd((now - node.created_at).total_seconds() + runtime_s + idle_tail_s(policy))
    if needed_s <= paid_s:
        return _ZERO
    return (price * (needed_s - paid_s) / _HOUR).quantize(MICRO, ROUND_CEILING)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a start is admitted; what it commits where; the budget that refused it."""

    admitted: bool
    blocker: str | None = None
    extension_usd: Decimal = _ZERO  # to the node's scope (and the node's commitment)
    run_usd: Decimal = _ZERO  # to the job's scope where the node is outside it


def held_gpus(nodes: list[Node] | tuple[Node, ...], runs: tuple[BurstRun, ...] = ()
              ) -> dict[str, int]:
    """Burst GPUs each project holds, as quotas count them: the GPUs of the live nodes launched
    for it, less those other projects' jobs use there, plus those its jobs use on nodes launched
    for another project (or none)."""
    held: dict[str, int] = {}
    owner: dict[str, str | None] = {}
    for n in nodes:
        if n.state is not NodeState.TERMINATED:
            owner[n.id] = n.project
            if n.project:
                held[n.project] = held.get(n.project, 0) + n.gpus
    for run in runs:
        if run.node_id not in owner:
            continue
        node_project = owner[run.node_id]
        if node_project == run.project:
            continue
        held[run.project] = held.get(run.project, 0) + run.gpus
        if node_project:
            held[node_project] = held.get(node_project, 0) - run.gpus
    return held


class Admission:
    """Admission of starts on burst nodes for one policy at one instant; see the module docstring.

    ``book``: the policy's budgets now (:meth:`BudgetBook.build`, foreign runs included); each
    admitted start is taken from it, so a sequence of starts at one instant is checked together.
    """

    def __init__(self, policy: Policy, book: BudgetBook | None, now: datetime,
                 held: dict[str, int] | None = None):
        self.policy = policy
        self.book = book if book is not None and book.states else None
        self.now = now
        self.extended: dict[str, Decimal] = {}  # node id -> extensions taken at this instant
        self.held = dict(held or {})  # project -> burst GPUs held (:func:`held_gpus`)
        # How many starts taken could have turned a refusal into an admission: a foreign job on
        # a project's node (that project then holds less) or an extension bought (the node's
        # next start needs less). Other takes only tighten, so a refusal seen since still holds.
        self.loosened = 0
        self._quotas = {p.name: p.max_burst_gpus for p in reversed(policy.projects)}

    def over_quota(self, project: str | None, gpus: int) -> bool:
        """Whether a job of ``project`` and ``gpus`` is refused on every node not launched for
        its project (the quota part of :meth:`check`, which it answers first)."""
        quota = self._quotas.get(project)  # type: ignore[arg-type]
        return quota is not None and self.held.get(project, 0) + gpus > quota  # type: ignore[arg-type]

    def check(self, job: Job, node: Node) -> Verdict:
        if node.project != job.project and self.over_quota(job.project, job.gpus):
            return Verdict(False, f"projects[{job.project}].max_burst_gpus")
        if self.book is None:
            return Verdict(True)
        runtime = job_runtime_s(self.policy, job.duration_s)
        ext = extension_usd(self.policy, node, runtime, self.now, self.extended.get(node.id, _ZERO))
        run = None
        for state in self.book.states:
            node_scoped = in_scope(state.budget, state.pool, node.pool, node.project)
            job_scoped = node.pool == state.pool and state.applies_to(job.project)
            if not (node_scoped or job_scoped):
                continue
            name = f"budgets[{state.name}]"
            action = state.action
            if action is not None and action.severity >= BudgetAction.NO_NEW_LAUNCHES.severity:
                return Verdict(False, name)
            if node_scoped:
                extra = ext
            else:
                if run is None:
                    run = run_usd(node, job.gpus, runtime)
                extra = run
            if extra and not state.fits(extra):
                return Verdict(False, name)
        return Verdict(True, None, ext, run if run is not None else _ZERO)

    def take(self, job: Job, node: Node, verdict: Verdict) -> None:
        """Commit an admitted start (its extension and its run) to the budgets and quotas."""
        if not verdict.admitted:
            return
        if node.project != job.project:
            self.held[job.project] = self.held.get(job.project, 0) + job.gpus
            if node.project:
                self.held[node.project] = self.held.get(node.project, 0) - job.gpus
                self.loosened += 1
        if self.book is None:
            return
        if verdict.extension_usd:
            self.loosened += 1
            self.extended[node.id] = self.extended.get(node.id, _ZERO) + verdict.extension_usd
        for state in self.book.states:
            if in_scope(state.budget, state.pool, node.pool, node.project):
                state.tick += verdict.extension_usd
            elif node.pool == state.pool and state.applies_to(job.project):
                state.tick += verdict.run_usd

    def admit(self, job: Job, node: Node) -> Verdict:
        """Check, and take when admitted."""
        verdict = self.check(job, node)
        self.take(job, node, verdict)
        return verdict


ANY_NODE = object()  # a node class that admits every job (:meth:`NodeAdmitter.node_class`)


class NodeAdmitter:
    """``admit(job, node id)`` for absorption: a ready node admits as the dispatcher will; a node
    still in flight is taken as covering what it was launched for (its launch committed it; the
    dispatcher checks again once it is ready). ``loosened``: :attr:`Admission.loosened`."""

    __slots__ = ("admission", "by_id", "quotas_only")

    def __init__(self, admission: Admission, nodes: list[Node] | tuple[Node, ...]):
        self.admission = admission
        self.by_id = {n.id: n for n in nodes}
        # No budget: a verdict is the quota's alone, so it reads of a node only whose it is
        # (:meth:`node_class`), and absorption may choose among nodes by that.
        self.quotas_only = admission.book is None

    def node_class(self, node_id: str | None) -> object:
        """What a quota-only verdict reads of a node: its project if it is ready, else
        :data:`ANY_NODE` (a node in flight covers any job)."""
        node = self.by_id.get(node_id) if node_id is not None else None
        return node.project if node is not None and node.state is NodeState.READY else ANY_NODE

    @property
    def loosened(self) -> int:
        return self.admission.loosened

    def __call__(self, job: Job, node_id: str | None) -> bool:
        node = self.by_id.get(node_id) if node_id is not None else None
        if node is None or node.state is not NodeState.READY:
            return True
        return self.admission.admit(job, node).admitted


__all__ = ["ANY_NODE", "Admission", "NodeAdmitter", "Verdict", "extension_usd", "held_gpus", "idle_tail_s"]
