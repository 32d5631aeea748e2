"""The planner: ``plan(snapshot, policies, now) -> Plan``, pure, deterministic and explainable.

It reads only its arguments: no store, no provider, no clock, no randomness. Ids it hands out
(decision, node, request) are derived from the policy name and ``now``, so planning the same
tick twice yields the same actions and the executor's idempotency makes the repeat harmless.

Per policy and tick, in order: drains and terminations (:mod:`.scaledown`); absorption of pending
jobs into on-prem and existing burst capacity (:mod:`.demand`); with ``trigger.wait_slo`` (set in
the shipped default), the wait-aware split of the unmet jobs into those due to burst now and those
left to on-prem or to later (:mod:`.wait`); the trigger with its
``sustained_for`` hysteresis; the cooldown; with data to stage (``storage``, job annotations), the
jobs whose staging would outlast their predicted on-prem wait are held (:mod:`.staging`); then
launches within every limit (:mod:`.scaleup`);
then an operator's pre-warm floor (:func:`_prewarm`), which launches what the floor still lacks.
Budgets (:mod:`.budgets`) are checked by every launch, which carries the spend it commits; a
budget past its drain grade drains its scope's ready nodes.
Exactly one :class:`Decision` records the rule that decided the tick, the inputs that mattered
(per budget: spent, committed, limit, grade), the offerings weighed with their expected cost,
and which limits and budgets held launches back.

Speed (the simulator plans at every virtual minute; ``docs/performance.md``): the nodes are
walked once per tick (:mod:`.census`); the policy's candidates, and what pricing no demand gives,
come from a pure memo (:func:`.offerings.resolved`); the queue is read as columns
(:class:`~orchestrator.domain.pending.PendingColumns`), ordered by one vectorised sort (memoized
for a pending sequence seen before, :func:`.demand.ordered`), and absorption tallies the unmet jobs
on the columns for the record and the pricing; the wait-aware split simulates only the unmet jobs
not already past their deadline (:func:`_split`, one comparison over the column of submit times);
the room under the pool limits is worked out only by the branches that may launch. None of it changes a decision: a tick that decides nothing
records what it always recorded (``tests/unit/test_planner_speed.py``).

Each decision also says until when its answer holds (``Decision.holds_until``, :mod:`.horizon`):
a tick that acts on nothing and keeps its memory names the first instant the clock alone could
change that (a job's ``wait_slo`` deadline, the trigger's thresholds, a cooldown's end, a node
reaching ``idle_for``...), so the simulator skips the ticks before it while nothing happens.
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from operator import attrgetter
from typing import Any

import numpy as np

from orchestrator.domain.jobs import NO_PROJECT_LABEL, Job
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.pending import JobsView, to_us
from orchestrator.domain.plan import (
    Action,
    ActionReason,
    Decision,
    Drain,
    Hold,
    Launch,
    OfferingOption,
    Plan,
    Rule,
)
from orchestrator.domain.snapshot import BurstRun, PolicyMemory, PoolQueue, PrewarmRequest, Snapshot
from orchestrator.planner import staging
from orchestrator.planner.admission import Admission, NodeAdmitter, held_gpus
from orchestrator.planner.boot import BootChoice, choose_boot, group_boot_s
from orchestrator.planner.budgets import BudgetBook, commitment_usd, in_scope
from orchestrator.planner.census import Census, take_census
from orchestrator.planner.demand import (
    Demand,
    absorb,
    first_projects,
    gpus_by_project,
    gpus_of,
    ordered,
    unmet_hours,
)
from orchestrator.planner.forecast import predict_onprem_starts
from orchestrator.planner.horizon import holds_until
from orchestrator.planner.offerings import Candidate, Resolved, price_options, resolved
from orchestrator.planner.spare_room import (
    KeptOnPrem,
    SpareAdmit,
    busy_nodes,
    keep_onprem,
    keep_ordered,
)
from orchestrator.planner.placement import (
    MULTI_NODE,
    NO_INTERCONNECT,
    WIDER_THAN_LIMIT,
    spans_nodes,
)
from orchestrator.planner.scaledown import plan_scale_down
from orchestrator.planner.scaleup import (
    Budget,
    Grant,
    grant_nodes,
    pool_budget,
)
from orchestrator.planner.spot import DEFERRED_RELAUNCHES, TICK_S, SpotChooser
from orchestrator.planner.wait import (
    NodeRules,
    WaitSplit,
    onprem_margin,
    split_pooled_view,
    split_unmet,
)
from orchestrator.planner.wait_nodes import cheapest_cost, node_space_problem
from orchestrator.policy.models import OnPremOrder, Policy, TriggerCombine, WaitModel

__all__ = ["plan"]

_TERMINATED = NodeState.TERMINATED
_READY = NodeState.READY
_IN_FLIGHT = frozenset(s for s in NodeState if s.in_flight)
_GPUS = attrgetter("gpus")
_PROJECT = attrgetter("project")
_OWNER_WIDTH = attrgetter("project", "user", "gpus")
# Owners (project, user) the decision record lists the unmet GPUs of: the largest first, the rest
# counted, so a queue of thousands of users keeps the record small.
MAX_OWNERS_IN_RECORD = 50
# Unmet jobs (in scheduling order) whose owners the record counts: all of a queue this size, and
# of a larger one those new nodes serve first, so a 100k-job queue costs the tick no full pass.
MAX_OWNER_SCAN = 10_000


def plan(snapshot: Snapshot, policies: Iterable[Policy], now: datetime) -> Plan:
    """Decide this tick's actions for every policy."""
    actions: list[Action] = []
    decisions: list[Decision] = []
    memory: dict[str, PolicyMemory] = {}
    for policy in policies:
        # Launches of earlier policies commit against budgets of the same pool too.
        earlier = [a for a in actions if isinstance(a, Launch)]
        policy_actions, decision, policy_memory = _plan_policy(snapshot, policy, now, earlier)
        actions.extend(policy_actions)
        decisions.append(decision)
        memory[policy.name] = policy_memory
    return Plan(at=now, actions=tuple(actions), decisions=tuple(decisions), memory=memory)


