"""What the provider contract suite needs from each adapter's test environment.

Each adapter module in ``tests/contract/adapters/`` exposes ``make_env(tmp_path: Path) ->
ContextManager[ContractEnv]``: the real adapter class, configured against a local peer (moto
server, the local Compute REST server, a fake Nova for libcloud, local processes), plus the few
test-side powers the suite needs that no provider API offers: read back what an instance booted
with, and make the peer fail the next call(s) the way the real cloud does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import Provider

# Fault kinds the suite injects; each env maps them to the real cloud's own error for that case
# (e.g. AWS InsufficientInstanceCapacity over HTTP 500, GCP ZONE_RESOURCE_POOL_EXHAUSTED inside an
# operation, HTTP 401/403, 503/throttling, quota codes).
FAULT_KINDS = ("capacity", "quota", "auth", "transient", "invalid")


@dataclass
class ContractEnv:
    name: str
    provider: Provider
    offering: Offering  # a launchable GPU offering at this peer
    cluster: str
    read_user_data: Callable[[str], str]  # instance id -> the bootstrap it received
    inject: Callable[[str, int], None]  # (fault kind, how many launch calls) -> None
    clear_faults: Callable[[], None]  # remove any injected fault still pending
    supported_faults: tuple[str, ...] = FAULT_KINDS
