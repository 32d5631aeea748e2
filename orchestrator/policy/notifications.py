"""The notifications section of a policy: webhook targets told about budgets and the fleet.

A target is a webhook whose URL is a secret: the policy names where to read it (an environment
variable or a file), never the URL itself, so policy files can be shared and the URL never reaches
the store, a log or an API answer. ``format`` picks the body: ``json`` (burst's own document) or
``slack`` (a Slack-compatible incoming-webhook body, which Mattermost and others accept too).
docs/monitoring.md lists the events and their bodies.
"""

from __future__ import annotations

from datetime import timedelta
from enum import StrEnum

from pydantic import Field, model_validator

from orchestrator.policy.base import Name, PolicyModel, field_problem
from orchestrator.policy.units import Duration

ENV_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"


class NotificationEvent(StrEnum):
    """What a notification is about."""

    BUDGET_GRADE = "budget-grade"  # a budget reached a grade (warn, spot-only, ...) this window
    BUDGET_FORECAST = "budget-forecast"  # at the last hour's burn a budget reaches its limit early
    LAUNCH_FAILURES = "launch-failures"  # an offering's launches failed repeatedly
    STUCK_NODE = "stuck-node"  # a burst node stayed in a state past its timeout
    LEAKED_INSTANCE = "leaked-instance"  # an owned instance with no node record was collected


class WebhookFormat(StrEnum):
    JSON = "json"  # {"event", "subject", "title", "text", "policy", "at", "details"}
    SLACK = "slack"  # {"text", "blocks"}: Slack incoming webhooks and compatible receivers


class WebhookTarget(PolicyModel):
    """One webhook. Exactly one of ``url_env`` and ``url_file`` says where its URL is."""

    name: Name = Field(description="Target name, unique in the policy (logs and the store name "
                       "targets by it, never by URL).")
    format: WebhookFormat = Field(default=WebhookFormat.JSON, description="Body format: json or "
                                  "slack.")
    url_env: str | None = Field(default=None, pattern=ENV_PATTERN, description="Environment "
                                "variable holding the webhook URL (read at send time).")
    url_file: str | None = Field(default=None, min_length=1, max_length=4096, description="File "
                                 "holding the webhook URL on its first line (read at send time).")
    events: list[NotificationEvent] = Field(
        default_factory=lambda: list(NotificationEvent),
        description="Events sent to this target (default: all).")
    timeout: Duration = Field(default=timedelta(seconds=5), description="Per-attempt timeout of "
                              "the HTTP call.")

    @model_validator(mode="after")
    def _one_source(self) -> WebhookTarget:
        if (self.url_env is None) == (self.url_file is None):
            raise field_problem("url_env", "give exactly one of url_env and url_file (the URL is "
                                "a secret: it is never written in the policy)")
        if not timedelta(0) < self.timeout <= timedelta(minutes=1):
            raise field_problem("timeout", "must be more than 0s and at most 1m")
        return self


class Notifications(PolicyModel):
    """Webhook notifications of the policy's budgets and nodes (sent once per subject, window
    and grade: deduplicated in the store)."""

    targets: list[WebhookTarget] = Field(default_factory=list, description="Webhook targets.")
    forecast_burn_over: Duration = Field(
        default=timedelta(hours=1), description="The burn a budget-forecast notification "
        "extrapolates: spend over this much time back from now.")
    launch_failures: int = Field(default=3, ge=1, le=1000, description="Failed launches of one "
                                 "offering within launch_failures_within that notify.")
    launch_failures_within: Duration = Field(default=timedelta(minutes=30), description="The "
                                             "window those failures are counted in.")

    @model_validator(mode="after")
    def _unique(self) -> Notifications:
        seen: set[str] = set()
        for index, target in enumerate(self.targets):
            if target.name in seen:
                raise field_problem(f"targets[{index}].name", f"duplicate target {target.name!r}")
            seen.add(target.name)
        if self.forecast_burn_over <= timedelta(0) or self.launch_failures_within <= timedelta(0):
            raise field_problem("forecast_burn_over", "durations must be more than 0s")
        return self


__all__ = ["NotificationEvent", "Notifications", "WebhookFormat", "WebhookTarget"]
