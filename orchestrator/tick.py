"""One planning pass: the sequence every driver of the control loop shares.

The embedded loop (:mod:`orchestrator.loop`), the Celery tick (:mod:`orchestrator.automation.tasks`)
and an on-demand evaluation (:func:`orchestrator.automation.operations.evaluate`) plan the same
way: start on-prem what fits, roll the cost ledger up to now (so budgets see current spend),
observe a snapshot, plan, then carry the plan out. They differ only in how the plan is carried out
(at once in this process, or recorded and handed to worker tasks) and in which store the writes go
through (the Celery tick's is fenced with its leader token). Those two are the parameters here, so
the sequence itself exists once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from orchestrator.costs.ledger import RollupResult, billing_rules, roll_up
from orchestrator.domain.plan import Plan
from orchestrator.domain.snapshot import Snapshot
from orchestrator.executor import Executor
from orchestrator.instruments import count_decisions, observe_tick
from orchestrator.planner import plan as make_plan
from orchestrator.policy.models import Policy
from orchestrator.policy.units import format_duration
from orchestrator.reconciler import Reconciler
from orchestrator.sources.builtin import BuiltinQueue
from orchestrator.store import Store
from orchestrator.store.fencing import StaleLeaderError
from orchestrator.store.ticknodes import TickNodes
from orchestrator.wiring import Runtime

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PlanPass(Generic[T]):
    """What one pass saw, decided and did (``outcome`` is whatever ``carry_out`` returned)."""

    now: datetime
    snapshot: Snapshot
    plan: Plan
    outcome: T


def roll_up_costs(rt: Runtime, now: datetime, *, store: Store | None = None,
                  only_policies: set[str] | None = None, strict: bool = False,
                  skip_fresh: bool = False, nodes: TickNodes | None = None
                  ) -> RollupResult | None:
    """Bring the cost ledger up to ``now``.

    Inside a tick a failure is logged, not raised: planning must go on, and budgets add what the
    ledger has not reached yet (:func:`orchestrator.costs.spend.spend`). ``strict`` raises instead
    (a report that must be exact). A stale leader's refusal always propagates: the caller's turn
    is over. ``skip_fresh`` (a tick): live nodes for which only the clock moved since their last
    roll-up are left as they are (:func:`orchestrator.costs.ledger.roll_up`). ``nodes``: the
    tick's one read of the nodes (``Store.tick_nodes``), shared with the snapshot.
    """
    try:
        return roll_up(store or rt.store, rt.policies, now,
                       billing=billing_rules(rt.observer.catalogue()), only_policies=only_policies,
                       skip_fresh=skip_fresh, nodes=nodes)
    except StaleLeaderError:
        raise
    except Exception:
        if strict:
            raise
        log.exception("cost roll-up failed at %s; the next one catches up", now.isoformat())
        return None


def planning_pass(rt: Runtime, policies: Iterable[Policy], now: datetime,
                  carry_out: Callable[[Plan], T], *, store: Store | None = None,
                  in_process: bool | None = None) -> PlanPass[T]:
    """Dispatch on-prem, roll up costs, observe, plan ``policies`` at ``now``, and carry out.

    ``store``: where the pass writes (jobs started on-prem, ledger lines); the runtime's own by
    default. ``carry_out`` receives the plan and is responsible for storing its decisions and
    memory before any side effect (the executor does; the Celery tick records them itself).
    ``in_process``: the pass runs in the process that serves the API (the embedded loop), so it
    dispatches through the runtime's queue (whose lock the API shares) even with a fenced
    ``store``; default: only when ``store`` is the runtime's own.
    """
    policies = list(policies)
    store = store or rt.store
    in_process = store is rt.store if in_process is None else in_process
    if in_process:
        # The runtime's queue: its lock is shared with the API; writing through ``store`` so a
        # deposed leader's dispatch is refused too.
        queue = rt.queue if store is rt.store else rt.queue.writing_to(store)
        read = queue.dispatch(now)
    else:
        # A fenced store: on-prem dispatch writes jobs, so a deposed leader's must be refused too.
        read = BuiltinQueue(store, policies).dispatch(now)
    names = {p.name for p in policies}
    # In process, planning every loaded policy: roll up everything, nodes of policies since
    # removed included. A Celery leader rolls up its own policies' nodes only: the rest is the
    # ``burst.cost.rollup`` task's, under its own lease.
    everything = in_process and names >= set(rt.policies)
    # The nodes, read once for the roll-up's candidates and the snapshot (nothing between the
    # two writes a node row): at 10,000 nodes each read cost 40-50 ms of a tick.
    nodes = store.tick_nodes()
    # Budgets see a node's cost past where its lines reach, so a tick leaves the nodes whose
    # open bucket only grew with the clock; their lines catch up at the next bucket.
    roll_up_costs(rt, now, store=store, only_policies=None if everything else names,
                  skip_fresh=True, nodes=nodes)
    # The queue as dispatch read and left it: one read of the queue per tick.
    snapshot = rt.observer.snapshot(now, queue_read=read, nodes=nodes)
    # Slurm's power save plans these itself, through `burst slurm resume` (a tick's plan would
    # launch for the CLOUD partition's pending jobs a second time, and drain what Slurm suspends);
    # their costs are rolled up above all the same.
    result = make_plan(snapshot, [p for p in policies if not p.power_saved], now)
    count_decisions(result.decisions)
    return PlanPass(now, snapshot, result, carry_out(result))


def fenced_runtime_parts(rt: Runtime, store: Store) -> tuple[Executor, Reconciler]:
    """An executor and a reconciler like the runtime's, writing through ``store`` (a fenced
    view): a leader's provider calls and node transitions are refused once it was deposed."""
    executor = Executor(store, rt.providers, rt.fabric, rt.clock, rt.tokens, rt.policies,
                        rt.executor.config)
    executor.disabled = rt.executor.disabled  # shared: a provider stopped stays stopped
    reconciler = Reconciler(store, rt.fabric, rt.policies, rt.reconciler.config)
    return executor, reconciler


