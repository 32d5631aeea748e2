"""Contract environment of the sim provider (the simulator's virtual cloud, built by wiring)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from orchestrator.policy import load_policy_text
from orchestrator.sim.engine import SimClock
from orchestrator.wiring import Settings, build_provider
from tests.contract.env import ContractEnv

POLICY = """
version: 1
name: contract
pool: {name: gpu, onprem: {nodes: 1, gpus_per_node: 8}}
offerings:
  - {provider: aws, region: us-east-1, instance_type: p4d.24xlarge, market: spot}
providers: {aws: {ami: ami-0123456789abcdef0}}
"""


@contextlib.contextmanager
def make_env(tmp_path: Path) -> Iterator[ContractEnv]:
    clock = SimClock()
    provider = build_provider("sim", Settings.model_construct(), [load_policy_text(POLICY, "contract")],
                              options={"clock": clock})
    offering = next(o for o in provider.offerings() if o.market == "spot")

    def inject(kind: str, times: int) -> None:
        provider.fail_next(kind, times)

    yield ContractEnv("sim", provider, offering, "contract", provider.user_data, inject,
                      provider.clear_faults)
