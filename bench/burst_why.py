"""Diagnostic: why the jobs a policy run burst went to the cloud, by what the node model's split
said of each the first time it saw it, in GPU-hours by class (``bench/burst_tally.py``'s
classes). Prints figures; not a test. Needs ``trigger.wait_model: nodes`` and displacement.

    python bench/burst_why.py --policy bench/policies/itp-default.yaml --node-gpus 4
    python bench/burst_why.py --policy bench/policies/itp-spare.yaml --days 10

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
"""

from __future__ import annotations

import argparse
from collections import Counter, defaultdict

from burst_tally import job_class

from orchestrator.planner import wait, wait_nodes
from orchestrator.policy import load_policy
from orchestrator.sim import SimOptions
from orchestrator.sim.controllers import PolicyController
from orchestrator.sim.replay import as_simulated, replay, size_onprem
from trace_args import add_trace_args, trace_of


def main() -> None:
    parser = argparse.ArgumentParser()
    add_trace_args(parser)
    parser.add_argument("--policy", required=True)
    parser.add_argument("--node-gpus", type=int, default=4)
    args = parser.parse_args()
    trace = trace_of(args)
    policy = load_policy(args.policy)
    options = SimOptions(seed=args.seed, slo_s=1800.0, node_gpus=args.node_gpus, onprem="p70",
                         tick_s=60.0)
    sizing = size_onprem(trace, policy, options.onprem, options.node_gpus)
    sim = as_simulated(policy, sizing)
    displace, split = wait_nodes._displace, wait.split_on_nodes
    tried: dict[str, str] = {}
    seen: dict[str, list[str]] = {}

    def displace_seen(builder, held, job, deadline, cost, config, horizon, cloud_cost):
        moved = displace(builder, held, job, deadline, cost, config, horizon, cloud_cost)
        if job.id not in tried:
            space = builder.fresh([h for h in held if not h.movable])
            found = space.earliest(job.gpus, wait_nodes._length(job))
            tried[job.id] = ("ok" if moved is not None
                             else "cheap-insufficient" if found is not None and found[0] <= deadline
                             else "blocked")
        return moved

    def split_seen(jobs, deadlines, absorbed, queue, now, width, displacement, cloud_cost):
        out = split(jobs, deadlines, absorbed, queue, now, width, displacement, cloud_cost)
        for name, indexes in (("deferred", out.deferred), ("late", out.late),
                              ("displaced", out.displaced), ("stuck", out.stuck)):
            for i in indexes:
                seen.setdefault(jobs[i].id, []).append(name)
        return out

    wait_nodes._displace, wait.split_on_nodes = displace_seen, split_seen
    try:
        engine = replay(PolicyController(sim, policy.name), policy, sim, trace, sizing, options)
    finally:
        wait_nodes._displace, wait.split_on_nodes = displace, split
    tally: dict[str, Counter] = defaultdict(Counter)
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
    print(f"trace {trace.name}: policy {policy.name}, seed {args.seed}; burst GPU-hours by what "
          "the split said first")
    for cls in sorted(tally):
        row = ", ".join(f"{k} {v:,.0f}" for k, v in tally[cls].most_common())
        print(f"{cls:<14} {row}")


if __name__ == "__main__":
    main()
