"""Digest of one policy replay's outcomes, to show a speed change left them alone: every job's
(id, state, start, end, where, wait, burst nodes, restarts), every node's life (id, offering,
created, state since, state, launched for), the cost, the decisions and limits by rule, the
forecasts recorded. Run it on two commits (a ``git archive`` of the old one with the same
interpreter) and compare the lines. Prints figures; not a test.

    python bench/replay_digest.py --trace itp --policy bench/policies/itp-default.yaml --node-gpus 4
    python bench/replay_digest.py --trace philly
    python bench/replay_digest.py --trace alibaba

Setting as ``bench/bench_replay.py`` (on-prem at the p70, seed 0, tick 1 minute).
"""

from __future__ import annotations

import argparse
import hashlib

from orchestrator.policy import DEFAULT_POLICY_PATH, load_policy
from orchestrator.sim import SimOptions
from orchestrator.sim.controllers import PolicyController
from orchestrator.sim.replay import as_simulated, replay, size_onprem
from trace_args import add_trace_args, trace_of


def _digest(value) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser()
    add_trace_args(parser)
    parser.add_argument("--policy", default=str(DEFAULT_POLICY_PATH))
    parser.add_argument("--node-gpus", type=int, default=None)
    args = parser.parse_args()

    trace = trace_of(args)
    policy = load_policy(args.policy)
    options = SimOptions(seed=args.seed, node_gpus=args.node_gpus)
    sizing = size_onprem(trace, policy, options.onprem, options.node_gpus)
    sim = as_simulated(policy, sizing)
    engine = replay(PolicyController(sim, policy.name), policy, sim, trace, sizing, options)
    jobs = [(j.trace.job_id, j.state, j.start_s, j.end_s, j.where, j.wait_s, j.burst_nodes,
             j.restarts) for j in engine.world.jobs]
    nodes = [(n.id, n.offering_key, n.created_at, n.state_since, n.state, n.launched_for)
             for n in engine.store.nodes(include_terminated=True)]
    cost = sum(b.cost_micro_usd for b in engine.provider.bills())
    counters = engine.counters
    print(f"trace {trace.name} policy {policy.name}: {len(jobs):,} jobs, {len(nodes):,} nodes, "
          f"plans {counters.plans:,}, slept {counters.slept_ticks:,}")
    print(f"cost micro-USD {cost}")
    print(f"jobs {_digest(jobs)}")
    print(f"nodes {_digest(nodes)}")
    print(f"rules {_digest(sorted(engine.store.rules.items()))} "
          f"held_back {_digest(sorted(engine.store.held_back.items()))}")
    print(f"predictions {_digest(engine.store.predictions)}")


if __name__ == "__main__":
    main()
