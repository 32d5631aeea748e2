"""Hypothesis properties of budgets, quotas and fair share (docs/budgets.md).

(a) One tick, any snapshot: whenever the planner launches in a budget's scope, spent + what live
    nodes still owe + this tick's commitments stay within the limit (and the hourly burn within
    its cap, and the grade in force is obeyed); no project's burst GPUs pass its quota.
(b) A history: jobs arrive, the planner plans each tick, its launches become nodes that boot and
    run the jobs they were launched for for their stated duration, idle, are drained and go.
    Nodes cost price x time from launch to termination, and the cost lands in the budgets of
    their scope. No budget's window ever ends (or is at any tick) over its limit.
    The world is "exclusive": a node runs only the work it was launched for, and shows no free
    GPUs to other work. That is the model a commitment is sized for; work a node picks up beyond
    it (a real dispatcher may put any job on free GPUs) is past its commitment, shows up in the
    spend, and the grades (no-new-launches, drain) act on it -- outside what (b) claims.
(c) Fair share: when a pool limit held a launch back, no project of equal priority that got a
    node this tick holds more than one node's GPUs (per weight) above another that still has
    unmet, launchable work.

Example counts are bounded (BURST_PROPERTY_EXAMPLES scales them) so the file runs in seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.domain import BudgetSpend, Drain, Job, Launch, Node, NodeState, Plan, Terminate
from orchestrator.planner import plan
from orchestrator.planner.budgets import window_bounds
from orchestrator.policy import Market, Policy
from orchestrator.policy.models import Budget, BudgetAction
from tests.builders import (
    POLICY,
    T0,
    make_job,
    make_node,
    make_offering,
    make_policy,
    make_snapshot,
    offering_spec,
)

S = NodeState
D = Decimal
# The counts below are per 150 BURST_PROPERTY_EXAMPLES; the default run takes 60 (0.4 of them).
SCALE = int(os.environ.get("BURST_PROPERTY_EXAMPLES", "60")) / 150


def _settings(examples: int) -> settings:
    return settings(max_examples=max(int(examples * SCALE), 5), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def usd(x: float | Decimal) -> Decimal:
    return x if isinstance(x, Decimal) else D(repr(float(x)))


def owed(node: Node, now: datetime) -> Decimal:
    """Independent reading of a live node's outstanding commitment: commitment minus price x time
    since it was created (nothing for a requested node), never below 0."""
    if node.state is S.TERMINATED:
        return D(0)
    hours = D(0) if node.state is S.REQUESTED else usd((now - node.created_at).total_seconds()) / 3600
    return max(usd(node.budget_commit_usd) - usd(node.price_usd_hour) * hours, D(0))


def scoped(budget: Budget, pool: str, project: str | None, node_pool: str) -> bool:
    return node_pool == pool and (budget.project is None or budget.project == project)


def grade(budget: Budget, used: Decimal) -> BudgetAction | None:
    if budget.limit_usd == 0:
        percent = D(0) if used <= 0 else D("Infinity")
    else:
        percent = used * 100 / budget.limit_usd
    found = None
    for g in budget.grades:
        at = usd(g.at_percent)
        if (percent > at) if g.action is BudgetAction.DRAIN else (percent >= at):
            found = g.action
    return found


# -- (a) one tick --------------------------------------------------------------------------------

PROJECTS = ("a", "b", "c")


@st.composite
def budget_specs(draw, *, min_limit: int = 0) -> list[dict]:
    out = []
    for name, project in (("pool", None), ("a-budget", "a"), ("b-budget", "b")):
        if not draw(st.booleans()):
            continue
        spec: dict = {"name": name, "limit_usd": draw(st.integers(min_limit, 120))}
        if project is not None:
            spec["project"] = project
        if draw(st.booleans()):
            spec["max_hourly_burn_usd"] = draw(st.sampled_from([10, 25, 40]))
        if draw(st.booleans()):
            spec["grades"] = draw(st.sampled_from([
                [], [{"at_percent": 50, "action": "spot-only"}],
                [{"at_percent": 60, "action": "warn"}, {"at_percent": 70, "action": "no-new-launches"},
                 {"at_percent": 70, "action": "drain"}],
            ]))
        out.append(spec)
    return out


@st.composite
def ticks(draw):
    """A policy with budgets, quotas and limits, and a snapshot of one tick."""
    offerings = [offering_spec("od", gpus=8, price=10)]
    if draw(st.booleans()):
        offerings.append(offering_spec("sp", gpus=8, price=draw(st.sampled_from([6, 12])),
                                       market="spot"))
    projects = [{"name": p, "priority": draw(st.integers(0, 1)),
                 "max_burst_gpus": draw(st.sampled_from([None, 8, 24]))}
                for p in PROJECTS if draw(st.booleans())]
    policy = make_policy(
        offerings=offerings, projects=projects, budgets=draw(budget_specs()),
        limits={"max_nodes": draw(st.integers(1, 8)), "max_concurrent_launches": draw(st.integers(1, 6))},
        budget_commitment={"default_runtime": draw(st.sampled_from(["30m", "1h"]))},
        cooldowns={"scale_down": draw(st.sampled_from(["0s", "5m"]))},
    )
    jobs = [make_job(f"j{i}", gpus=draw(st.integers(1, 16)), project=draw(st.sampled_from(PROJECTS)),
                     submitted_at=T0 - timedelta(minutes=20) + timedelta(seconds=i),
                     duration_s=draw(st.sampled_from([None, 600.0, 3600.0, 4 * 3600.0])))
            for i in range(draw(st.integers(0, 8)))]
    nodes = []
    for i in range(draw(st.integers(0, 4))):
        market = draw(st.sampled_from([Market.ON_DEMAND, Market.SPOT]))
        offering = make_offering("od" if market is Market.ON_DEMAND else "sp", gpus=8,
                                 price=10 if market is Market.ON_DEMAND else 6, market=market)
        state = draw(st.sampled_from([S.REQUESTED, S.BOOTING, S.READY, S.READY, S.DRAINING]))
        busy = draw(st.sampled_from([0, 8]))
        nodes.append(make_node(
            f"n{i}", state=state, offering=offering, project=draw(st.sampled_from(PROJECTS + (None,))),
            created_at=T0 - timedelta(minutes=draw(st.integers(0, 180))),
            gpus_busy=busy if state is S.READY else 0, running_jobs=1 if busy else 0,
            idle_since=None if busy else T0 - timedelta(minutes=5),
            budget_commit_usd=draw(st.sampled_from([0.0, 5.5, 13.333334, 40.0]))))
    spend = {}
    for b in policy.budgets:
        if draw(st.booleans()):
            start, end = window_bounds(b, T0)
            spend[f"{POLICY}/{b.name}"] = BudgetSpend(D(draw(st.integers(0, 130))), D(0), start, end)
    return policy, make_snapshot(jobs, nodes=nodes, budget_spend=spend)


@_settings(120)
@given(ticks())
def test_launches_never_commit_past_a_budget_or_quota(case) -> None:
    policy, snapshot = case
    result = plan(snapshot, [policy], T0)
    launches = result.launches
    live = [n for n in snapshot.nodes if n.state.counts_toward_limits]
    for budget in policy.budgets:
        mine = [lc for lc in launches if scoped(budget, lc.pool, lc.project, lc.pool)]
        if not mine:
            continue
        nodes = [n for n in live if scoped(budget, policy.pool.name, n.project, n.pool)]
        seen = snapshot.budget_spend.get(f"{POLICY}/{budget.name}")
        spent = seen.spent_usd if seen is not None else D(0)
        before = spent + sum((owed(n, T0) for n in nodes), D(0))
        after = before + sum((usd(lc.budget_commit_usd) for lc in mine), D(0))
        assert after <= budget.limit_usd, (budget.name, before, after, result.decisions[0].summary)
        if budget.max_hourly_burn_usd is not None:
            burn = sum((usd(n.price_usd_hour) for n in nodes), D(0)) + sum(
                (usd(lc.offering.price_usd_hour) for lc in mine), D(0))
            assert burn <= budget.max_hourly_burn_usd
        action = grade(budget, before)
        assert action not in (BudgetAction.NO_NEW_LAUNCHES, BudgetAction.DRAIN), budget.name
        if action is BudgetAction.SPOT_ONLY:
            assert all(lc.offering.market is Market.SPOT for lc in mine)
        assert grade(budget, after) is not BudgetAction.DRAIN  # launches never cause a drain
    for project in policy.projects:
        if project.max_burst_gpus is not None:
            held = sum(n.gpus for n in live if n.project == project.name)
            new = sum(lc.offering.gpus for lc in launches if lc.project == project.name)
            assert new == 0 or held + new <= project.max_burst_gpus
    for lc in launches:  # every launch commits at least its node's minimum billing
        assert lc.budget_commit_usd >= lc.offering.price_usd_hour * 60 / 3600


# -- (b) a history -------------------------------------------------------------------------------

TICK = timedelta(minutes=1)


@dataclass
class History:
    """The exclusive world of the module docstring, on a virtual clock."""

    policy: Policy
    arrivals: list[tuple[int, Job]]  # (tick, job)
    boot_ticks: int
    now: datetime = T0
    tick: int = 0
    pending: dict[str, Job] = field(default_factory=dict)
    nodes: dict[str, Node] = field(default_factory=dict)
    ready_at: dict[str, int] = field(default_factory=dict)
    launched_for: dict[str, tuple[str, ...]] = field(default_factory=dict)
    running: dict[str, dict[str, datetime]] = field(default_factory=dict)  # node -> job -> end
    started: set[str] = field(default_factory=set)
    lives: dict[str, list] = field(default_factory=dict)  # node -> [price, project, start, end]
    memory: dict = field(default_factory=dict)
    plans: list[Plan] = field(default_factory=list)

    def runtime(self, job: Job) -> timedelta:
        if job.duration_s:
            return timedelta(seconds=job.duration_s)
        return self.policy.budget_commitment.default_runtime

    def spent(self, budget: Budget, start: datetime, end: datetime) -> Decimal:
        """What the budget's scope cost in [start, min(end, now)): price x time of each node."""
        total = D(0)
        stop = min(end, self.now)
        for node_id, (price, project, born, died) in self.lives.items():
            if not scoped(budget, self.policy.pool.name, project, self.policy.pool.name):
                continue
            lo, hi = max(born, start), min(died or stop, stop)
            if hi > lo:
                total += usd(price) * usd((hi - lo).total_seconds()) / 3600
        return total

    def snapshot(self):
        spend = {}
        for b in self.policy.budgets:
            start, end = window_bounds(b, self.now)
            spend[f"{POLICY}/{b.name}"] = BudgetSpend(self.spent(b, start, end), D(0), start, end)
        nodes = []
        for node in self.nodes.values():
            if node.state is S.READY:  # exclusive: no free GPUs for work it was not launched for
                node = replace(node, gpus_busy=node.gpus)
            nodes.append(node)
        return make_snapshot(list(self.pending.values()), nodes=nodes, taken_at=self.now,
                             memory=self.memory, budget_spend=spend)

    def step(self) -> Plan:
        for tick, job in self.arrivals:
            if tick == self.tick:
                self.pending[job.id] = job
        self._finish_jobs()
        result = plan(self.snapshot(), [self.policy], self.now)
        self.plans.append(result)
        self._apply(result)
        return result

    def _finish_jobs(self) -> None:
        for node_id, jobs in self.running.items():
            done = [j for j, end in jobs.items() if end <= self.now]
            if not done:
                continue
            last = max(jobs[j] for j in done)
            for j in done:
                del jobs[j]
            node = self.nodes[node_id]
            self.nodes[node_id] = replace(node, running_jobs=len(jobs),
                                          idle_since=None if jobs else last)

    def _apply(self, result: Plan) -> None:
        for action in result.actions:
            if isinstance(action, Launch):
                node = make_node(action.node_id, state=S.BOOTING, offering=action.offering,
                                 project=action.project, state_since=self.now, created_at=self.now,
                                 request_id=action.request_id,
                                 budget_commit_usd=action.budget_commit_usd)
                self.nodes[node.id] = node
                self.ready_at[node.id] = self.tick + self.boot_ticks
                self.launched_for[node.id] = action.jobs
                self.lives[node.id] = [node.price_usd_hour, node.project, self.now, None]
            elif isinstance(action, Drain):
                node = self.nodes[action.node_id]
                self.nodes[node.id] = replace(node, state=S.DRAINING, state_since=self.now,
                                              drain_deadline=action.deadline)
            elif isinstance(action, Terminate):
                self.nodes.pop(action.node_id)
                self.lives[action.node_id][3] = self.now
                for job_id in self.running.pop(action.node_id, {}):
                    self.started.discard(job_id)  # cut off at a drain deadline: requeued
        self.memory = dict(result.memory)
        self.tick += 1
        self.now += TICK
        for node_id, node in list(self.nodes.items()):
            if node.state is S.BOOTING and self.ready_at[node_id] <= self.tick:
                runs = {}
                for job_id in self.launched_for[node_id]:
                    job = self.pending.pop(job_id, None)
                    if job is not None:
                        runs[job_id] = self.now + self.runtime(job)
                        self.started.add(job_id)
                self.running[node_id] = runs
                self.nodes[node_id] = replace(
                    node, state=S.READY, state_since=self.now, running_jobs=len(runs),
                    idle_since=None if runs else self.now)
            elif node.state is S.DRAINING and not self.running.get(node_id):
                self.nodes[node_id] = replace(node, released=True)  # the fabric let it go

    def quiet(self) -> bool:
        """No node left and nothing launched for a while after the last arrival: what is still
        pending is held back for good (the budget is spent for this window)."""
        last = max((t for t, _ in self.arrivals), default=0)
        return (not self.nodes and self.tick > last + 5
                and not any(p.launches for p in self.plans[-5:]))

    def check_budgets(self) -> None:
        for b in self.policy.budgets:
            start, end = window_bounds(b, self.now)
            used = self.spent(b, start, end)
            assert used <= b.limit_usd, (b.name, used, self._log())
            previous = window_bounds(b, start - timedelta(seconds=1))  # the window just ended
            assert self.spent(b, *previous) <= b.limit_usd, (b.name, self._log())

    def _log(self) -> str:
        return "\n".join(f"t{i}: {p.decisions[0].rule}: {p.decisions[0].summary}"
                         for i, p in enumerate(self.plans[-15:]))


