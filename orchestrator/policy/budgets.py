"""The budget sections of a policy: spend limits per project or pool over a window, their
graded actions, and what a launch commits against them (docs/budgets.md).

Split from :mod:`orchestrator.policy.models` (which re-exports every name here) so the policy
models stay one concern a module; the planner's budget arithmetic is
:mod:`orchestrator.planner.budgets`.
"""

from __future__ import annotations

from datetime import UTC, timedelta
from enum import StrEnum

from pydantic import AwareDatetime, Field, model_validator

from orchestrator.policy.base import Name, PolicyModel, field_problem
from orchestrator.policy.bounds import MAX_PERCENT, MAX_USD
from orchestrator.policy.units import Duration, Money


class BudgetWindow(StrEnum):
    """The period a budget's limit applies to. Calendar windows are in UTC."""

    DAY = "day"  # 00:00 to 24:00 UTC
    WEEK = "week"  # Monday 00:00 UTC to the next Monday
    MONTH = "month"  # the 1st 00:00 UTC to the 1st of the next month
    CUSTOM = "custom"  # back-to-back windows of `period`, the first starting at `starts`


class BudgetAction(StrEnum):
    """What a budget grade does once spend reaches it; each includes the milder ones before it."""

    WARN = "warn"  # recorded in the decision (inputs and summary); nothing else changes
    SPOT_ONLY = "spot-only"  # launches in the budget's scope consider spot offerings only
    NO_NEW_LAUNCHES = "no-new-launches"  # no launch in the budget's scope
    DRAIN = "drain"  # also drain the scope's ready nodes (running work finishes, up to drain_grace)

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {BudgetAction.WARN: 0, BudgetAction.SPOT_ONLY: 1, BudgetAction.NO_NEW_LAUNCHES: 2,
             BudgetAction.DRAIN: 3}


class BudgetGrade(PolicyModel):
    """One step of a budget's graded response to spend approaching its limit."""

    at_percent: float = Field(
        gt=0,
        le=MAX_PERCENT,
        description="Share of the limit, in percent, used by spend plus outstanding commitments at "
        "which the action applies (reached: used >= at_percent). A `drain` grade applies only when "
        "the share is strictly above it, so `{at_percent: 100, action: drain}` means past the "
        "budget.",
    )
    action: BudgetAction = Field(description="What happens from this share on.")

    def reached(self, used_percent: float) -> bool:
        if self.action is BudgetAction.DRAIN:
            return used_percent > self.at_percent
        return used_percent >= self.at_percent


def _default_grades() -> list[BudgetGrade]:
    return [
        BudgetGrade(at_percent=80, action=BudgetAction.WARN),
        BudgetGrade(at_percent=90, action=BudgetAction.SPOT_ONLY),
        BudgetGrade(at_percent=100, action=BudgetAction.NO_NEW_LAUNCHES),
        BudgetGrade(at_percent=100, action=BudgetAction.DRAIN),
    ]


class Budget(PolicyModel):
    """A spend limit over a window for one project of the pool, or for the whole pool.

    The planner commits spend before launching: a node is launched only if the budget's limit
    covers what was spent in the window, what live nodes have committed and not yet spent, and
    this node's commitment (see `budget_commitment` and docs/budgets.md).
    """

    name: Name = Field(description="Budget name, unique in the policy; decisions name it as "
                       "`budgets[NAME]`.")
    project: Name | None = Field(
        default=None,
        description="The project whose burst spend the budget limits: nodes launched for it, "
        "and its jobs' share of other projects' nodes (work is checked against its budget "
        "before it starts, whoever's node it is); unset: the whole pool, every project "
        "together. Any project name may be given, listed under projects or not.",
    )
    window: BudgetWindow = Field(
        default=BudgetWindow.MONTH, description="The period the limit applies to (UTC calendar "
        "windows, or custom)."
    )
    period: Duration | None = Field(
        default=None,
        description="Length of each custom window, whole hours (window: custom only).",
    )
    starts: AwareDatetime | None = Field(
        default=None,
        description="Start of one custom window, with a timezone, on a whole UTC hour, e.g. "
        "2026-01-01T00:00:00Z; the windows run back to back from it, before and after "
        "(window: custom only).",
    )
    limit_usd: Money = Field(le=MAX_USD, description="Most USD the scope may spend on burst nodes "
                             "in a window.")
    max_hourly_burn_usd: Money | None = Field(
        default=None, le=MAX_USD,
        description="Most USD per hour the scope's live burst nodes may cost together (their "
        "hourly prices, a launch's included).",
    )
    grades: list[BudgetGrade] = Field(
        default=_default_grades(),
        description="Graded actions as spend approaches the limit, in ascending at_percent. "
        "Unset: 80 warn, 90 spot-only, 100 no-new-launches, past 100 drain. An empty list keeps "
        "only the commitment check: still a cap (work is admitted only within the limit, and a "
        "scope past it is drained).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Budget:
        if self.window is BudgetWindow.CUSTOM:
            if self.period is None:
                raise field_problem("period", "window: custom needs a period, e.g. 14d")
            if self.period <= timedelta(0):
                raise field_problem("period", "must be longer than 0s")
            if self.starts is None:
                raise field_problem("starts", "window: custom needs starts, e.g. "
                                    "2026-01-01T00:00:00Z")
            # Spend is kept in hourly buckets: a window must start and end on a whole UTC hour.
            if self.period % timedelta(hours=1):
                raise field_problem("period", "must be a whole number of hours (spend is kept "
                                    "per hour)")
            start = self.starts.astimezone(UTC)
            if (start.minute, start.second, start.microsecond) != (0, 0, 0):
                raise field_problem("starts", "must fall on a whole UTC hour (spend is kept per "
                                    "hour)")
        else:
            for name in ("period", "starts"):
                if getattr(self, name) is not None:
                    raise field_problem(name, f"only applies to window: custom (window is "
                                        f"{self.window})")
        for index in range(1, len(self.grades)):
            before, grade = self.grades[index - 1], self.grades[index]
            if grade.action.severity < before.action.severity:
                raise field_problem(f"grades[{index}].action",
                                    f"{grade.action} is milder than {before.action} before it; "
                                    "grades go from mild to severe")
            same_drain = (grade.at_percent == before.at_percent
                          and grade.action is BudgetAction.DRAIN
                          and before.action is not BudgetAction.DRAIN)
            if grade.at_percent <= before.at_percent and not same_drain:
                raise field_problem(f"grades[{index}].at_percent",
                                    f"{grade.at_percent:g} is not above {before.at_percent:g} "
                                    "before it; grades go in ascending at_percent (only a drain "
                                    "grade may repeat the percent before it: it applies past it)")
        return self


class BudgetCommitment(PolicyModel):
    """How much budget a launch commits before it is made.

    A new node commits its hourly price x billed time, the time being the overhead, plus the
    expected runtime of the jobs it is launched for (the longest of them: they run side by side),
    plus `scale_down.idle_for` and `cooldowns.scale_down` (the longest it idles before it is
    drained), and never less than the provider's minimum billing.
    """

    default_runtime: Duration = Field(
        default=timedelta(hours=1),
        description="Expected runtime of a job that gives none (no time limit), and of nodes "
        "launched for min_nodes.",
    )
    overhead: Duration = Field(
        default=timedelta(minutes=10),
        description="Time a new node costs outside its jobs: booting, joining, being drained and "
        "terminated.",
    )


__all__ = ["Budget", "BudgetAction", "BudgetCommitment", "BudgetGrade", "BudgetWindow"]
