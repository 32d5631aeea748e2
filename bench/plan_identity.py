"""Check that a planner change decides identically: dump ``repr(plan(...))`` over generated
snapshots, run it on two commits, compare. Prints figures; not a test.

    git stash; python bench/plan_identity.py --out /tmp/before.json; git stash pop
    python bench/plan_identity.py --out /tmp/after.json
    python bench/plan_identity.py --compare /tmp/before.json /tmp/after.json

Cases: the three ``bench_plan.py`` snapshots, 160 mixed ones (0 to 6,000 jobs, 0 to 400 burst
nodes, ties in submit time, limits and quotas that bind or not, every sixth with ``wait_slo``),
and 200 with ``wait_slo: 30m`` and jobs submitted in the last 15 minutes to 2 hours, so jobs are
deferred to on-prem and kept waiting; with ``--large``, 8 random large ones (30k to 200k jobs, up
to 10k nodes). ``--columns`` hands each queue to the planner as the
:class:`~orchestrator.domain.pending.PendingColumns` a queue source builds from its rows: the
plans must equal those of the tuple form.

    python bench/plan_identity.py --large --out /tmp/after.json
    python bench/plan_identity.py --large --columns --out /tmp/columns.json The repr holds every action and the whole decision record,
dict order included.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from datetime import timedelta
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_plan import NOW, as_columns, make_policy, make_snapshot  # noqa: E402

from orchestrator.domain import Job, Node, NodeState, OnPremState, PoolQueue, Snapshot  # noqa: E402
from orchestrator.domain.snapshot import OnPremRelease  # noqa: E402
from orchestrator.planner import plan  # noqa: E402
from orchestrator.policy import Market, load_policy_text  # noqa: E402


def policy(offerings: int, *, projects: bool = True, wait: bool = False, max_nodes: int = 10000,
           quota: int = 4000, launches: int = 200, spend: float | None = None,
           prio: bool = True) -> object:
    specs = [{"provider": "sim", "region": "r", "zone": "z", "instance_type": f"t{i}",
              "market": "spot" if i % 2 else "on-demand", "gpus": [1, 2, 4, 8][i % 4],
              "price_usd_hour": round(1.0 + i * 0.37 % 30, 2)} for i in range(offerings)]
    doc: dict = {"version": 1, "name": "bench",
                 "pool": {"name": "gpu", "onprem": {"nodes": 500, "gpus_per_node": 8}},
                 "trigger": {"sustained_for": "0s", **({"wait_slo": "30m"} if wait else {})},
                 "offerings": specs,
                 "limits": {"max_nodes": max_nodes, "max_concurrent_launches": launches,
                            **({"max_hourly_spend_usd": spend} if spend else {})}}
    if projects:
        doc["projects"] = [{"name": f"p{i}", "priority": (i % 3) if prio else 0,
                            "max_burst_gpus": quota} for i in range(20)]
    return load_policy_text(yaml.safe_dump(doc), "bench")


def mixed_snapshot(rng: random.Random, jobs: int, nodes: int, *, ties: bool, unique_ids: bool,
                   levels: int, free_choices: tuple[int, ...]) -> Snapshot:
    widths = [1] * 50 + [2] * 25 + [4] * 15 + [8] * 10 + [16] * 2
    pending = []
    for i in range(jobs):
        age = rng.randrange(1, 86400)
        if ties:
            age -= age % 600
        job_id = f"j{i}" if unique_ids else f"j{rng.randrange(10**6)}"
        pending.append(Job(job_id, f"p{rng.randrange(24)}", "gpu", rng.choice(widths),
                           NOW - timedelta(seconds=age), priority=rng.randrange(levels),
                           duration_s=rng.choice([600, 3600, 14400, None])))
    states = [NodeState.READY] * 7 + [NodeState.BOOTING, NodeState.DRAINING, NodeState.LAUNCHING]
    fleet = tuple(Node(f"n{i}", "bench", "gpu", "sim", f"sim/r/z/t{i % 8}/spot", f"t{i % 8}",
                       Market.SPOT, 8, 9.5, rng.choice(states),
                       NOW - timedelta(minutes=rng.randrange(1, 600)), NOW - timedelta(hours=1),
                       f"r{i}", instance_id=f"i{i}", project=f"p{i % 20}",
                       gpus_busy=rng.choice([0, 8, 8, 8, 4, 7]), running_jobs=1, idle_since=None,
                       last_heartbeat=NOW) for i in range(nodes))
    free = tuple(rng.choice(free_choices) for _ in range(max(jobs // 100, 5)))
    releases = tuple(OnPremRelease(rng.choice([1, 2, 4, 8]),
                                   NOW + timedelta(minutes=rng.randrange(1, 120)))
                     for _ in range(20))
    queue = PoolQueue("gpu", OnPremState(sum(free) + 4000, sum(free), free), tuple(pending),
                      onprem_releases=releases)
    return Snapshot(NOW, {"gpu": queue}, fleet, ())


def fresh_snapshot(rng: random.Random, jobs: int, span_s: int) -> Snapshot:
    pending = tuple(Job(f"j{i}", f"p{rng.randrange(6)}", "gpu", rng.choice([1, 1, 2, 4, 8, 16]),
                        NOW - timedelta(seconds=rng.randrange(0, span_s)),
                        priority=rng.randrange(2), duration_s=rng.choice([600, 3600, None]))
                    for i in range(jobs))
    free = tuple(rng.choice([0, 1, 2, 8]) for _ in range(rng.choice([2, 20])))
    releases = tuple(OnPremRelease(rng.choice([1, 2, 4, 8]),
                                   NOW + timedelta(minutes=rng.randrange(0, 40)))
                     for _ in range(rng.choice([0, 5, 40])))
    queue = PoolQueue("gpu", OnPremState(sum(free) + 64, sum(free), free), pending,
                      onprem_releases=releases)
    return Snapshot(NOW, {"gpu": queue}, (), ())


def cases():
    rng = random.Random(42)
    for jobs, nodes, offerings in [(1_000, 100, 10), (10_000, 1_000, 50), (100_000, 10_000, 500)]:
        yield make_policy(offerings), make_snapshot(jobs, nodes, rng)
    rng = random.Random(7)
    for k in range(160):
        jobs = rng.choice([0, 1, 5, 50, 300, 2000, 6000])
        nodes = rng.choice([0, 3, 40, 400])
        snapshot = mixed_snapshot(rng, jobs, nodes, ties=k % 3 == 0, unique_ids=k % 5 != 0,
                                  levels=rng.choice([1, 3]),
                                  free_choices=rng.choice([(0, 0, 0, 1, 2), (0,), (8, 3, 0), (1,)]))
        yield policy(rng.choice([1, 4, 10]), projects=k % 4 != 0, wait=k % 6 == 1,
                     max_nodes=rng.choice([5, 10000, 60]), quota=rng.choice([16, 4000]),
                     launches=rng.choice([3, 200]), spend=rng.choice([None, 50, 5000]),
                     prio=k % 7 != 0), snapshot
    rng = random.Random(11)
    for k in range(200):
        snapshot = fresh_snapshot(rng, rng.choice([1, 5, 50, 300, 2000]),
                                  rng.choice([900, 2400, 7200]))
        yield policy(rng.choice([1, 4, 10]), projects=k % 4 != 0, wait=True,
                     max_nodes=rng.choice([5, 10000]), quota=rng.choice([16, 4000]),
                     launches=rng.choice([3, 200]), prio=k % 3 != 0), snapshot


def large_cases():
    """Random large snapshots: 30k to 200k pending jobs, up to 10k burst nodes, ties in submit
    time, one or three priority levels, with and without wait_slo (jobs fresh enough to defer)."""
    rng = random.Random(17)
    for k in range(8):
        jobs = [30_000, 100_000, 200_000][k % 3]
        if k % 2:
            snapshot = fresh_snapshot(rng, jobs, rng.choice([2400, 7200, 86400]))
        else:
            snapshot = mixed_snapshot(rng, jobs, [0, 2000, 10_000][k % 3], ties=k % 4 == 0,
                                      unique_ids=k != 4, levels=rng.choice([1, 3]),
                                      free_choices=rng.choice([(0, 0, 0, 1, 2), (8, 3, 0)]))
        yield policy(rng.choice([4, 10, 500]), projects=k != 2, wait=k % 3 != 2,
                     max_nodes=rng.choice([60, 10000]), quota=rng.choice([16, 4000]),
                     launches=rng.choice([3, 200]), prio=k != 6), snapshot



def main() -> None:
    parser = argparse.ArgumentParser()
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", type=Path, help="write the plans' reprs to this JSON file")
    group.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--large", action="store_true",
                        help="also the 8 random large snapshots (30k to 200k jobs; minutes)")
    parser.add_argument("--columns", action="store_true",
                        help="hand the planner each queue as PendingColumns built from rows")
    args = parser.parse_args()
    if args.out:
        every = itertools.chain(cases(), large_cases() if args.large else ())
        form = as_columns if args.columns else (lambda s: s)
        plans = []
        for number, (pol, snapshot) in enumerate(every):
            plans.append(repr(plan(form(snapshot), [pol], NOW)))
            if number % 100 == 99 or number >= 363:
                print(f"  {number + 1} plans", file=sys.stderr, flush=True)
        args.out.write_text(json.dumps(plans))
        waiting = sum("deferred to on-prem" in p for p in plans)
        print(f"{len(plans)} plans written to {args.out} ({waiting} with jobs deferred to on-prem)")
        return
    before, after = (json.loads(p.read_text()) for p in args.compare)
    differ = [i for i, (a, b) in enumerate(zip(before, after)) if a != b]
    print(f"{len(before)} and {len(after)} plans; {len(differ)} differ"
          + (f" (cases {differ[:20]})" if differ else ""))
    sys.exit(1 if differ or len(before) != len(after) else 0)


if __name__ == "__main__":
    main()
