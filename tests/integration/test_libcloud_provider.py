"""Integration tests of the libcloud provider: our adapter with libcloud's real OpenStack driver
talking HTTP to the fake Nova (``tests/servers/fake_nova.py``), plus the Dummy driver for the
plumbing that needs no server.

The driver is configured only through the policy-shaped config (``args`` with the forced token as
``env:VAR`` and the forced base URL), as in production. State is asserted on the fake's side
(what Nova stored), not just on what the adapter reports back.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterator
from datetime import UTC
from types import SimpleNamespace

import pytest
import requests
from libcloud.common.exceptions import BaseHTTPError, RateLimitReachedError
from libcloud.common.types import InvalidCredsError, LibcloudError, MalformedResponseError

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.offerings import Offering
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
from providers import load_provider_class
from providers.libcloud_driver import LibcloudProvider, ServerFault, classify
from tests.contract.adapters.libcloud import SIZES, TOKEN_ENV, libcloud_config
from tests.providers_support import shared_nova
from tests.servers.fake_nova import NO_VALID_HOST, NODE_IMAGE_ID, NODE_IMAGE_NAME, FakeNova

FAST = {"settle_s": 3.0, "poll_s": 0.02}


@pytest.fixture(scope="module")
def nova() -> Iterator[FakeNova]:
    """The session's fake Nova (shared with the contract suite), empty for this module."""
    server = shared_nova()
    server.reset()
    yield server
    server.reset()


@pytest.fixture(scope="module")
def token_env(nova: FakeNova) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TOKEN_ENV, nova.token)
        yield


@pytest.fixture(scope="module")
def shared_provider(nova: FakeNova, token_env: None) -> LibcloudProvider:
    # One provider for the module: libcloud lists OpenStack flavors slowly (it re-reads its price
    # file per flavor), and the adapter caches them.
    return LibcloudProvider(libcloud_config(nova), **FAST)


@pytest.fixture
def provider(shared_provider: LibcloudProvider, nova: FakeNova) -> Iterator[LibcloudProvider]:
    nova.reset()
    yield shared_provider
    nova.clear()


def offering(provider: LibcloudProvider, instance_type: str = "gpu.a100.4x") -> Offering:
    return next(o for o in provider.offerings() if o.instance_type == instance_type)


def request(provider: LibcloudProvider, cluster: str = "lab", *, request_id: str | None = None,
            instance_type: str = "gpu.a100.4x") -> LaunchRequest:
    request_id = request_id or f"r-{uuid.uuid4().hex[:12]}"
    tags = OwnershipTags(cluster, "train", f"train-{request_id[2:12]}", request_id)
    return LaunchRequest(request_id, offering(provider, instance_type), tags,
                         user_data=f"#!/bin/sh\n# bootstrap of {request_id}\nexport TOKEN=bjt_x\n")


def posts(nova: FakeNova) -> int:
    return sum(1 for method, path in nova.requests if method == "POST" and path.endswith("/servers"))


# -- offerings ----------------------------------------------------------------------------------


def test_offerings_come_from_the_configured_sizes_matched_to_flavors(nova, token_env, caplog):
    sizes = dict(SIZES, **{"gpu.missing": SimpleNamespace(gpus=8, gpu_model="H200", price_usd_hour=40)})
    provider = LibcloudProvider(libcloud_config(nova, sizes=sizes), region="regionOne", **FAST)
    caplog.set_level(logging.WARNING, logger="providers.libcloud_driver")
    offerings = {o.instance_type: o for o in provider.offerings()}

    assert set(offerings) == {"g1.a100.1", "gpu.a100.4x"}, "matched by flavor id and by name"
    assert "gpu.missing" in caplog.text, "a configured size the cloud lacks is warned about"
    one, four = offerings["g1.a100.1"], offerings["gpu.a100.4x"]
    assert (one.gpus, one.gpu_model, one.price_usd_hour) == (1, "A100-80GB", 3.2)
    assert (four.gpus, four.vcpus, four.memory_gib) == (4, 48, 384.0)
    assert four.key == "libcloud/regionOne/-/gpu.a100.4x/on-demand"
    assert all(o.market == "on-demand" and o.zone is None and o.provider == "libcloud"
               for o in offerings.values())


