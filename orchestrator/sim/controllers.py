"""Who decides about burst nodes in a run: a policy (through the production planner) or a
baseline whose rule is pinned in ``docs/simulator.md``.

* :class:`PolicyController` runs the production tick at every tick of virtual time: a Snapshot
  built as :mod:`orchestrator.observe` builds it, ``plan()`` with the policy as the user wrote it
  (offerings relabelled to the sim provider), the production executor, and a re-plan within the
  tick after a capacity error, as :mod:`orchestrator.loop` does. The planner's memory is carried
  from tick to tick through the (in-memory) store, as in production. No decision is made here.
  Ticks whose plan is known are not planned: those the simulator proves idle or held
  (:mod:`orchestrator.sim.idletick`), and those before the last plan's ``holds_until`` (the
  planner's own statement, :mod:`orchestrator.planner.horizon`) while nothing changed since
  (no job arrived, started or ended, no node changed): such a tick counts as that plan's rule
  and limits held back by (``slept_ticks``).
* :class:`NeverController` (``never``): on-prem only.
* :class:`GreedyController` (``greedy``, what pending-pod autoscalers do): a job still pending 30 s
  after arrival goes to an idle cloud node that fits it, else new nodes are launched for it; small
  jobs share a node up to its GPU count, a job larger than a node takes whole nodes; a node is
  removed after 10 idle minutes.
* :class:`ThresholdController` (``threshold``): bursts when pending GPUs minus free on-prem GPUs
  exceed N, launching nodes for every pending job that burst capacity cannot hold; same
  scale-down as greedy.

Baselines launch the cheapest offering per GPU-hour among the policy's (the reference policy's)
usable offerings, through the same executor and sim provider as the policy runs: same boot
times, billing, capacity errors and interruptions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from time import perf_counter

from orchestrator.domain.nodes import NodeState
from orchestrator.domain.offerings import Offering
from orchestrator.domain.plan import ActionReason, Hold, Launch, Rule, Terminate
from orchestrator.domain.snapshot import PolicyMemory, Snapshot
from orchestrator.planner import plan as make_plan
from orchestrator.planner.admission import Admission, held_gpus
from orchestrator.planner.budgets import BudgetBook
from orchestrator.planner.horizon import FOREVER
from orchestrator.planner.offerings import resolve_candidates
from orchestrator.planner.placement import spans_nodes
from orchestrator.policy.models import Policy
from orchestrator.sim.burstpool import Spread
from orchestrator.sim.idletick import IdleMode, IdleTicks
from orchestrator.sim.pool import GpuPool
from orchestrator.sim.spend import SpendMeter
from orchestrator.sim.world import SimJob, at, seconds

MAX_REPLANS = 2  # re-plans within one tick after capacity errors, as orchestrator.loop.MAX_REPLANS
GREEDY_WAIT_S = 30.0
IDLE_S = 600.0
RETRY_S = 60.0  # a baseline whose launches all failed tries again this much later
DEFAULT_THRESHOLD = 64


HOLDS_STEP_S = 60.0  # holds_until is claimed for re-plans a whole number of minutes later


@dataclass(frozen=True, slots=True)
class _Holds:
    """The last plan's ``holds_until``, and what a tick skipped before it counts as."""

    state: tuple  # what only events change (IdleTicks.state) right after that plan
    until_s: float  # holds_until on the virtual clock (inf: FOREVER)
    planned_s: float  # when that plan was made
    rule: str
    held_back: tuple[str, ...]
    staging_held: frozenset[str]
    spare_kept: frozenset[str] = frozenset()  # trigger.spare_room: the jobs that plan kept


class Controller:
    """The interface the engine drives; the hooks default to doing nothing."""

    name = "controller"
    kind = "baseline"
    periodic = False  # True: act at every tick of virtual time
    min_wait_s = 0.0  # a job may run on burst nodes only after pending this long

    def bind(self, engine) -> None:
        self.engine = engine

    def act(self, now: float) -> None:
        return None

    def on_arrival(self, job: SimJob, now: float) -> None:
        return None

    def on_eligible(self, job: SimJob, now: float) -> None:
        return None

    def on_idle(self, node_id: str, now: float) -> None:
        return None

    def on_requeue(self, now: float) -> None:
        return None