@st.composite
def histories(draw) -> History:
    offerings = [offering_spec("od", gpus=8, price=10)]
    if draw(st.booleans()):
        offerings.append(offering_spec("sp", gpus=8, price=6, market="spot"))
    budgets = []
    window = draw(st.sampled_from(["month", "custom"]))
    extra = ({"window": "custom", "period": "1h", "starts": "2025-03-01T11:00:00Z"}
             if window == "custom" else {})
    budgets.append({"name": "a-budget", "project": "a", "limit_usd": draw(st.integers(3, 30)),
                    **extra})
    if draw(st.booleans()):
        budgets.append({"name": "pool", "limit_usd": draw(st.integers(5, 60)), **extra,
                        **({"max_hourly_burn_usd": 30} if draw(st.booleans()) else {})})
    if draw(st.booleans()):
        budgets.append({"name": "b-budget", "project": "b", "limit_usd": draw(st.integers(3, 40)),
                        "grades": [{"at_percent": 50, "action": "spot-only"}]})
    policy = make_policy(
        offerings=offerings, budgets=budgets,
        projects=[{"name": "a"}, {"name": "b", "weight": draw(st.sampled_from([1, 2]))}],
        limits={"max_nodes": draw(st.integers(1, 6)), "max_concurrent_launches": draw(st.integers(1, 4))},
        scale_down={"idle_for": draw(st.sampled_from(["1m", "3m"])), "drain_grace": "2m"},
        cooldowns={"scale_up": draw(st.sampled_from(["0s", "2m"])),
                   "scale_down": draw(st.sampled_from(["0s", "2m"]))},
        trigger={"sustained_for": draw(st.sampled_from(["0s", "1m"]))},
        # A tight overhead: in this world a node boots in at most 3 ticks, and idle detection,
        # drain and termination take 2 more, so 5 minutes is what it costs beyond its work.
        budget_commitment={"default_runtime": "20m", "overhead": "5m"},
    )
    specs = draw(st.lists(st.tuples(
        st.integers(0, 20), st.integers(1, 16), st.sampled_from(["a", "a", "b"]),
        st.sampled_from([None, 120.0, 600.0, 1500.0, 2400.0])), min_size=2, max_size=10))
    arrivals = [(tick, make_job(f"j{i}", gpus=gpus, project=project, duration_s=duration,
                                submitted_at=T0 + tick * TICK))
                for i, (tick, gpus, project, duration) in enumerate(specs)]
    return History(policy=policy, arrivals=arrivals, boot_ticks=draw(st.integers(0, 3)))