def test_a_size_carries_its_clouds_billing_rule_into_the_offering(nova, token_env):
    """The cost ledger bills by the offering's rule; a libcloud cloud may bill by the hour."""
    from orchestrator.domain.offerings import BillingRule
    from orchestrator.policy.providers import LibcloudSize

    hourly = LibcloudSize(gpus=1, gpu_model="A100-80GB", price_usd_hour=3.2,
                          billing_minimum_s=3600, billing_increment_s=3600)
    sizes = dict(SIZES, **{"g1.a100.1": hourly})
    provider = LibcloudProvider(libcloud_config(nova, sizes=sizes), region="regionOne", **FAST)
    offerings = {o.instance_type: o for o in provider.offerings()}
    assert offerings["g1.a100.1"].billing == BillingRule(minimum_s=3600, increment_s=3600)
    assert offerings["g1.a100.1"].billing.billed_seconds(3601) == 7200
    assert offerings["gpu.a100.4x"].billing == BillingRule(minimum_s=60, increment_s=1)


def test_the_region_defaults_to_default(provider):
    assert {o.region for o in provider.offerings()} == {"default"}


def test_it_is_registered_and_is_a_provider(provider):
    assert load_provider_class("libcloud") is LibcloudProvider
    assert isinstance(provider, Provider) and provider.name == "libcloud"


# -- launch -------------------------------------------------------------------------------------


def test_launch_creates_a_server_with_ownership_metadata_and_user_data(provider, nova):
    req = request(provider)
    [instance] = provider.launch(req)

    [server] = nova.servers()
    assert server["id"] == instance.id
    assert server["name"] == req.tags.node_id
    assert server["flavor_id"] == "g1.a100.4" and server["image_id"] == NODE_IMAGE_ID
    assert server["metadata"] == req.tags.as_dict(), "burst:* keys are valid Nova metadata keys"
    assert nova.user_data(instance.id) == req.user_data
    assert instance.ownership == req.tags
    assert instance.offering_key == req.offering.key
    assert instance.state in (InstanceState.PENDING, InstanceState.RUNNING)
    assert instance.launched_at is not None and instance.launched_at.tzinfo is not None
    assert instance.launched_at.utcoffset() == UTC.utcoffset(None)


def test_cost_allocation_tags_go_in_the_server_metadata(provider, nova):
    from dataclasses import replace

    from providers.libcloud_driver.tags import write_tags

    cost = {"burst:project": "research", "burst:user": "ada", "team": "ml"}
    req = replace(request(provider), cost_tags=cost)
    [instance] = provider.launch(req)
    [server] = nova.servers()
    assert server["metadata"] == {**cost, **req.tags.as_dict()}
    assert instance.ownership == req.tags and instance.tags == req.tags.as_dict()
    # GCE through libcloud: metadata keys allow no ':', burst's keys are spelled burst-*.
    assert write_tags(req.tags, dash_keys=True, cost=cost) == {
        "burst-project": "research", "burst-user": "ada", "team": "ml",
        **{k.replace(":", "-"): v for k, v in req.tags.as_dict().items()}}


def test_launch_is_idempotent_on_the_request_id(provider, nova, token_env):
    req = request(provider)
    [first] = provider.launch(req)
    [again] = provider.launch(req)
    # A restarted controller (a new provider object) finds the same server by its metadata.
    [after_restart] = LibcloudProvider(libcloud_config(nova), **FAST).launch(req)

    assert again.id == first.id == after_restart.id
    assert posts(nova) == 1 and len(nova.servers()) == 1
    assert again.ownership == req.tags


def test_a_launch_still_scheduling_is_returned_pending_and_settled_by_the_next_call(token_env):
    with FakeNova(token=None, build_polls=10_000) as slow, pytest.MonkeyPatch.context() as mp:
        mp.setenv(TOKEN_ENV, slow.token)
        provider = LibcloudProvider(libcloud_config(slow), settle_s=0.1, poll_s=0.02)
        req = request(provider)
        [instance] = provider.launch(req)
        assert instance.state is InstanceState.PENDING
        [again] = provider.launch(req)
        assert again.id == instance.id and posts(slow) == 1


def test_an_earlier_attempt_that_failed_is_raised_deleted_and_then_replaced(token_env):
    # settle_s=0: the first launch returns while Nova is still scheduling; the server then fails
    # with NoValidHost. The retry with the same request id learns it (CapacityError) and deletes
    # the failed server; the next retry launches a fresh one.
    with FakeNova() as nova, pytest.MonkeyPatch.context() as mp:
        mp.setenv(TOKEN_ENV, nova.token)
        provider = LibcloudProvider(libcloud_config(nova), settle_s=0, poll_s=0.02)
        req = request(provider)
        nova.inject("capacity", 1)
        [pending] = provider.launch(req)
        assert pending.state is InstanceState.PENDING
        with pytest.raises(CapacityError):
            provider.launch(req)
        assert nova.servers() == []
        [fresh] = provider.launch(req)
        assert fresh.id != pending.id and [s["id"] for s in nova.servers()] == [fresh.id]