class PolicyController(Controller):
    """The production planner at every tick (see the module docstring)."""

    kind = "policy"
    periodic = True

    def __init__(self, policy: Policy, name: str, *, sleep_when_idle: bool = True,
                 idle_ticks: IdleMode = IdleMode.SKIP):
        self.policy = policy
        self.name = name
        self.sleep_when_idle = sleep_when_idle  # False: plan every tick even in an empty world
        self.idle_mode = IdleMode(idle_ticks)  # ticks plan() provably does nothing at (idletick)
        self._quiet = False
        self._holds: _Holds | None = None  # the last plan's holds_until, while it may be used
        self._held: tuple = (None, {})  # (nodes and runs version, burst GPUs per project)

    def bind(self, engine) -> None:
        super().bind(engine)
        self.catalogue = tuple(engine.provider.offerings())
        # What the snapshot's offering health covers: the policy's offerings as it resolves
        # them (a pinned zone is part of the key).
        usable, _ = resolve_candidates(self.policy, self.catalogue, (), at(0))
        self.keys = tuple(c.key for c in usable)
        self.meter = SpendMeter(self.policy, engine.store, engine.world)
        # What one job may use of the burst nodes is what the policy's fabric can run: one node
        # (the built-in queue's dispatcher), or whole nodes of one offering (Slurm, torch elastic:
        # the planner launches a wide job's nodes as one launch group of one offering).
        engine.world.burst.spread = (Spread.ONE_OFFERING if spans_nodes(self.policy)
                                     else Spread.ONE_NODE)
        if getattr(self.policy, "budgets", ()) or any(
                p.max_burst_gpus is not None for p in self.policy.projects):
            engine.world.admission = self.admission
        self.idle = IdleTicks(self.policy, engine)
        # trigger.spare_room: the world's burst dispatch keeps the kept jobs off spare room
        # (orchestrator.sim.sparefill), as this controller's plans list them
        engine.world.spare_on = self.policy.trigger.spare_room.enabled

    def holding(self, now: float) -> _Holds | None:
        """The last plan's statement, if it covers ``now`` and nothing changed since."""
        holds = self._holds
        if (holds is None or now >= holds.until_s
                or (now - holds.planned_s) % HOLDS_STEP_S != 0.0
                or holds.state != self.idle.state()):
            return None
        return holds

    def snapshot(self, now: float) -> Snapshot:
        engine = self.engine
        moment = at(now)
        store = engine.store
        return Snapshot(
            taken_at=moment,
            queues={self.policy.pool.name: engine.world.queue()},
            nodes=store.live_nodes(),
            offerings=self.catalogue,
            capacity_blocks=tuple(store.capacity_blocks(moment)) if store.has_blocks(moment) else (),
            memory=store.load_memory(),
            budget_spend=self.meter.observe(moment),
            burst_runs=engine.world.running_on_burst(),
            offering_health=(engine.learner.view(self.keys, now / 3600.0)
                             if engine.learner is not None else {}),
            boot_estimates=(engine.boot_learner.snapshot(engine.boot_learner.keys(), now / 3600.0)
                            if engine.boot_learner is not None else {}),
        )

    def admission(self, now: float) -> Admission:
        """What the dispatcher checks a start on a burst node against (the built-in queue's
        rule): the policy's budgets now, from the metered spend, the nodes and the runs."""
        moment = at(now)
        engine = self.engine
        nodes = engine.store.live_nodes()
        runs = engine.world.running_on_burst()
        book = None
        if self.policy.budgets:
            snapshot = Snapshot(taken_at=moment, nodes=nodes,
                                budget_spend=self.meter.observe(moment), burst_runs=runs)
            book = BudgetBook.build(self.policy, snapshot, moment)
        # What each project holds moves only with the nodes and the runs (Admission copies it).
        key = (engine.store.version, engine.world.changes)
        if self._held[0] != key:
            self._held = (key, held_gpus(nodes, runs))
        return Admission(self.policy, book, moment, self._held[1])

    def act(self, now: float) -> None:
        engine = self.engine
        quiet = engine.world.quiescent()
        if quiet and self._quiet:
            # Nothing pending, no node, and the last plan of this same empty world did nothing:
            # plan() is a pure function of it, so it would do nothing again. Sleep until work comes.
            engine.next_tick = None
            return
        name = self.policy.name
        idle = self.idle_mode is not IdleMode.PLAN and self.idle.holds(now)
        if idle and self.idle_mode is IdleMode.SKIP:
            # plan() would record a no-demand decision and change nothing (idletick).
            engine.counters.idle_ticks += 1
            engine.store.count_decision(str(Rule.NO_DEMAND))
            engine.world.staging_held = frozenset()
            self._quiet = self.sleep_when_idle and quiet  # (as after a plan that did nothing)
            if self._quiet:
                engine.next_tick = None
            return
        holds = (None if idle or self.idle_mode is IdleMode.PLAN else self.holding(now))
        if holds is not None and self.idle_mode is IdleMode.SKIP:
            # The last plan said its answer holds until later, and nothing changed since.
            engine.counters.slept_ticks += 1
            engine.store.count_decision(holds.rule, holds.held_back)
            engine.world.staging_held = holds.staging_held
            return
        held = (not idle and holds is None and self.idle_mode is not IdleMode.PLAN
                and self.idle.held(now))
        if held and self.idle_mode is IdleMode.SKIP:
            # plan() would only hold again, as at the last plan (idletick's second rule).
            engine.counters.held_ticks += 1
            engine.world.staging_held = frozenset()
            return
        before = engine.store.load_memory().get(name)
        acted = False
        for _ in range(1 + MAX_REPLANS):
            snapshot = self.snapshot(now)
            began = perf_counter()
            plan = make_plan(snapshot, [self.policy], snapshot.taken_at)
            engine.counters.plan_wall_s += perf_counter() - began
            engine.counters.plans += 1
            engine.world.staging_held = _staging_held(plan)
            engine.world.keep_spare(_spare_kept(plan), now)
            report = engine.executor.execute(plan)
            engine.settle(report)
            acted = acted or any(not isinstance(a, Hold) for a in plan.actions)
            if idle or held:  # IdleMode.CHECK: the rule said this plan does nothing
                _check_idle(plan, before, now, held)
            if holds is not None:  # IdleMode.CHECK: the last plan said this one is the same
                _check_holds(plan, before, now, holds)
            if not report.capacity_errors:
                break
            if not report.launched:
                # As the loop does: failed launches must not start the scale-up cooldown.
                previous = snapshot.memory.get(name)
                engine.store.save_memory(name, replace(
                    plan.memory[name], last_launch_at=previous.last_launch_at if previous else None))
        after = engine.store.load_memory().get(name) or PolicyMemory()
        self.idle.planned(plan, before, after)
        if holds is None:  # (a checked tick keeps the statement the skip would have used)
            self._holds = self._statement(plan, report, now)
        self._quiet = (self.sleep_when_idle and quiet and not acted
                       and after == (before or PolicyMemory()))
        if self._quiet:
            engine.next_tick = None


    def _statement(self, plan, report, now: float) -> _Holds | None:
        """The plan's holds_until as the ticks after it may use it (None: plan them)."""
        [decision] = plan.decisions
        until = decision.holds_until
        engine = self.engine
        # The statement is about the same snapshot: learned capacity and boot times (their
        # views decay with the clock) and budgets (spend grows with it) change the snapshot
        # without an event, so their runs plan every tick.
        if (until is None or report.capacity_errors or engine.learner is not None
                or engine.boot_learner is not None or self.policy.budgets):
            return None
        return _Holds(self.idle.state(), math.inf if until == FOREVER else seconds(until), now,
                      str(decision.rule), tuple(decision.held_back_by),
                      self.engine.world.staging_held, self.engine.world.spare_kept)


