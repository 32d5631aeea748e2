"""Running a what-if: size the on-prem pool, replay a trace under each policy and baseline, and
collect the comparable metrics (the ``--json`` object of ``burst simulate``).

A policy runs as its user wrote it with two substitutions, both documented in
``docs/simulator.md``: every offering is bought from the ``sim`` provider (same region, zone,
instance type and market, at the catalogue price of the provider the policy names, or the price
the policy gives), and ``pool.onprem`` becomes the simulated on-prem pool. The sim provider comes
from :func:`orchestrator.wiring.build_provider`, as every provider does.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from orchestrator.domain.boot import BootLearner
from orchestrator.domain.capacity import CapacityLearner, region_market
from orchestrator.domain.offerings import Offering
from orchestrator.planner.backfill import BackfillConfig
from orchestrator.planner.offerings import resolve_candidates
from orchestrator.policy.models import Policy, ProviderName
from orchestrator.sim.clairvoyant import clairvoyant
from orchestrator.sim.controllers import (
    DEFAULT_THRESHOLD,
    Controller,
    GreedyController,
    NeverController,
    PolicyController,
    ThresholdController,
)
from orchestrator.sim.engine import Engine, Sample, SimClock
from orchestrator.sim.memstore import SimStore
from orchestrator.sim.metrics import Outcome, summarize, usd
from orchestrator.sim.roi import onprem_starts, sim_roi
from orchestrator.sim.spotdata import published_priors, spot_markets
from orchestrator.sim.traces import Trace
from orchestrator.sim.world import DONE, PENDING, Backfill, World, at
from orchestrator.wiring import Settings, build_provider

BASELINES = ("never", "greedy", "threshold", "clairvoyant")


class SimulationError(Exception):
    """The simulation cannot run as asked; the message says which option or policy is at fault."""


@dataclass(frozen=True, slots=True)
class OnPremSizing:
    """The simulated on-prem pool and how it was sized."""

    nodes: int
    gpus_per_node: int
    how: str

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class SimOptions:
    """Knobs of a simulation (the ``burst simulate`` options)."""

    seed: int = 0
    slo_s: float = 1800.0
    tick_s: float = 60.0
    onprem: str = "p70"  # "N" GPUs, "pNN" (percentile of concurrent demand) or "policy"
    node_gpus: int | None = None  # GPUs per on-prem node (default: the policy's)
    threshold: int = DEFAULT_THRESHOLD
    backfill: Backfill = Backfill.EASY  # the on-prem scheduler's rule (orchestrator.sim.world)
    # ``slurm`` backfill's knobs (orchestrator.planner.backfill): bf_max_job_test, how many
    # blocked jobs a pass reserves for, and bf_interval.
    bf_max_job_test: int = 100
    bf_reservations: int = 8  # (Slurm reserves for every job it tests: slower to replay)
    bf_interval_s: float = 30.0
    # The sim provider's knobs, by field name (providers/sim.py BootTime and SimRates); empty:
    # its defaults (boot median 200 s; no capacity errors, no interruptions).
    boot: dict = field(default_factory=dict)
    rates: dict = field(default_factory=dict)
    chart_points: int = 600
    # Also replay on-prem only and report each policy run's return on burst spend, exact and as
    # the planner predicted it (orchestrator.sim.roi): one more replay (``burst simulate --roi``).
    roi: bool = False
    # Spot offerings replay the measured spot capacity of the shared data (orchestrator.sim.spotdata)
    # instead of the flat rates; the policy's planner learns hazards from its node events.
    spot_data: bool = False


@dataclass
class SimResult:
    """The JSON-ready result and, per run, the series the chart draws."""

    data: dict
    series: dict[str, list[Sample]] = field(default_factory=dict)
    # Wall-clock figures per run (replay seconds, seconds inside plan()): for benchmarks, never in
    # ``data``, which must be byte-identical for the same inputs.
    timings: dict[str, dict[str, float]] = field(default_factory=dict)


# -- sizing --------------------------------------------------------------------------------------


def demand_percentile(trace: Trace, percentile: float) -> int:
    """Time-weighted percentile of concurrent GPU demand if every job started when submitted."""
    events: list[tuple[float, int]] = []
    for job in trace.jobs:
        events.append((job.submit_s, job.gpus))
        events.append((job.submit_s + job.duration_s, -job.gpus))
    if not events:
        return 0
    events.sort()
    weights: dict[int, float] = {}
    level = 0
    previous = events[0][0]
    for moment, delta in events:
        if moment > previous:
            weights[level] = weights.get(level, 0.0) + (moment - previous)
            previous = moment
        level += delta
    total = sum(weights.values())
    if total <= 0:
        return max((j.gpus for j in trace.jobs), default=0)
    covered = 0.0
    for level in sorted(weights):
        covered += weights[level]
        if covered >= percentile / 100.0 * total - 1e-9:
            return level
    return max(weights)


def size_onprem(trace: Trace, reference: Policy, spec: str, node_gpus: int | None) -> OnPremSizing:
    per_node = node_gpus or reference.pool.onprem.gpus_per_node
    if per_node < 1:
        raise SimulationError(f"--node-gpus must be at least 1, got {per_node}")
    text = str(spec).strip().lower()
    if text == "policy":
        onprem = reference.pool.onprem
        per_node = node_gpus or onprem.gpus_per_node
        return OnPremSizing(onprem.total_gpus // per_node if node_gpus else onprem.nodes, per_node,
                            f"the policy's pool.onprem ({onprem.nodes} x {onprem.gpus_per_node} GPUs)")
    if text.startswith("p"):
        try:
            q = float(text[1:])
        except ValueError:
            raise SimulationError(f"--onprem-gpus {spec!r}: write N, pNN (e.g. p70) or policy") from None
        if not 0 < q <= 100:
            raise SimulationError(f"--onprem-gpus {spec!r}: the percentile must be in (0, 100]")
        gpus = demand_percentile(trace, q)
        nodes = max(math.ceil(gpus / per_node), 1)
        return OnPremSizing(nodes, per_node, f"p{q:g} of concurrent GPU demand ({gpus} GPUs), "
                                             f"rounded up to whole {per_node}-GPU nodes")
    try:
        gpus = int(text)
    except ValueError:
        raise SimulationError(f"--onprem-gpus {spec!r}: write N, pNN (e.g. p70) or policy") from None
    if gpus < 0:
        raise SimulationError(f"--onprem-gpus must be >= 0, got {gpus}")
    return OnPremSizing(math.ceil(gpus / per_node), per_node,
                        f"{gpus} GPUs given, rounded up to whole {per_node}-GPU nodes")


def as_simulated(policy: Policy, sizing: OnPremSizing) -> Policy:
    """The policy with its offerings bought from the sim provider and the simulated on-prem pool."""
    offerings = [spec.model_copy(update={"provider": ProviderName.SIM}) for spec in policy.offerings]
    keys = [o.key for o in offerings]
    clashes = sorted({k for k in keys if keys.count(k) > 1})
    if clashes:
        raise SimulationError(f"policy {policy.name}: offerings {', '.join(clashes)} become the same "
                              "sim offering (same region, zone, type and market at two providers)")
    onprem = policy.pool.onprem.model_copy(update={"nodes": sizing.nodes,
                                                   "gpus_per_node": sizing.gpus_per_node})
    pool = policy.pool.model_copy(update={"onprem": onprem})
    return policy.model_copy(update={"offerings": offerings, "pool": pool})


def as_simulated_offerings(policy: Policy) -> Policy:
    """The policy with its offerings bought from the sim provider (nothing else changed)."""
    return policy.model_copy(update={"offerings": [
        spec.model_copy(update={"provider": ProviderName.SIM}) for spec in policy.offerings]})


# -- runs ------------------------------------------------------------------------------------------


def _provider(policy: Policy, options: SimOptions, clock: SimClock):
    knobs = {"clock": clock, "seed": options.seed, "boot": dict(options.boot),
             "rates": dict(options.rates)}
    # The settings are not read by the sim provider: no BURST_* environment is needed to simulate.
    try:
        provider = build_provider(str(ProviderName.SIM), Settings.model_construct(), [policy],
                                  options=knobs)
    except (TypeError, ValueError) as exc:
        raise SimulationError(f"sim provider settings: {exc}") from None
    if options.spot_data:
        # Keyed as the policy launches them (a pinned zone is part of the key).
        usable, _ = resolve_candidates(as_simulated_offerings(policy), tuple(provider.offerings()),
                                       (), at(0))
        try:
            provider.markets.update(spot_markets([c.offering for c in usable], options.seed))
        except (OSError, ValueError, KeyError) as exc:
            raise SimulationError(f"spot data: {exc}") from None
    return provider


def replay(controller: Controller, policy: Policy, sim_policy: Policy, trace: Trace,
           sizing: OnPremSizing, options: SimOptions,
           progress: Callable[[float], None] | None = None) -> Engine:
    """Replay ``trace`` with ``controller`` deciding about burst nodes; the finished engine (its
    world, store and provider hold everything that happened)."""
    provider = _provider(policy, options, SimClock())
    world = World(sim_policy, trace.jobs, sizing.nodes, sizing.gpus_per_node, SimStore(),
                  backfill=options.backfill,
                  slurm=BackfillConfig(options.bf_max_job_test, options.bf_reservations),
                  bf_interval_s=options.bf_interval_s)
    sample_s = max(trace.span_s / max(options.chart_points, 1), 60.0)
    engine = Engine(world, provider, sim_policy, controller, tick_s=options.tick_s,
                    sample_s=sample_s, progress=progress)
    if sim_policy.spot.by_expected_cost:
        usable, _ = resolve_candidates(sim_policy, tuple(provider.offerings()), (), at(0))
        priors = published_priors([c.offering for c in usable]) if options.spot_data else {}
        engine.learner = CapacityLearner(priors, pool_by=region_market)
    if sim_policy.trigger.learn_boot or sim_policy.spot.learn_restart_wait:
        engine.boot_learner = BootLearner()
    engine.run()
    return engine


def run_controlled(name: str, controller: Controller, policy: Policy, sim_policy: Policy,
                   trace: Trace, sizing: OnPremSizing, options: SimOptions,
                   progress: Callable[[float], None] | None = None,
                   timings: dict | None = None,
                   counterfactual: dict[int, float | None] | None = None
                   ) -> tuple[dict, list[Sample]]:
    """Replay ``trace`` with ``controller`` deciding about burst nodes; (run JSON, chart series)."""
    began = time.perf_counter()
    engine = replay(controller, policy, sim_policy, trace, sizing, options, progress)
    provider, world, store = engine.provider, engine.world, engine.store
    knobs = {"boot": _fields(provider.boot), "rates": _fields(provider.rates)}
    if timings is not None:
        timings[name] = {"wall_s": round(time.perf_counter() - began, 3),
                         "plan_s": round(engine.counters.plan_wall_s, 3),
                         "plans": engine.counters.plans}
    bills = provider.bills(until=at(engine.now))
    node_of = {n.instance_id: n.id for n in store.nodes(include_terminated=True) if n.instance_id}
    cost = sum(b.cost_micro_usd for b in bills)
    billed_gpu_s = sum(b.billed_s * b.gpus for b in bills)
    busy_gpu_s = sum(world.node_busy_gpu_s.values())
    idle = 0
    for bill in bills:
        billed = bill.billed_s * bill.gpus
        busy = world.node_busy_gpu_s.get(node_of.get(bill.instance_id, ""), 0.0)
        if billed > 0:
            idle += round(bill.cost_micro_usd * max(1.0 - busy / billed, 0.0))
    outcomes = []
    lost = 0.0
    for job in world.jobs:
        lost += job.lost_gpu_s
        wait = job.wait_s + (engine.now - job.pending_since if job.state == PENDING else 0.0)
        where = job.where if job.state == DONE else None
        outcomes.append(Outcome(job.domain.project, job.gpus * job.trace.duration_s, wait, where))
    counters = engine.counters
    extra: dict = {
        "capacity_errors": provider.capacity_errors,
        "interruptions": counters.interruptions,
        "boot_timeouts": counters.boot_timeouts,
        "requeued_jobs": world.requeued,
        "egress_usd": usd(world.egress_micros),
        "staged_gb": round(world.staged_gb, 3),
        "staging_hours": round(world.staging_s / 3600.0, 3),
        "peak_burst_nodes": counters.peak_nodes,
        "simulated_s": round(engine.now - (trace.jobs[0].submit_s if trace.jobs else 0.0), 1),
        "cloud": knobs,
    }
    if counters.interruptions:
        # The checkpoint bound: the most compute one interruption cost any job.
        extra["max_loss_per_interruption_s"] = round(max(j.max_loss_s for j in world.jobs), 1)
    if controller.kind == "policy":
        extra["policy"] = policy.name
        extra["plans"] = counters.plans
        extra["idle_ticks"] = counters.idle_ticks
        extra["held_ticks"] = counters.held_ticks
        extra["slept_ticks"] = counters.slept_ticks
        extra["ticks"] = counters.ticks
        extra["decisions_by_rule"] = dict(sorted(store.rules.items()))
        extra["held_back_by"] = dict(sorted(store.held_back.items()))
        if counterfactual is not None:
            extra["roi"] = sim_roi(world.jobs, store.predictions, counterfactual, cost / 1e6,
                                   billed_gpu_s)
    run = summarize(name, controller.kind, options.slo_s, outcomes, cost_micro=cost,
                    billed_gpu_s=billed_gpu_s, busy_gpu_s=busy_gpu_s, idle_micro=idle,
                    lost_gpu_s=lost, span_s=max(trace.span_s, 1.0),
                    launches=counters.launches, terminations=counters.terminations, extra=extra)
    return run, counters.samples


def _fields(value) -> dict:
    return {name: getattr(value, name) for name in value.__dataclass_fields__}


def cheapest_per_gpu(policy: Policy, catalogue: Sequence[Offering]) -> Offering | None:
    candidates, _ = resolve_candidates(policy, tuple(catalogue), (), at(0))
    if not candidates:
        return None
    return min((c.offering for c in candidates),
               key=lambda o: (o.price_per_gpu_hour, o.price_usd_hour, o.key))


def run_clairvoyant(policy: Policy, sim_policy: Policy, trace: Trace, sizing: OnPremSizing,
                    options: SimOptions) -> tuple[dict, list[Sample]]:
    provider = _provider(policy, options, SimClock())
    offering = cheapest_per_gpu(sim_policy, provider.offerings())
    if offering is None:
        raise SimulationError(f"policy {policy.name}: no usable offering to price the clairvoyant with")
    per_gpu_hour = offering.price_per_gpu_hour
    placements = clairvoyant(trace.jobs, sizing.gpus, options.slo_s)
    outcomes = []
    cost = 0
    for job, placed in zip(trace.jobs, placements):
        gpu_s = job.gpus * job.duration_s
        if placed.cloud:
            cost += round(gpu_s * per_gpu_hour * 1_000_000 / 3600)
        outcomes.append(Outcome(job.project or "default", gpu_s, placed.wait_s,
                                "cloud" if placed.cloud else "onprem"))
    cloud_gpu_s = sum(o.gpu_s for o in outcomes if o.where == "cloud")
    run = summarize("clairvoyant", "baseline", options.slo_s, outcomes, cost_micro=cost,
                    billed_gpu_s=cloud_gpu_s, busy_gpu_s=cloud_gpu_s, idle_micro=0, lost_gpu_s=0.0,
                    span_s=max(trace.span_s, 1.0), launches=None, terminations=None,
                    # The reference ignores data staging: it places work, it moves no data.
                    extra={"egress_usd": None, "staged_gb": None, "staging_hours": None})
    run["priced_at"] = {"offering": offering.key, "usd_per_gpu_hour": round(per_gpu_hour, 6)}
    return run, _cost_series(trace, placements, per_gpu_hour, options)


def _cost_series(trace: Trace, placements, per_gpu_hour: float, options: SimOptions) -> list[Sample]:
    import numpy as np

    start = trace.jobs[0].submit_s if trace.jobs else 0.0
    step = max(trace.span_s / max(options.chart_points, 1), 60.0)
    cloud = [(j.submit_s, j.duration_s, j.gpus) for j, p in zip(trace.jobs, placements) if p.cloud]
    times = np.arange(0.0, trace.span_s + step, step) + start
    if not cloud:
        return [Sample(float(t), 0, 0, 0.0) for t in times]
    s, d, g = (np.array(c, dtype=float) for c in zip(*cloud))
    samples = []
    for t in times:
        spent = float((np.clip(t - s, 0.0, d) * g).sum() * per_gpu_hour / 3600.0)
        samples.append(Sample(float(t), 0, 0, spent))
    return samples


def simulate(trace: Trace, policies: Sequence[tuple[str, Policy]], *, baselines: bool = False,
             options: SimOptions = SimOptions(),
             progress: Callable[[str, float], None] | None = None) -> SimResult:
    """Replay ``trace`` under each ``(run name, policy)`` and, with ``baselines``, under never,
    greedy, threshold and the clairvoyant reference (priced with the first policy's offerings)."""
    if not policies:
        raise SimulationError("at least one policy is needed (the baselines use its offerings)")
    if not trace.jobs:
        raise SimulationError(f"trace {trace.name}: no jobs")
    if options.tick_s <= 0:
        raise SimulationError(f"--tick must be longer than 0s, got {options.tick_s}")
    if options.slo_s < 0:
        raise SimulationError(f"--slo must not be negative, got {options.slo_s}")
    reference = policies[0][1]
    sizing = size_onprem(trace, reference, options.onprem, options.node_gpus)
    result = SimResult(_header(trace, sizing, options))
    runs = result.data["runs"]

    def reporter(name: str) -> Callable[[float], None] | None:
        if progress is None:
            return None
        return lambda fraction: progress(name, fraction)

    counterfactual = None
    if options.roi:  # the on-prem-only replay each policy run's burst jobs are compared with
        began = time.perf_counter()
        never = replay(NeverController(), reference, as_simulated(reference, sizing), trace,
                       sizing, options, reporter("on-prem only (--roi)"))
        counterfactual = onprem_starts(never.world.jobs)
        result.timings["roi-counterfactual"] = {"wall_s": round(time.perf_counter() - began, 3),
                                                "plan_s": 0.0, "plans": 0}
    for name, policy in policies:
        sim_policy = as_simulated(policy, sizing)
        run, samples = run_controlled(name, PolicyController(sim_policy, name), policy, sim_policy,
                                      trace, sizing, options, reporter(name), result.timings,
                                      counterfactual)
        result.data["cloud"] = run.pop("cloud")
        runs.append(run)
        result.series[name] = samples
    if baselines:
        sim_reference = as_simulated(reference, sizing)
        for controller in (NeverController(), GreedyController(sim_reference),
                           ThresholdController(sim_reference, options.threshold)):
            run, samples = run_controlled(controller.name, controller, reference, sim_reference,
                                          trace, sizing, options, reporter(controller.name),
                                          result.timings)
            if controller.name == "threshold":
                run["threshold_gpus"] = options.threshold
            run.pop("cloud")
            runs.append(run)
            result.series[controller.name] = samples
        began = time.perf_counter()
        run, samples = run_clairvoyant(reference, sim_reference, trace, sizing, options)
        result.timings["clairvoyant"] = {"wall_s": round(time.perf_counter() - began, 3),
                                         "plan_s": 0.0, "plans": 0}
        runs.append(run)
        result.series["clairvoyant"] = samples
        if progress is not None:
            progress("clairvoyant", 1.0)
        reference_cost = run["cloud_cost_usd"]
        for other in runs:
            other["cost_vs_clairvoyant"] = (round(other["cloud_cost_usd"] / reference_cost, 4)
                                            if reference_cost else None)
    return result


def _header(trace: Trace, sizing: OnPremSizing, options: SimOptions) -> dict:
    onprem = {"nodes": sizing.nodes, "gpus_per_node": sizing.gpus_per_node, "gpus": sizing.gpus,
              "sizing": sizing.how, "backfill": str(Backfill(options.backfill))}
    if Backfill(options.backfill) is Backfill.SLURM:
        onprem |= {"bf_max_job_test": options.bf_max_job_test,
                   "bf_reservations": options.bf_reservations,
                   "bf_interval_s": round(options.bf_interval_s, 1)}
    return {
        "trace": {"name": trace.name, "source": trace.source, "jobs": len(trace.jobs),
                  "gpu_hours": round(trace.gpu_hours, 3), "span_s": round(trace.span_s, 1),
                  "max_job_gpus": max(j.gpus for j in trace.jobs)},
        "onprem": onprem,
        "seed": options.seed,
        "slo_s": round(options.slo_s, 1),
        "tick_s": round(options.tick_s, 1),
        "cloud": {},  # the sim provider's boot-time and rate settings, filled by the first run
        "runs": [],
    }
