"""Build the bundled ITP trace sample ``orchestrator/sim/data/itp-sample.csv`` from the real trace.

Run from the repository root (rerunnable; the output is deterministic, byte for byte)::

    python scripts/build_trace_sample.py --data ../shared/data
    python scripts/build_trace_sample.py --data ../shared/data --check

The sample is one whole cluster of the Microsoft ITP ElasticFlow traces (``--cluster``, default
``cluster10``: 260 jobs over two months, 1 to 16 GPUs; MIT licence, Copyright (c) Microsoft
Corporation), converted to the canonical format (``job_id,submit_s,duration_s,gpus,project,priority``):
the job id is ``clusterNN/<uuid>``, the cluster is the project, and submit times, durations and GPU
counts are the trace's, unchanged. The licence and attribution sit beside it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.sim.traces import ITP_DIR, load_itp, to_canonical  # noqa: E402

OUT = ROOT / "orchestrator" / "sim" / "data" / "itp-sample.csv"
CLUSTER = "cluster10"


def build(data: Path, cluster: str) -> str:
    trace = load_itp(data / ITP_DIR)
    jobs = [j for j in trace.jobs if j.project == cluster]
    if not jobs:
        raise SystemExit(f"no jobs of {cluster} in {data / ITP_DIR}")
    return to_canonical(jobs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--cluster", default=CLUSTER)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs")
    args = parser.parse_args()
    text = build(args.data, args.cluster)
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out} ({text.count(chr(10)) - 1} jobs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
