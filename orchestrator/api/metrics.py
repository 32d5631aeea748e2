"""Prometheus ``/metrics``: gauges and counters computed from the store at scrape time.

Nothing is counted in this process: a custom Collector reads the store on each scrape, so every
API replica reports the same numbers, a restart loses nothing, and the Celery workers need no
metrics port of their own. The families (all prefixed ``burst_``):

=========================================  =========  ==============================================
family                                     type       labels / meaning
=========================================  =========  ==============================================
``burst_nodes``                            gauge      state, provider, pool: live nodes per state
``burst_node_launches_total``              counter    provider, pool: launches the provider accepted
``burst_node_failures_total``              counter    provider, reason: nodes that failed, by kind
``burst_spend_rate_usd_per_hour``          gauge      pool: summed hourly price of live nodes
``burst_budget_used_ratio``                gauge      policy, budget, project: spent+committed/limit
``burst_budget_spent_usd``                 gauge      policy, budget, project: spent this window
``burst_budget_limit_usd``                 gauge      policy, budget, project: the window's limit
``burst_queue_pending_jobs``               gauge      pool: jobs waiting in the built-in queue
``burst_queue_pending_gpus``               gauge      pool: GPUs those jobs ask for
``burst_queue_oldest_wait_seconds``        gauge      pool: wait of the oldest pending job
``burst_queue_mean_wait_seconds``          gauge      pool: mean wait of the pending jobs
``burst_tick_duration_seconds``            summary    policy: count and sum of tick durations
``burst_tick_last_duration_seconds``       gauge      policy: duration of the latest tick
``burst_tick_last_timestamp_seconds``      gauge      policy: when the latest tick ran (Unix time)
=========================================  =========  ==============================================

More store-side families (lifecycle latency histograms, launch failures per offering, nodes past
a timeout, budget grades and forecasts, cumulative cost, leader tenures, build info) are in
:mod:`orchestrator.api.fleet_metrics`, measured GPU use and idle GPUs in
:mod:`orchestrator.api.usage_metrics`; the process-side ones (provider calls, decisions, launches
held back, tick histogram; merged across Celery workers in multiprocess mode) in
:mod:`orchestrator.instruments`. docs/monitoring.md lists them all.

Failure reasons are reduced to a small set of kinds (a provider error kind such as ``capacity``,
a timeout such as ``boot-timeout``, ``vanished``, else ``other``) so the label stays bounded.
The endpoint is admin-only: budgets and spend rates are every project's numbers.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from orchestrator.api import fleet_metrics, usage_metrics
from orchestrator.domain.nodes import NodeState
from orchestrator.instruments import process_collectors
from orchestrator.domain.plan import ActionReason
from orchestrator.wiring import Runtime

log = logging.getLogger(__name__)

# What the executor writes before the first ':' of a failure reason (see Executor._call_launch).
_PROVIDER_KINDS = {"capacity error": "capacity", "quota error": "quota",
                   "CapacityError": "capacity", "QuotaError": "quota", "AuthError": "auth",
                   "TransientError": "transient", "InvalidRequest": "invalid-request",
                   "ProviderError": "provider"}
_REASON_KINDS = frozenset(r.value for r in ActionReason)
LIVE_STATES = tuple(s for s in NodeState if s is not NodeState.TERMINATED)


def failure_kind(reason: str) -> str:
    """A bounded label for a node's failure reason (the event's free text)."""
    head = reason.split(":", 1)[0].strip()
    if head in _PROVIDER_KINDS:
        return _PROVIDER_KINDS[head]
    if head in _REASON_KINDS:
        return head
    if head.startswith("provider "):
        return "provider-unavailable"  # not configured here, or stopped after an auth error
    if "vanished" in reason:
        return "vanished"
    return "other"


class StoreCollector(Collector):
    """Reads the store on each scrape (see the module docstring)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        now = self.runtime.clock.now()
        errors = GaugeMetricFamily("burst_scrape_errors",
                                   "1 where a group of families could not be read this scrape.",
                                   labels=["section"])
        rt = self.runtime
        sections = (("nodes", self._nodes), ("queue", lambda: self._queue(now)),
                    ("ticks", self._ticks), ("budgets", lambda: self._budgets(now)),
                    ("lifecycle", lambda: fleet_metrics.lifecycle_families(rt)),
                    ("failures", lambda: fleet_metrics.failure_families(rt, now)),
                    ("ledger", lambda: fleet_metrics.ledger_families(rt)),
                    ("utilisation", lambda: usage_metrics.utilisation_families(rt, now)),
                    ("build", fleet_metrics.build_info))
        for name, section in sections:
            # Each group is read whole before any of it is yielded, and a failing group is
            # reported rather than failing the scrape: the other families still arrive.
            try:
                families = list(section())
            except Exception:  # noqa: BLE001 - any store or budget error
                log.exception("metrics: cannot read the %s families", name)
                families = []
                errors.add_metric([name], 1)
            else:
                errors.add_metric([name], 0)
            yield from families
        yield errors

    def _nodes(self) -> Iterator[Metric]:
        store = self.runtime.store
        counts = store.node_counts()
        nodes = GaugeMetricFamily("burst_nodes", "Burst nodes not yet terminated, by state.",
                                  labels=["state", "provider", "pool"])
        places = sorted({(provider, pool) for _, provider, pool in counts})
        for provider, pool in places:
            for state in LIVE_STATES:
                nodes.add_metric([state.value, provider, pool],
                                 counts.get((state.value, provider, pool), 0))
        yield nodes

        launches = CounterMetricFamily("burst_node_launches", "Launches the provider accepted.",
                                       labels=["provider", "pool"])
        failures = CounterMetricFamily("burst_node_failures", "Nodes that failed, by reason kind.",
                                       labels=["provider", "reason"])
        launched: dict[tuple[str, str], int] = {}
        failed: dict[tuple[str, str], int] = {}
        for to_state, provider, pool, reason, count in store.transition_counts(
                (NodeState.LAUNCHING, NodeState.FAILED)):
            if to_state == NodeState.LAUNCHING.value:
                launched[(provider, pool)] = launched.get((provider, pool), 0) + count
            else:
                key = (provider, failure_kind(reason))
                failed[key] = failed.get(key, 0) + count
        for key, count in sorted(launched.items()):
            launches.add_metric(list(key), count)
        for key, count in sorted(failed.items()):
            failures.add_metric(list(key), count)
        yield launches
        yield failures

        spend = GaugeMetricFamily("burst_spend_rate_usd_per_hour",
                                  "Summed hourly price of the pool's nodes not yet terminated.",
                                  labels=["pool"])
        rates = store.live_spend_by_pool()
        for pool in sorted(set(rates) | set(self._pools())):
            spend.add_metric([pool], rates.get(pool, 0.0))
        yield spend

    def _queue(self, now: datetime) -> Iterator[Metric]:
        depth = GaugeMetricFamily("burst_queue_pending_jobs", "Pending jobs of the built-in queue.",
                                  labels=["pool"])
        gpus = GaugeMetricFamily("burst_queue_pending_gpus", "GPUs the pending jobs ask for.",
                                 labels=["pool"])
        oldest = GaugeMetricFamily("burst_queue_oldest_wait_seconds",
                                   "Wait of the oldest pending job.", labels=["pool"])
        mean = GaugeMetricFamily("burst_queue_mean_wait_seconds",
                                 "Mean wait of the pending jobs.", labels=["pool"])
        pending = self.runtime.store.pending_jobs()
        for pool in sorted({j.pool for j in pending} | set(self._pools())):
            waits = [max((now - j.submitted_at).total_seconds(), 0.0)
                     for j in pending if j.pool == pool]
            depth.add_metric([pool], len(waits))
            gpus.add_metric([pool], sum(j.gpus for j in pending if j.pool == pool))
            oldest.add_metric([pool], max(waits, default=0.0))
            mean.add_metric([pool], sum(waits) / len(waits) if waits else 0.0)
        yield from (depth, gpus, oldest, mean)

    def _ticks(self) -> Iterator[Metric]:
        summary = SummaryMetricFamily("burst_tick_duration_seconds",
                                      "Duration of the control loop's ticks.", labels=["policy"])
        last = GaugeMetricFamily("burst_tick_last_duration_seconds",
                                 "Duration of the latest tick.", labels=["policy"])
        when = GaugeMetricFamily("burst_tick_last_timestamp_seconds",
                                 "When the latest tick ran (Unix time).", labels=["policy"])
        for stat in self.runtime.store.tick_stats():
            summary.add_metric([stat.policy], count_value=stat.ticks,
                               sum_value=stat.total_duration_s)
            last.add_metric([stat.policy], stat.last_duration_s)
            when.add_metric([stat.policy], stat.last_at.timestamp())
        yield from (summary, last, when)

    def _budgets(self, now: datetime) -> Iterator[Metric]:
        used = GaugeMetricFamily("burst_budget_used_ratio",
                                 "Spent plus committed over the limit, this budget window.",
                                 labels=["policy", "budget", "project"])
        spent = GaugeMetricFamily("burst_budget_spent_usd", "Spent in this budget window.",
                                  labels=["policy", "budget", "project"])
        limit = GaugeMetricFamily("burst_budget_limit_usd", "Limit of this budget window.",
                                  labels=["policy", "budget", "project"])
        statuses = budget_statuses_of(self.runtime, now)
        for status in statuses:
            labels = [status.policy, status.budget, status.project or ""]
            used.add_metric(labels, float(status.used_fraction))
            spent.add_metric(labels, float(status.spent_usd))
            limit.add_metric(labels, float(status.limit_usd))
        yield from (used, spent, limit)
        yield from fleet_metrics.budget_families(statuses, self.runtime)

    def _pools(self) -> list[str]:
        return sorted({p.pool.name for p in self.runtime.policies.values()})


def budget_statuses_of(runtime: Runtime, now: datetime) -> list:
    """Every budget of the running policies, as :mod:`orchestrator.costs.budgets` reports it."""
    from orchestrator.costs.budgets import budget_statuses

    return budget_statuses(runtime.store, list(runtime.policies.values()), now)


def registry_for(runtime: Runtime) -> CollectorRegistry:
    """A registry of its own per app (the global one would mix apps, e.g. in tests)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(runtime))
    for collector in process_collectors():
        registry.register(collector)
    return registry


__all__ = ["StoreCollector", "budget_statuses_of", "failure_kind", "registry_for"]
