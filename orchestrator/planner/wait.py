"""The wait-aware scale-up rule (``trigger.wait_slo``, set in the shipped default): which unmet
jobs to burst now.

Without it every unmet job may be burst as soon as the trigger fires, so a job that on-prem would
have started a few minutes later still goes to the cloud. With it, each unmet job's on-prem start
is predicted by a small simulation: the pool's on-prem GPUs, free now (less what the jobs absorbed
this tick take), free up at the running on-prem jobs' expected ends
(:attr:`~orchestrator.domain.snapshot.PoolQueue.onprem_releases`); the unmet jobs are placed in
scheduling order at the first minute where enough GPUs stay free for their expected runtime. The
GPUs are pooled (node fragmentation is ignored) and future arrivals are unknown: an estimate, as in
:mod:`.demand`, not a schedule.

A job's *deadline* is ``submitted_at + wait_slo - expected_boot``: the last moment a node launched
for it can still start it within the SLO. A job predicted to start on-prem by its deadline is
*deferred* (left queued for on-prem, and its GPUs are reserved in the simulation so later jobs
queue behind it). Any other job is *late*: it is *due* (burst now) once ``now`` is within one tick
(:data:`TICK_S`) of its deadline, and *waiting* until then, so a burst happens just in time rather
than at arrival (a GPU freeing early meanwhile can still take it on-prem). A job whose deadline has
passed is always due, so a wrong prediction cannot hold a job back forever.

With ``trigger.wait_model: nodes`` the starts are predicted node by node with Slurm's backfill
model instead, and ``trigger.displacement`` may burst cheaper queued jobs so that a dearer one
keeps its on-prem start (:mod:`.wait_nodes`), and ``trigger.onprem_order: longest-first`` places
the jobs longest first, so the short ones are those left for the cloud, and carries the kept
jobs' order for the on-prem scheduler to follow (:func:`longest_first`,
:mod:`orchestrator.fabric.onprem_order`); with ``trigger.learn_boot`` the boot allowed is the
learned one (:mod:`.boot`); with ``trigger.spare_room`` the deferred jobs are listed as kept off
burst nodes' spare room where they would lengthen a node's bill (:mod:`.spare_room`). The pooled rule is what runs with neither.

Pure: no clock, no I/O; ``now`` is an argument. A job without an expected runtime holds its GPUs
to the end of the simulated horizon; a running job past its expected end frees at once.

**Until when the split holds** (:attr:`WaitSplit.holds_s`, read by the planner's
``Decision.holds_until``). Planned again on the same snapshot a whole number of minutes later, the
split is the same while (1) no waiting job reaches its burst time (``earliest_burst_at``), (2) no
simulated job passes its on-prem bound (it would stop being simulated), and (3) every start the
model placed lies ahead: the on-prem schedule is built from the running jobs' expected ends, which
are fixed instants, so moving ``now`` later cuts its past off and every later start, window and
reservation keeps its instant (the pooled timeline counts whole minutes from ``now``, hence whole
minutes). A start at ``now`` itself (a deferred job that fits at once, or the tick's on-prem
starts the simulation holds from ``now``) would move with the clock: then no claim is made (0).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np

from orchestrator.domain.jobs import Job
from orchestrator.domain.pending import JobsView, to_us
from orchestrator.domain.snapshot import PoolQueue
from orchestrator.planner.boot import BootChoice
from orchestrator.planner.spare_room import KeptOnPrem
from orchestrator.planner.wait_nodes import node_space_problem, split_on_nodes
from orchestrator.policy.models import OnPremOrder, Policy, WaitModel

STEP_S = 60.0  # resolution of the simulated on-prem schedule
ORDER_RECORDED = 20  # ids of the on-prem order the decision record lists (the first ones)
TICK_S = 60.0  # the margin before a deadline at which a late job becomes due (one planner tick)


@dataclass(frozen=True, slots=True)
class WaitSplit:
    """The unmet jobs, split by the wait-aware rule (each tuple in scheduling order)."""

    due: tuple[Job, ...]  # late and at their deadline: burst now
    deferred: tuple[Job, ...]  # predicted to start on-prem within the SLO: not burst
    waiting: tuple[Job, ...]  # late, but bursting them can wait until their deadline
    earliest_burst_at: datetime | None = None  # when the first waiting job becomes due
    boot: BootChoice | None = None  # the boot allowed (None: the policy's expected_boot)
    model: str = ""  # the on-prem model used ("" for the pooled default; see record())
    displaced: tuple[dict, ...] = ()  # trigger.displacement: who went to the cloud for whom
    spot_early: int = 0  # late jobs made due before their deadline: spot first (SLO guard)
    spot_last_room: int = 0  # deferred jobs made due in their last tick of room (SLO guard)
    margin: timedelta | None = None  # trigger.onprem_margin, where it applied
    # How long (s from now) the same snapshot planned a whole number of minutes later splits the
    # same way (inf: for ever; 0: no claim): see "Until when the split holds" above.
    holds_s: float = math.inf
    spare: KeptOnPrem | None = None  # trigger.spare_room: the deferred jobs kept off spare room
    # trigger.onprem_order: longest-first: the deferred jobs' ids in the order the model kept
    # them for on-prem (the order the on-prem scheduler is asked to start them in); () otherwise
    onprem_order: tuple[str, ...] = ()

    def inputs(self, policy: Policy) -> dict:
        trigger = policy.trigger
        out = {
            "wait_slo_s": trigger.wait_slo.total_seconds() if trigger.wait_slo else None,
            "expected_boot_s": trigger.expected_boot.total_seconds(),
            "deferred_to_onprem_jobs": len(self.deferred),
            "deferred_to_onprem_gpus": sum(j.gpus for j in self.deferred),
            "waiting_jobs": len(self.waiting),
            "due_jobs": len(self.due),
            "earliest_burst_deadline": (self.earliest_burst_at.isoformat()
                                        if self.earliest_burst_at else None),
        }
        # The new rules' records only where they are on, so default decisions stay as they were.
        if trigger.onprem_margin is not None:  # (None where the pooled model stood in)
            out["onprem_margin_s"] = (self.margin.total_seconds() if self.margin is not None
                                      else None)
        if trigger.learn_boot and self.boot is not None:
            out.update(self.boot.inputs())
        if self.model:
            out["onprem_model"] = self.model
        if trigger.displacement.enabled:
            out["displaced_jobs"] = len(self.displaced)
            out["displaced"] = list(self.displaced)
        if policy.spot.by_expected_cost and policy.spot.max_slo_miss_odds is not None:
            out["spot_early_jobs"] = self.spot_early
            out["spot_last_room_jobs"] = self.spot_last_room
        if trigger.onprem_order is OnPremOrder.LONGEST_FIRST:
            out["onprem_order"] = {
                "order": str(trigger.onprem_order),
                "applied": self.model == "nodes",  # (the pooled model standing in keeps submit)
                "jobs": len(self.onprem_order),
                "first": list(self.onprem_order[:ORDER_RECORDED]),
            }
        if trigger.spare_room.enabled:
            out["spare_room"] = (self.spare.inputs() if self.spare is not None
                                 else KeptOnPrem((), (), trigger.spare_room.max_extension).inputs())
        return out

    def text(self) -> str:
        parts = []
        if self.displaced:
            parts.append(f"{len(self.displaced)} queued job(s) displaced to the cloud so dearer "
                         "ones keep their on-prem start")
        if self.spot_early:
            parts.append(f"{self.spot_early} late job(s) burst before their deadline: spot is "
                         "their first choice and waiting would spend the slack restarts need "
                         "(spot.max_slo_miss_odds)")
        if self.spot_last_room:
            parts.append(f"{self.spot_last_room} deferred job(s) burst on spot in their last tick "
                         "of room for a restart and a relaunch (spot.max_slo_miss_odds)")
        if self.deferred:
            order = ", kept longest first" if self.onprem_order else ""
            parts.append(f"{len(self.deferred)} unmet job(s) deferred to on-prem "
                         f"(predicted to start within wait_slo{order})")
        if self.spare is not None and self.spare.kept:
            parts.append(self.spare.text())
        if self.waiting:
            at = self.earliest_burst_at.isoformat().replace("+00:00", "Z")  # type: ignore[union-attr]
            parts.append(f"{len(self.waiting)} late job(s) to burst from {at}")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class NodeRules:
    """What the node model needs beyond the queue: the widest job a burst node holds and each
    job's cloud cost (both from the tick's usable offerings)."""

    burst_width: int | None
    cloud_cost: Callable[[Job], float | None]


def split_unmet(unmet: tuple[Job, ...], onprem_absorbed: tuple[Job, ...], queue: PoolQueue,
                policy: Policy, now: datetime, boot: BootChoice | None = None,
                rules: NodeRules | None = None) -> WaitSplit:
    """Split ``unmet`` (in scheduling order) into due, deferred and waiting jobs; see the module
    docstring. ``onprem_absorbed``: the jobs that start on free on-prem GPUs this tick; ``boot``:
    the boot allowed (default: the policy's ``expected_boot``)."""
    slo = policy.trigger.wait_slo
    if slo is None or not unmet:
        return WaitSplit(tuple(unmet), (), (), boot=boot)
    boot_td = (policy.trigger.expected_boot if boot is None
               else timedelta(seconds=boot.seconds))
    lead = slo.total_seconds() - boot_td.total_seconds()
    # The on-prem bound: a job predicted to start on-prem by submit + slo - margin stays queued
    # (trigger.onprem_margin; unset, the launch deadline itself, submit + slo - boot).
    margin_td = onprem_margin(policy, queue)
    hold_td = slo - boot_td if margin_td is None else slo - margin_td
    hold_s = lead if margin_td is None else hold_td.total_seconds()
    # A job submitted before ``cutoff`` is past its on-prem bound: it cannot be deferred, so it is
    # due (or, where the bound comes before the launch deadline, waiting) without simulating it
    # (at 100k pending jobs, nearly all of a long queue; the comparison of datetimes is exact, as
    # the float deadline below is not).
    cutoff = now - hold_td
    late = [j.submitted_at < cutoff for j in unmet]
    deadlines = [0.0 if past else (j.submitted_at - now).total_seconds() + hold_s
                 for j, past in zip(unmet, late)]  # the on-prem bound, from now, in s
    if margin_td is None:
        launch_by = deadlines  # the bound is the launch deadline
    else:
        launch_by = [(j.submitted_at - now).total_seconds() + lead for j in unmet]
    if policy.trigger.wait_model is WaitModel.NODES:
        problem = node_space_problem(queue)
        if problem is None:
            return _split_nodes(unmet, onprem_absorbed, queue, policy, now, boot, rules,
                                late, deadlines, launch_by, margin_td)
        model = f"pooled ({problem})"
    else:
        model = ""
    horizon = max((d for d, past in zip(deadlines, late) if not past), default=0.0)
    free = _timeline(horizon, onprem_absorbed, queue, now)

    def hold(gpus: int, start: int, duration_s: float | None) -> None:
        _hold(free, gpus, start, duration_s)

    due: list[Job] = []
    deferred: list[Job] = []
    waiting: list[Job] = []
    earliest: float | None = None
    # Until when the split holds (module docstring): the first on-prem bound of a simulated job,
    # the first start the timeline placed (below), none where the tick's on-prem starts are held.
    holds = math.inf if all(late) else 0.0 if onprem_absorbed else min(
        d for d, past in zip(deadlines, late) if not past)
    for job, deadline, launch, past in zip(unmet, deadlines, launch_by, late):
        if not past:
            start = _first_fit(free, job.gpus, job.duration_s, int(deadline // STEP_S))
            if start is not None:
                hold(job.gpus, start, job.duration_s)
                holds = min(holds, start * STEP_S)
                deferred.append(job)
                continue
        if launch - TICK_S <= 0:
            due.append(job)
        else:
            waiting.append(job)
            burst_in = launch - TICK_S
            earliest = burst_in if earliest is None else min(earliest, burst_in)
    at = None if earliest is None else now + timedelta(seconds=earliest)
    if earliest is not None:
        holds = min(holds, earliest)
    return WaitSplit(tuple(due), tuple(deferred), tuple(waiting), at, boot=boot, model=model,
                     holds_s=holds)


def _split_nodes(unmet: tuple[Job, ...], absorbed: tuple[Job, ...], queue: PoolQueue,
                 policy: Policy, now: datetime, boot: BootChoice | None, rules: NodeRules | None,
                 late: list[bool], deadlines: list[float], launch_by: list[float],
                 margin: timedelta | None) -> WaitSplit:
    """The split with on-prem starts predicted node by node (:mod:`.wait_nodes`): ``deadlines``
    are the on-prem bounds, ``launch_by`` the launch deadlines (from now, in s)."""
    ahead = [i for i, past in enumerate(late) if not past]
    longest = policy.trigger.onprem_order is OnPremOrder.LONGEST_FIRST
    if longest:
        ahead = longest_first(ahead, unmet, policy)
    jobs = [unmet[i] for i in ahead]
    displacement = policy.trigger.displacement if policy.trigger.displacement.enabled else None
    rules = rules or NodeRules(None, lambda job: None)
    result = split_on_nodes(jobs, [deadlines[i] for i in ahead], absorbed, queue, now,
                            rules.burst_width, displacement, rules.cloud_cost)
    # The model's order of the jobs kept for on-prem (their positions in ``jobs``, which
    # longest-first sorted) is the order the on-prem scheduler is asked to start them in.
    order = tuple(jobs[k].id for k in result.deferred) if longest else ()
    due_at = [ahead[k] for k in result.displaced]  # burst now: out of the on-prem queue soonest
    waiting_at: list[int] = []
    earliest: float | None = None
    for i in sorted([i for i, past in enumerate(late) if past]
                    + [ahead[k] for k in result.late + result.stuck]):
        launch = launch_by[i]
        if launch - TICK_S <= 0:
            due_at.append(i)
        else:
            waiting_at.append(i)
            burst_in = launch - TICK_S
            earliest = burst_in if earliest is None else min(earliest, burst_in)
    due_at.sort()
    at = None if earliest is None else now + timedelta(seconds=earliest)
    holds = result.holds_s if earliest is None else min(result.holds_s, earliest)
    deferred = sorted(ahead[k] for k in result.deferred)  # back in scheduling order
    return WaitSplit(tuple(unmet[i] for i in due_at), tuple(unmet[i] for i in deferred),
                     tuple(unmet[i] for i in waiting_at), at, boot=boot, model="nodes",
                     displaced=tuple(result.records), margin=margin, holds_s=holds,
                     onprem_order=order)


def longest_first(positions: list[int], jobs: Sequence[Job], policy: Policy) -> list[int]:
    """``positions`` (into ``jobs``, in scheduling order) in the ``longest-first`` order: by
    project priority (the policy's), then the longest expected runtime first; a job of unknown
    runtime after those of its class that have one (the model holds its GPUs for ever, so placed
    first it would keep every other job off on-prem). Ties keep the scheduling order: the sort is
    stable. A job's own priority is not a class here: Slurm's differs from job to job (it is how
    ``priority/basic`` keeps submit order), so as a class it would leave nothing to reorder."""
    priority = policy.project_priority
    ranks: dict[str | None, int] = {}

    def key(i: int) -> tuple:
        job = jobs[i]
        project = job.project
        rank = ranks.get(project)
        if rank is None:
            rank = ranks[project] = (priority(project) if project is not None
                                     else policy.default_project_priority)
        runtime = job.duration_s
        return (-rank, runtime is None, -(runtime or 0.0))

    return sorted(positions, key=key)


def onprem_margin(policy: Policy, queue: PoolQueue) -> timedelta | None:
    """``trigger.onprem_margin`` where the node model predicts the starts; None (the launch
    deadline bounds the on-prem start) otherwise: the pooled model ignores how jobs fit on nodes,
    so its starts of multi-GPU jobs are early, and the boot allowance covers for that."""
    margin = policy.trigger.onprem_margin
    if margin is None or policy.trigger.wait_model is not WaitModel.NODES:
        return None
    return margin if node_space_problem(queue) is None else None


def split_pooled_view(early: JobsView, onprem_absorbed: tuple[Job, ...], queue: PoolQueue,
                      policy: Policy, now: datetime, boot: BootChoice | None = None
                      ) -> tuple[WaitSplit, np.ndarray]:
    """The pooled split of ``early`` (unmet jobs, in scheduling order, none past its deadline),
    read on the columns: what :func:`split_unmet` decides for ``tuple(early)`` with the pooled
    model, with views for its job lists, and the mask of ``early``'s due jobs.

    Only a job no wider than the widest free GPU count on the timeline can be deferred (wider,
    every window is short), and that count only falls as deferred jobs hold GPUs: the others
    are told due or waiting by their deadline on the columns, with no Job made and no minute
    scanned (at 1M pending jobs, ~17k jobs within their SLO and no free on-prem GPU: all)."""
    slo = policy.trigger.wait_slo
    assert slo is not None
    boot_td = (policy.trigger.expected_boot if boot is None
               else timedelta(seconds=boot.seconds))
    lead = slo.total_seconds() - boot_td.total_seconds()
    # As split_unmet's (submitted_at - now).total_seconds() + lead: exact microseconds over 1e6,
    # one correctly rounded division either way, then the same float sum.
    deadlines = (early.column("submitted_us") - to_us(now)) / 1e6 + lead
    horizon = float(deadlines.max()) if len(deadlines) else 0.0
    free = _timeline(horizon, onprem_absorbed, queue, now)
    gpus = early.column("gpus")
    deferred = np.zeros(len(early), dtype=bool)
    # Until when the split holds (module docstring): the first on-prem bound, the first start
    # the timeline placed (below), no claim at all where the tick's on-prem starts are held.
    holds = math.inf
    if len(early):
        holds = 0.0 if len(onprem_absorbed) else float(deadlines.min())
    peak = max(free)
    candidates = np.flatnonzero(gpus <= peak)
    if len(candidates):
        durations = early.column("duration_s")[candidates].tolist()
        for i, width, duration, deadline in zip(candidates.tolist(), gpus[candidates].tolist(),
                                                durations, deadlines[candidates].tolist()):
            if width > peak:
                continue
            length = None if math.isnan(duration) else duration
            start = _first_fit(free, width, length, int(deadline // STEP_S))
            if start is not None:
                _hold(free, width, start, length)
                deferred[i] = True
                peak = max(free)
                holds = min(holds, start * STEP_S)
    burst_in = deadlines - TICK_S
    due = ~deferred & (burst_in <= 0)
    waiting = ~deferred & ~due
    earliest = float(burst_in[waiting].min()) if waiting.any() else None
    at = None if earliest is None else now + timedelta(seconds=earliest)
    if earliest is not None:
        holds = min(holds, earliest)
    return WaitSplit(early.where(due), early.where(deferred), early.where(waiting), at,
                     boot=boot, holds_s=holds), due


def _timeline(horizon: float, onprem_absorbed: tuple[Job, ...], queue: PoolQueue,
              now: datetime) -> list[int]:
    """Free on-prem GPUs per simulated minute up to ``horizon`` (s from now): free now, less
    what the jobs absorbed this tick hold, plus the running jobs' releases."""
    slots = max(int(horizon // STEP_S) + 2, 2)
    free = [queue.onprem.free_gpus] * slots
    for job in onprem_absorbed:  # they start now, on GPUs counted free above
        _hold(free, job.gpus, 0, job.duration_s)
    for release in queue.onprem_releases:
        k = max(math.ceil((release.ends_at - now).total_seconds() / STEP_S), 0)
        for i in range(k, slots):
            free[i] += release.gpus
    return free


def _hold(free: list[int], gpus: int, start: int, duration_s: float | None) -> None:
    slots = len(free)
    end = slots if duration_s is None else min(start + _length(duration_s), slots)
    for k in range(start, end):
        free[k] -= gpus


def _length(duration_s: float) -> int:
    return max(math.ceil(duration_s / STEP_S), 1)


def _first_fit(free: list[int], gpus: int, duration_s: float | None, last: int) -> int | None:
    """The first slot ``k <= last`` from which ``gpus`` stay free for the job's runtime (to the
    horizon at most), or None."""
    slots = len(free)
    length = slots if duration_s is None else _length(duration_s)
    k = 0
    stop = min(last, slots - 1)
    while k <= stop:
        end = min(k + length, slots)
        short = -1
        for i in range(end - 1, k - 1, -1):
            if free[i] < gpus:
                short = i
                break
        if short < 0:
            return k
        k = short + 1
    return None