def decision_id(policy: str, now: datetime, blocks: tuple = ()) -> str:
    """Deterministic id of a policy's decision at ``now``.

    The negative-capacity cache is part of the identity: re-planning at the same instant after a
    capacity error (a virtual clock does not move) is a different decision, so its fallback launch
    gets fresh node and request ids instead of colliding with the failed one.
    """
    cache = ",".join(sorted(f"{b.offering_key}@{b.until.isoformat()}" for b in blocks))
    return "d-" + hashlib.sha256(f"{policy}|{now.isoformat()}|{cache}".encode()).hexdigest()[:12]


def _burst_wait(wanted: list[str], demand: Demand, queue: PoolQueue, now: datetime) -> dict:
    """``inputs.burst_wait``: per job in ``wanted``, the predicted on-prem start in seconds after
    the decision (None: the model never starts it on-prem). The jobs that stay queued had they
    not been burst are every pending job not starting on-prem now, in scheduling order."""
    onprem = {job.id for job in demand.onprem_absorbed}
    queued = (job for job in demand.ordered if job.id not in onprem)
    starts = predict_onprem_starts(queued, demand.onprem_absorbed, queue, now, wanted)
    return {"predicted_onprem_start_s": {j: starts[j] for j in sorted(starts)}}


def _child_id(prefix: str, parent: str, index: int) -> str:
    return prefix + hashlib.sha256(f"{parent}|{index}".encode()).hexdigest()[:12]


