"""The trace arguments the simulator's bench and analysis scripts share (``--trace``, ``--days``,
``--seed``) and the trace they name. Each script adds its own policy and sizing arguments."""

from __future__ import annotations

import argparse

from orchestrator.sim import load_trace
from orchestrator.sim.traces import Trace


def add_trace_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trace", default="itp", help="a bundled trace (itp, philly, alibaba)")
    parser.add_argument("--days", type=float, default=None, help="only the first DAYS days")
    parser.add_argument("--seed", type=int, default=0, help="the simulator's seed")


def trace_of(args: argparse.Namespace) -> Trace:
    """The trace ``args`` name, cut to its first ``--days`` where given."""
    trace = load_trace(args.trace)
    return trace if args.days is None else trace.first_days(args.days)
