"""The Provider contract (orchestrator/domain/ports.py), checked against every adapter.

One suite, parametrised over the adapters' environments in ``tests/contract/adapters/``: each runs
the real adapter class with its real client library against a local peer (local processes, moto
server for AWS, our Compute REST server for GCP, a fake Nova behind libcloud's OpenStack driver).
An adapter is done when it passes all of it.
"""

from __future__ import annotations

import importlib
import time

import pytest

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.ports import (
    AuthError,
    CapacityError,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    Provider,
    ProviderError,
    QuotaError,
    TransientError,
)
from orchestrator.fabric.bootstrap import Bootstrap
from tests.contract.env import ContractEnv

ADAPTERS = ["local", "aws", "gcp", "libcloud", "sim"]
ERRORS = {"capacity": CapacityError, "quota": QuotaError, "auth": AuthError,
          "transient": TransientError, "invalid": InvalidRequest}
_counter = iter(range(1_000_000))


@pytest.fixture(params=ADAPTERS)
def env(request, tmp_path):
    module = importlib.import_module(f"tests.contract.adapters.{request.param}")
    with module.make_env(tmp_path) as contract_env:
        yield contract_env


def launch_request(env: ContractEnv, *, cluster: str | None = None) -> LaunchRequest:
    n = next(_counter)
    node_id = f"contract-{n:06d}"
    request_id = f"r-contract-{n:06d}-{time.monotonic_ns() % 10**9:09d}"
    boot = Bootstrap(node_id=node_id, controller_url="http://127.0.0.1:9", join_token=f"bjt_secret{n}",
                     cluster=cluster or env.cluster, policy="contract", gpus=env.offering.gpus,
                     gpu_model=env.offering.gpu_model or "gpu")
    tags = OwnershipTags(cluster or env.cluster, "contract", node_id, request_id)
    return LaunchRequest(request_id, env.offering, tags, boot.render())


def eventually(check, timeout: float = 20.0, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def test_it_is_a_provider(env):
    assert isinstance(env.provider, Provider)
    assert env.provider.name == env.name


def test_offerings_are_gpu_offerings_with_prices(env):
    offerings = env.provider.offerings()
    assert offerings, "an adapter must list what it can launch"
    for offering in offerings:
        assert offering.provider == env.name
        assert offering.gpus >= 1 and offering.price_usd_hour > 0
        assert offering.key.startswith(f"{env.name}/")
    assert len({o.key for o in offerings}) == len(offerings), "offering keys are unique"


def test_launch_tags_ownership_and_delivers_the_bootstrap(env):
    req = launch_request(env)
    [instance] = env.provider.launch(req)
    assert instance.provider == env.name
    assert instance.state in (InstanceState.PENDING, InstanceState.RUNNING)
    assert instance.ownership == req.tags
    booted_with = Bootstrap.parse(env.read_user_data(instance.id))
    assert booted_with.node_id == req.tags.node_id
    assert booted_with.join_token == Bootstrap.parse(req.user_data).join_token


def test_launch_is_idempotent_on_the_request_id(env):
    req = launch_request(env)
    [first] = env.provider.launch(req)
    [again] = env.provider.launch(req)
    assert again.id == first.id, "the same request id must not create a second instance"
    owned = eventually(lambda: [i for i in env.provider.list_owned(env.cluster)
                                if i.tags.get("burst:request-id") == req.request_id])
    assert [i.id for i in owned] == [first.id]


def test_list_owned_and_describe_see_only_our_instances(env):
    ours = launch_request(env)
    theirs = launch_request(env, cluster="other")
    [mine] = env.provider.launch(ours)
    [other] = env.provider.launch(theirs)
    listed = eventually(lambda: {i.id for i in env.provider.list_owned(env.cluster)} >= {mine.id} or None)
    assert listed
    ids = {i.id for i in env.provider.list_owned(env.cluster)}
    assert mine.id in ids and other.id not in ids
    assert all(i.tags.get("burst:cluster") == env.cluster for i in env.provider.list_owned(env.cluster))
    described = env.provider.describe([mine.id, "i-does-not-exist-0000"])
    assert [d.id for d in described] == [mine.id], "unknown ids are omitted, not an error"
    env.provider.terminate([other.id])


def test_terminate_is_idempotent_and_the_instance_goes(env):
    [instance] = env.provider.launch(launch_request(env))
    env.provider.terminate([instance.id])
    env.provider.terminate([instance.id])  # already done: a normal return
    env.provider.terminate(["i-does-not-exist-0000"])  # unknown: a normal return

    def gone():
        seen = [i for i in env.provider.list_owned(env.cluster) if i.id == instance.id]
        return not seen or seen[0].state in (InstanceState.TERMINATED, InstanceState.STOPPING)

    assert eventually(gone), "a terminated instance must show as going or gone"


@pytest.mark.parametrize("kind", list(ERRORS))
def test_errors_are_typed_and_keep_the_cause(env, kind):
    if kind not in env.supported_faults:
        pytest.skip(f"the {env.name} peer cannot produce a {kind} error")
    req = launch_request(env)
    env.inject(kind, 1)
    try:
        with pytest.raises(ProviderError) as caught:
            env.provider.launch(req)
    finally:
        env.clear_faults()
    error = caught.value
    assert isinstance(error, ERRORS[kind]), f"{kind} fault surfaced as {type(error).__name__}: {error}"
    assert error.provider == env.name
    assert error.request_id == req.request_id
    assert error.offering_key == env.offering.key
    if env.name != "local":
        assert error.__cause__ is not None, "the SDK's own error is kept as the cause"
    assert error.retryable is (kind == "transient")
    # After the fault clears, the same request launches (nothing half-created blocks it).
    [instance] = env.provider.launch(req)
    assert instance.ownership == req.tags


def test_capacity_error_creates_nothing(env):
    if "capacity" not in env.supported_faults:
        pytest.skip("no capacity fault")
    before = {i.id for i in env.provider.list_owned(env.cluster)}
    env.inject("capacity", 1)
    try:
        with pytest.raises(CapacityError):
            env.provider.launch(launch_request(env))
    finally:
        env.clear_faults()
    time.sleep(0.5)
    live = {i.id for i in env.provider.list_owned(env.cluster) if i.state is not InstanceState.TERMINATED}
    assert live <= before, "a launch refused for capacity must leave no instance behind"
