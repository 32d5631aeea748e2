"""Domain: plain typed values shared by every part (no I/O, no clock, no randomness)."""

from orchestrator.domain.jobs import Job, JobState, Placement
from orchestrator.domain.nodes import Node, NodeState, OwnershipTags
from orchestrator.domain.offerings import BillingRule, Offering, offering_key
from orchestrator.domain.plan import (
    Action,
    ActionReason,
    Decision,
    Drain,
    Hold,
    Launch,
    OfferingOption,
    Plan,
    Rule,
    Terminate,
)
from orchestrator.domain.snapshot import (
    BudgetSpend,
    CapacityBlock,
    OnPremState,
    PolicyMemory,
    PoolQueue,
    Snapshot,
)

__all__ = [
    "Action", "ActionReason", "BillingRule", "BudgetSpend", "CapacityBlock", "Decision", "Drain", "Hold", "Job",
    "JobState", "Launch", "Node", "NodeState", "Offering", "OfferingOption", "OnPremState",
    "OwnershipTags", "Placement", "Plan", "PolicyMemory", "PoolQueue", "Rule", "Snapshot",
    "Terminate", "offering_key",
]