def _plan_policy(snapshot: Snapshot, policy: Policy, now: datetime,
                 earlier: list[Launch] | None = None
                 ) -> tuple[list[Action], Decision, PolicyMemory]:
    did = decision_id(policy.name, now, snapshot.capacity_blocks)
    pool = policy.pool.name
    name = policy.name
    # One pass over the nodes gathers what scale-down, absorption and the record read of them.
    census = take_census(snapshot.nodes, policy, now, only_policy=name)
    nodes = census.nodes
    memory = given = snapshot.memory.get(policy.name, PolicyMemory())
    queue = snapshot.queues.get(pool)
    books = BudgetBook.build(policy, snapshot, now, earlier or ()) if policy.budgets else None
    # With budgets, a ready node counts as covering a pending job only if the dispatcher would
    # admit the job there (:mod:`.admission`); what the starts commit is taken from the books.
    # The burst GPUs each project holds, read once: absorption's admission takes from its own
    # copy, scale-up starts again from these.
    held_now = (held_gpus(nodes, snapshot.burst_runs)
                if books is not None or _has_quotas(policy) else None)
    admit = (NodeAdmitter(Admission(policy, books, now, held_now), nodes)
             if held_now is not None else None)
    spare_turns_s = math.inf  # trigger.spare_room: when a job let onto spare room would not be
    spare_busy = None  # (and the burst nodes' work, as its absorption read it)
    if (queue is not None and policy.trigger.spare_room.enabled
            and policy.trigger.wait_slo is not None):
        admit = _spare_admit(queue, census, policy, admit, snapshot, now)
    demand = absorb(queue, nodes, policy, census, admit)
    if isinstance(admit, SpareAdmit):
        spare_turns_s = admit.turns_s
        spare_busy = tuple(admit.busy.values())
    if demand.burst_absorbed and queue is not None and staging.applies(policy, demand.ordered):
        demand = _unstaged(demand, queue, nodes, policy, census, admit, now)
    # The wait-aware rule (trigger.wait_slo): only the unmet jobs due now may launch (the others
    # stay queued).
    split: WaitSplit | None = None
    if policy.trigger.wait_slo is not None and demand.unmet and queue is not None:
        boot = choose_boot(policy, snapshot.boot_estimates)
        rules = (_node_rules(policy, snapshot, now)
                 if policy.trigger.wait_model is WaitModel.NODES else None)
        split = _split(demand.unmet, demand.onprem_absorbed, queue, policy, now, boot, rules)
        if ((split.waiting or split.deferred) and policy.spot.by_expected_cost
                and policy.spot.max_slo_miss_odds):
            split = _spot_early(split, demand.unmet, policy, snapshot, now)
        if split.deferred or split.waiting:  # else every unmet job is due: the tallies hold
            demand = demand.narrowed(split.due, split.deferred + split.waiting)
        if policy.trigger.spare_room.enabled and split.deferred:
            split = replace(split, spare=keep_onprem(
                split.deferred, nodes, snapshot.burst_runs,
                policy.trigger.spare_room.max_extension, now, spare_busy))
    prewarm = snapshot.prewarm.get(pool)
    if prewarm is not None and not prewarm.active(now):
        prewarm = None
    # The floor is the pool's: GPUs that other policies keep in the pool count toward it.
    # The floor is of *free* GPUs (a scheduled experiment needs them idle): GPUs busy with jobs
    # do not count toward it.
    others = floor = 0
    if prewarm is not None:
        others = sum(_free_gpus(n) for n in snapshot.nodes
                     if n.pool == pool and n.policy != name and _staying(n))
        floor = max(prewarm.gpus - others, 0)  # this policy's share

    bounded = (frozenset(n.id for n in nodes if books.covers(n)) if books is not None
               else frozenset())
    actions: list[Action] = list(plan_scale_down(policy, nodes, demand.busy_nodes, memory, now, did,
                                                 floor_gpus=floor, bounded=bounded, census=census))
    budget_drains = _budget_drains(policy, books, nodes, actions, now, did) if books else []
    actions.extend(budget_drains)
    if any(a for a in actions if getattr(a, "reason", None) in _SCALE_DOWN_IDLE):
        memory = PolicyMemory(memory.trigger_since, memory.last_launch_at, now)

    fired, trigger_text = _trigger(policy, demand, now)
    trigger_since = (memory.trigger_since or now) if fired else None
    held_for = (now - trigger_since).total_seconds() if trigger_since else 0.0
    inputs = _inputs(demand, census, queue is not None, now, trigger_text, held_for)
    if split is not None:
        inputs["wait_aware"] = split.inputs(policy)
    if census.low_utilisation:
        inputs["low_utilisation"] = _low_utilisation_inputs(policy, census, actions)

    resolved_ = resolved(policy, snapshot.offerings, snapshot.capacity_blocks, now)
    candidates, rejected = list(resolved_.candidates), list(resolved_.rejected)
    rule, summary, options, chosen, held_back = Rule.NO_DEMAND, "", list(rejected), None, ()
    launches: list[Launch] = []
    burst_for: list[str] = []  # ids of the jobs this tick's launches are for
    # Priced alternatives are recorded whenever there is demand, even when nothing launches, so
    # "why did it not burst" can be answered with the money involved.
    ranked = _rank(candidates, options, demand, resolved_) if candidates else []
    # The room under the pool limits is worked out only by the branches that may launch (most
    # ticks launch nothing); None: no usable offering, or not needed yet.
    budget: Budget | None = None

    min_missing = policy.limits.min_nodes - census.staying
    if pool in snapshot.paused_pools:
        rule, summary = Rule.PAUSED, f"bursting for pool {pool} is paused"
        trigger_since = None
    elif min_missing > 0 and candidates:
        budget = pool_budget(policy, nodes, candidates)
        grants = []
        runtime = policy.budget_commitment.default_runtime.total_seconds()
        for _ in range(min_missing):
            grant, blocker = _plain_grant(policy, ranked, budget, books, runtime)
            if grant is None:
                held_back = (blocker or "",)
                break
            grants.append(grant)
        launches = _launches(policy, grants, did, ActionReason.MIN_NODES)
        rule, chosen = Rule.MIN_NODES, ranked[0].offering.key
        summary = f"launching {len(launches)} node(s) to keep min_nodes={policy.limits.min_nodes}"
    elif not demand.unmet:
        if demand.burst_absorbed:
            rule = Rule.COVERED
            summary = (f"{gpus_of(demand.burst_absorbed)} pending GPU(s) fit on burst "
                       "nodes already ready or booting")
        else:
            summary = ("nothing pending" if not demand.ordered
                       else "all pending work fits on free on-prem GPUs")
            if split is not None:
                summary = "no unmet job is due to burst (wait_slo)"
    elif not fired:
        rule = Rule.TRIGGER_NOT_MET
        summary = f"{demand.unmet_gpus} unmet GPU(s), but {trigger_text}"
    elif held_for < policy.trigger.sustained_for.total_seconds():
        rule = Rule.SUSTAINING
        summary = (f"trigger holds ({trigger_text}) for {held_for:.0f}s of the "
                   f"{policy.trigger.sustained_for.total_seconds():.0f}s required")
    elif (memory.last_launch_at is not None
          and now - memory.last_launch_at < policy.cooldowns.scale_up):
        rule = Rule.COOLDOWN
        wait = policy.cooldowns.scale_up - (now - memory.last_launch_at)
        summary = f"{demand.unmet_gpus} unmet GPU(s); scale-up cooldown for {wait.total_seconds():.0f}s more"
    elif not candidates:
        rule = Rule.NO_OFFERING
        summary = "no usable offering: " + "; ".join(f"{o.offering_key}: {o.rejected}" for o in rejected)
    else:
        budget = pool_budget(policy, nodes, candidates)
        held = (dict(held_now) if held_now is not None
                else _held_gpus(nodes, snapshot.burst_runs))
        chooser = (SpotChooser(policy, ranked, snapshot.offering_health, now,
                               choose_boot(policy, snapshot.boot_estimates).seconds,
                               partial(group_boot_s, policy, snapshot.boot_estimates))
                   if policy.spot.by_expected_cost else None)
        # Data staging (pool/project storage, job annotations): jobs whose data would take
        # longer to stage than their predicted on-prem wait are not burst (:mod:`.staging`).
        unmet, staged = demand.unmet, None
        if queue is not None and staging.applies(policy, unmet):
            staged = staging.review(policy, unmet, demand.ordered, demand.onprem_absorbed, queue,
                                    now)
            unmet = staged.kept
        grants, held_list = grant_nodes(policy, unmet, ranked, budget, held, demand.burst,
                                        books, rank_for=chooser.rank if chooser else None)
        if staged is not None:
            inputs["staging"] = staged.inputs(staging.granted_rates(policy, staged, grants))
            if staged.held:
                held_list = [*held_list, staging.HELD_BY]
        held_back = tuple(held_list)
        launches = _launches(policy, grants, did, ActionReason.DEMAND)
        chosen = ranked[0].offering.key
        if chooser is not None:
            inputs["spot_choice"] = chooser.record()
            if launches:
                chosen = Counter(lc.offering.key for lc in launches).most_common(1)[0][0]
        if launches:
            rule = Rule.SCALE_UP
            burst_for = [job for grant in grants for job in grant.jobs]
            kinds = sorted({lc.offering.key for lc in launches})
            summary = (f"launching {len(launches)} node(s) ({', '.join(kinds)}) for "
                       f"{demand.unmet_gpus} unmet GPU(s) of {_projects(demand)}; trigger: {trigger_text}")
            if held_back:
                summary += f"; held back by {', '.join(held_back)}"
        else:
            rule = Rule.LIMITED
            summary = f"{demand.unmet_gpus} unmet GPU(s) but held back by {', '.join(held_back)}"
        if staged is not None and staged.held:
            summary += f"; {staged.text()}"
        if MULTI_NODE in held_back:
            widest = max(c.offering.gpus for c in candidates)
            wide = _wider_than(demand.unmet, widest)
            summary += (f"; {wide} job(s) wider than one burst node ({widest} GPUs) are not "
                        f"launched for: the {policy.fabric_kind} fabric runs a job on one burst "
                        "node (Slurm and torch elastic span nodes)")
        if WIDER_THAN_LIMIT in held_back:
            summary += (f"; a job wider than one node needs more nodes at once than "
                        f"limits.max_nodes ({policy.limits.max_nodes}) or its offering's "
                        "max_nodes allow: held, never partly launched")
        if NO_INTERCONNECT in held_back:
            summary += (f"; offerings without interconnect {policy.multi_node_requires} are not "
                        "used for jobs wider than one node (multi_node_requires)")
        groups = {lc.group: lc for lc in launches if lc.group is not None}
        if groups:
            summary += "; launch group(s): " + ", ".join(
                f"{g} ({lc.group_size}x {lc.offering.key})" for g, lc in groups.items())

    if split is not None and (split.deferred or split.waiting or split.spot_early
                              or split.spot_last_room):
        summary = f"{summary}; {split.text()}"
    # The wait each job burst this tick avoids (planner.forecast): the jobs launched for, and
    # those about to start on burst nodes ready or booting.
    if queue is not None and (burst_for or demand.burst_absorbed):
        absorbed = demand.burst_absorbed
        absorbed_ids = (absorbed.ids() if isinstance(absorbed, JobsView)
                        else [j.id for j in absorbed])
        inputs["burst_wait"] = _burst_wait([*burst_for, *absorbed_ids], demand, queue, now)

    if prewarm is not None:
        if budget is None and candidates:
            budget = pool_budget(policy, nodes, candidates)
        # Free GPUs ready or starting: less what pending work is about to take on them (jobs
        # fitted onto burst nodes up or booting); this tick's launches are for demand, so busy.
        free = sum(_free_gpus(n) for n in census.nodes if _staying(n))
        have = others + max(free - demand.absorbed_burst_gpus(), 0)
        warm = _prewarm(policy, prewarm, have, candidates, rejected, budget,
                        pool in snapshot.paused_pools, now, did, start=len(launches), books=books)
        held_back = tuple(dict.fromkeys(held_back + warm.held_back))
        inputs["prewarm"] = {"gpus": prewarm.gpus, "until": prewarm.until.isoformat(),
                             "have_gpus": have}
        if warm.launches and not launches:
            # The floor alone launches: it decides the tick (any demand story stays in the text).
            if rule is not Rule.NO_DEMAND:
                warm.summary += f"; demand: {rule}: {summary}"
            rule, summary, chosen = Rule.PREWARM, warm.summary, warm.launches[0].offering.key
            options = list(rejected) + warm.options
        elif rule is Rule.NO_DEMAND:
            rule, summary = Rule.PREWARM, warm.summary
            if warm.options:
                options = list(rejected) + warm.options
        elif rule is Rule.COVERED and warm.held_back:
            # Demand is answered; what is left to explain is the floor the limits hold back.
            rule, summary = Rule.PREWARM, f"{warm.summary}; {summary}"
        else:
            summary = f"{summary}; {warm.summary}"
        launches = launches + warm.launches

    if books is not None:
        inputs["budgets"] = books.inputs()
        notes = books.notes()
        if budget_drains:
            names = ", ".join(s.name for s in books.draining())
            notes.append(f"draining {len(budget_drains)} node(s) past budget {names}")
        if notes:
            summary = f"{summary}; {'; '.join(notes)}" if summary else "; ".join(notes)

    actions = list(launches) + actions
    if launches:
        memory = PolicyMemory(trigger_since, now, memory.last_drain_at)
    else:
        memory = PolicyMemory(trigger_since, memory.last_launch_at, memory.last_drain_at)
    if not launches and demand.unmet:
        actions.append(Hold(policy.name, summary))
    holds = holds_until(policy, snapshot, now, census=census, demand=demand, split=split,
                        fired=fired, before=given, after=memory, actions=actions, rule=rule,
                        recorded=inputs, spare_turns_s=spare_turns_s)
    decision = Decision(
        id=did,
        policy=policy.name,
        at=now,
        rule=rule,
        summary=summary,
        inputs=inputs,
        options=tuple(options),
        chosen=chosen if launches else None,
        held_back_by=held_back,
        actions=tuple(_describe(a) for a in actions),
        holds_until=holds,
        onprem_order=split.onprem_order if split is not None else (),
        kept_off=_kept_off(policy, split, nodes, snapshot, now),
    )
    return actions, decision, memory


