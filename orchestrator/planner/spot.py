"""Spot or on-demand, and which provider and region, per job by expected cost (``spot``).

Pure maths over the snapshot's offering health
(:class:`~orchestrator.domain.snapshot.OfferingHealth`: preemption hazard and stockout odds
per offering, learned by the observer from node events). For a job of ``D`` seconds of work that checkpoints every ``c`` seconds (no checkpoint: ``c = D``) on an
offering whose instances are interrupted at rate ``λ`` (per node; a job on ``n`` nodes at ``nλ``),
each segment of ``x`` seconds of work takes, in expectation,

    E[x] = (e^{λx} - 1) (1/λ + K),      K = restart overhead + boot of the next node,

seconds of billed node time (a failed attempt's work since the checkpoint is lost, then ``K`` is
paid and the segment retried; the limit λ -> 0 is ``x``), with ``e^{λx} - 1`` interruptions. The
billed time is the first boot plus the sum over the segments; the expected cost is price x billed
time x the job's share of the node (its GPUs over the node's, whole nodes for a wider job). The
SLO risk is the expected delay (``K`` per interruption, a retry back-off per stockout: ``s/(1-s)``
failed launches at stockout odds ``s``) x the job's GPUs x ``spot.delay_usd_per_gpu_hour``
(default: the cheapest on-demand price per GPU-hour among the candidates; with the SLO guard, 0:
the guard bounds the SLO risk, and a delay within the SLO costs nothing by its terms). The offering
with the lowest expected cost plus risk takes the job; every alternative is kept for the decision
record.

SLO guard (``spot.max_slo_miss_odds``): an expected delay priced in dollars does not bound the odds
of a miss, and a long or wide job on spot is interrupted many times, each restart waiting for a new
node. A job of wait so far ``w`` (now - submitted - ``Job.ran_s``, the earlier attempts' run of a
requeued job; where the queue does not report it, that run counts as waiting and the job is assumed
to have no slack left) has room for a restart when ``SLO - w - boot >= boot + tick``, ``boot`` being
the boot of the job's launch group (``spot.learn_restart_wait``: the learned p90 of the slowest of
``n`` boots, ``n`` its nodes on the smallest candidate node; :func:`.boot.group_boot_s`; else
``trigger.expected_boot``): a relaunch of a job on 8 nodes waits for the slowest of 8. Interruptions
are Poisson of mean ``N`` (the offering's expected count). With no room, the odds of a miss are
``P(X >= 1)``. With room, the job misses only if its first attempt is cut and, requeued, it runs
out of room on spot and is cut again there; with no room the guard lets it on spot only at odds
within the bound, so the odds are at most ``P(X >= 1) x bound``: in effect a job runs on spot while
it has room for a restart, then where the guard allows (mostly on demand). A spot offering whose
odds are above the bound is ranked after every offering within it (kept last: where nothing else is
on offer it is still used). A late job (``trigger.wait_slo``) whose first choice under the guard is
spot is burst at once instead of at its deadline (:meth:`SpotChooser.burst_early`): waiting would
only spend the slack its restarts need; on-demand first choices wait for their deadline, as on-prem
may still take them. A job deferred to on-prem (predicted to start there within its SLO) bursts in
the last tick it has room for a restart and a relaunch (:meth:`SpotChooser.room_left_s` with
:data:`DEFERRED_RELAUNCHES`, under one tick) where its first choice then is spot: past that tick,
should on-prem not take it after all, its deadline burst has no room and the guard puts it on
demand for the whole of its run (the relaunch: its launch itself may be refused, or its node
reclaimed while it boots); bursting it then on spot costs the spot run (about a third of
on-demand's) in the cases on-prem would have taken it.

Jobs are priced per class (GPUs, duration on a 5 % grid, checkpoint interval; with the guard,
whether it has room for a restart): a queue of 100k jobs has few.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from orchestrator.domain.jobs import Job
from orchestrator.domain.snapshot import OfferingHealth
from orchestrator.planner.offerings import DEFAULT_JOB_HOURS, Candidate
from orchestrator.policy.models import Market, Policy

STOCKOUT_RETRY_S = 180.0  # a capacity error excludes an offering this long (executor's back-off)
TICK_S = 60.0  # a restart waits one planner tick beyond the next node's boot (the SLO guard)
# A deferred job bursts while its slack still holds a relaunch beyond the restart room: its launch
# itself may fail (refused, or the node reclaimed while it boots), and a relaunch at the last tick
# of room would leave none (the rest of its run on demand).
DEFERRED_RELAUNCHES = 1
MAX_STOCKOUT_ODDS = 0.99  # odds past this are planned as this (the expected retries stay finite)
RECORDED_CLASSES = 4  # job classes whose alternatives a decision records (the largest by GPU-hours)
# Durations are priced on a geometric grid of this ratio (a class per 5 % of runtime): the ranking
# of offerings moves smoothly with runtime, and a queue of unique time limits prices few classes.
DURATION_STEP = 1.05


_MEMO: OrderedDict[tuple, tuple] = OrderedDict()  # (class, inputs) -> (ranking, prices)
_MEMO_SIZE = 4096
_MEMO_LOCK = threading.Lock()  # the API and the loop may plan in two threads


@dataclass(frozen=True, slots=True)
class JobPrice:
    """What running one job on one offering is expected to take and cost."""

    offering_key: str
    market: Market
    nodes: float  # nodes' worth of the offering the job holds (a share when it packs)
    billed_hours: float  # expected node-hours billed, interruptions and re-runs included
    interruptions: float  # expected number of interruptions
    lost_hours: float  # expected work redone (since the last checkpoint) plus restart overhead
    stockout_odds: float
    run_usd: float  # price x billed hours x share
    risk_usd: float  # SLO risk: expected delay x GPUs x delay price
    expected_cost_usd: float  # run_usd + risk_usd
    slo_miss_odds: float | None = None  # the SLO guard's odds of a miss (None: guard off)
    guarded: bool = False  # passed over by the SLO guard (odds above spot.max_slo_miss_odds)

    def as_record(self) -> dict:
        def r(value: float) -> float:
            return round(min(value, 1e12), 4)  # an infinitely dear option stays valid JSON
        out = {"offering": self.offering_key, "market": str(self.market),
               "billed_hours": r(self.billed_hours), "interruptions": r(self.interruptions),
               "lost_hours": r(self.lost_hours), "stockout_odds": r(self.stockout_odds),
               "run_usd": r(self.run_usd), "risk_usd": r(self.risk_usd),
               "expected_cost_usd": r(self.expected_cost_usd)}
        if self.slo_miss_odds is not None:
            out["slo_miss_odds"] = r(self.slo_miss_odds)
            out["slo_guard"] = self.guarded
        return out


def poisson_tail(mean: float, k: int) -> float:
    """P(X > k) for X Poisson of ``mean`` (the odds of more than ``k`` interruptions)."""
    if mean <= 0:
        return 0.0
    if not math.isfinite(mean):
        return 1.0
    term = cdf = math.exp(-mean)
    for i in range(1, k + 1):
        term *= mean / i
        cdf += term
    return min(max(1.0 - cdf, 0.0), 1.0)


def expected_work_s(work_s: float, checkpoint_s: float | None, restart_s: float,
                    hazard_per_s: float) -> tuple[float, float]:
    """Expected wall seconds to get ``work_s`` done under interruptions at ``hazard_per_s``,
    resuming from the last checkpoint (every ``checkpoint_s``; None: from the start) after
    ``restart_s``; and the expected number of interruptions."""
    if work_s <= 0:
        return 0.0, 0.0
    if hazard_per_s <= 0:
        return work_s, 0.0
    segment = min(checkpoint_s or work_s, work_s)
    full, last = divmod(work_s, segment)
    total = interruptions = 0.0
    for length, count in ((segment, full), (last, 1.0 if last > 1e-9 else 0.0)):
        if count:
            # expm1 keeps precision when λx is tiny; past ~700 it would overflow: infinitely
            # dear (never chosen while anything finite is on offer).
            exponent = hazard_per_s * length
            grown = math.expm1(exponent) if exponent < 700.0 else math.inf
            total += count * (grown / hazard_per_s + grown * restart_s)  # 1/λ may overflow
            interruptions += count * grown
    return total, interruptions


def price_job(gpus: int, duration_s: float, checkpoint_s: float | None, candidate: Candidate,
              health: OfferingHealth | None, restart_s: float, boot_s: float,
              delay_usd_per_gpu_hour: float) -> JobPrice:
    """One job's expected cost on one offering (module docstring)."""
    offering = candidate.offering
    node_gpus = offering.gpus
    nodes_held = -(-gpus // node_gpus) if gpus > node_gpus else 1
    share = nodes_held if gpus > node_gpus else gpus / node_gpus
    hazard_h = health.preemptions_per_hour if health is not None else 0.0
    stockout = min(health.stockout_odds, MAX_STOCKOUT_ODDS) if health is not None else 0.0
    hazard_s = hazard_h * nodes_held / 3600.0  # any of the job's nodes going ends the attempt
    restart_total = restart_s + boot_s
    run_s, interruptions = expected_work_s(duration_s, checkpoint_s, restart_total, hazard_s)
    billed_s = (offering.billing.billed_seconds(boot_s + run_s) if math.isfinite(run_s)
                else math.inf)
    run_usd = offering.price_usd_hour * billed_s / 3600.0 * share
    retries = stockout / (1.0 - stockout)
    delay_s = interruptions * restart_total + retries * STOCKOUT_RETRY_S
    # (no delay price: no risk, even for an infinite delay; inf x 0 would be NaN)
    risk_usd = delay_s / 3600.0 * gpus * delay_usd_per_gpu_hour if delay_usd_per_gpu_hour else 0.0
    return JobPrice(candidate.key, offering.market, share, billed_s / 3600.0, interruptions,
                    max(run_s - duration_s, 0.0) / 3600.0, stockout, run_usd, risk_usd,
                    run_usd + risk_usd)


def _rates(health: OfferingHealth | None) -> tuple[float, float]:
    return (health.preemptions_per_hour, health.stockout_odds) if health else (0.0, 0.0)


class SpotChooser:
    """Ranks the candidates for each job by expected cost (memoized per job class for a tick)."""

    def __init__(self, policy: Policy, candidates: list[Candidate],
                 health: Mapping[str, OfferingHealth], now: datetime | None = None,
                 boot_s: float | None = None,
                 group_boot: Callable[[int], float] | None = None):
        self.policy = policy
        self.candidates = candidates
        self.health = health
        spot = policy.spot
        self.restart_s = spot.restart_overhead.total_seconds()
        # The boot the wait-aware rule allows (learned with trigger.learn_boot: planner.boot).
        self.boot_s = (policy.trigger.expected_boot.total_seconds() if boot_s is None
                       else boot_s)
        # The SLO guard (module docstring): on with a bound, an SLO and the decision's moment.
        slo = policy.trigger.wait_slo
        self.max_odds = spot.max_slo_miss_odds
        self.now = now
        self.guard = self.max_odds is not None and slo is not None and now is not None
        self.slo_s = slo.total_seconds() if slo is not None else 0.0
        # The boot of a launch group of n nodes (its slowest node; planner.boot.group_boot_s):
        # a wide job's launch and restarts wait for it. Its n: the job's nodes on the smallest
        # candidate node (the most it may take).
        self.group_boot = group_boot
        self.smallest_node = min((c.offering.gpus for c in candidates), default=1) or 1
        self._boots: dict[int, float] = {}
        if spot.delay_usd_per_gpu_hour is not None:
            self.delay_rate = float(spot.delay_usd_per_gpu_hour)
        elif self.guard:
            # The guard bounds the odds that restarts push a job past its SLO, and a delay
            # within the SLO costs nothing by the SLO's own terms: priced on top, the delay
            # counts the same risk twice (and sends wide jobs, whose delay is priced per GPU,
            # on demand or to dearer offerings while their slack absorbs the restarts).
            self.delay_rate = 0.0
        else:
            on_demand = [c.offering.price_per_gpu_hour for c in candidates
                         if c.offering.market is Market.ON_DEMAND]
            self.delay_rate = min(on_demand, default=max(
                (c.offering.price_per_gpu_hour for c in candidates), default=0.0))
        # class -> (ranking, prices, their records), for this tick
        self._classes: dict[tuple, tuple] = {}
        # Everything but the job class that a price depends on, by value: equal inputs on a later
        # tick reuse the ranking (health is carried to two significant figures, so it repeats).
        self._world = (tuple((c.key, c.offering.price_usd_hour, c.offering.gpus,
                              c.offering.market, *_rates(health.get(c.key)))
                             for c in candidates),
                       self.restart_s, self.boot_s, self.delay_rate,
                       self.max_odds if self.guard else None)
        self._gpu_hours: dict[tuple, float] = {}

    def _class(self, job: Job) -> tuple:
        duration = job.duration_s or DEFAULT_JOB_HOURS * 3600.0
        if duration > 1.0:
            duration = round(DURATION_STEP ** round(math.log(duration, DURATION_STEP)), 1)
        checkpoint = self.policy.checkpoint_every_s(job.project, job.checkpoint_s)
        if not self.guard:
            return (job.gpus, duration, checkpoint)
        return (job.gpus, duration, checkpoint, self.restarts_allowed(job))

    def restarts_allowed(self, job: Job) -> int:
        """Restarts ``job``'s slack absorbs if it is launched for now (the SLO guard)."""
        # (a requeued job's earlier run is not waiting: ran_s, where the queue reports it)
        boot = self.boot_for(job.gpus)
        since = (self.now - job.submitted_at).total_seconds()  # type: ignore[operator]
        waited = max(since - job.ran_s, 0.0)
        slack = self.slo_s - waited - boot
        if slack <= 0:
            return 0
        # One restart absorbed is what the guard needs (see _guarded): the class key stays 0/1.
        return min(int(slack // (boot + TICK_S)), 1)

    def boot_for(self, gpus: int) -> float:
        """The boot a job of ``gpus`` waits for, launched or relaunched: its launch group's
        (``group_boot``), else the one boot allowed (``boot_s``)."""
        boot = self._boots.get(gpus)
        if boot is None:
            nodes = -(-gpus // self.smallest_node)
            boot = self._boots[gpus] = (self.group_boot(nodes) if self.group_boot is not None
                                        else self.boot_s)
        return boot

    def room_left_s(self, job: Job, relaunches: int = 0) -> float:
        """Seconds until ``job``, launched then, would have no room for a restart and
        ``relaunches`` more (negative: none now; the SLO guard)."""
        if not self.guard:
            return -math.inf
        boot = self.boot_for(job.gpus)
        since = (self.now - job.submitted_at).total_seconds()  # type: ignore[operator]
        waited = max(since - job.ran_s, 0.0)
        return self.slo_s - waited - boot - (1 + relaunches) * (boot + TICK_S)

    def rank(self, job: Job, count: bool = True) -> list[Candidate]:
        """The candidates for ``job``, by expected cost plus SLO risk (ties by key; with the SLO
        guard, the spot offerings it passes over last). ``count``: the job is launched for (its
        class is in :meth:`record`)."""
        key = self._class(job)
        if count:
            self._gpu_hours[key] = self._gpu_hours.get(key, 0.0) + key[0] * key[1] / 3600.0
        entry = self._classes.get(key)
        if entry is None:
            memo_key = (key, self._world)
            with _MEMO_LOCK:
                entry = _MEMO.get(memo_key)
            if entry is None:
                gpus, duration, checkpoint = key[:3]
                prices = [price_job(gpus, duration, checkpoint, c, self.health.get(c.key),
                                    self.restart_s, self.boot_s, self.delay_rate)
                          for c in self.candidates]
                if self.guard:
                    prices = [self._guarded(p, key[3]) for p in prices]
                order = sorted(range(len(prices)),
                               key=lambda i: (prices[i].guarded, prices[i].expected_cost_usd,
                                              prices[i].offering_key))
                ranked = tuple(prices[i] for i in order)
                entry = ([self.candidates[i] for i in order], ranked,
                         tuple(p.as_record() for p in ranked))
                with _MEMO_LOCK:
                    _MEMO[memo_key] = entry
                    if len(_MEMO) > _MEMO_SIZE:
                        _MEMO.popitem(last=False)
            self._classes[key] = entry
        return entry[0]

    def _guarded(self, price: JobPrice, restarts: int) -> JobPrice:
        # Interrupted once, a job is requeued with no slack assumed (restarts_allowed 0): it goes
        # back to spot only at odds of another interruption within the bound. So with room for
        # one restart it misses only if the first attempt is cut (P(X >= 1)) and the second,
        # on spot again, is cut too (at most the bound).
        odds = poisson_tail(price.interruptions, 0)
        if restarts >= 1:
            odds *= self.max_odds  # type: ignore[operator]
        return replace(price, slo_miss_odds=odds,
                       guarded=price.market is Market.SPOT and odds > self.max_odds)

    def burst_early(self, job: Job) -> bool:
        """Whether a late ``job`` should burst now rather than at its deadline: its first choice
        under the SLO guard is spot (waiting would spend the slack its restarts need)."""
        if not self.guard:
            return False
        ranking = self.rank(job, count=False)
        return bool(ranking) and ranking[0].offering.market is Market.SPOT

    def record(self) -> list[dict]:
        """The job classes ranked this tick (the largest by GPU-hours first), each with every
        alternative's expected cost, the chosen one first: the decision's ``inputs.spot_choice``."""
        largest = sorted(self._gpu_hours, key=lambda k: (
            -self._gpu_hours[k], k[0], k[1], k[2] or 0.0, k[3:]))[:RECORDED_CLASSES]
        out = []
        for key in largest:
            gpus, duration, checkpoint = key[:3]
            _, prices, records = self._classes[key]
            row = {"gpus": gpus, "duration_s": duration, "checkpoint_s": checkpoint,
                   "gpu_hours": round(self._gpu_hours[key], 3),
                   "chosen": prices[0].offering_key if prices else None,
                   "alternatives": [dict(r) for r in records]}
            if self.guard:
                row["restarts_allowed"] = key[3]
                row["restart_wait_s"] = round(self.boot_for(gpus) + TICK_S, 1)
                row["max_slo_miss_odds"] = self.max_odds
            out.append(row)
        return out