def test_an_image_may_be_named_instead_of_identified(nova, token_env):
    provider = LibcloudProvider(libcloud_config(nova, image=NODE_IMAGE_NAME), **FAST)
    nova.reset()
    [instance] = provider.launch(request(provider))
    assert nova.servers()[0]["image_id"] == NODE_IMAGE_ID
    provider.terminate([instance.id])


def test_an_ambiguous_image_name_is_an_invalid_request(nova, token_env):
    # The bundled Glance fixture has two images named "hypernode".
    provider = LibcloudProvider(libcloud_config(nova, image="hypernode"), **FAST)
    with pytest.raises(InvalidRequest, match="2 images"):
        provider.launch(request(provider))


def test_an_offering_that_is_not_configured_is_an_invalid_request(provider):
    req = request(provider)
    foreign = LaunchRequest(req.request_id, Offering("libcloud", "default", None, "gpu.h100.8x",
                                                     "on-demand", 8, 30.0), req.tags, "")
    with pytest.raises(InvalidRequest) as caught:
        provider.launch(foreign)
    assert caught.value.request_id == req.request_id


def test_the_default_openstack_api_version_works_too(nova, token_env):
    # Without api_version libcloud picks its 1.1 driver, which reads images through Nova's proxy.
    config = libcloud_config(nova)
    config.args = {k: v for k, v in config.args.items() if k != "api_version"}
    provider = LibcloudProvider(config, **FAST)
    nova.reset()
    [instance] = provider.launch(request(provider))
    assert provider.describe([instance.id])[0].ownership is not None
    provider.terminate([instance.id])


# -- observing and terminating ------------------------------------------------------------------


def test_list_owned_filters_by_cluster_and_describe_omits_unknown_ids(provider, nova):
    [mine] = provider.launch(request(provider, "lab"))
    [theirs] = provider.launch(request(provider, "other"))
    # A server burst did not create (no metadata) is never ours.
    provider._driver.create_node(name="someone-else", size=provider._sizes()["g1.a100.1"],
                                 image=provider._resolve_image(None))

    owned = provider.list_owned("lab")
    assert [i.id for i in owned] == [mine.id]
    assert owned[0].ownership.cluster == "lab" and owned[0].offering_key == mine.offering_key
    assert [i.id for i in provider.list_owned("other")] == [theirs.id]
    assert [i.id for i in provider.describe([mine.id, "no-such-server"])] == [mine.id]
    assert provider.describe([mine.id])[0].state is InstanceState.RUNNING


def test_terminate_is_idempotent_including_unknown_ids(provider, nova):
    [instance] = provider.launch(request(provider))
    provider.terminate([instance.id])
    provider.terminate([instance.id])
    provider.terminate(["no-such-server"])
    provider.terminate([])

    assert nova.servers() == []
    assert provider.list_owned("lab") == []
    deletes = [p for m, p in nova.requests if m == "DELETE"]
    assert deletes == [f"/v2.1/{nova.tenant}/servers/{instance.id}"]


def test_a_server_in_error_is_seen_as_stopping_with_a_log_line(nova, token_env, caplog):
    provider = LibcloudProvider(libcloud_config(nova), settle_s=0, poll_s=0.02)
    nova.reset()
    nova.inject("capacity", 1)
    [instance] = provider.launch(request(provider))
    assert instance.state is InstanceState.PENDING, "returned while Nova was still scheduling"
    caplog.set_level(logging.WARNING, logger="providers.libcloud_driver")
    [seen] = provider.list_owned("lab")
    assert seen.state is InstanceState.STOPPING
    assert f"instance {instance.id} is in libcloud state error" in caplog.text
    provider.terminate([instance.id])
    assert nova.servers() == []


# -- errors -------------------------------------------------------------------------------------

FAULTS = {"capacity": CapacityError, "quota": QuotaError, "auth": AuthError,
          "transient": TransientError, "invalid": InvalidRequest}