def _node_rules(policy: Policy, snapshot: Snapshot, now: datetime) -> NodeRules:
    """The node model's view of the offerings: the widest job the burst nodes hold and each job's
    cost on its cheapest usable offering. Where the fabric spans nodes a wider job takes a launch
    group of whole nodes (of an offering with the interconnect ``multi_node_requires`` asks for,
    at most ``limits.max_nodes`` of them), priced as its nodes; on the built-in queue's one-node
    dispatcher the widest node bounds it."""
    usable = resolved(policy, snapshot.offerings, snapshot.capacity_blocks, now).candidates
    prices = [(c.offering.gpus, float(c.offering.price_usd_hour)) for c in usable]
    if spans_nodes(policy):
        need = policy.multi_node_requires
        spanning = [(c.offering.gpus, float(c.offering.price_usd_hour)) for c in usable
                    if need.met_by(c.offering.interconnect)]
        width = max([g for g, _ in prices] + [g * policy.limits.max_nodes for g, _ in spanning],
                    default=0)
        return NodeRules(width, cheapest_cost(prices, spanning, policy.limits.max_nodes))
    width = max((g for g, _ in prices), default=0)
    return NodeRules(width, cheapest_cost(prices))


def _split(unmet: Sequence[Job], onprem_absorbed: tuple[Job, ...], queue: PoolQueue,
           policy: Policy, now: datetime, boot: BootChoice | None = None,
           rules: NodeRules | None = None) -> WaitSplit:
    """:func:`.wait.split_unmet`, with the jobs already past their deadline taken out first on
    the columns (one comparison over the view): the split makes them due without simulating
    them, so it is handed only the others, and the due jobs are put back in scheduling order."""
    slo = policy.trigger.wait_slo
    if not isinstance(unmet, JobsView) or slo is None:
        return split_unmet(tuple(unmet), onprem_absorbed, queue, policy, now, boot, rules)
    boot_td = (policy.trigger.expected_boot if boot is None
               else timedelta(seconds=boot.seconds))
    margin_td = onprem_margin(policy, queue)
    # Past both the on-prem bound and the launch deadline: due whatever the prediction says.
    bound = slo - boot_td if margin_td is None else max(slo - margin_td, slo - boot_td)
    cutoff = to_us(now - bound)
    late = unmet.column("submitted_us") < cutoff
    if late.all():
        return WaitSplit(unmet, (), (), boot=boot,
                         model=_model_name(policy, queue), margin=margin_td)
    early = unmet.where(~late)
    model = _model_name(policy, queue)
    if model != "nodes":  # the pooled model (asked for, or standing in), on the columns
        split, early_due = split_pooled_view(early, onprem_absorbed, queue, policy, now, boot)
        due = late.copy()
        due[np.flatnonzero(~late)[early_due]] = True
        return replace(split, due=unmet.where(due), model=model)
    split = split_unmet(tuple(early), onprem_absorbed, queue, policy, now, boot, rules)
    due = late.copy()
    if split.due:  # the early due jobs are a subsequence of ``early``: matched in one walk
        positions = np.flatnonzero(~late).tolist()
        picked, k = [], 0
        for position, job in zip(positions, early):
            if k < len(split.due) and job is split.due[k]:
                picked.append(position)
                k += 1
        due[picked] = True
    return WaitSplit(unmet.where(due), split.deferred, split.waiting, split.earliest_burst_at,
                     boot=split.boot, model=split.model, displaced=split.displaced,
                     margin=split.margin, holds_s=split.holds_s, onprem_order=split.onprem_order)


