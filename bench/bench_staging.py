"""Benchmark: what the data-staging rule (``pool.storage``) adds to plan() on large queues.
Prints figures; not a test.

    python bench/bench_staging.py [JOBS]   # default 100000

The snapshot of ``bench/bench_plan.py`` (JOBS pending jobs as columns, 1,000 burst nodes, 50
offerings), planned twice by the same policy without storage (the floor, measured in the same run)
and with ``pool.storage`` (500 GB per job): cold ms (first plan of the queue), warm ms (again).
"""

from __future__ import annotations

import random
import sys
import time

import yaml

from bench.bench_plan import NOW, as_columns, make_policy, make_snapshot
from orchestrator.planner import plan
from orchestrator.policy import load_policy_text


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    snapshot = as_columns(make_snapshot(jobs, 1000, random.Random(0)))
    base = make_policy(50)
    doc = base.model_dump(mode="json", exclude_none=True)
    doc["pool"]["storage"] = {"datasets": [{"uri": "nfs://fs/d", "size_gb": 500}],
                              "egress_usd_per_gb": 0.09}
    staged = load_policy_text(yaml.safe_dump(doc), "bench")
    print(f"{jobs:,} pending jobs")
    for name, policy in (("floor: no storage", base), ("pool.storage", staged)):
        times = []
        for _ in range(2):
            began = time.perf_counter()
            result = plan(snapshot, [policy], NOW)
            times.append((time.perf_counter() - began) * 1000)
        staging = result.decisions[0].inputs.get("staging", {})
        print(f"{name:18} cold {times[0]:7.0f} ms  warm {times[1]:7.0f} ms  rule "
              f"{result.decisions[0].rule}  staging rows {len(staging.get('jobs', {}))}")


if __name__ == "__main__":
    main()