@pytest.mark.parametrize("kind", list(FAULTS))
def test_each_nova_fault_surfaces_as_its_typed_error(provider, nova, kind):
    req = request(provider)
    nova.inject(kind, 1)
    with pytest.raises(ProviderError) as caught:
        provider.launch(req)
    error = caught.value
    assert type(error) is FAULTS[kind]
    assert (error.provider, error.request_id, error.offering_key) == (
        "libcloud", req.request_id, req.offering.key)
    assert error.__cause__ is not None
    if kind == "capacity":
        # Nova accepted the launch and the scheduler failed it: the fault is the cause, and the
        # failed server was deleted.
        assert isinstance(error.__cause__, ServerFault)
        assert error.code == "NoValidHost" and "No valid host" in str(error)
        assert nova.servers() == []
    else:
        assert isinstance(error.__cause__, BaseHTTPError)
        assert nova.servers() == []
    # The fault is gone: the same request launches.
    [instance] = provider.launch(req)
    assert instance.ownership == req.tags


@pytest.mark.parametrize(("exc", "expected"), [
    (InvalidCredsError(), AuthError),
    (RateLimitReachedError(headers={"retry-after": "3"}), TransientError),
    (BaseHTTPError(500, f"500 Internal Server Error {NO_VALID_HOST}"), CapacityError),
    (BaseHTTPError(400, "400 Bad Request InsufficientInstanceCapacity: no p4d"), CapacityError),
    (BaseHTTPError(403, "403 Forbidden Quota exceeded for cores"), QuotaError),
    (BaseHTTPError(413, "413 Request Entity Too Large overLimit"), QuotaError),
    (BaseHTTPError(400, "400 Bad Request InstanceLimitExceeded"), QuotaError),
    (BaseHTTPError(403, "403 Forbidden Rate limit exceeded"), TransientError),
    (BaseHTTPError(401, "401 Unauthorized"), AuthError),
    (BaseHTTPError(403, "403 Forbidden Policy does not allow"), AuthError),
    (BaseHTTPError(403, "403 Forbidden insufficient privileges"), AuthError),
    (BaseHTTPError(409, "409 Conflict Cannot 'delete' while in task_state"), TransientError),
    (BaseHTTPError(502, "502 Bad Gateway"), TransientError),
    (BaseHTTPError(504, "504 Gateway Timeout"), TransientError),
    (BaseHTTPError(400, "400 Bad Request Invalid flavorRef"), InvalidRequest),
    (BaseHTTPError(404, "404 Not Found"), InvalidRequest),
    (requests.exceptions.ConnectionError("refused"), TransientError),
    (requests.exceptions.ReadTimeout("slow"), TransientError),
    (TimeoutError("timed out"), TransientError),
    (MalformedResponseError("Failed to parse JSON", body="<html>"), TransientError),
    (LibcloudError("Job did not complete in 200 seconds"), TransientError),
    (ServerFault("s1", NO_VALID_HOST, 500), CapacityError),
    (ServerFault("s1", "Build of instance aborted: image download failed", 500), TransientError),
    (NotImplementedError("no"), InvalidRequest),
    (KeyError("server"), InvalidRequest),
])
def test_the_error_table(exc, expected):
    assert classify(exc)[0] is expected


def test_an_unreachable_endpoint_is_transient(nova, token_env):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: connection refused
    config = libcloud_config(nova)
    config.args = dict(config.args, ex_force_base_url=f"http://127.0.0.1:{port}/v2.1/t")
    provider = LibcloudProvider(config, **FAST)
    with pytest.raises(TransientError) as caught:
        provider.list_owned("lab")
    assert isinstance(caught.value.__cause__, OSError)


def test_a_wrong_token_is_an_auth_error(nova, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "tok-wrong")
    provider = LibcloudProvider(libcloud_config(nova), **FAST)
    with pytest.raises(AuthError) as caught:
        provider.list_owned("lab")
    assert caught.value.__cause__ is not None


