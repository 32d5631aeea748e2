"""What deserves a notification now: budget grades, forecast overruns, repeated launch failures,
stuck nodes and collected leaks, read from the store.

:func:`events_due` only reads; :func:`claim` writes each event's own record and one row per
target that listens, each unique per (target, subject, window, grade), and returns the rows this
call made: those, and only those, are sent. Running both twice (two beats, a restart) claims
nothing the second time, so nothing is sent twice. The window of each kind of event:

* budget grade and forecast: the budget window (a new day or month notifies again);
* launch failures of an offering: the ``launch_failures_within`` period the count falls in;
* a stuck node: its stay in that state (the state and when it began);
* a leaked instance: the instance (once ever).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from orchestrator.costs.budgets import budget_statuses
from orchestrator.costs.spend import spend
from orchestrator.domain.plan import ActionReason, Terminate
from orchestrator.lifecycle import overdue, state_timeouts
from orchestrator.planner.budgets import used_percent
from orchestrator.policy.models import Policy
from orchestrator.policy.notifications import NotificationEvent as E
from orchestrator.store import Store
from orchestrator.store.notices import EVENT_RECORD, NoticeKey

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Event:
    """One thing to tell: its key (what makes it unique), a title and a sentence."""

    key: NoticeKey
    title: str
    text: str
    details: dict[str, Any] = field(default_factory=dict)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _money(value: Decimal) -> str:
    return f"${value:,.2f}"


def budget_events(store: Store, policies: list[Policy], now: datetime) -> list[Event]:
    events = []
    by_name = {p.name: p for p in policies}
    for status in budget_statuses(store, policies, now):
        policy = by_name[status.policy]
        budget = next(b for b in policy.budgets if b.name == status.budget)
        subject = f"budget:{status.policy}/{status.budget}"
        window = _iso(status.window_start)
        scope = f"project {status.project}" if status.project else f"pool {status.pool}"
        details = {"policy": status.policy, "budget": status.budget, "project": status.project,
                   **{k: v for k, v in status.as_json().items()
                      if k in ("limit_usd", "spent_usd", "committed_usd", "forecast_usd",
                               "window_start", "window_end", "used_fraction")}}
        percent = used_percent(status.spent_usd + status.committed_usd, status.limit_usd)
        for grade in budget.grades:
            if not grade.reached(float(percent)):
                continue
            events.append(Event(
                NoticeKey(E.BUDGET_GRADE, subject, window, str(grade.action), status.policy),
                f"Budget {status.policy}/{status.budget} reached {grade.action}",
                f"Budget {status.budget} ({scope}) has used {float(percent):.0f}% of "
                f"{_money(status.limit_usd)} this window (grade {grade.action} from "
                f"{grade.at_percent:g}%).", {**details, "grade": str(grade.action)}))
        forecast = _forecast(store, policy, status, now)
        if forecast is not None:
            burn, reach = forecast
            events.append(Event(
                NoticeKey(E.BUDGET_FORECAST, subject, window, "forecast", status.policy),
                f"Budget {status.policy}/{status.budget} is forecast to run out",
                f"At the burn of the last {_span(policy.notifications.forecast_burn_over)} "
                f"({_money(burn)}/h), budget {status.budget} ({scope}) reaches its limit of "
                f"{_money(status.limit_usd)} on {reach:%Y-%m-%d %H:%M} UTC, before its window "
                f"ends ({status.window_end:%Y-%m-%d %H:%M} UTC).",
                {**details, "burn_usd_hour": str(burn.quantize(Decimal('0.000001'))),
                 "reaches_limit_at": _iso(reach)}))
    return events


def _span(span: timedelta) -> str:
    hours = span.total_seconds() / 3600
    return "hour" if hours == 1 else (f"{hours:g} hours" if hours >= 1
                                      else f"{span.total_seconds() / 60:g} minutes")


def _forecast(store: Store, policy: Policy, status: Any, now: datetime
              ) -> tuple[Decimal, datetime] | None:
    """(burn of the last ``forecast_burn_over`` in USD/h, when the limit is reached at it), if
    that is before the window ends and the limit is not already reached."""
    over = policy.notifications.forecast_burn_over
    # Ledger lines are hourly buckets: start at a whole hour so the span holds whole buckets.
    since = (now - over).replace(minute=0, second=0, microsecond=0)
    hours = Decimal(str((now - since).total_seconds())) / 3600
    if hours <= 0:
        return None
    spent = spend(store, since=since, until=now, now=now, pool=status.pool, project=status.project)
    burn = spent / hours
    left = status.limit_usd - status.spent_usd
    if burn <= 0 or left <= 0:
        return None
    reach = now + timedelta(hours=float(left / burn))
    return (burn, reach) if reach < status.window_end else None


def fleet_events(store: Store, policies: list[Policy], now: datetime,
                 leaked: Iterable[Terminate] = ()) -> list[Event]:
    events = []
    by_name = {p.name: p for p in policies}
    for policy in policies:
        rules = policy.notifications
        period = rules.launch_failures_within
        start = datetime.fromtimestamp(
            now.timestamp() // period.total_seconds() * period.total_seconds(), UTC)
        for name, provider, offering, count in store.launch_failures_since(start):
            if name != policy.name or count < rules.launch_failures:
                continue
            events.append(Event(
                NoticeKey(E.LAUNCH_FAILURES, f"offering:{offering}", _iso(start), "failing",
                          policy.name),
                f"Launches of {offering} keep failing",
                f"{count} launches of {offering} at {provider} failed before booting since "
                f"{start:%H:%M} UTC (policy {policy.name}).",
                {"policy": policy.name, "provider": provider, "offering": offering,
                 "failures": count, "since": _iso(start)}))
    timeouts = {p.name: state_timeouts(p) for p in policies}
    for node in store.nodes():
        if node.policy not in by_name or not overdue(node, timeouts[node.policy], now):
            continue
        since = int((now - node.state_since).total_seconds())
        events.append(Event(
            NoticeKey(E.STUCK_NODE, f"node:{node.id}", f"{node.state}@{_iso(node.state_since)}",
                      "stuck", node.policy),
            f"Burst node {node.id} stuck in {node.state}",
            f"Node {node.id} ({node.provider} {node.instance_type}, policy {node.policy}) has "
            f"been {node.state} for {since // 60} min, past its timeout.",
            {"policy": node.policy, "node": node.id, "state": str(node.state),
             "provider": node.provider, "since": _iso(node.state_since)}))
    for action in leaked:
        if action.reason is not ActionReason.LEAKED or action.instance_id is None:
            continue
        for policy in policies:  # a leak has no node, hence no policy: every policy's targets
            events.append(Event(
                NoticeKey(E.LEAKED_INSTANCE, f"instance:{action.provider}/{action.instance_id}",
                          "-", "collected", policy.name),
                f"Leaked instance {action.instance_id} collected",
                f"Instance {action.instance_id} at {action.provider} carried burst's ownership "
                "tags but had no live node record; the reconciler terminated it.",
                {"provider": action.provider, "instance": action.instance_id}))
    return events


def events_due(store: Store, policies: Iterable[Policy], now: datetime,
               leaked: Iterable[Terminate] = ()) -> list[Event]:
    policies = list(policies)
    return budget_events(store, policies, now) + fleet_events(store, policies, now, leaked)


def claim(store: Store, policies: Iterable[Policy], events: Iterable[Event], now: datetime
          ) -> list[int]:
    """Record each event once and claim one row per listening target; the ids of the target
    rows this call made (to be sent)."""
    by_name = {p.name: p for p in policies}
    claimed = []
    for event in events:
        record = dict(title=event.title, text=event.text, details=event.details, at=now)
        store.claim_notice(EVENT_RECORD, event.key, **record)
        policy = by_name.get(event.key.policy)
        if policy is None:
            continue
        for target in policy.notifications.targets:
            if event.key.event not in target.events:
                continue
            notice_id = store.claim_notice(target.name, event.key, **record)
            if notice_id is not None:
                claimed.append(notice_id)
    return claimed


def check(store: Store, policies: Iterable[Policy], now: datetime,
          leaked: Iterable[Terminate] = ()) -> list[int]:
    """:func:`events_due` then :func:`claim`; never raises (a tick must not fail for it)."""
    policies = list(policies)
    try:
        return claim(store, policies, events_due(store, policies, now, leaked), now)
    except Exception:  # noqa: BLE001 - notifications must never fail a tick
        log.exception("notifications: could not check what to notify")
        return []


__all__ = ["Event", "budget_events", "check", "claim", "events_due", "fleet_events"]