class NeverController(Controller):
    """``never``: on-prem only."""

    name = "never"


class _Bursting(Controller):
    """What greedy and threshold share: the offering, packing, and 10-idle-minute scale-down."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._launched = 0

    def offering(self, now: float) -> Offering | None:
        """The cheapest usable offering per GPU-hour (capacity-blocked ones are skipped)."""
        store = self.engine.store
        moment = at(now)
        candidates, _ = resolve_candidates(self.policy, tuple(self.engine.provider.offerings()),
                                           tuple(store.capacity_blocks(moment)), moment)
        if not candidates:
            return None
        return min((c.offering for c in candidates),
                   key=lambda o: (o.price_per_gpu_hour, o.price_usd_hour, o.key))

    def on_idle(self, node_id: str, now: float) -> None:
        self.engine.wake(now + IDLE_S)

    def on_requeue(self, now: float) -> None:
        self.engine.wake(now)

    def scale_down(self, now: float) -> list:
        actions = []
        for node in self.engine.store.live_nodes():
            if (node.state is NodeState.READY and node.running_jobs == 0
                    and node.idle_since is not None
                    and now - seconds(node.idle_since) >= IDLE_S - 1e-6):
                actions.append(Terminate(node.id, ActionReason.IDLE))
        return actions

    def scale_up(self, jobs: list[SimJob], now: float) -> list:
        """Launches for the jobs that burst nodes in flight cannot hold: small jobs share a node
        up to its GPU count (first fit, in the order given), a wider job takes whole nodes."""
        if not jobs:
            return []
        offering = self.offering(now)
        if offering is None:
            self.engine.wake(now + RETRY_S)
            return []
        bins = GpuPool()
        for index, node in enumerate(self.engine.store.live_nodes()):
            if node.state.in_flight:
                bins.add_node(index, node.gpus)
        projects: list[str] = []  # the project whose job each new node is launched for
        base = 1 << 30
        for job in jobs:
            while not bins.fits(job.gpus):
                bins.add_node(base + len(projects), offering.gpus)
                projects.append(job.domain.project)
                if job.gpus > offering.gpus and bins.max_size > offering.gpus:
                    break  # in-flight nodes larger than ours: whole nodes of ours never fit it
            bins.place(job.gpus)
        launches = []
        for project in projects:
            self._launched += 1
            node_id = f"{self.name}-{self._launched:07d}"
            launches.append(Launch(policy=self.policy.name, pool=self.policy.pool.name,
                                   node_id=node_id, request_id=f"r-{node_id}", offering=offering,
                                   reason=ActionReason.DEMAND, project=project))
        return launches

    def run(self, actions: list, now: float) -> None:
        if not actions:
            return
        report = self.engine.execute(actions)
        if report.capacity_errors:
            self.engine.wake(now)  # the next offering, in the same instant (as a re-plan)


class GreedyController(_Bursting):
    """``greedy`` (see the module docstring)."""

    name = "greedy"
    min_wait_s = GREEDY_WAIT_S

    def on_eligible(self, job: SimJob, now: float) -> None:
        self.engine.wake(now)

    def act(self, now: float) -> None:
        world = self.engine.world
        waiting = sorted((j for j in world.pending.values() if j.eligible), key=lambda j: j.index)
        self.run(self.scale_down(now) + self.scale_up(waiting, now), now)


class ThresholdController(_Bursting):
    """``threshold`` (see the module docstring)."""

    name = "threshold"

    def __init__(self, policy: Policy, threshold: int = DEFAULT_THRESHOLD):
        super().__init__(policy)
        self.threshold = threshold

    def on_arrival(self, job: SimJob, now: float) -> None:
        self.engine.wake(now)

    def act(self, now: float) -> None:
        world = self.engine.world
        actions = self.scale_down(now)
        if world.pending_gpus - world.onprem.free_total > self.threshold:
            waiting = sorted(world.pending.values(), key=lambda j: j.key)
            actions += self.scale_up(waiting, now)
        self.run(actions, now)


def _check_idle(plan, before: PolicyMemory | None, now: float, held: bool = False) -> None:
    [decision] = plan.decisions
    memory = next(iter(plan.memory.values()))
    if held:  # only Holds, whatever the rule
        wrong = any(not isinstance(a, Hold) for a in plan.actions)
    else:
        wrong = bool(plan.actions) or decision.rule is not Rule.NO_DEMAND
    if wrong or memory != (before or PolicyMemory()):
        raise AssertionError(f"at {now:.0f} s the idle-tick rule skipped a plan that does "
                             f"something: {decision.rule}: {decision.summary}; "
                             f"{len(plan.actions)} action(s); memory {before} -> {memory}")


def _check_holds(plan, before: PolicyMemory | None, now: float, holds: _Holds) -> None:
    [decision] = plan.decisions
    memory = next(iter(plan.memory.values()))
    acts = [a for a in plan.actions if not isinstance(a, Hold)]
    if (acts or memory != (before or PolicyMemory()) or str(decision.rule) != holds.rule
            or tuple(decision.held_back_by) != holds.held_back
            or _spare_kept(plan) != holds.spare_kept):
        raise AssertionError(
            f"at {now:.0f} s, before the holds_until ({holds.until_s:.0f} s) of the plan at "
            f"{holds.planned_s:.0f} s ({holds.rule}, held back by {holds.held_back}), the plan "
            f"differs: {decision.rule}: {decision.summary}; {len(acts)} action(s), held back by "
            f"{decision.held_back_by}; memory {before} -> {memory}")


def _spare_kept(plan) -> frozenset[str]:
    """Jobs the decision keeps for on-prem under ``trigger.spare_room``: the world's burst
    dispatcher starts them only where they lengthen a node's bill by little (sim.sparefill)."""
    kept: set[str] = set()
    for decision in plan.decisions:
        spare = (decision.inputs.get("wait_aware") or {}).get("spare_room") or {}
        kept.update(spare.get("kept") or ())
    return frozenset(kept)


def _staging_held(plan) -> frozenset[str]:
    """Jobs the decision keeps off burst nodes because staging their data would outlast their
    on-prem wait: the world's dispatcher leaves them for on-prem, as the decision says."""
    held: set[str] = set()
    for decision in plan.decisions:
        jobs = (decision.inputs.get("staging") or {}).get("jobs") or {}
        held.update(job for job, row in jobs.items() if not row.get("burst", True))
    return frozenset(held)

