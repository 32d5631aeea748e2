"""Diagnostic: where a spot policy run's cloud money goes. Prints figures; not a test.

    python bench/spot_money.py --days 5                                 # itp-spot, seed 0
    python bench/spot_money.py --policy bench/policies/itp-spot-first.yaml --days 5 --seed 1

Setting as ``bench/bench_spot.py`` (ITP, on-prem at the p70, SLO 30 min, spot markets from the
shared data). Read-only wrappers record, per job, the spot chooser's last ranking before each of
its burst attempts (``SpotChooser.rank``) and, per attempt, the offering it ran on; the bills are
then attributed to attempts by their GPU-seconds on each node (a node's idle time is its own line).

Printed: dollars by market (spot / on-demand; busy and idle); the on-demand dollars by why the job
went there:

* ``guard-no-room``: every spot offering passed over by the SLO guard, the job with no room for a
  restart (``restarts_allowed`` 0);
* ``guard-room``: the same with room;
* ``risk``: a spot offering within the guard was on offer, but an on-demand one ranked first by
  run cost plus risk (``run-cheaper`` when on-demand's run cost alone was lower too);
* ``fallback``: the chooser put it on spot, the attempt ran on demand (a refused spot launch group
  fell back to its on-demand twin, or on-demand nodes already up took it);
* ``unranked``: never ranked (absorbed by burst room of other jobs' nodes);

and both markets' dollars by job class (width x duration, ``bench/burst_tally.py``'s), by the
attempt (first, re-runs; a re-run by the wait at its job's first burst start), the first attempts
the guard sent on demand by the wait at their first ranking and whether they were late before
(deferred to on-prem, or late), the restart waits (an interruption's requeue to the next start) by
nodes held, and the jobs over the SLO. The key is the job's *last* ranking: an earlier one that put
on-demand first (by risk, say), keeping a late job from bursting early, shows as
``guard-no-room`` when it reaches its deadline without room.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

from burst_tally import job_class

from orchestrator.planner import spot
from orchestrator.policy import load_policy
from orchestrator.policy.models import Market
from orchestrator.sim import SimOptions
from orchestrator.sim.controllers import PolicyController
from orchestrator.sim.replay import as_simulated, replay, size_onprem
from orchestrator.sim.simjob import at
from orchestrator.sim.world import World
from trace_args import add_trace_args, trace_of

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser()
    add_trace_args(parser)
    parser.add_argument("--policy", default=str(HERE / "policies" / "itp-spot.yaml"))
    args = parser.parse_args()
    trace = trace_of(args)
    options = SimOptions(seed=args.seed, slo_s=1800.0, spot_data=True)
    policy = load_policy(args.policy)
    reference = load_policy(HERE / "policies" / "itp-ondemand.yaml")
    sizing = size_onprem(trace, reference, options.onprem, options.node_gpus)
    sim = as_simulated(policy, sizing)

    ranked: dict[str, tuple] = {}  # job id -> its last ranking's summary
    rank = spot.SpotChooser.rank

    def record_rank(self, job, count=True):
        out = rank(self, job, count)
        if count:
            key = self._class(job)
            prices = self._classes[key][1]
            first = prices[0]
            spots = [p for p in prices if p.market is Market.SPOT]
            ods = [p for p in prices if p.market is Market.ON_DEMAND]
            open_spot = [p for p in spots if not p.guarded]
            if first.market is Market.SPOT:
                why = "spot"
            elif not open_spot:
                why = "guard-room" if key[3:] and key[3] else "guard-no-room"
            else:
                best_od = min(ods, key=lambda p: p.run_usd) if ods else None
                cheap = min(open_spot, key=lambda p: p.run_usd)
                why = ("risk:run-cheaper" if best_od is not None and best_od.run_usd <= cheap.run_usd
                       else "risk")
            ranked[job.id] = (why, first.offering_key)
            waited = (self.now - job.submitted_at).total_seconds() - job.ran_s
            ranked_wait.setdefault(job.id, (waited, key[3] if key[3:] else None))
        else:
            early_seen.setdefault(job.id, ((self.now - job.submitted_at).total_seconds()
                                           - job.ran_s, self._class(job)[3:]))
        return out

    ranked_wait: dict[str, tuple] = {}
    early_seen: dict[str, tuple] = {}

    spot.SpotChooser.rank = record_rank  # type: ignore[method-assign]

    attempts: list[tuple] = []  # (job, attempt, node ids, used per node, start, why)
    start = World._start

    requeued_at: dict[int, float] = {}
    restart_waits: dict[int, list[float]] = defaultdict(list)  # nodes -> restart waits (s)
    gone = World.node_gone

    def record_gone(self, node, moment):
        for job in self.node_jobs.get(node.id, ()):
            requeued_at.setdefault(job.index, (moment - at(0)).total_seconds())
        return gone(self, node, moment)

    World.node_gone = record_gone  # type: ignore[method-assign]

    def record_start(self, job, alloc, where, now):
        start(self, job, alloc, where, now)
        if job.index in requeued_at:
            restart_waits[len(alloc)].append(now - requeued_at.pop(job.index))
        if where != "onprem":
            why = ranked.get(job.domain.id, ("unranked", ""))[0]
            attempts.append((job, job.attempt, job.burst_nodes, tuple(u for _, u in alloc), now, why))

    World._start = record_start  # type: ignore[method-assign]
    engine = replay(PolicyController(sim, policy.name), policy, sim, trace, sizing, options)
    World._start = start  # type: ignore[method-assign]
    World.node_gone = gone  # type: ignore[method-assign]
    spot.SpotChooser.rank = rank  # type: ignore[method-assign]

    store, provider, world = engine.store, engine.provider, engine.world
    bills = provider.bills(until=at(engine.now))
    nodes = {n.instance_id: n for n in store.nodes(include_terminated=True) if n.instance_id}
    cost_of: dict[str, tuple[float, float, str]] = {}  # node id -> ($, billed GPU-s, market)
    ended: dict[str, float] = {}  # node id -> when its bill ended
    total = defaultdict(float)
    for bill in bills:
        node = nodes.get(bill.instance_id)
        market = bill.offering_key.rsplit("/", 1)[-1]
        usd = bill.cost_micro_usd / 1e6
        total[market] += usd
        if node is not None:
            cost_of[node.id] = (usd, bill.billed_s * bill.gpus, market)
            ended[node.id] = ((bill.ended_at or at(engine.now)) - at(0)).total_seconds()
    # attempt GPU-seconds per node: its end is the next attempt's start or the job's end
    ends: dict[tuple[int, int], float] = {}
    for job in world.jobs:
        if job.end_s is not None:
            ends[(job.index, job.attempt)] = job.end_s
    # an interrupted attempt ended when the job was requeued: its next attempt's pending_since is
    # not kept, so use the node's busy share instead: attribute by used GPUs x (end - start), end
    # unknown for cut attempts -> the node's bill end
    busy = defaultdict(float)
    parts = []
    for job, attempt, node_ids, used, t0, why in attempts:
        t1 = ends.get((job.index, attempt))
        for node_id, gpus in zip(node_ids, used):
            end = t1 if t1 is not None else ended.get(node_id, t0)
            gpu_s = gpus * max(end - t0, 0.0)
            busy[node_id] += gpu_s
            parts.append((job, attempt, node_id, gpu_s, why))
    by = defaultdict(lambda: defaultdict(float))
    attributed = defaultdict(float)
    for job, attempt, node_id, gpu_s, why in parts:
        usd, billed, market = cost_of.get(node_id, (0.0, 1.0, "?"))
        share = usd * min(gpu_s / max(busy[node_id], 1e-9), 1.0) * min(busy[node_id] / billed, 1.0)
        attributed[market] += share
        cls = job_class(job.gpus, job.trace.duration_s)
        by[market][f"why {why}"] += share
        by[market][f"class {cls}"] += share
        by[market][f"width {job.gpus:>3} GPUs"] += share
        by[market]["attempt first" if attempt == 0 else "attempt re-run"] += share
        by[market][f"why {why} x {cls} x {'first' if attempt == 0 else 're-run'}"] += share
        if job.wait_s > 1800:
            by[market][f"missed-slo why {why}"] += share
        if attempt > 0 and job.burst_start_s is not None:
            first_wait = (job.burst_start_s - job.trace.submit_s) / 60
            by[market][f"re-run, first burst start at wait {int(first_wait // 5) * 5:>2}+ min"] += share
    print(f"{policy.name} seed {args.seed} days {args.days}: total ${sum(total.values()):,.0f}")
    for market in sorted(total):
        idle = total[market] - attributed[market]
        print(f"  {market:10} ${total[market]:>10,.0f}  (busy ${attributed[market]:,.0f}, idle ${idle:,.0f})")
        for key in sorted(by[market]):
            print(f"      {key:32} ${by[market][key]:>10,.0f}")
    hist = defaultdict(lambda: [0, 0.0])
    for job, attempt, node_ids, used, t0, why in attempts:
        if attempt == 0 and why == "guard-no-room":
            waited = ranked_wait.get(job.domain.id, (None,))[0]
            seen = early_seen.get(job.domain.id)
            bucket = (f"first ranked at wait {int(waited // 300) * 5:>2}-{int(waited // 300) * 5 + 5} min"
                      if waited is not None else "?")
            bucket += (f"; seen late at {seen[0] / 60:.0f} min room {seen[1]}" if seen
                       else "; seen late >=10 min" if seen else "; never late before")
            hist[bucket][0] += 1
            hist[bucket][1] += job.gpus * job.trace.duration_s / 3600
    print("  guard-no-room first attempts:")
    for key in sorted(hist):
        print(f"    {key:70} {hist[key][0]:5} jobs {hist[key][1]:10,.0f} GPU-h")
    print("  restart waits (requeued by an interruption to the next start), by nodes held:")
    for n in sorted(restart_waits):
        waits = sorted(restart_waits[n])
        def q(p):
            return waits[min(int(p * len(waits)), len(waits) - 1)] / 60
        print(f"    {n:>3} node(s): {len(waits):5} restarts; p50 {q(0.5):5.1f} p90 {q(0.9):5.1f} "
              f"p99 {q(0.99):5.1f} max {waits[-1] / 60:5.1f} min")
    missed = [j for j in world.jobs if j.wait_s > 1800]
    print(f"  jobs over the SLO: {len(missed)}; their GPU-h "
          f"{sum(j.gpus * j.trace.duration_s for j in missed) / 3600:,.0f} of "
          f"{sum(j.gpus * j.trace.duration_s for j in world.jobs) / 3600:,.0f}")
    for job in sorted(missed, key=lambda j: -j.gpus * j.trace.duration_s)[:12]:
        whys = [a[5] for a in attempts if a[0] is job]
        print(f"    {job.trace.job_id} {job.gpus:>3} GPUs {job.trace.duration_s / 3600:6.1f} h "
              f"wait {job.wait_s / 60:5.1f} m restarts {job.restarts} {whys}")


if __name__ == "__main__":
    main()
