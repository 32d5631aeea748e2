"""Process-side Prometheus instruments: what a process observes while it works.

The store-side families of ``/metrics`` (:mod:`orchestrator.api.metrics`) are computed from the
store at scrape time. These are the ones only the process doing the work can see: how long each
provider call took and how it failed, which rule decided each planning pass, what held launches
back, and how long ticks took. They are counted where the work happens: in the embedded loop's
process, and in every Celery worker (``burst worker``).

Celery's prefork pool forks its children, and each child counts on its own. With the
``PROMETHEUS_MULTIPROC_DIR`` environment variable set (prometheus-client's multiprocess mode, read
when ``prometheus_client`` is first imported), every process writes its samples into files in that
directory and :func:`process_collectors` merges them: an API process given the same directory
exports the workers' counts on its own ``/metrics`` (same auth as today). Only counters and
histograms live here, which multiprocess mode sums across processes correctly.

Label values are kept bounded: provider names, operations (the Provider Protocol's methods), error
classes (the typed errors of :mod:`orchestrator.domain.ports`), policy names, rules (an enum) and a
kind of limit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.registry import Collector

# Seconds: provider calls take 50 ms to minutes (a GCP operation wait), ticks a few ms to seconds.
CALL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
TICK_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

REGISTRY = CollectorRegistry(auto_describe=True)

PROVIDER_CALL_SECONDS = Histogram(
    "burst_provider_call_duration_seconds", "Duration of calls to a provider, by operation.",
    ["provider", "operation"], buckets=CALL_BUCKETS, registry=REGISTRY)
PROVIDER_CALL_ERRORS = Counter(
    "burst_provider_call_errors", "Provider calls that raised, by operation and error class.",
    ["provider", "operation", "error"], registry=REGISTRY)
DECISIONS = Counter(
    "burst_decisions", "Planning decisions made, by policy and the rule that fired.",
    ["policy", "rule"], registry=REGISTRY)
LAUNCHES_HELD_BACK = Counter(
    "burst_launches_held_back", "Planning passes where a limit held launches back, by kind of "
    "limit (limit: max_nodes and pool limits, budget, quota: a project's max_burst_gpus, "
    "offering, other).", ["policy", "kind"], registry=REGISTRY)
LEAKED_COLLECTED = Counter(
    "burst_leaked_instances_collected", "Owned instances with no live node record that the "
    "reconciler had terminated.", ["provider"], registry=REGISTRY)
TICK_SECONDS = Histogram(
    "burst_tick_seconds", "Duration of planning passes (aggregate across workers with "
    "histogram_quantile over the bucket rates).", ["policy"], buckets=TICK_BUCKETS,
    registry=REGISTRY)

# The Provider Protocol's methods that call out to the cloud.
INSTRUMENTED_OPERATIONS = frozenset({"offerings", "launch", "describe", "list_owned", "terminate",
                                     "spot_notices"})


def held_back_kind(blocker: str) -> str:
    """A bounded label for one ``Decision.held_back_by`` entry (e.g. ``limits.max_nodes``,
    ``budgets[day].max_hourly_burn_usd``, ``projects[research].max_burst_gpus``)."""
    if blocker.startswith("limits."):
        return "limit"
    if blocker.startswith("budgets["):
        return "budget"
    if blocker.startswith("projects["):
        return "quota"
    if blocker.startswith("offerings["):
        return "offering"
    return "other"


def count_decisions(decisions: Iterable[Any]) -> None:
    """Count a plan's decisions (``orchestrator.domain.plan.Decision``) and what held them back."""
    for decision in decisions:
        DECISIONS.labels(decision.policy, str(decision.rule)).inc()
        for kind in sorted({held_back_kind(b) for b in decision.held_back_by if b}):
            LAUNCHES_HELD_BACK.labels(decision.policy, kind).inc()


def observe_tick(policies: Iterable[str], duration_s: float) -> None:
    for name in policies:
        TICK_SECONDS.labels(name).observe(max(duration_s, 0.0))


class InstrumentedProvider:
    """A provider adapter whose cloud calls are timed and whose errors are counted; every other
    attribute is the adapter's own (``name``, ``region``, ...)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def inner(self) -> Any:
        return self._inner

    def __getattr__(self, attribute: str) -> Any:
        value = getattr(self._inner, attribute)
        if attribute not in INSTRUMENTED_OPERATIONS or not callable(value):
            return value
        provider = str(getattr(self._inner, "name", type(self._inner).__name__))

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return value(*args, **kwargs)
            except Exception as error:
                PROVIDER_CALL_ERRORS.labels(provider, attribute, type(error).__name__).inc()
                raise
            finally:
                PROVIDER_CALL_SECONDS.labels(provider, attribute).observe(
                    time.perf_counter() - started)

        return timed


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def process_collectors() -> list[Collector]:
    """What ``/metrics`` adds to the store-side families: this process's instruments, or, in
    multiprocess mode, every process's samples merged from the directory."""
    path = multiprocess_dir()
    if path is None:
        return [REGISTRY]
    from prometheus_client.multiprocess import MultiProcessCollector

    merged = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(merged, path=path)
    return [merged]


__all__ = ["DECISIONS", "INSTRUMENTED_OPERATIONS", "InstrumentedProvider", "LAUNCHES_HELD_BACK", "LEAKED_COLLECTED",
           "PROVIDER_CALL_ERRORS", "PROVIDER_CALL_SECONDS", "REGISTRY", "TICK_SECONDS",
           "count_decisions", "held_back_kind", "multiprocess_dir", "observe_tick",
           "process_collectors"]