def test_a_missing_environment_variable_is_an_auth_error_naming_it(nova, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(AuthError, match=TOKEN_ENV) as caught:
        LibcloudProvider(libcloud_config(nova), **FAST)
    assert caught.value.provider == "libcloud"


def test_an_unknown_driver_is_an_invalid_request_listing_known_ones(nova, token_env):
    with pytest.raises(InvalidRequest, match="openstack"):
        LibcloudProvider(libcloud_config(nova, driver="no-such-cloud"))
    assert LibcloudProvider(libcloud_config(nova, driver="OpenStack")).driver_name == "openstack"


def test_bad_driver_arguments_are_invalid_requests_that_quote_no_values(nova, token_env):
    dummy = SimpleNamespace(driver="dummy", key="0", secret=None, image="1", sizes={},
                            args={"ex_no_such_option": f"env:{TOKEN_ENV}"})
    with pytest.raises(InvalidRequest, match="ex_no_such_option") as caught:
        LibcloudProvider(dummy)
    assert nova.token not in str(caught.value)
    config = libcloud_config(nova)
    config.args = {k: v for k, v in libcloud_config(nova).args.items()
                   if k not in ("ex_force_auth_url", "ex_force_base_url")}
    with pytest.raises(InvalidRequest, match="LibcloudError"):
        LibcloudProvider(config)  # "OpenStack instance must have auth_url set"


def test_the_token_never_reaches_the_logs_or_the_errors(nova, token_env, caplog):
    caplog.set_level(logging.DEBUG)
    provider = LibcloudProvider(libcloud_config(nova), **FAST)
    nova.reset()
    messages = []
    for kind in FAULTS:
        nova.inject(kind, 1)
        try:
            provider.launch(request(provider))
        except ProviderError as exc:
            messages.append(f"{exc!r} {exc} {exc.__cause__!r}")
    [instance] = provider.launch(request(provider))
    provider.list_owned("lab")
    provider.check()
    provider.terminate([instance.id])
    assert nova.token not in caplog.text
    assert all(nova.token not in m for m in messages)
    assert "ex_force_auth_token" in caplog.text, "argument names are logged, values are not"


# -- check --------------------------------------------------------------------------------------


def test_check_reports_credentials_sizes_and_image(provider, nova, token_env):
    rows = provider.check()
    assert all(row.ok for row in rows), rows
    assert [row.check for row in rows] == [
        "credentials", "list instances", "size g1.a100.1", "size gpu.a100.4x",
        f"image {NODE_IMAGE_ID}"]

    sizes = dict(SIZES, **{"gpu.missing": SimpleNamespace(gpus=1, gpu_model="", price_usd_hour=1)})
    broken = LibcloudProvider(libcloud_config(nova, sizes=sizes, image="no-such-image"), **FAST)
    failed = {row.check: row for row in broken.check() if not row.ok}
    assert set(failed) == {"size gpu.missing", "image no-such-image"}


def test_check_with_bad_credentials_says_so_and_stops(nova, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "tok-wrong")
    rows = LibcloudProvider(libcloud_config(nova), **FAST).check()
    assert [(r.check, r.ok) for r in rows] == [("credentials", False)]
    assert "AuthError" in rows[0].detail


# -- Dummy driver: plumbing without a server -----------------------------------------------------


def test_the_dummy_driver_works_through_the_same_adapter(caplog):
    config = SimpleNamespace(
        driver="dummy", key="0", secret=None, args={}, image="1",
        sizes={"1": SimpleNamespace(gpus=1, gpu_model="T4", price_usd_hour=0.5),
               "Big": SimpleNamespace(gpus=4, gpu_model="T4", price_usd_hour=2.0)})
    caplog.set_level(logging.WARNING, logger="providers.libcloud_driver")
    provider = LibcloudProvider(config)
    assert "cannot pass user data" in caplog.text
    offerings = {o.instance_type: o for o in provider.offerings()}
    assert set(offerings) == {"1", "Big"} and offerings["Big"].gpus == 4

    tags = OwnershipTags("lab", "train", "train-1", "r-dummy-1")
    [instance] = provider.launch(LaunchRequest("r-dummy-1", offerings["Big"], tags, "#!/bin/sh\n"))
    assert instance.state is InstanceState.RUNNING and instance.ownership == tags
    # The Dummy driver ignores names and has no metadata: ownership cannot be kept, and says so.
    assert "ignored the node name" in caplog.text
    assert [i.id for i in provider.describe([instance.id])] == [instance.id]
    assert provider.list_owned("lab") == [], "the pre-existing dummy nodes are not ours either"
    provider.terminate([instance.id, "999"])
    assert provider.describe([instance.id]) == []


def test_drivers_without_metadata_keep_ownership_in_the_name():
    config = SimpleNamespace(driver="dummy", key="0", secret=None, args={}, image="1",
                             sizes={"1": SimpleNamespace(gpus=1, gpu_model="", price_usd_hour=1)})
    provider = LibcloudProvider(config)
    offering_ = provider.offerings()[0]
    tags = OwnershipTags("lab", "train", "train-1", "r-1")
    req = LaunchRequest("r-1", offering_, tags, "")
    assert provider._node_name(req) == "burst--lab--train--train-1--r-1"
    node = SimpleNamespace(name="burst--lab--train--train-1--r-1", extra={})
    assert OwnershipTags.from_dict(provider._read_tags(node)) == tags
    bad = LaunchRequest("r--1", offering_, OwnershipTags("lab", "train", "train-1", "r--1"), "")
    with pytest.raises(InvalidRequest):
        provider._node_name(bad)
