"""Garbage-collector settings of burst's long-running processes (the control loop, the API, the
Celery workers, the simulator).

A tick at a real site's size allocates hundreds of thousands of small objects (the queue's
columns, 10,000 nodes' rows, the plan's records) in a process holding millions more (the policy,
the catalogue, the store's metadata). With CPython's default thresholds (700, 10, 10) the
collector's young pass runs every 700 container allocations and a full pass, which walks every
object the process holds, every 70,000: about an eighth of a tick at 100,000 pending jobs
and 10,000 nodes was collector time (docs/performance.md, "The tick's collector"). burst's objects
are nearly all acyclic (frozen dataclasses, tuples, numpy arrays), so collecting young objects
less often frees the same memory a little later and keeps the cycle detector for what it is
for. Every ``burst`` command sets them (``orchestrator.cli.main``), and so does a Celery worker
of the control plane when it starts (``worker_init``), whatever started it.
"""

from __future__ import annotations

import gc

# (young, middle, old): a young pass every 50,000 container allocations, a middle one every 20
# of those, a full one every 10 middle ones (and, as always, only when the objects that survived
# since the last full pass are a quarter of those it kept).
THRESHOLDS = (50_000, 20, 10)


def tune_gc() -> None:
    """Set the collector's thresholds for a burst process (once, at its start)."""
    gc.set_threshold(*THRESHOLDS)


__all__ = ["THRESHOLDS", "tune_gc"]
