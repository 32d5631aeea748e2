"""Contract environment of the libcloud provider: LibcloudProvider and libcloud's real OpenStack
driver against the fake Nova (``tests/servers/fake_nova.py``) over HTTP.

One fake Nova serves the whole test session (started on first use, stopped at exit); each
environment resets it. The driver reaches it only through the policy-shaped config, the way
production does: ``args`` carry ``ex_force_auth_token`` (as ``env:BURST_TEST_OS_TOKEN``, set only
while the environment is open), ``ex_force_base_url`` and the other Keystone-skipping settings.

Faults are Nova's own answers to the next ``POST /servers``: capacity is a server that turns ERROR
with "No valid host was found" after scheduling, quota 403 "Quota exceeded", auth 401, transient
503, invalid 400.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.domain.offerings import Offering
from providers.libcloud_driver import LibcloudProvider
from tests.contract.env import ContractEnv
from tests.providers_support import shared_nova
from tests.servers.fake_nova import NODE_IMAGE_ID, FakeNova

CLUSTER = "contract"
TOKEN_ENV = "BURST_TEST_OS_TOKEN"
# Sizes burst may launch: keyed by the fake's flavor ids or names, as a policy would write them.
SIZES = {
    "g1.a100.1": SimpleNamespace(gpus=1, gpu_model="A100-80GB", price_usd_hour=3.2),
    "gpu.a100.4x": SimpleNamespace(gpus=4, gpu_model="A100-80GB", price_usd_hour=12.8),
}

def libcloud_config(nova: FakeNova, **overrides: object) -> SimpleNamespace:
    """A LibcloudConfig-shaped object pointing libcloud's OpenStack driver at ``nova``."""
    values: dict[str, object] = {
        "driver": "openstack",
        "key": "burst-user",
        "secret": None,
        "args": {
            "api_version": "2.0",
            "ex_force_auth_version": "3.x_password",
            # Never contacted: the forced token and base URL skip Keystone.
            "ex_force_auth_url": "http://127.0.0.1:9/identity",
            "ex_force_auth_token": f"env:{TOKEN_ENV}",
            "ex_force_base_url": nova.base_url,
            "ex_tenant_name": nova.tenant,
        },
        "image": NODE_IMAGE_ID,
        "sizes": dict(SIZES),
    }
    values.update(overrides)
    return SimpleNamespace(**values)


@contextlib.contextmanager
def make_env(tmp_path: Path) -> Iterator[ContractEnv]:
    nova = shared_nova()
    nova.reset()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TOKEN_ENV, nova.token)
        provider = LibcloudProvider(libcloud_config(nova), settle_s=5.0, poll_s=0.05)
        offering: Offering = next(o for o in provider.offerings() if o.instance_type == "gpu.a100.4x")
        env = ContractEnv("libcloud", provider, offering, CLUSTER, nova.user_data, nova.inject,
                          nova.clear)
        try:
            yield env
        finally:
            nova.clear()
