"""Policy: the YAML a platform owner writes, as strict pydantic models, with a positioned loader."""

from pathlib import Path

from orchestrator.policy.loader import PolicyError, Problem, load_policy, load_policy_text
from orchestrator.policy.models import (
    Cooldowns,
    Limits,
    Market,
    OfferingSpec,
    OnPrem,
    Policy,
    Pool,
    Project,
    ProviderName,
    QueueConfig,
    QueueSourceKind,
    ScaleDown,
    Timeouts,
    Trigger,
    TriggerCombine,
)
from orchestrator.policy.units import format_duration, parse_duration, parse_money

__all__ = [
    "Cooldowns", "Limits", "Market", "OfferingSpec", "OnPrem", "Policy", "PolicyError", "Pool",
    "Problem", "Project", "ProviderName", "QueueConfig", "QueueSourceKind", "ScaleDown",
    "Timeouts", "Trigger", "TriggerCombine", "format_duration", "load_policy", "load_policy_text",
    "parse_duration", "parse_money",
]

DEFAULT_POLICY_PATH = Path(__file__).resolve().parent / "default.yaml"  # the shipped default policy