def record_tick(rt: Runtime, policies: Iterable[str], at: datetime, started: float) -> None:
    """Store a tick's duration (from ``started``, a ``perf_counter`` reading) per policy, for the
    metrics endpoint. Not fenced: timing is no state a deposed leader could corrupt; and a failure
    is logged, since metrics must never fail a tick."""
    duration = time.perf_counter() - started
    policies = list(policies)
    observe_tick(policies, duration)
    try:
        for name in policies:
            rt.store.record_tick(name, at, duration)
    except Exception:  # noqa: BLE001 - see the docstring
        log.warning("could not record the tick's duration", exc_info=True)


PRUNE_EVERY = timedelta(hours=1)  # how often the embedded loop and beat apply decision retention


def prune_decisions(rt: Runtime, now: datetime) -> int:
    """Apply ``settings.decision_retention``: delete decisions last made longer ago; returns how
    many went. Shared by the embedded loop (hourly) and beat's ``burst.decisions.prune``, which
    apply ``settings.usage_retention`` to the GPU-use aggregates in the same pass."""
    removed = rt.store.prune_decisions(now - rt.settings.decision_retention)
    if removed:
        log.info("pruned %d decision(s) last made before the %s retention", removed,
                 format_duration(rt.settings.decision_retention))
    usage = rt.store.prune_utilisation(now - rt.settings.usage_retention)
    if usage:
        log.info("pruned %d GPU-use row(s) (job aggregates, node-hours) older than the %s "
                 "retention", usage, format_duration(rt.settings.usage_retention))
    return removed


__all__ = ["PRUNE_EVERY", "PlanPass", "fenced_runtime_parts", "planning_pass", "prune_decisions", "record_tick",
           "roll_up_costs"]