@_settings(60)
@given(histories())
def test_a_history_never_ends_over_budget(history: History) -> None:
    for _ in range(150):
        history.step()
        history.check_budgets()
        if history.quiet():
            break
    history.check_budgets()


# -- (c) fair share ------------------------------------------------------------------------------

@st.composite
def contests(draw):
    """Whole-node jobs of equal-priority projects competing for a pool limit."""
    size = 8
    projects = [{"name": p, "weight": draw(st.sampled_from([1, 1, 2, 3])),
                 "max_burst_gpus": draw(st.sampled_from([None, None, 16]))} for p in PROJECTS]
    offerings = [offering_spec("od", gpus=size, price=10)]
    if draw(st.booleans()):
        offerings = [offering_spec("od", gpus=size, price=10, max_nodes=draw(st.integers(0, 2))),
                     offering_spec("od2", gpus=size, price=12)]
    limits = {"max_nodes": draw(st.integers(1, 9)), "max_concurrent_launches": draw(st.integers(1, 9))}
    if draw(st.booleans()):
        limits["max_burst_gpus"] = draw(st.sampled_from([16, 32, 48]))
    policy = make_policy(offerings=offerings, projects=projects, limits=limits)
    jobs = [make_job(f"j{i}", gpus=size, project=draw(st.sampled_from(PROJECTS)),
                     submitted_at=T0 - timedelta(minutes=30) + timedelta(seconds=draw(st.integers(0, 900))),
                     priority=draw(st.sampled_from([0, 0, 1])))
            for i in range(draw(st.integers(2, 12)))]
    held = [make_node(f"h{i}", project=draw(st.sampled_from(PROJECTS)), gpus_busy=size, running_jobs=1)
            for i in range(draw(st.integers(0, 3)))]
    return policy, jobs, held, size


@_settings(150)
@given(contests())
def test_fair_share_when_a_pool_limit_binds(case) -> None:
    policy, jobs, held_nodes, size = case
    result = plan(make_snapshot(jobs, nodes=held_nodes), [policy], T0)
    [decision] = result.decisions
    if not any(b.startswith("limits.") for b in decision.held_back_by):
        return
    held = {p: sum(n.gpus for n in held_nodes if n.project == p) for p in PROJECTS}
    granted = {p: sum(1 for lc in result.launches if lc.project == p) for p in PROJECTS}
    waiting = {p: sum(1 for j in jobs if j.project == p) - granted[p] for p in PROJECTS}
    share = {p: (held[p] + granted[p] * size) / policy.project_weight(p) for p in PROJECTS}
    for winner in PROJECTS:
        if not granted[winner]:
            continue
        for other in PROJECTS:
            quota = policy.project_quota(other)
            launchable = quota is None or held[other] + granted[other] * size + size <= quota
            if other == winner or waiting[other] <= 0 or not launchable:
                continue
            assert share[winner] <= share[other] + size / policy.project_weight(winner), (
                winner, other, share, granted, decision.summary)
