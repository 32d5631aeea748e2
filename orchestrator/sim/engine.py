"""The discrete-event engine: a virtual clock, the event queue, and one controller driving nodes.

Events are job arrivals (read in order from the trace), job ends, instances turning running,
spot interruptions, state timeouts and controller wake-ups. At each instant, in order: the events
of that instant are applied, pending jobs are dispatched (on-prem first, then ready burst nodes),
then the controller acts if it is due. For a policy that is the production tick
(:class:`~orchestrator.sim.controllers.PolicyController`): a Snapshot, ``plan()``, the production
:class:`~orchestrator.executor.Executor` against the sim provider, and a re-plan within the tick
after a capacity error, as in :mod:`orchestrator.loop`.

What the reconciler does in production (record that an instance runs, that it vanished, that a
terminate went through; fail nodes past a state timeout) is done here when the sim provider says
so, through the same lifecycle gate (:func:`orchestrator.lifecycle.transition`) and, for
terminations, the same executor.
"""

from __future__ import annotations

import gc
import heapq
import math
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime

from orchestrator.domain.boot import BootLearner
from orchestrator.domain.capacity import CapacityLearner
from orchestrator.domain.nodes import NodeState
from orchestrator.domain.plan import Action, ActionReason, Terminate
from orchestrator.executor import ExecutionReport, Executor, ExecutorConfig
from orchestrator.fabric.tokens import JoinTokens
from orchestrator.lifecycle import state_timeouts, transition
from orchestrator.policy.models import Policy
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.world import DONE, PENDING, SimJob, World, at, seconds

INF = math.inf
FINISH, BOOT, INTERRUPT, TIMEOUT, WAKE, ELIGIBLE, BACKFILL = range(7)
_ALIVE = (NodeState.LAUNCHING, NodeState.BOOTING, NodeState.JOINING, NodeState.READY,
          NodeState.DRAINING)
YOUNG_GC = 10_000  # containers made between young collections during a run (Python's: 700)

# Runs in progress in this process (threads may replay side by side): the first sets the
# collector up, the last puts it back.
_gc_lock = threading.Lock()
_gc_runs = [0]
_gc_saved: list[tuple[int, ...]] = []


@contextmanager
def _collector_for_a_run() -> Iterator[None]:
    """The cyclic garbage collector, not the replay, was a tenth of the full ITP replay: a plan
    makes and drops thousands of containers (the node space's step lists), which set off a young
    pass every 700 with CPython's defaults, and a full pass walks every object (a tenth of a
    second each with the trace loaded). During a run young passes come every :data:`YOUNG_GC`
    containers at least (a burst process's own thresholds, orchestrator.gctune, are higher);
    they are put back after the run. Nothing is frozen: freezing the run's set-up saved no more
    once the passes were rarer, froze the garbage the set-up left (~50 MiB on the full ITP
    trace), and the full collection that avoids it cost seconds per replay in a process holding
    much else (the test suite's)."""
    with _gc_lock:
        if not _gc_runs[0]:
            thresholds = gc.get_threshold()
            _gc_saved[:] = [thresholds]
            gc.set_threshold(max(thresholds[0], YOUNG_GC), *thresholds[1:])
        _gc_runs[0] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_runs[0] -= 1
            if not _gc_runs[0]:
                gc.set_threshold(*_gc_saved[0])


STALL_S = 6 * 3600.0  # stop when nothing has changed this long after the last arrival
HORIZON_S = 365 * 86400.0  # hard stop after the last arrival (a safety net)


