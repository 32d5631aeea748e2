"""Contract environment of the local provider (processes running a stand-in for the agent)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from providers.local import LocalProvider
from tests.contract.env import ContractEnv


@contextlib.contextmanager
def make_env(tmp_path: Path) -> Iterator[ContractEnv]:
    capacity = tmp_path / "stockout"
    provider = LocalProvider(tmp_path / "local-cloud", boot_delay_s=0,
                             agent_command=[sys.executable, "-c", "import time; time.sleep(120)"],
                             capacity_file=capacity)
    offering = next(o for o in provider.offerings() if o.instance_type == "local.4gpu" and o.market == "spot")
    remaining = {"capacity": 0}

    def inject(kind: str, times: int) -> None:
        if kind != "capacity":
            raise NotImplementedError(kind)
        # The local cloud's stockout is a file listing offering keys; it stays until removed.
        capacity.write_text(offering.key + "\n")
        remaining["capacity"] = times

    def read_user_data(instance_id: str) -> str:
        return (tmp_path / "local-cloud" / "instances" / f"{instance_id}.user-data").read_text()

    env = ContractEnv("local", provider, offering, "contract", read_user_data, inject,
                      lambda: capacity.unlink(missing_ok=True), supported_faults=("capacity",))
    try:
        yield env
    finally:
        capacity.unlink(missing_ok=True)
        owned = [i.id for i in provider.list_owned("contract")] + [i.id for i in provider.list_owned("other")]
        provider.terminate(owned)
