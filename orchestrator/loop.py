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

One controller plans a pool at a time (:mod:`orchestrator.leadership`): each tick first claims the
store leases ``reconcile`` and ``policy:<name>`` of its policies; a scope another live controller
leads (another ``burst run``, Celery workers on the same store) is skipped and reported in the
tick's ``skipped``; the writes of the scopes it leads are fenced with their tokens. A clean stop
releases the leases; a killed loop's are taken over at once by a new one on the same host.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime

from orchestrator.domain.plan import ActionReason, Decision, Terminate
from orchestrator.domain.ports import Instance, ProviderError
from orchestrator.executor import ExecutionReport
from orchestrator.groups import sweep_groups
from orchestrator.leadership import (
    RECONCILE,
    Controller,
    Holder,
    lease_ttl,
    policy_scope,
    watch_gap,
)
from orchestrator.notify.sender import NotificationSender
from orchestrator.notify.watch import check
from orchestrator.store.fence import StaleLeaderError
from orchestrator.tick import (
    PRUNE_EVERY,
    fenced_runtime_parts,
    planning_pass,
    prune_decisions,
    record_tick,
)
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
    skipped: dict[str, str] = field(default_factory=dict)  # scope -> the controller leading it


class ControlLoop:
    """Drives a runtime tick by tick, leading the scopes no other live controller leads."""

    def __init__(self, runtime: Runtime, tick_s: float, controller: Controller | None = None):
        self.runtime = runtime
        self.tick_s = tick_s
        # When retention last ran: the one thing the loop remembers, and only to run it hourly
        # (a restart runs it again at once, which is harmless).
        self._pruned_at: datetime | None = None
        self.controller = controller or Controller(
            runtime.store, Holder.this_process("burst-run"), lease_ttl(tick_s), watch_gap(tick_s))
        self._reported: dict[str, str] = {}
        # The loop's own notification sender, started with the first notification to send.
        self.notifier: NotificationSender | None = None

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
        claims = self.controller.claim([RECONCILE, *map(policy_scope, rt.policies)], now)
        report.skipped = claims.skipped
        self._report_skipped(claims.skipped)
        try:
            leaked: list[Terminate] = []
            if claims.leads(RECONCILE):
                leaked = self._reconcile(report, now)
            led = [p for name, p in rt.policies.items() if claims.leads(policy_scope(name))]
            if led:
                self._plan(report, led, now)
        except StaleLeaderError as exc:
            # Taken over mid-tick (we were paused past the lease): the store refused the write.
            log.warning("another controller took over (%s); this tick stops here", exc)
            self.controller.held.clear()
        report.duration_s = time.perf_counter() - started
        record_tick(rt, [p for p in rt.policies if claims.leads(policy_scope(p))], report.at,
                    started)
        if claims.leads(RECONCILE):
            self._apply_retention(report.at)  # one controller's chore, not every one's
            self._notify(report.at, leaked)
        return report

    def _notify(self, now: datetime, leaked: list[Terminate]) -> None:
        """Claim what deserves a notification and hand it to the sender thread: a slow or
        failing webhook never holds the tick."""
        rt = self.runtime
        claimed = check(rt.store, rt.policies.values(), now, leaked)
        if not claimed:
            return
        if self.notifier is None:
            self.notifier = NotificationSender(rt.store, rt.policies.values(), rt.clock.now).start()
        self.notifier.submit(claimed)

    def _reconcile(self, report: TickReport, now: datetime) -> list[Terminate]:
        """Reality first: what providers really have, then the fixes it calls for, judged on
        what this controller could have observed (its tenure, the API's presence window)."""
        rt = self.runtime
        view = self.controller.view([RECONCILE])
        executor, _ = fenced_runtime_parts(rt, view)
        rt.reconciler.store = view  # the runtime's reconciler keeps its memory of vanishings
        try:
            rt.reconciler.sync(self.observe_providers(), now)
            corrective = rt.reconciler.step(now, self.controller.observing_since(now))
            report.corrective = len(corrective)
            report.execution.merge(executor.run(corrective))
            # placement groups whose burst is over, interrupted deletions, leaked groups
            sweep_groups(view, rt.providers, {p.cluster for p in rt.policies.values()}, now)
        finally:
            rt.reconciler.store = rt.store
        return [a for a in corrective if isinstance(a, Terminate)
                and a.reason is ActionReason.LEAKED]

    def _plan(self, report: TickReport, policies: list, now: datetime) -> None:
        rt = self.runtime
        view = self.controller.view([policy_scope(p.name) for p in policies])
        executor, _ = fenced_runtime_parts(rt, view)
        for attempt in range(1 + MAX_REPLANS):
            done = planning_pass(rt, policies, now, executor.execute, store=view, in_process=True)
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
                    view.save_memory(name, replace(memory, last_launch_at=before.last_launch_at if before else None))
            log.info("capacity error on %s: re-planning within the tick (attempt %d)",
                     ", ".join(executed.capacity_errors), attempt + 1)
            now = rt.clock.now()

    def _report_skipped(self, skipped: dict[str, str]) -> None:
        """Say once (not every tick) which scopes another controller leads."""
        for scope, holder in skipped.items():
            if self._reported.get(scope) != holder:
                log.warning("%s is led by another live controller (%s): not acting on it",
                            scope, holder)
        for scope in set(self._reported) - set(skipped):
            log.info("%s: no other controller leads it any more", scope)
        self._reported = dict(skipped)

    def close(self) -> None:
        """A clean stop: release the leases so the next controller need not wait for expiry."""
        self.controller.release_all(self.runtime.clock.now())
        if self.notifier is not None:
            self.notifier.stop()

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
        self.close()
