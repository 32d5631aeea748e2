"""Benchmark: what `burst --help` costs against the floor of importing typer and rich. Prints
figures; not a test (tests/unit/test_cli_startup.py checks, structurally, what --help imports).

    python bench/bench_cli_startup.py [--repeat 15] [--command "--help"]

Runs, interleaved so that both see the same load, ``--repeat`` fresh interpreters of

* the floor: ``python -c "import typer, rich"``;
* burst: the ``burst`` entry point (``from orchestrator.cli import main; main()``) with the
  given arguments (default ``--help``; e.g. ``--command "status --help"``),

and prints the best and the median wall time of each and their ratio (best over best: the least
disturbed runs; the median shows how noisy the machine was). The issue's target: burst at most
2x the floor, on the same machine, in the same run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wall(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="interpreters of each (default 15)")
    parser.add_argument("--command", default="--help", help="burst arguments (default --help)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    floor_argv = [sys.executable, "-c", "import typer, rich"]
    burst_argv = [sys.executable, "-c", "from orchestrator.cli import main; main()",
                  *shlex.split(args.command)]
    wall(floor_argv, env), wall(burst_argv, env)  # warm the file cache; not counted
    floor: list[float] = []
    burst: list[float] = []
    for _ in range(args.repeat):
        floor.append(wall(floor_argv, env))
        burst.append(wall(burst_argv, env))
    print(f"floor  python -c 'import typer, rich'   best {min(floor) * 1000:6.0f} ms   "
          f"median {statistics.median(floor) * 1000:6.0f} ms")
    print(f"burst  burst {args.command:<24}   best {min(burst) * 1000:6.0f} ms   "
          f"median {statistics.median(burst) * 1000:6.0f} ms")
    print(f"ratio  best/best {min(burst) / min(floor):.2f}   "
          f"median/median {statistics.median(burst) / statistics.median(floor):.2f}   "
          f"(target: at most 2.00; {args.repeat} runs each, interleaved)")


if __name__ == "__main__":
    main()
