"""Diagnostic: why the jobs a policy run burst went to the cloud, by what the node model's split
said of each the first time it saw it, in GPU-hours by class (``bench/burst_tally.py``'s
classes). Prints figures; not a test. Needs ``trigger.wait_model: nodes`` and displacement.

    python bench/burst_why.py --policy bench/policies/itp-default.yaml --node-gpus 4
    python bench/burst_why.py --policy bench/policies/itp-no-spare.yaml --days 10

It wraps the planner's ``split_on_nodes`` and ``_displace`` (read-only: it records, it changes
no decision). Keys, for each burst job:

* ``late-first:blocked``: late when first seen, and it would still have started past its deadline
  with every deferred job ahead of it gone (running work, or jobs kept by displacement, hold it);
* ``late-first:cheap-insufficient``: late when first seen; removing every deferred job would have
  started it in time, but no set displacement may take (cheaper, within the lookahead, at most
  ``max_displaced``) did;
* ``late-first:ok``: displacement kept it on-prem, and it was burst later all the same;
* ``late-first:not-tried``: late, displacement not tried (no price, or the tick's tries spent);
* ``deferred-then-...``: kept for on-prem first, then late (with the same sub-keys), displaced,
  or burst without the split ever calling it late (it took room on a burst node);
* ``displaced-first``: displaced for a dearer job when first seen;
* ``never-split``: never in the split (absorbed by burst room, or past its bound when first seen).

A second table says, for each burst job the split called late when it first saw it, what held it
past its bound then: ``running`` (it starts too late even in the space of the running jobs
alone: only an interruption of running work could have kept it on-prem), ``tick-starts`` (the
jobs starting on free on-prem GPUs at that tick take the room), or ``holds-ahead`` (the
reservations of the jobs ahead of it in the queue, which displacement may move). With
``--lateness``, the running-only cases are also bucketed by how far past its bound the space of
the running jobs starts it. A last line gives the on-prem GPU-hours left free while jobs ran on
burst nodes (whole free nodes, and free GPUs of partly used ones): what bringing a burst job home
could at most reclaim. Two more say where displacement's jobs ran in the end: the jobs it burst,
and the jobs it burst them for (on burst all the same: both costs paid).
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

from burst_tally import job_class

from orchestrator.planner import wait, wait_nodes
from orchestrator.planner.backfill import INF
from orchestrator.policy import load_policy
from orchestrator.sim import SimOptions
from orchestrator.sim.controllers import PolicyController
from orchestrator.sim.engine import Engine
from orchestrator.sim.replay import as_simulated, replay, size_onprem
from trace_args import add_trace_args, trace_of


def _bucket(over_s: float) -> str:
    """How far past its bound a job starts, as a bucket name."""
    for limit, name in ((600, "<10m"), (1800, "<30m"), (3600, "<1h"), (4 * 3600, "<4h")):
        if over_s <= limit:
            return name
    return ">=4h" if over_s < INF else "never"


def main() -> None:
    parser = argparse.ArgumentParser()
    add_trace_args(parser)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--node-gpus", type=int, default=4)
    parser.add_argument("--lateness", action="store_true",
                        help="bucket the jobs running work holds by how far past their bound")
    args = parser.parse_args()
    trace = trace_of(args)
    policy = load_policy(args.policy)
    options = SimOptions(seed=args.seed, slo_s=1800.0, node_gpus=args.node_gpus, onprem="p70",
                         tick_s=60.0)
    sizing = size_onprem(trace, policy, options.onprem, options.node_gpus)
    sim = as_simulated(policy, sizing)
    displace, split = wait_nodes._displace, wait.split_on_nodes
    tried: dict[str, str] = {}
    displaced_ids: set[str] = set()  # jobs displacement burst, and the jobs it burst them for
    displaced_for: set[str] = set()
    seen: dict[str, list[str]] = {}

    def displace_seen(builder, held, job, deadline, cost, config, horizon, cloud_cost):
        moved = displace(builder, held, job, deadline, cost, config, horizon, cloud_cost)
        if moved is not None:
            for h in moved[0]:
                displaced_ids.add(h.job.id)
            displaced_for.add(job.id)
        if job.id not in tried:
            space = builder.fresh([h for h in held if not h.movable])
            found = space.earliest(job.gpus, wait_nodes._length(job))
            tried[job.id] = ("ok" if moved is not None
                             else "cheap-insufficient" if found is not None and found[0] <= deadline
                             else "blocked")
        return moved

    held_by: dict[str, str] = {}

    def split_seen(jobs, deadlines, absorbed, queue, now, width, displacement, cloud_cost):
        out = split(jobs, deadlines, absorbed, queue, now, width, displacement, cloud_cost)
        for name, indexes in (("deferred", out.deferred), ("late", out.late),
                              ("displaced", out.displaced), ("stuck", out.stuck)):
            for i in indexes:
                seen.setdefault(jobs[i].id, []).append(name)
        first_late = [i for i in out.late if jobs[i].id not in held_by]
        if first_late:
            builder = wait_nodes._Space(queue, absorbed, now)
            running = builder._build()  # (the running jobs alone: no tick starts, no holds)
            ticked = builder.fresh()
            for i in first_late:
                job, length = jobs[i], wait_nodes._length(jobs[i])
                alone = running.earliest(job.gpus, length)
                if alone is None or alone[0] > deadlines[i]:
                    over = INF if alone is None else alone[0] - deadlines[i]
                    held_by[job.id] = f"running:{_bucket(over)}" if args.lateness else "running"
                    continue
                start = ticked.earliest(job.gpus, length)
                held_by[job.id] = ("tick-starts" if start is None or start[0] > deadlines[i]
                                   else "holds-ahead")
        return out

    # On-prem GPUs free while jobs run on burst nodes, in GPU-seconds: whole free nodes, and
    # the rest (free GPUs of partly used nodes), integrated between the engine's instants.
    idle = {"whole": 0.0, "part": 0.0}
    advance = Engine._advance

    def advance_seen(engine, now: float) -> None:
        step, world = now - engine.now, engine.world
        if step > 0 and world.running_burst:
            whole = world.onprem.whole_gpus
            idle["whole"] += whole * step
            idle["part"] += (world.onprem.free_total - whole) * step
        advance(engine, now)

    wait_nodes._displace, wait.split_on_nodes = displace_seen, split_seen
    Engine._advance = advance_seen  # type: ignore[method-assign]
    try:
        engine = replay(PolicyController(sim, policy.name), policy, sim, trace, sizing, options)
    finally:
        wait_nodes._displace, wait.split_on_nodes = displace, split
        Engine._advance = advance  # type: ignore[method-assign]
    tally: dict[str, Counter] = defaultdict(Counter)
    held: dict[str, Counter] = defaultdict(Counter)
    for job in engine.world.jobs:
        if job.where != "burst":
            continue
        gpu_h = job.gpus * job.trace.duration_s / 3600.0
        states = seen.get(job.domain.id, [])
        steps = [s for k, s in enumerate(states) if k == 0 or states[k - 1] != s]
        how = tried.get(job.domain.id, "not-tried")
        if not steps:
            key = "never-split"
        elif steps[0] == "late":
            key = f"late-first:{how}"
        elif steps[0] == "displaced":
            key = "displaced-first"
        elif "displaced" in steps:
            key = "deferred-then-displaced"
        elif "late" in steps:
            key = f"deferred-then-late:{how}"
        else:
            key = "deferred-then-burst"
        for cls in (job_class(job.gpus, job.trace.duration_s), "all"):
            tally[cls][key] += gpu_h
            if job.domain.id in held_by:
                held[cls][held_by[job.domain.id]] += gpu_h
    print(f"trace {trace.name}: policy {policy.name}, seed {args.seed}; burst GPU-hours by what "
          "the split said first")
    for cls in sorted(tally):
        row = ", ".join(f"{k} {v:,.0f}" for k, v in tally[cls].most_common())
        print(f"{cls:<14} {row}")
    print(f"on-prem GPU-hours free while jobs ran on burst nodes: {idle['whole'] / 3600:,.0f} on "
          f"whole free nodes, {idle['part'] / 3600:,.0f} on partly used ones")
    # Where displacement's jobs ran in the end: a job displaced for, that ran on burst all the
    # same, makes both its cloud cost and the displaced jobs' a loss.
    fates: dict[str, Counter] = {"displaced": Counter(), "displaced for": Counter()}
    for job in engine.world.jobs:
        for name, ids in (("displaced", displaced_ids), ("displaced for", displaced_for)):
            if job.domain.id in ids:
                fates[name][f"{job.where} jobs"] += 1
                fates[name][f"{job.where} GPU-h"] += job.gpus * job.trace.duration_s / 3600.0
    for name, fate in fates.items():
        print(f"{name + ':':<14} " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(fate.items())))
    print("burst GPU-hours of the jobs late when first seen, by what held them past their bound")
    for cls in sorted(held):
        row = ", ".join(f"{k} {v:,.0f}" for k, v in held[cls].most_common())
        print(f"{cls:<14} {row}")


if __name__ == "__main__":
    main()
