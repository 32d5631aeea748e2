"""Which boot time the wait-aware rule allows: the policy's ``expected_boot`` or the learned one.

With ``trigger.learn_boot`` the snapshot's ``boot_estimates`` (the observer's
:class:`~orchestrator.domain.boot.BootLearner`: per offering, the decayed p90 of the observed
launch-to-ready times) replace the constant once an offering of the policy has
:data:`MIN_SAMPLES` boots behind its estimate. The rule picks one value for the tick before any
offering is chosen, so it takes the slowest of the policy's learned offerings (a job's deadline
must hold whichever offering is then launched). Until then, and without ``learn_boot``, the
policy's value stands. The choice (value, where it came from, the offering and its samples) is
recorded with the decision (``inputs.wait_aware``).

Pure: reads the policy and the snapshot's estimates only.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.domain.snapshot import BootEstimate
from orchestrator.policy.models import Policy

MIN_SAMPLES = 8.0  # decayed boots an estimate needs before it replaces expected_boot


@dataclass(frozen=True, slots=True)
class BootChoice:
    """The boot time allowed this tick and its source."""

    seconds: float
    source: str  # "policy" (trigger.expected_boot) or "learned" (the offering's estimate)
    offering: str | None = None
    samples: float = 0.0

    def inputs(self) -> dict:
        out: dict = {"expected_boot_s": self.seconds, "expected_boot_source": self.source}
        if self.offering is not None:
            out["expected_boot_offering"] = self.offering
            out["expected_boot_samples"] = self.samples
        return out


def _matches(key: str, specs: set[tuple[str, str, str]]) -> bool:
    parts = key.split("/")  # provider/region/zone/instance_type/market
    return len(parts) == 5 and (parts[0], parts[1], parts[3]) in specs


def choose_boot(policy: Policy, estimates: dict[str, BootEstimate]) -> BootChoice:
    """The boot time the wait-aware rule allows (module docstring)."""
    fixed = BootChoice(policy.trigger.expected_boot.total_seconds(), "policy")
    if not policy.trigger.learn_boot or not estimates:
        return fixed
    specs = {(s.provider, s.region, s.instance_type) for s in policy.offerings}
    best: BootEstimate | None = None
    for key in sorted(estimates):
        estimate = estimates[key]
        if estimate.samples < MIN_SAMPLES or not _matches(key, specs):
            continue
        if best is None or estimate.boot_s > best.boot_s:
            best = estimate
    if best is None:
        # Not enough boots yet: the policy's value, with what the learner has so far.
        return fixed
    return BootChoice(best.boot_s, "learned", best.offering_key, best.samples)


def group_boot_s(policy: Policy, estimates: dict[str, BootEstimate], nodes: int) -> float:
    """The boot a launch group of ``nodes`` waits for (its slowest node; the SLO guard's room
    for a restart, :mod:`.spot`): with ``trigger.learn_boot`` or ``spot.learn_restart_wait`` and
    enough boots, the slowest of the policy's learned offerings' group estimates
    (:meth:`~orchestrator.domain.snapshot.BootEstimate.group_boot_s`); else the policy's
    ``expected_boot`` (a constant that is to cover the slowest boots already)."""
    fixed = policy.trigger.expected_boot.total_seconds()
    if not (policy.trigger.learn_boot or policy.spot.learn_restart_wait) or not estimates:
        return fixed
    specs = {(s.provider, s.region, s.instance_type) for s in policy.offerings}
    return max((estimates[key].group_boot_s(nodes) for key in sorted(estimates)
                if estimates[key].samples >= MIN_SAMPLES and _matches(key, specs)),
               default=fixed)


__all__ = ["MIN_SAMPLES", "BootChoice", "choose_boot", "group_boot_s"]
