"""Store-side ``/metrics`` families for operators and alert rules: node lifecycle latency, launch
failures per offering, nodes stuck past a timeout, budget grades and forecasts, cumulative burst
cost, leader tenures and build info.

Like the families of :mod:`orchestrator.api.metrics`, these are computed from the store at scrape
time (every API replica reports the same numbers; a restart loses nothing). Families:

================================================  =========  ======================================
family                                            type       labels / meaning
================================================  =========  ======================================
``burst_node_launch_to_ready_seconds``            histogram  provider, offering: launching→ready
``burst_node_ready_to_drain_seconds``             histogram  provider, offering: ready→draining
``burst_node_drain_duration_seconds``             histogram  provider, offering: draining→terminating
``burst_launch_failures_total``                   counter    provider, offering, reason: nodes that
                                                             failed before they booted
``burst_nodes_past_timeout``                      gauge      policy, state, provider: live nodes in
                                                             a state longer than its timeout
``burst_budget_grade``                            gauge      policy, budget, project, grade: 1 for
                                                             the grade in force (``none``: none)
``burst_budget_forecast_usd``                     gauge      policy, budget, project: window's end
                                                             at the current burn
``burst_budget_burn_usd_per_hour``                gauge      policy, budget, project: current burn
``burst_budget_window_end_timestamp_seconds``     gauge      policy, budget, project
``burst_budget_grade_crossings_total``            counter    policy, budget, grade: grades reached
``burst_cost_usd_total``                          counter    provider, project: burst cost in the
                                                             ledger
``burst_leader_tenures_total``                    counter    scope: leaders so far (fencing token)
``burst_build_info``                              gauge      version, python: always 1
================================================  =========  ======================================

A lifecycle histogram observes each node once, when it has reached the later state; the
observations are rebuilt from the events at each scrape, so they are counters over the whole
history like any other histogram.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from datetime import datetime
from importlib import metadata

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from orchestrator.costs.budgets import BudgetStatus
from orchestrator.domain.nodes import NodeState
from orchestrator.lifecycle import overdue, state_timeouts
from orchestrator.wiring import Runtime

S = NodeState
# Seconds: a boot takes one to ten minutes, a node serves minutes to days, a drain minutes.
LIFECYCLE_BUCKETS = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0,
                     21600.0, 86400.0)
# (family, help, from state, to states: the first reached ends the span)
SPANS = (
    ("burst_node_launch_to_ready_seconds", "Seconds from launching to ready, per node.",
     S.LAUNCHING, (S.READY,)),
    ("burst_node_ready_to_drain_seconds", "Seconds a node served: from ready to draining.",
     S.READY, (S.DRAINING,)),
    ("burst_node_drain_duration_seconds", "Seconds from draining to terminating.",
     S.DRAINING, (S.TERMINATING, S.TERMINATED)),
)


def version() -> str:
    try:
        return metadata.version("burst")
    except metadata.PackageNotFoundError:
        return "unknown"


def lifecycle_families(runtime: Runtime) -> Iterator[Metric]:
    marks = runtime.store.lifecycle_marks()
    for name, doc, start, ends in SPANS:
        spans: dict[tuple[str, str], list[float]] = {}
        for mark in marks:
            began = mark.entered.get(start)
            ended = next((mark.entered[s] for s in ends if s in mark.entered), None)
            if began is None or ended is None:
                continue
            spans.setdefault((mark.provider, mark.offering), []).append(
                max((ended - began).total_seconds(), 0.0))
        family = HistogramMetricFamily(name, doc, labels=["provider", "offering"])
        for key, values in sorted(spans.items()):
            buckets = [(repr(le), sum(1 for v in values if v <= le)) for le in LIFECYCLE_BUCKETS]
            buckets.append(("+Inf", len(values)))
            family.add_metric(list(key), buckets, sum_value=sum(values))
        yield family


def failure_families(runtime: Runtime, now: datetime) -> Iterator[Metric]:
    from orchestrator.api.metrics import failure_kind

    failures = CounterMetricFamily(
        "burst_launch_failures", "Nodes that failed before they booted, by offering.",
        labels=["provider", "offering", "reason"])
    counts: dict[tuple[str, str, str], int] = {}
    for provider, offering, reason, count in runtime.store.launch_failure_counts():
        key = (provider, offering, failure_kind(reason))
        counts[key] = counts.get(key, 0) + count
    for key, count in sorted(counts.items()):
        failures.add_metric(list(key), count)
    yield failures

    stuck = GaugeMetricFamily(
        "burst_nodes_past_timeout", "Live nodes in a state longer than its timeout (the "
        "reconciler should have moved them on; draining: past the drain deadline).",
        labels=["policy", "state", "provider"])
    timeouts = {name: state_timeouts(policy) for name, policy in runtime.policies.items()}
    # Every (policy, timed state, provider) is reported, 0 included: a series that comes and goes
    # would make "for: 10m" alert rules restart.
    found: dict[tuple[str, str, str], int] = {
        (name, state.value, str(spec.provider)): 0
        for name, policy in runtime.policies.items()
        for state in (*(t.state for t in timeouts[name]), S.DRAINING)
        for spec in policy.offerings}
    for node in runtime.store.nodes():
        late = overdue(node, timeouts.get(node.policy, ()), now)
        key = (node.policy, node.state.value, node.provider)
        found[key] = found.get(key, 0) + (1 if late else 0)
    for key, count in sorted(found.items()):
        stuck.add_metric(list(key), count)
    yield stuck


def budget_families(statuses: list[BudgetStatus], runtime: Runtime) -> Iterator[Metric]:
    labels = ["policy", "budget", "project"]
    grade = GaugeMetricFamily("burst_budget_grade", "1 for the budget's grade in force (none: no "
                              "grade reached), 0 for its other grades.", labels=[*labels, "grade"])
    forecast = GaugeMetricFamily("burst_budget_forecast_usd", "What the budget window ends at if "
                                 "the current burn goes on.", labels=labels)
    burn = GaugeMetricFamily("burst_budget_burn_usd_per_hour", "Hourly prices of the budget's "
                             "live nodes.", labels=labels)
    end = GaugeMetricFamily("burst_budget_window_end_timestamp_seconds", "When the budget's "
                            "current window ends (Unix time).", labels=labels)
    for status in statuses:
        key = [status.policy, status.budget, status.project or ""]
        policy = runtime.policies.get(status.policy)
        budget = next((b for b in policy.budgets if b.name == status.budget), None) if policy else None
        actions = ["none", *dict.fromkeys(str(g.action) for g in (budget.grades if budget else []))]
        for action in actions:
            grade.add_metric([*key, action], 1 if (status.grade or "none") == action else 0)
        forecast.add_metric(key, float(status.forecast_usd))
        burn.add_metric(key, float(status.burn_usd_hour))
        end.add_metric(key, status.window_end.timestamp())
    yield from (grade, forecast, burn, end)

    crossings = CounterMetricFamily("burst_budget_grade_crossings", "Times a budget reached a "
                                    "grade (once per budget window and grade).",
                                    labels=["policy", "budget", "grade"])
    for policy_name, subject, reached, count in runtime.store.grade_crossings():
        budget_name = subject.split("/", 1)[-1]
        crossings.add_metric([policy_name, budget_name, reached], count)
    yield crossings


def ledger_families(runtime: Runtime) -> Iterator[Metric]:
    cost = CounterMetricFamily("burst_cost_usd", "Burst cost in the cost ledger so far (the open "
                               "hour provisional).", labels=["provider", "project"])
    for sums in runtime.store.cost_sums(["provider", "project"]):
        if sums.cost_micros:
            # A label of no project is empty (as the budget families' project is).
            cost.add_metric([k or "" for k in sums.keys], sums.cost_micros / 1_000_000)
    yield cost

    tenures = CounterMetricFamily("burst_leader_tenures", "Leaders a scope has had (its fencing "
                                  "token): grows by one at every leader change.", labels=["scope"])
    for scope, token in sorted(runtime.store.leader_tenures().items()):
        tenures.add_metric([scope], token)
    yield tenures


def build_info() -> Iterator[Metric]:
    info = GaugeMetricFamily("burst_build_info", "The running build (always 1).",
                             labels=["version", "python"])
    info.add_metric([version(), platform.python_version()], 1)
    yield info


__all__ = ["LIFECYCLE_BUCKETS", "budget_families", "build_info", "failure_families",
           "ledger_families", "lifecycle_families"]
