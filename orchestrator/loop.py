"""The control loop: every tick, reconcile with reality, observe, plan, execute.

One tick:

1. ``reconciler.sync``: record what each provider really has (booted, gone, vanished);
2. ``reconciler.step`` -> corrective actions (leaks, stuck nodes, lost heartbeats), executed;
3. the planning pass shared with the Celery tick (:func:`orchestrator.tick.planning_pass`): the
   built-in queue finishes on-prem jobs whose time is up and starts what fits on-prem; the cost
   ledger is rolled up to now (budgets see current spend); a Snapshot is observed, ``plan()``
   run, and the plan executed (decisions and memory are stored first);
4. if a launch hit a capacity error, the offering is now in the negative-capacity cache: observe and
   plan again within the same tick, so the next offering is launched without waiting a tick;
5. hourly, decisions older than ``decision_retention`` are pruned.

The loop holds no state of its own: everything lives in the store, so a restart (or a crash at any
line) continues from the records, and the reconciler adopts or cleans up whatever was in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from orchestrator.domain.plan import Decision
from orchestrator.domain.ports import Instance, ProviderError
from orchestrator.executor import ExecutionReport
from orchestrator.tick import PRUNE_EVERY, planning_pass, prune_decisions, record_tick
from orchestrator.wiring import Runtime

log = logging.getLogger(__name__)

MAX_REPLANS = 2  # re-plans within one tick after capacity errors (one per fallback offering)


@dataclass(slots=True)
class TickReport:
    """What one tick did (for progress displays and tests)."""

    at: datetime
    duration_s: float = 0.0
    decisions: list[Decision] = field(default_factory=list)
    execution: ExecutionReport = field(default_factory=ExecutionReport)
    corrective: int = 0


class ControlLoop:
    """Drives a runtime tick by tick."""

    def __init__(self, runtime: Runtime, tick_s: float):
        self.runtime = runtime
        self.tick_s = tick_s
        # When retention last ran: the one thing the loop remembers, and only to run it hourly
        # (a restart runs it again at once, which is harmless).
        self._pruned_at: datetime | None = None

    def observe_providers(self) -> dict[str, list[Instance]]:
        clusters = sorted({p.cluster for p in self.runtime.policies.values()})
        observed: dict[str, list[Instance]] = {}
        for name, provider in self.runtime.providers.items():
            try:
                observed[name] = [i for c in clusters for i in provider.list_owned(c)]
            except ProviderError as exc:
                log.warning("provider %s: cannot list instances this tick: %s", name, exc)
        return observed

    def tick(self) -> TickReport:
        rt = self.runtime
        started = time.perf_counter()
        now = rt.clock.now()
        report = TickReport(at=now)
        # Reality first: what providers really have, then the fixes it calls for (the on-prem
        # dispatch and the cost roll-up come in the planning pass, before observing).
        rt.reconciler.sync(self.observe_providers(), now)
        corrective = rt.reconciler.step(now)
        report.corrective = len(corrective)
        report.execution.merge(rt.executor.run(corrective))

        for attempt in range(1 + MAX_REPLANS):
            done = planning_pass(rt, rt.policies.values(), now, rt.executor.execute)
            snapshot, plan, executed = done.snapshot, done.plan, done.outcome
            report.decisions.extend(plan.decisions)
            report.execution.merge(executed)
            if not executed.capacity_errors:
                break
            # The failed launches must not start the scale-up cooldown: put back the last launch
            # time of policies that launched nothing, then plan again around the blocked offering.
            launched_policies = {n.policy for n in rt.store.nodes() if n.id in executed.launched}
            for name, memory in plan.memory.items():
                if name not in launched_policies:
                    before = snapshot.memory.get(name)
                    rt.store.save_memory(name, replace(memory, last_launch_at=before.last_launch_at if before else None))
            log.info("capacity error on %s: re-planning within the tick (attempt %d)",
                     ", ".join(executed.capacity_errors), attempt + 1)
            now = rt.clock.now()
        report.duration_s = time.perf_counter() - started
        record_tick(rt, rt.policies, report.at, started)
        self._apply_retention(report.at)
        return report

    def _apply_retention(self, now: datetime) -> None:
        if self._pruned_at is not None and now - self._pruned_at < PRUNE_EVERY:
            return
        try:
            prune_decisions(self.runtime, now)
            self._pruned_at = now
        except Exception:  # noqa: BLE001 - retention must never fail a tick; retried next tick
            log.warning("could not prune old decisions", exc_info=True)

    def run(self, stop: threading.Event, on_tick=None) -> None:
        """Tick every ``tick_s`` until ``stop`` is set; a failing tick is logged, not fatal."""
        while not stop.is_set():
            began = time.monotonic()
            try:
                report = self.tick()
                if on_tick is not None:
                    on_tick(report)
            except Exception:  # noqa: BLE001 - the loop must outlive one bad tick
                log.exception("tick failed; continuing at the next tick")
            stop.wait(max(self.tick_s - (time.monotonic() - began), 0.0))