def _spot_early(split: WaitSplit, unmet: Sequence[Job], policy: Policy, snapshot: Snapshot,
                now: datetime) -> WaitSplit:
    """The split with the waiting jobs whose first choice under the SLO guard is spot made due
    now (:meth:`.spot.SpotChooser.burst_early`): waiting for their deadline would spend the slack
    their restarts need. Due jobs stay in scheduling order."""
    usable = resolved(policy, snapshot.offerings, snapshot.capacity_blocks, now)
    candidates = list(usable.candidates)
    if not candidates:
        return split
    chooser = SpotChooser(policy, candidates, snapshot.offering_health, now,
                          choose_boot(policy, snapshot.boot_estimates).seconds,
                          partial(group_boot_s, policy, snapshot.boot_estimates))
    early = [job for job in split.waiting if chooser.burst_early(job)]
    # A deferred job bursts in the last tick it has room for a restart and a relaunch, where its
    # first choice then is spot: past it, should on-prem not take it after all, its deadline
    # burst has no room and goes on demand (for the whole of its run).
    room_left = [(job, chooser.room_left_s(job, DEFERRED_RELAUNCHES)) for job in split.deferred]
    last = [job for job, left in room_left if 0.0 <= left < TICK_S and chooser.burst_early(job)]
    # The split holds only until the next such tick (a whole number of ticks from now).
    ends = [left for _, left in room_left if left >= TICK_S]
    holds_s = min([split.holds_s, *(left // TICK_S * TICK_S for left in ends)])
    if not early and not last:
        return replace(split, holds_s=holds_s) if holds_s < split.holds_s else split
    early += last
    early_ids = {job.id for job in early}
    due_ids = early_ids | set(split.due.ids() if isinstance(split.due, JobsView)
                              else (job.id for job in split.due))
    if isinstance(unmet, JobsView):  # read on the columns: no Job made for 100k queued jobs
        due: Sequence[Job] = unmet.where(np.fromiter((i in due_ids for i in unmet.ids()),
                                                     dtype=bool, count=len(unmet)))
    else:
        due = tuple(job for job in unmet if job.id in due_ids)
    left = tuple(job for job in split.waiting if job.id not in early_ids)
    deferred = tuple(job for job in split.deferred if job.id not in early_ids)
    deadlines = [job.submitted_at for job in left]
    earliest = split.earliest_burst_at if left else None
    if left and split.earliest_burst_at is not None:
        # the first deadline among those still waiting (the same lead for every job)
        lead = split.earliest_burst_at - min(j.submitted_at for j in split.waiting)
        earliest = min(deadlines) + lead
    order = tuple(i for i in split.onprem_order if i not in early_ids)
    return replace(split, due=due, waiting=left, deferred=deferred, earliest_burst_at=earliest,
                   onprem_order=order, spot_early=len(early) - len(last), spot_last_room=len(last),
                   holds_s=0.0)  # (its odds read the clock: no claim)


def _kept_off(policy: Policy, split: WaitSplit | None, nodes: list[Node],
              snapshot: Snapshot, now: datetime) -> KeptOnPrem | None:
    """``Decision.kept_off``: under ``trigger.spare_room``, the jobs kept for on-prem and the
    burst nodes each may take; under ``trigger.onprem_order: longest-first`` alone, the jobs
    kept in order, off the nodes on their way for other jobs (:func:`.spare_room.keep_ordered`).
    None kept: an empty list, so the fabric lifts what it set before; neither rule: None."""
    trigger = policy.trigger
    if trigger.spare_room.enabled:
        if split is not None and split.spare is not None:
            return split.spare
        return KeptOnPrem((), (), trigger.spare_room.max_extension)
    if trigger.onprem_order is OnPremOrder.LONGEST_FIRST:
        if split is not None and split.onprem_order:
            return keep_ordered(split.onprem_order, split.deferred, nodes,
                                snapshot.burst_runs, now)
        return KeptOnPrem((), (), math.inf, only_launched=True)
    return None


def _model_name(policy: Policy, queue: PoolQueue) -> str:
    """``inputs.wait_aware.onprem_model`` when no job was simulated (as the split names it)."""
    if policy.trigger.wait_model is not WaitModel.NODES:
        return ""
    problem = node_space_problem(queue)
    return "nodes" if problem is None else f"pooled ({problem})"


def _spare_admit(queue: PoolQueue, census: Census, policy: Policy,
                 admit: NodeAdmitter | None, snapshot: Snapshot, now: datetime
                 ) -> NodeAdmitter | SpareAdmit | None:
    """The admitter absorption asks under ``trigger.spare_room`` (:class:`.spare_room.SpareAdmit`:
    a job is refused on a burst node it would lengthen beyond its share) where a node has room
    (ready with GPUs free, or booting); else ``admit`` as it is. Where no burst node takes a job
    without it, none takes one with it (it only refuses more), so absorption asks it at once
    rather than absorbing twice."""
    if not census.burst_free:  # (the nodes with room: ready with GPUs free, or in flight)
        return admit
    wanted = {j for n in census.in_flight for j in n.launched_for}
    launched: dict[str, float | None] = {}
    if wanted:  # the runtimes of the jobs the booting nodes are for
        columns = ordered(queue.pending, policy).columns
        durations = columns.duration_s
        ids = columns.ids
        for job_id in wanted:  # (few: a scan of the ids in C for each, not one in Python)
            try:
                index = ids.index(job_id)
            except ValueError:
                continue  # no longer pending
            runtime = float(durations[index])
            launched[job_id] = None if math.isnan(runtime) else runtime
    busy = {b.node: b for b in busy_nodes(census.nodes, snapshot.burst_runs, now, launched)}
    return SpareAdmit(busy, policy.trigger.spare_room.max_extension, admit)


def _unstaged(demand: Demand, queue: PoolQueue, nodes: list[Node], policy: Policy,
              census: Census, admit: NodeAdmitter | None, now: datetime) -> Demand:
    """Absorption again without the jobs burst nodes took whose data staging would outlast
    their predicted on-prem wait (:mod:`.staging`): a node booting for one job must not count
    as covering another that is better off waiting on-prem, or the first is launched for twice."""
    held = staging.review(policy, demand.burst_absorbed, demand.ordered, demand.onprem_absorbed,
                          queue, now).held
    if not held:
        return demand
    return absorb(queue, nodes, policy, census, _Unstaged(frozenset(j.id for j in held), admit))


class _Unstaged:
    """An admitter (as :class:`~.admission.NodeAdmitter` reads) that refuses the held jobs on
    every burst node and asks ``base`` about the rest. Its verdicts depend on the job itself,
    not on its (project, width, duration), so absorption's cache of refusals by that key must
    not hold: ``loosened`` differs at every read, and ``quotas_only`` is off."""

    quotas_only = False

    def __init__(self, refused: frozenset[str], base: NodeAdmitter | None):
        self.refused = refused
        self.base = base
        self.admission = base.admission if base is not None else None
        self._reads = 0

    @property
    def loosened(self) -> int:
        self._reads += 1
        return -self._reads

    def node_class(self, node_id: str | None) -> object:  # pragma: no cover - quotas_only off
        return node_id

    def __call__(self, job: Job, node_id: str | None) -> bool:
        return job.id not in self.refused and (self.base is None or self.base(job, node_id))


def _wider_than(jobs: Sequence[Job], widest: int) -> int:
    if isinstance(jobs, JobsView):
        return int((jobs.column("gpus") > widest).sum())
    return sum(1 for j in jobs if j.gpus > widest)


def _has_quotas(policy: Policy) -> bool:
    return any(p.max_burst_gpus is not None for p in policy.projects)


def _trigger(policy: Policy, demand: Demand, now: datetime) -> tuple[bool, str]:
    trigger = policy.trigger
    gpus = demand.pending_gpus - demand.absorbed_onprem_gpus()
    wait = demand.oldest_wait_s(now)
    by_gpus = gpus > trigger.pending_gpus_above
    by_wait = bool(demand.beyond_onprem) and wait > trigger.oldest_wait_above.total_seconds()
    fired = (by_gpus or by_wait) if trigger.combine is TriggerCombine.ANY else (by_gpus and by_wait)
    text = (f"pending GPUs beyond on-prem {gpus} {'>' if by_gpus else '<='} "
            f"{trigger.pending_gpus_above} {trigger.combine} oldest wait {wait:.0f}s "
            f"{'>' if by_wait else '<='} {trigger.oldest_wait_above.total_seconds():.0f}s")
    return fired, text


def _rank(candidates: list[Candidate], options: list[OfferingOption], demand: Demand,
          resolved_: Resolved) -> list[Candidate]:
    if not demand.unmet:  # nothing to pack: every option at 0 nodes, ranked by hourly price (memoized)
        options.extend(resolved_.idle_options)
        return list(resolved_.by_price)
    widths, hours, unmet = demand.unmet_widths, demand.unmet_hours, demand.unmet
    if isinstance(unmet, JobsView):  # untallied (the split narrowed it): counted on the columns
        if widths is None:  # (nodes_needed reads the widths in its own order)
            values, counts = np.unique(unmet.column("gpus"), return_counts=True)
            widths = Counter(dict(zip(values.tolist(), counts.tolist())))
        if hours is None:
            hours = unmet_hours(unmet)
    priced = price_options(unmet, candidates, widths=widths, hours=hours)
    options.extend(priced)
    order = {o.offering_key: i for i, o in enumerate(priced)}
    return sorted(candidates, key=lambda c: order[c.key])


def _held_gpus(nodes: list[Node], runs: tuple[BurstRun, ...] = ()) -> dict[str, int]:
    """Burst GPUs each project holds, as quotas count them (:func:`.admission.held_gpus`)."""
    return held_gpus(nodes, runs)


def _free_gpus(node: Node) -> int:
    """GPUs of a node not running anything (all of them while it is still starting)."""
    return node.gpus - node.gpus_busy if node.state is _READY else node.gpus


def _staying(node: Node) -> bool:
    """Alive and not leaving: what min_nodes and a pre-warm floor count."""
    return node.state is _READY or node.state in _IN_FLIGHT


@dataclass(slots=True)
class _Prewarm:
    launches: list[Launch]
    summary: str
    held_back: tuple[str, ...] = ()
    options: list[OfferingOption] = field(default_factory=list)


def _prewarm(policy: Policy, request: PrewarmRequest, have: int, candidates: list[Candidate],
             rejected: list[OfferingOption], budget: Budget | None, paused: bool, now: datetime,
             did: str, start: int, books: BudgetBook | None = None) -> _Prewarm:
    """Launch what the pool's pre-warm floor lacks: ``request.gpus`` free burst GPUs ready or
    starting (``have`` of them already are) until ``request.until``; nothing once a node could
    not be ready (``trigger.expected_boot``) before the floor ends.

    The offering is the one covering the gap for the least money per hour (node count x price),
    then the next ones should its own ``max_nodes`` or a budget (spot-only, say) bind; a pool-wide
    limit stops all pre-warm launching and is named in ``held_back``. Each node commits budget for
    the time left until ``until``. A paused pool launches nothing.
    """
    until = request.until.isoformat().replace("+00:00", "Z")
    text = f"pre-warming {request.gpus} GPUs until {until}"
    gap = request.gpus - have
    if gap <= 0:
        return _Prewarm([], f"{text}: {have} GPU(s) ready or starting, the floor is met")
    if paused:
        return _Prewarm([], f"{text}: {gap} GPU(s) short, held while the pool is paused")
    boot = policy.trigger.expected_boot
    if request.until - now <= boot:
        # A node launched now would be ready only after the floor ends: all cost, no use.
        return _Prewarm([], f"{text}: {gap} GPU(s) short, but a node launched now would not be "
                            f"ready before the floor ends (trigger.expected_boot "
                            f"{boot.total_seconds():.0f}s)")
    if budget is None:
        why = "; ".join(f"{o.offering_key}: {o.rejected}" for o in rejected)
        return _Prewarm([], f"{text}: {gap} GPU(s) short, no usable offering ({why})")
    hours = max((request.until - now).total_seconds(), 60.0) / 3600

    def cost(c: Candidate) -> tuple:
        nodes = -(-gap // c.offering.gpus)
        return (nodes * c.offering.price_usd_hour, c.offering.price_per_gpu_hour, c.key)

    ranked = sorted(candidates, key=cost)
    options = []
    for c in ranked:
        nodes = -(-gap // c.offering.gpus)
        options.append(OfferingOption(c.key, c.offering.gpus, c.offering.price_usd_hour,
                                      nodes, round(nodes * c.offering.price_usd_hour * hours, 4)))
    grants: list[Grant] = []
    held: list[str] = []
    missing = gap
    runtime = hours * 3600
    for candidate in ranked:
        blocker = None
        commit = commitment_usd(policy, candidate.offering, runtime)
        while missing > 0 and blocker is None:
            blocker = budget.blocker(candidate)
            if blocker is None and books is not None:
                blocker = books.blocker(None, candidate.offering, commit)
            if blocker is None:
                budget.take(candidate)
                if books is not None:
                    books.take(None, candidate.offering, commit)
                grants.append(Grant(candidate, "-", runtime, commit))
                missing -= candidate.offering.gpus
        if blocker is None:
            break  # the gap is covered
        if blocker not in held:
            held.append(blocker)
        if not blocker.startswith(("offerings[", "budgets[")):
            break  # a pool-wide limit: no other offering helps
    launches = _launches(policy, grants, did, ActionReason.PREWARM, start=start)
    if launches:
        kinds = ", ".join(sorted({lc.offering.key for lc in launches}))
        text += (f": {have} GPU(s) ready or starting, launching {len(launches)} node(s) ({kinds}) "
                 f"for the {gap} short")
    else:
        text += f": {gap} GPU(s) short"
    if held:
        text += f"; held back by {', '.join(held)}"
    return _Prewarm(launches, text, tuple(held), options)


def _launches(policy: Policy, grants: list[Grant], did: str, reason: ActionReason,
              start: int = 0) -> list[Launch]:
    launches = []
    for index, grant in enumerate(grants, start):
        node_id = f"{policy.name}-" + _child_id("", did, index)[:10]
        launches.append(Launch(
            policy=policy.name,
            pool=policy.pool.name,
            node_id=node_id,
            request_id=_child_id("r-", did, index),
            offering=grant.candidate.offering,
            group=(None if grant.group < 0
                   else f"{policy.name}-g" + _child_id("", did, grant.group + start)[:10]),
            group_size=grant.group_size,
            reason=reason,
            project=None if grant.project == "-" else grant.project,
            decision_id=did,
            budget_commit_usd=float(grant.commit_usd),
            jobs=grant.jobs,
            user=grant.user,
        ))
    return launches


def _plain_grant(policy: Policy, ranked: list[Candidate], budget: Budget, books: BudgetBook | None,
                 runtime_s: float) -> tuple[Grant | None, str | None]:
    """One node for no project (min_nodes): the first candidate every limit allows. Only a budget
    (spot-only, say) passes the turn to the next candidate; any other limit stops it."""
    first = None
    for candidate in ranked:
        commit = commitment_usd(policy, candidate.offering, runtime_s)
        blocker = budget.blocker(candidate)
        if blocker is None and books is not None:
            blocker = books.blocker(None, candidate.offering, commit)
        if blocker is None:
            budget.take(candidate)
            if books is not None:
                books.take(None, candidate.offering, commit)
            return Grant(candidate, "-", runtime_s, commit), None
        first = first or blocker
        if not blocker.startswith("budgets["):
            break
    return None, first


def _budget_drains(policy: Policy, books: BudgetBook, nodes: list[Node], actions: list[Action],
                   now: datetime, did: str) -> list[Drain]:
    """Drain the ready nodes of every budget past its drain grade (running work is waited for,
    up to drain_grace: the next safe point), except those already drained this tick."""
    over = books.draining()
    if not over:
        return []
    leaving = {a.node_id for a in actions if isinstance(a, Drain)}
    deadline = now + policy.scale_down.drain_grace
    drains = []
    for node in nodes:
        if node.state is not NodeState.READY or node.id in leaving:
            continue
        if any(in_scope(s.budget, s.pool, node.pool, node.project) for s in over):
            drains.append(Drain(node.id, ActionReason.BUDGET, deadline, decision_id=did))
    return drains


def _projects(demand: Demand) -> str:
    if demand.unmet_by_project is not None:  # tallied already: its keys are the unmet projects
        names = set(demand.unmet_by_project)
    else:
        names = set(first_projects(demand.unmet))
    # A job of no project is named as such, never under a made-up project.
    return ", ".join(sorted(p if p is not None else NO_PROJECT_LABEL for p in names))


def _owners(unmet: tuple[Job, ...]) -> tuple[list[dict[str, Any]], int, int]:
    """Whose work is unmet: the GPUs and jobs per (project, user) of the first
    :data:`MAX_OWNER_SCAN` unmet jobs in scheduling order (those new nodes serve first; every one
    in a smaller queue), the most GPUs first (then by name, a missing project or user as null),
    at most :data:`MAX_OWNERS_IN_RECORD` of them; how many more owners there were; and how many
    jobs were counted. One C-level pass (attrgetter of the three fields): a full pass over 100k
    jobs of thousands of owners would cost a tenth of the plan (docs/performance.md)."""
    scanned = unmet if len(unmet) <= MAX_OWNER_SCAN else unmet[:MAX_OWNER_SCAN]
    if isinstance(scanned, JobsView):
        triples = scanned.columns.owner_counts(scanned.indexes)
    else:
        triples = Counter(map(_OWNER_WIDTH, scanned))
    gpus: dict[tuple[str | None, str | None], int] = {}
    jobs: dict[tuple[str | None, str | None], int] = {}
    for (project, user, width), count in triples.items():
        gpus[project, user] = gpus.get((project, user), 0) + width * count
        jobs[project, user] = jobs.get((project, user), 0) + count
    # The largest only (a heap, not a sort of thousands of owners).
    top = heapq.nsmallest(MAX_OWNERS_IN_RECORD, gpus, key=lambda k: (
        -gpus[k], k[0] is None, k[0] or "", k[1] is None, k[1] or ""))
    rows = [{"project": k[0], "user": k[1], "gpus": gpus[k], "jobs": jobs[k]} for k in top]
    return rows, max(len(gpus) - MAX_OWNERS_IN_RECORD, 0), len(scanned)


_SCALE_DOWN_IDLE = frozenset({ActionReason.IDLE, ActionReason.LOW_UTILISATION})


def _low_utilisation_inputs(policy: Policy, census: Census, actions: list[Action]) -> dict:
    """The ready nodes whose jobs barely use their GPUs (measured), as the decision records
    them: flagged whether or not the policy counts them as idle for scale-down."""
    drained = [a.node_id for a in actions
               if getattr(a, "reason", None) is ActionReason.LOW_UTILISATION]
    return {
        "nodes": sorted(n.id for n in census.low_utilisation),
        "below_percent": policy.utilisation.idle_below_percent,
        "for_s": policy.utilisation.idle_for.total_seconds(),
        "counted_as_idle": policy.scale_down.count_low_utilisation_as_idle,
        "drained": drained,
    }


def _inputs(demand: Demand, fleet: Census, observed: bool, now: datetime, trigger_text: str,
            held_for: float) -> dict:
    per_project: dict[str, int] = {}
    # Counted by (project, width) in C first: 100k unmet jobs fall into a few dozen pairs, which
    # come in the order of the jobs, so projects keep the order of their first unmet job. (Absorb
    # tallies them from the queue's columns; after the wait-aware split, counted here.)
    unmet = demand.unmet
    if demand.unmet_by_project is not None:
        per_project = dict(demand.unmet_by_project)
    elif unmet:
        per_project = gpus_by_project(unmet)
    if None in per_project:  # a JSON key cannot be null: the no-project bucket says so
        per_project = {NO_PROJECT_LABEL if k is None else k: v for k, v in per_project.items()}
    onprem_gpus = demand.absorbed_onprem_gpus()
    owners, omitted, scanned = _owners(unmet)
    return {
        "queue_observed": observed,
        "pending_jobs": len(demand.ordered),
        "pending_gpus": demand.pending_gpus,
        # Beyond on-prem = all pending less what on-prem absorbs, as the trigger counts it (the
        # wait-aware split narrows ``unmet`` to the due jobs, not what is beyond on-prem).
        "pending_gpus_beyond_onprem": demand.pending_gpus - onprem_gpus,
        "oldest_wait_s": round(demand.oldest_wait_s(now), 1),
        "absorbed_onprem_gpus": onprem_gpus,
        "absorbed_burst_gpus": demand.absorbed_burst_gpus(),
        "unmet_gpus": demand.unmet_gpus,
        "unmet_gpus_by_project": per_project,  # "(no project)": jobs of no project
        # Whose work is unmet: project and user (null: a job of no project, or of no known user).
        "unmet_by_owner": owners,
        "unmet_owners_omitted": omitted,
        "unmet_owner_jobs_counted": scanned,  # < len(unmet): the first ones in scheduling order
        "trigger": trigger_text,
        "trigger_held_s": round(held_for, 1),
        "nodes_by_state": dict(fleet.by_state),
        "spend_usd_hour": round(fleet.spend_usd_hour, 4),
    }


def _describe(action: Action) -> str:
    if isinstance(action, Launch):
        return f"launch {action.node_id} {action.offering.key} for {action.project or '-'} ({action.reason})"
    if isinstance(action, Hold):
        return "hold"
    return f"{type(action).__name__.lower()} {getattr(action, 'node_id', None)} ({action.reason})"
