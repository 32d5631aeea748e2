"""The control loop: every tick, reconcile with reality, observe, plan, execute.

One tick:

1. the built-in queue finishes on-prem jobs whose time is up and starts what fits on-prem;
2. ``reconciler.sync``: record what each provider really has (booted, gone, vanished);
3. ``reconciler.step`` -> corrective actions (leaks, stuck nodes, lost heartbeats), executed;
   then the cost ledger is rolled up to now (``costs.ledger.roll_up``): budgets see current spend;
4. observe a Snapshot, ``plan()`` it, execute the plan (decisions and memory are stored first);
5. if a launch hit a capacity error, the offering is now in the negative-capacity cache: observe and
   plan again within the same tick, so the next offering is launched without waiting a tick.

The loop holds no state of its own: everything lives in the store, so a restart (or a crash at any
line) continues from the records, and the reconciler adopts or cleans up whatever was in flight.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from orchestrator.costs.ledger import billing_rules, roll_up
from orchestrator.domain.plan import Decision
from orchestrator.domain.ports import Instance, ProviderError
from orchestrator.executor import ExecutionReport
from orchestrator.planner import plan as make_plan
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

    def observe_providers(self) -> dict[str, list[Instance]]:
        clusters = sorted({p.cluster for p in self.runtime.policies.values()})
        observed: dict[str, list[Instance]] = {}
        for name, provider in self.runtime.providers.items():
            try:
                observed[name] = [i for c in clusters for i in provider.list_owned(c)]
            except ProviderError as exc:
                log.warning("provider %s: cannot list instances this tick: %s", name, exc)
        return observed

    def roll_up_costs(self, now: datetime) -> None:
        """Bring the cost ledger up to ``now`` before observing. A failure is logged, not fatal:
        planning must go on, and budgets add what the ledger has not reached (``costs.spend``)."""
        rt = self.runtime
        try:
            roll_up(rt.store, rt.policies, now, billing=billing_rules(rt.observer.catalogue()))
        except Exception:  # noqa: BLE001 - see the docstring
            log.exception("cost roll-up failed; the next tick catches up")

    def tick(self) -> TickReport:
        rt = self.runtime
        started = time.perf_counter()
        now = rt.clock.now()
        report = TickReport(at=now)
        rt.queue.dispatch_onprem(now)
        rt.reconciler.sync(self.observe_providers(), now)
        corrective = rt.reconciler.step(now)
        report.corrective = len(corrective)
        report.execution.merge(rt.executor.run(corrective))
        self.roll_up_costs(now)

        for attempt in range(1 + MAX_REPLANS):
            snapshot = rt.observer.snapshot(now)
            plan = make_plan(snapshot, rt.policies.values(), now)
            executed = rt.executor.execute(plan)
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
        self._record_tick(report)
        return report

    def _record_tick(self, report: TickReport) -> None:
        """Store the tick's duration for the metrics endpoint (every policy ticked together)."""
        try:
            for name in self.runtime.policies:
                self.runtime.store.record_tick(name, report.at, report.duration_s)
        except Exception:  # noqa: BLE001 - timing is for metrics; it must not fail a tick
            log.warning("could not record the tick's duration", exc_info=True)

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