class SimClock:
    """The virtual clock the executor and the sim provider read."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> datetime:
        return at(self.t)


@dataclass(slots=True)
class Sample:
    """One point of the chart: time, jobs pending, burst nodes alive, cost accrued so far."""

    t: float
    pending: int
    nodes: int
    cost_usd: float


@dataclass(slots=True)
class Counters:
    launches: int = 0
    terminations: int = 0
    interruptions: int = 0
    boot_timeouts: int = 0
    peak_nodes: int = 0
    plans: int = 0  # plan() calls
    idle_ticks: int = 0  # ticks plan() was not called at: it provably did nothing (idletick)
    held_ticks: int = 0  # ticks plan() was not called at: it provably only held again
    slept_ticks: int = 0  # ticks plan() was not called at: before the last plan's holds_until
    plan_wall_s: float = 0.0  # wall time inside plan() (for benchmarks; never in the JSON)
    ticks: int = 0
    samples: list[Sample] = field(default_factory=list)


class Engine:
    """One simulation run: a world, a sim provider, an executor, and a controller."""

    def __init__(self, world: World, provider, policy: Policy, controller, *,
                 tick_s: float = 60.0, sample_s: float = 3600.0,
                 progress: Callable[[float], None] | None = None):
        self.world = world
        self.store: SimStore = world.store
        self.provider = provider
        self.policy = policy
        self.clock: SimClock = provider.clock
        self.tick_s = tick_s
        self.sample_s = sample_s
        self.progress = progress
        self.executor = Executor(self.store, {provider.name: provider}, world, self.clock,
                                 JoinTokens(b"burst-simulator"), {policy.name: policy},
                                 ExecutorConfig(controller_url="http://simulator.invalid"))
        self.launch_limit_s = next(t.limit for t in state_timeouts(policy)
                                   if t.state is NodeState.LAUNCHING).total_seconds()
        self.heap: list[tuple] = []
        self._seq = 0
        self.counters = Counters()
        self.controller = controller
        self.next_tick: float | None = None
        self._wake_due = False
        self._backfill_at: float | None = None  # when a held-back backfill pass is due
        self.last_change = 0.0
        self.now = 0.0
        self._billing: dict[str, float] = {}  # node id -> $/h while its instance is billed
        self._rate = 0.0
        self._accrued = 0.0
        self._next_sample = 0.0
        # Learned capacity (spot.by_expected_cost): fed every launch outcome and node end; the
        # policy controller's snapshot carries what it has learned (offering_health).
        self.learner: CapacityLearner | None = None
        # Learned boot times (trigger.learn_boot): fed each boot once it has happened.
        self.boot_learner: BootLearner | None = None
        world.on_node_idle = self._node_idle
        controller.bind(self)

    # -- scheduling ------------------------------------------------------------------------------

    def push(self, t: float, kind: int, payload) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq, kind, payload))

    def wake(self, t: float) -> None:
        """Ask for the controller to act at ``t`` (baselines time their rules this way)."""
        self.push(max(t, self.now), WAKE, None)

    def start_ticking(self, now: float) -> None:
        if self.next_tick is None:
            self.next_tick = math.ceil(now / self.tick_s - 1e-9) * self.tick_s

    def _node_idle(self, node_id: str, now: float) -> None:
        self.controller.on_idle(node_id, now)

    # -- the run ---------------------------------------------------------------------------------

    def run(self) -> None:
        with _collector_for_a_run():
            self._run()

    def _run(self) -> None:
        world = self.world
        jobs = world.jobs
        total = len(jobs)
        i = 0
        heap = self.heap
        controller = self.controller
        min_wait = controller.min_wait_s
        last_arrival = jobs[-1].trace.submit_s if jobs else 0.0
        if jobs:
            self._next_sample = jobs[0].trace.submit_s
            if controller.periodic:
                self.start_ticking(jobs[0].trace.submit_s)
        steps = 0
        while True:
            t_arrival = jobs[i].trace.submit_s if i < total else INF
            t_event = heap[0][0] if heap else INF
            t_tick = self.next_tick if self.next_tick is not None else INF
            now = min(t_arrival, t_event, t_tick)
            if now == INF:
                break
            # Only ticks are left: stop once nothing has changed for a long while.
            if i >= total and not heap and (now - self.last_change > STALL_S
                                            or now - last_arrival > HORIZON_S):
                break
            self._advance(now)
            while i < total and jobs[i].trace.submit_s == now:
                job = jobs[i]
                i += 1
                world.arrive(job, now, eligible=min_wait <= 0)
                if 0 < min_wait < INF:
                    self.push(now + min_wait, ELIGIBLE, job)
                controller.on_arrival(job, now)
            while heap and heap[0][0] == now:
                _, _, kind, payload = heapq.heappop(heap)
                self._handle(kind, payload, now)
            self._dispatch(now)
            if self._wake_due or (self.next_tick is not None and self.next_tick <= now):
                if self.next_tick is not None and self.next_tick <= now:
                    self.counters.ticks += 1
                    self.next_tick = now + self.tick_s
                self._wake_due = False
                controller.act(now)
                self._dispatch(now)
            if controller.periodic and self.next_tick is None and not world.quiescent():
                self.start_ticking(now)
            steps += 1
            if self.progress is not None and steps % 512 == 0:
                self.progress((i + world.finished) / (2 * total or 1))
        self._finish_off()
        if self.progress is not None:
            self.progress(1.0)

    def _advance(self, now: float) -> None:
        if now > self.now:
            while self._next_sample <= now:
                t = self._next_sample
                cost = self._accrued + self._rate * (t - self.now) / 3600.0
                self.counters.samples.append(Sample(t, len(self.world.pending),
                                                    len(self.store.live_nodes()), cost))
                self._next_sample += self.sample_s
            self._accrued += self._rate * (now - self.now) / 3600.0
            self.now = now
        self.clock.t = now

    def _dispatch(self, now: float) -> None:
        world = self.world
        started = world.dispatch(now)
        due = world.backfill_due_at
        if due is not None and due != self._backfill_at:
            # Slurm's backfill pass was held back by bf_interval: come back for it (the
            # dispatch after the event's instant runs it).
            self._backfill_at = due
            self.push(max(due, now), BACKFILL, None)
        if started:
            self.last_change = now
            push = self.push
            for job in started:
                push(now + job.run_s, FINISH, (job, job.attempt))

    def _handle(self, kind: int, payload, now: float) -> None:
        if kind == FINISH:
            job, attempt = payload
            if self.world.finish(job, attempt, now):
                self.last_change = now
        elif kind == WAKE:
            self._wake_due = True
        elif kind == BACKFILL:
            self._backfill_at = None
        elif kind == ELIGIBLE:
            if self.world.make_eligible(payload):
                self.controller.on_eligible(payload, now)
        elif kind == BOOT:
            self._booted(payload, now)
        elif kind == INTERRUPT:
            self._interrupted(payload, now)
        elif kind == TIMEOUT:
            node = self.store.get_node(payload)
            if node is not None and node.state is NodeState.LAUNCHING:
                self.counters.boot_timeouts += 1
                self.execute([Terminate(node.id, ActionReason.BOOT_TIMEOUT)])

    # -- what the reconciler records in production ---------------------------------------------

    def _booted(self, node_id: str, now: float) -> None:
        node = self.store.get_node(node_id)
        if node is None or node.state is not NodeState.LAUNCHING:
            return
        moment = at(now)
        for target, reason in ((NodeState.BOOTING, "instance running"),
                               (NodeState.JOINING, "agent registered"),
                               (NodeState.READY, "joined the fabric")):
            new, event = transition(node, target, at=moment, reason=reason)
            if not self.store.save_transition(node, new, event):
                return
            node = new
        self.last_change = now
        if self.boot_learner is not None:
            launched = seconds(self.provider.timeline(node.instance_id).launched_at)
            self.boot_learner.booted(node.offering_key, now - launched, now / 3600.0)
        self.world.node_ready(node, now)

    def _interrupted(self, node_id: str, now: float) -> None:
        node = self.store.get_node(node_id)
        if node is None or node.state not in _ALIVE:
            return
        [instance] = self.provider.describe([node.instance_id])
        if instance.state.value != "terminated":
            return
        self.counters.interruptions += 1
        self._learn_end(node, now, interrupted=True)
        self._stop_billing(node_id, now)
        new, event = transition(node, NodeState.FAILED, at=at(now),
                                reason="instance vanished at the provider (spot interruption)")
        if self.store.save_transition(node, new, event):
            requeued = self.world.node_gone(new, at(now))
            self.execute([Terminate(node_id, ActionReason.FAILED)])
            if requeued:
                self.controller.on_requeue(now)

    # -- acting through the executor -------------------------------------------------------------

    def execute(self, actions: Iterable[Action]) -> ExecutionReport:
        report = self.executor.run(actions)
        self.settle(report)
        return report

    def settle(self, report: ExecutionReport) -> None:
        """After the executor: schedule what launched instances will do, and record terminations
        the provider confirmed (the sim provider terminates at once)."""
        now = self.now
        if report.launched or report.terminated or report.drained:
            self.last_change = now
        learner = self.learner
        if learner is not None:
            for key in report.capacity_errors:
                learner.launch(key, now / 3600.0, refused=True)
        for node_id in report.launched:
            node = self.store.get_node(node_id)
            if learner is not None:
                learner.launch(node.offering_key, now / 3600.0, refused=False)
            timeline = self.provider.timeline(node.instance_id)
            launched = seconds(timeline.launched_at)
            running = seconds(timeline.running_at)
            if learner is not None:
                learner.started(node.offering_key, node_id, launched / 3600.0)
            self.counters.launches += 1
            self._billing[node_id] = node.price_usd_hour
            self._rate += node.price_usd_hour
            if running - launched >= self.launch_limit_s:
                self.push(launched + self.launch_limit_s, TIMEOUT, node_id)
            self.push(running, BOOT, node_id)
            if timeline.interrupt_at is not None:
                self.push(seconds(timeline.interrupt_at), INTERRUPT, node_id)
        for node_id in report.terminated:
            node = self.store.get_node(node_id)
            if node is None or node.state is not NodeState.TERMINATING:
                continue
            [instance] = self.provider.describe([node.instance_id])
            if instance.state.value != "terminated":
                continue
            self._learn_end(node, now, interrupted=False)
            self._stop_billing(node_id, now)
            new, event = transition(node, NodeState.TERMINATED, at=at(now),
                                    reason="provider confirms the instance is gone")
            self.store.save_transition(node, new, event)
            self.counters.terminations += 1
        live = len(self.store.live_nodes())
        self.counters.peak_nodes = max(self.counters.peak_nodes, live)

    def _learn_end(self, node, now: float, interrupted: bool) -> None:
        if self.learner is not None and node.id in self._billing:
            launched = seconds(self.provider.timeline(node.instance_id).launched_at)
            self.learner.ran(node.offering_key, (now - launched) / 3600.0, now / 3600.0,
                             interrupted, node.id)

    def _stop_billing(self, node_id: str, now: float) -> None:
        price = self._billing.pop(node_id, None)
        if price is not None:
            self._rate -= price
            if not self._billing:
                self._rate = 0.0  # no float residue once nothing is billed

    def _finish_off(self) -> None:
        """End of the run: nodes still alive (e.g. ``min_nodes``) are terminated now."""
        leftovers = [Terminate(n.id, ActionReason.OPERATOR) for n in self.store.live_nodes()
                     if n.state is not NodeState.TERMINATING]
        if leftovers:
            self.execute(leftovers)
        self._advance(self.now)

    # -- for metrics -----------------------------------------------------------------------------

    def unfinished(self) -> list[SimJob]:
        return [j for j in self.world.jobs if j.state != DONE]

    def pending_count(self) -> int:
        return sum(1 for j in self.world.jobs if j.state == PENDING)
