"""Contract environment of the GCP provider: the real adapter and client library (REST) against
our Compute REST server (tests/servers/fake_gce.py), authenticated with a real-format service
account key whose self-signed JWTs the server verifies."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from google.oauth2 import service_account

from orchestrator.domain.offerings import Offering
from orchestrator.policy.models import Market
from orchestrator.policy.providers import GcpAccelerator, GcpConfig
from providers.gcp import SCOPES, GcpProvider, parse_instance_id
from tests.contract.env import ContractEnv
from tests.providers_support import GCE_ZONES, shared_fake_gce
from tests.servers.fake_gce import write_service_account_key

PROJECT = "burst-contract"
ZONES = GCE_ZONES
CATALOG = [
    Offering("gcp", "us-central1", zone, itype, market, gpus, price, model, vcpus, mem)
    for zone in ZONES
    for itype, gpus, model, vcpus, mem, od in [
        ("a2-highgpu-1g", 1, "A100", 12, 85.0, 3.67),
        ("g2-standard-4", 1, "L4", 4, 16.0, 0.71),
        ("n1-standard-8", 1, "T4", 8, 30.0, 0.73),
    ]
    for market, price in [(Market.ON_DEMAND, od), (Market.SPOT, round(od * 0.3, 4))]
]

@contextlib.contextmanager
def make_env(tmp_path: Path) -> Iterator[ContractEnv]:
    fake = shared_fake_gce()
    fake.reset()
    fake.add_image(PROJECT, "burst-node-v1", family="burst-node")
    key_file = write_service_account_key(fake, tmp_path / "gcp-key.json", project=PROJECT)
    credentials = service_account.Credentials.from_service_account_file(
        str(key_file), scopes=list(SCOPES)
    )
    config = GcpConfig(
        project=PROJECT,
        image=f"projects/{PROJECT}/global/images/family/burst-node",
        api_endpoint=fake.url,
        accelerators={"n1-standard-8": GcpAccelerator(type="nvidia-tesla-t4", count=1)},
    )
    provider = GcpProvider(
        config,
        zones=set(ZONES),
        catalog=CATALOG,
        credentials=credentials,
        operation_timeout_s=10.0,
        poll_interval_s=0.01,
        call_timeout_s=10.0,
    )
    offering = next(
        o
        for o in CATALOG
        if o.zone == ZONES[0] and o.instance_type == "a2-highgpu-1g" and o.market == Market.SPOT
    )

    def read_user_data(instance_id: str) -> str:
        zone, name = parse_instance_id(instance_id)
        return fake.metadata(zone or ZONES[0], name)["user-data"]

    # The contract's kinds are the fake's kinds of the same name: capacity and quota fail inside
    # the operation, auth is a 403 on insert, transient a 503, invalid a 400.
    env = ContractEnv(
        "gcp", provider, offering, "contract", read_user_data, fake.inject, fake.clear_faults
    )
    try:
        yield env
    finally:
        fake.clear_faults()
        fake.reset()
