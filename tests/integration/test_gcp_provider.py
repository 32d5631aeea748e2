"""Integration tests of the GCP provider: our adapter through the real google-cloud-compute client
(REST) against our Compute REST server over real HTTP, with real credentials flows (service-account
self-signed JWTs and an OAuth2 token endpoint served by the same fake).

Every test runs with name resolution limited to 127.0.0.1: a call that tried to reach
compute.googleapis.com (e.g. operation polling that ignored the endpoint override) fails the test.
"""

from __future__ import annotations

import json
import logging
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.api_core import exceptions as gexc
from google.auth import exceptions as auth_exc
from google.oauth2 import service_account

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
from orchestrator.policy.models import Market
from orchestrator.policy.providers import GcpAccelerator, GcpConfig
from providers import load_provider_class
from providers.gcp import (
    API_PERMISSIONS,
    SCOPES,
    GcpProvider,
    gce_request_id,
    instance_name,
    label_value,
    tags_from_labels,
)
from tests.providers_support import GCE_ZONES, shared_fake_gce
from tests.servers.fake_gce import (
    DEFAULT_ACCELERATOR_TYPES,
    DEFAULT_MACHINE_TYPES,
    FakeGce,
    private_key_marker,
    write_external_account_file,
    write_service_account_key,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT = "burst-it"
ZONE_A, ZONE_B = GCE_ZONES
IMAGE = f"projects/{PROJECT}/global/images/family/burst-node"


def offering(
    itype: str = "a2-highgpu-1g",
    market: Market = Market.ON_DEMAND,
    zone: str | None = ZONE_A,
    gpus: int = 1,
) -> Offering:
    return Offering(
        "gcp",
        "us-central1",
        zone,
        itype,
        market,
        gpus,
        3.0 if market == Market.ON_DEMAND else 1.0,
        "A100",
    )


CATALOG = [
    offering(t, m, z, g)
    for z in (ZONE_A, ZONE_B)
    for t, g in [("a2-highgpu-1g", 1), ("a2-highgpu-8g", 8), ("n1-standard-8", 1)]
    for m in Market
]
CATALOG += [offering("a2-highgpu-1g", Market.SPOT, "europe-west4-a")]  # not a configured zone

_counter = iter(range(1, 1_000_000))


def request(
    off: Offering | None = None,
    *,
    cluster: str = "alpha",
    node_id: str | None = None,
    request_id: str | None = None,
) -> LaunchRequest:
    n = next(_counter)
    node_id = node_id or f"train-{n:04d}"
    request_id = request_id or f"r-{uuid.uuid4().hex[:12]}"
    user_data = f"#!/bin/bash\nexport BURST_JOIN_TOKEN=bjt_secret_{n}_{uuid.uuid4().hex}\n"
    return LaunchRequest(
        request_id,
        off or offering(),
        OwnershipTags(cluster, "train", node_id, request_id),
        user_data,
    )


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> FakeGce:
    """The session's Compute REST server (shared with the contract suite; reset per test)."""
    return shared_fake_gce()


@pytest.fixture(autouse=True)
def local_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Only 127.0.0.1 resolves; every other host name asked for is recorded and refused."""
    asked: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host not in ("127.0.0.1", "localhost"):
            asked.append(str(host))
            raise socket.gaierror(f"test: no network beyond 127.0.0.1 (asked for {host})")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield asked
    assert asked == [], f"the adapter tried to reach {asked}"


@pytest.fixture
def gce(server: FakeGce) -> Iterator[FakeGce]:
    server.reset()
    server.op_polls = 2
    server.add_image(PROJECT, "burst-node-v1", family="burst-node")
    yield server
    server.reset()
    # The server is the session's (tests/providers_support.py): leave its settings as found.
    server.op_polls, server.wait_delay_s = 2, 0.0
    server.machine_types = {z: dict(DEFAULT_MACHINE_TYPES) for z in server.zones}
    server.accelerator_types = {z: set(DEFAULT_ACCELERATOR_TYPES) for z in server.zones}


@pytest.fixture
def key_file(gce: FakeGce, tmp_path: Path) -> Path:
    return write_service_account_key(gce, tmp_path / "sa-key.json", project=PROJECT)


@pytest.fixture
def make_provider(gce: FakeGce, key_file: Path) -> Callable[..., GcpProvider]:
    def make(
        *, adc: bool = False, config: dict[str, Any] | None = None, **kwargs: Any
    ) -> GcpProvider:
        settings: dict[str, Any] = {
            "project": PROJECT,
            "image": IMAGE,
            "api_endpoint": gce.url,
            "subnetwork": "regions/us-central1/subnetworks/burst",
            "service_account": "burst-node@burst-it.iam.gserviceaccount.com",
            "accelerators": {"n1-standard-8": GcpAccelerator(type="nvidia-tesla-t4", count=1)},
        }
        settings.update(config or {})
        credentials = (
            None
            if adc
            else service_account.Credentials.from_service_account_file(
                str(key_file), scopes=list(SCOPES)
            )
        )
        options: dict[str, Any] = {
            "zones": {ZONE_A, ZONE_B},
            "catalog": CATALOG,
            "credentials": credentials,
            "operation_timeout_s": 10.0,
            "poll_interval_s": 0.01,
            "call_timeout_s": 10.0,
        }
        options.update(kwargs)
        return GcpProvider(GcpConfig(**settings), **options)

    return make


@pytest.fixture
def provider(make_provider: Callable[..., GcpProvider]) -> GcpProvider:
    return make_provider()


def sent(gce: FakeGce, api: str = "compute.instances.insert") -> list[Any]:
    return gce.calls_to(api)


# -- registry and helpers --------------------------------------------------------------------------


def test_registered_and_a_provider(provider: GcpProvider) -> None:
    assert load_provider_class("gcp") is GcpProvider
    assert isinstance(provider, Provider) and provider.name == "gcp"


def test_names_and_labels_follow_gcp_rules() -> None:
    assert instance_name("train-3f2a9c01de") == "burst-train-3f2a9c01de"
    odd = instance_name("9_Policy.X-" + "a" * 80)
    assert len(odd) <= 63 and odd.startswith("burst-9-policy-x-") and odd[-1].isalnum()
    assert odd != instance_name("9-policy-x-" + "a" * 80), "names that sanitise alike stay distinct"
    assert label_value("Team.A/ü") == "team-a--"
    assert tags_from_labels({"burst-cluster": "c", "burst-node-id": "n", "other": "x"}) == {
        "burst:cluster": "c",
        "burst:node-id": "n",
    }
    assert uuid.UUID(gce_request_id("r-1")).version == 5
    assert gce_request_id("r-1") == gce_request_id("r-1") != gce_request_id("r-1", 1)


def test_cost_allocation_tags_are_labels_the_billing_export_can_group_by(
    gce: FakeGce, provider: GcpProvider
) -> None:
    from dataclasses import replace

    cost = {"burst:project": "research", "burst:user": "Ada.L@lab", "team": "ml",
            "cost-center": "cc-42"}
    req = replace(request(), cost_tags=cost)
    [instance] = provider.launch(req)
    zone, name = instance.id.split("/")
    labels = gce.instance(zone, name)["labels"]
    assert {k: labels[k] for k in ("burst-project", "burst-user", "team", "cost-center")} == {
        "burst-project": "research", "burst-user": "ada-l-lab",  # made a valid label value
        "team": "ml", "cost-center": "cc-42"}
    assert all(len(k) <= 63 and len(v) <= 63 for k, v in labels.items())
    [disk] = gce.instance(zone, name)["disks"]
    assert disk["initializeParams"]["labels"] == labels  # the boot disk is billed apart
    assert instance.ownership == req.tags  # ownership labels and metadata as before


def test_offerings_are_the_catalogue_for_our_zones(
    make_provider: Callable[..., GcpProvider],
) -> None:
    keys = {o.key for o in make_provider().offerings()}
    assert "gcp/us-central1/us-central1-a/n1-standard-8/spot" in keys
    assert not any("europe-west4" in k for k in keys), "only the configured zones"
    bare = make_provider(config={"accelerators": {}})
    assert not any(o.instance_type == "n1-standard-8" for o in bare.offerings()), (
        "an N1 type without configured GPUs cannot be launched as a GPU offering"
    )


# -- launching -------------------------------------------------------------------------------------


def test_on_demand_launch_sends_what_a_burst_node_needs(
    gce: FakeGce, provider: GcpProvider
) -> None:
    req = request()
    [instance] = provider.launch(req)
    name = f"burst-{req.tags.node_id}"
    assert instance.id == f"{ZONE_A}/{name}"
    assert instance.state is InstanceState.PENDING and instance.provider == "gcp"
    assert instance.tags == req.tags.as_dict() and instance.ownership == req.tags
    assert instance.offering_key == req.offering.key and instance.launched_at is not None

    [insert] = sent(gce)
    assert insert.query["requestId"] == gce_request_id(req.request_id)
    body = insert.body
    assert body["name"] == name
    assert body["machineType"] == f"zones/{ZONE_A}/machineTypes/a2-highgpu-1g"
    assert body["labels"] == {
        "burst-cluster": "alpha",
        "burst-policy": "train",
        "burst-node-id": req.tags.node_id,
        "burst-request-id": req.request_id,
    }
    items = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert items["user-data"] == req.user_data
    assert items["burst-node-id"] == req.tags.node_id
    assert json.loads(items["burst-tags"]) == req.tags.as_dict()
    [disk] = body["disks"]
    assert disk["boot"] and disk["autoDelete"]
    assert disk["initializeParams"]["sourceImage"] == IMAGE
    assert disk["initializeParams"]["diskSizeGb"] == "200"
    assert body["networkInterfaces"] == [
        {
            "network": "global/networks/default",
            "subnetwork": "regions/us-central1/subnetworks/burst",
        }
    ]
    assert body["serviceAccounts"] == [
        {"email": "burst-node@burst-it.iam.gserviceaccount.com", "scopes": list(SCOPES)}
    ]
    assert body["scheduling"] == {
        "provisioningModel": "STANDARD",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert "guestAccelerators" not in body, "A2 machines carry their GPUs"

    # PROVISIONING -> STAGING -> RUNNING as time (reads) passes.
    assert provider.describe([instance.id])[0].state is InstanceState.PENDING
    assert provider.describe([instance.id])[0].state is InstanceState.RUNNING


def test_spot_launch_asks_for_spot_that_is_deleted_on_preemption(
    gce: FakeGce, provider: GcpProvider
) -> None:
    provider.launch(request(offering(market=Market.SPOT)))
    assert sent(gce)[0].body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }


def test_n1_machines_get_the_configured_accelerators(gce: FakeGce, provider: GcpProvider) -> None:
    provider.launch(request(offering("n1-standard-8", zone=ZONE_B)))
    assert sent(gce)[0].body["guestAccelerators"] == [
        {
            "acceleratorType": f"zones/{ZONE_B}/acceleratorTypes/nvidia-tesla-t4",
            "acceleratorCount": 1,
        }
    ]


@pytest.mark.parametrize(
    "accelerators", [{}, {"n1-standard-8": GcpAccelerator(type="nvidia-tesla-t4", count=2)}]
)
def test_n1_without_matching_accelerators_is_refused_before_any_call(
    gce: FakeGce, make_provider: Callable[..., GcpProvider], accelerators: dict[str, Any]
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_provider(config={"accelerators": accelerators}).launch(
            request(offering("n1-standard-8"))
        )
    assert "n1-standard-8" in str(caught.value) and gce.calls == []


def test_offering_outside_our_zones_is_invalid(gce: FakeGce, provider: GcpProvider) -> None:
    with pytest.raises(InvalidRequest):
        provider.launch(request(offering(zone="europe-west4-a")))
    assert gce.calls == []


def test_a_regional_offering_lands_in_the_first_zone_of_its_region(provider: GcpProvider) -> None:
    [instance] = provider.launch(request(offering(zone=None)))
    assert instance.id.startswith(f"{ZONE_A}/")


def test_same_request_twice_makes_one_instance(gce: FakeGce, provider: GcpProvider) -> None:
    req = request()
    [first] = provider.launch(req)
    [again] = provider.launch(req)
    assert again.id == first.id and again.tags == req.tags.as_dict()
    inserts = sent(gce)
    assert len(inserts) == 2 and inserts[0].query["requestId"] == inserts[1].query["requestId"]
    assert len(gce.instances()) == 1


def test_lost_response_then_retry_is_already_done(gce: FakeGce, provider: GcpProvider) -> None:
    req = request()
    gce.inject("drop")
    with pytest.raises(TransientError) as caught:
        provider.launch(req)
    assert isinstance(caught.value.__cause__, OSError)  # requests' ConnectionError
    assert len(gce.instances()) == 1, "the insert was carried out; only its answer was lost"
    [instance] = provider.launch(req)
    assert instance.ownership == req.tags and len(gce.instances()) == 1


def test_name_conflict_with_our_own_instance_is_already_done(
    gce: FakeGce, make_provider: Callable[..., GcpProvider]
) -> None:
    req = request()
    [first] = make_provider().launch(req)
    gce.forget_request_ids()  # GCE's dedupe window is over; a restarted controller retries
    [again] = make_provider().launch(req)
    assert again.id == first.id
    assert [c.status for c in sent(gce)] == [200, 409]
    assert len(gce.instances()) == 1


def test_name_conflict_with_a_foreign_instance_is_invalid(
    gce: FakeGce, provider: GcpProvider
) -> None:
    req = request()
    gce.create_instance(
        PROJECT,
        ZONE_A,
        {
            "name": instance_name(req.tags.node_id),
            "machineType": f"zones/{ZONE_A}/machineTypes/a2-highgpu-1g",
            "labels": {"burst-cluster": "alpha", "burst-request-id": "r-someone-else"},
        },
    )
    with pytest.raises(InvalidRequest) as caught:
        provider.launch(req)
    assert caught.value.code == "alreadyExists" and isinstance(
        caught.value.__cause__, gexc.Conflict
    )


def test_a_failed_operation_is_not_replayed_on_retry(
    gce: FakeGce, make_provider: Callable[..., GcpProvider]
) -> None:
    provider = make_provider()
    req = request()
    gce.inject("capacity")
    with pytest.raises(CapacityError):
        provider.launch(req)
    [instance] = provider.launch(req)  # the stockout is over
    assert instance.ownership == req.tags
    keys = [c.query["requestId"] for c in sent(gce)]
    assert keys == [gce_request_id(req.request_id), gce_request_id(req.request_id, 1)]

    # A restarted controller has forgotten the failed attempt: GCE replays the old failure once
    # for the old key (creating nothing), and the next try goes through.
    other = request()
    gce.inject("capacity")
    with pytest.raises(CapacityError):
        make_provider().launch(other)
    restarted = make_provider()
    with pytest.raises(CapacityError):
        restarted.launch(other)
    assert len(gce.instances()) == 1
    [instance] = restarted.launch(other)
    assert instance.ownership == other.tags and len(gce.instances()) == 2

    # Restarted once more, with the request already done by the second key: the first key's
    # replayed failure is recognised as stale, and the instance is returned.
    [again] = make_provider().launch(other)
    assert again.id == instance.id and len(gce.instances()) == 2


def test_operation_waiting_goes_through_the_configured_endpoint(
    gce: FakeGce, provider: GcpProvider
) -> None:
    gce.op_polls = 4
    provider.launch(request())
    waits = sent(gce, "compute.zoneOperations.wait")
    assert len(waits) == 4, "each poll is a wait call at our endpoint"
    assert all(c.auth == "jwt" for c in waits)
    # (the autouse local_only fixture fails the test had anything asked for googleapis.com)


def test_an_operation_past_our_deadline_returns_the_pending_instance(
    gce: FakeGce, make_provider: Callable[..., GcpProvider]
) -> None:
    gce.op_polls = 10_000
    [instance] = make_provider(operation_timeout_s=0.3).launch(request())
    assert instance.state is InstanceState.PENDING


def test_a_wait_that_blocks_past_our_deadline_is_cut_short(
    gce: FakeGce, make_provider: Callable[..., GcpProvider]
) -> None:
    # GCE's wait blocks for up to two minutes; here 60 s. Cut short, the launch returns within
    # about our 0.2 s deadline: the bound is wide so that a loaded machine cannot fail it, and
    # still far below the 60 s a wait that is not cut short would take.
    gce.op_polls, gce.wait_delay_s = 10_000, 60.0
    try:
        started = time.monotonic()
        [instance] = make_provider(operation_timeout_s=0.2).launch(request())
        assert time.monotonic() - started < 20.0, "our deadline is the wait's read timeout"
    finally:
        gce.wait_delay_s = 0.0
    assert instance.state is InstanceState.PENDING


# -- observing and terminating ---------------------------------------------------------------------


def test_list_owned_filters_by_cluster_on_the_server_and_follows_pages(
    gce: FakeGce, make_provider: Callable[..., GcpProvider]
) -> None:
    provider = make_provider(page_size=2)
    ours = [
        provider.launch(request(offering(zone=z)))[0].id for z in (ZONE_A, ZONE_A, ZONE_A, ZONE_B)
    ]
    provider.launch(request(cluster="beta"))
    owned = provider.list_owned("alpha")
    assert sorted(i.id for i in owned) == sorted(ours)
    assert all(i.tags["burst:cluster"] == "alpha" for i in owned)
    lists = sent(gce, "compute.instances.list")
    assert {c.query["filter"] for c in lists} == {'labels.burst-cluster = "alpha"'}
    assert any(c.query.get("pageToken") for c in lists), "three instances in pages of two"
    assert {c.query["maxResults"] for c in lists} == {"2"}


def test_exact_tags_survive_values_labels_cannot_hold(gce: FakeGce, provider: GcpProvider) -> None:
    req = request(cluster="Team.A")
    [instance] = provider.launch(req)
    assert gce.instance(ZONE_A, instance.id.split("/")[1])["labels"]["burst-cluster"] == "team-a"
    assert instance.ownership == req.tags
    assert [i.id for i in provider.list_owned("Team.A")] == [instance.id]
    assert provider.list_owned("team-a") == [], "the lossy label is only a pre-filter"


def test_tags_fall_back_to_the_labels(gce: FakeGce, provider: GcpProvider) -> None:
    gce.create_instance(
        PROJECT,
        ZONE_B,
        {
            "name": "burst-hand-made",
            "machineType": f"zones/{ZONE_B}/machineTypes/a2-highgpu-8g",
            "scheduling": {"provisioningModel": "SPOT"},
            "labels": {
                "burst-cluster": "alpha",
                "burst-policy": "p",
                "burst-node-id": "n",
                "burst-request-id": "r",
            },
        },
    )
    [instance] = provider.list_owned("alpha")
    assert instance.ownership == OwnershipTags("alpha", "p", "n", "r")
    assert instance.offering_key == "gcp/us-central1/us-central1-b/a2-highgpu-8g/spot"


def test_terminate_is_idempotent_and_the_instance_goes(gce: FakeGce, provider: GcpProvider) -> None:
    [instance] = provider.launch(request())
    provider.terminate([instance.id])
    provider.terminate([instance.id])  # the delete is under way: GCE answers resourceNotReady
    provider.terminate([f"{ZONE_A}/burst-never-existed", "burst-never-existed"])
    assert [c.status for c in sent(gce, "compute.instances.delete")] == [200, 400, 404]
    assert provider.describe([instance.id])[0].state is InstanceState.STOPPING
    assert provider.describe([instance.id]) == []
    assert provider.list_owned("alpha") == []


def test_terminate_accepts_a_bare_name(gce: FakeGce, provider: GcpProvider) -> None:
    [instance] = provider.launch(request(offering(zone=ZONE_B)))
    provider.terminate([instance.id.split("/")[1]])
    assert [c.path.split("/")[6] for c in sent(gce, "compute.instances.delete")] == [ZONE_B]


def test_describe_omits_unknown_ids(provider: GcpProvider) -> None:
    [instance] = provider.launch(request())
    found = provider.describe([instance.id, f"{ZONE_B}/burst-unknown", "burst-unknown"])
    assert [i.id for i in found] == [instance.id]


# -- errors ----------------------------------------------------------------------------------------

FAULT_CASES = [
    # kind, times, error, code, google exception kept as the cause
    ("capacity", 1, CapacityError, "ZONE_RESOURCE_POOL_EXHAUSTED", gexc.ServiceUnavailable),
    (
        "capacity-details",
        1,
        CapacityError,
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        gexc.ServiceUnavailable,
    ),
    ("quota", 1, QuotaError, "QUOTA_EXCEEDED", gexc.Forbidden),
    ("quota-http", 1, QuotaError, "quotaExceeded", gexc.Forbidden),
    ("auth", 1, AuthError, "insufficientPermissions", gexc.Forbidden),
    # google-auth refreshes and retries a 401 itself before giving up: fail every try.
    ("unauthenticated", 5, AuthError, "authError", gexc.Unauthorized),
    ("transient", 1, TransientError, "backendError", gexc.ServiceUnavailable),
    ("rate-limit", 1, TransientError, "rateLimitExceeded", gexc.TooManyRequests),
    ("server-error", 1, TransientError, "backendError", gexc.InternalServerError),
    ("invalid", 1, InvalidRequest, "invalid", gexc.BadRequest),
    ("precondition", 1, InvalidRequest, "conditionNotMet", gexc.PreconditionFailed),
]


@pytest.mark.parametrize(
    ("kind", "times", "error", "code", "cause"), FAULT_CASES, ids=[c[0] for c in FAULT_CASES]
)
def test_each_fault_becomes_its_typed_error(
    gce: FakeGce,
    provider: GcpProvider,
    kind: str,
    times: int,
    error: type[ProviderError],
    code: str,
    cause: type,
) -> None:
    req = request()
    gce.inject(kind, times)
    with pytest.raises(ProviderError) as caught:
        provider.launch(req)
    gce.clear_faults()
    raised = caught.value
    assert type(raised) is error, f"{kind} -> {type(raised).__name__}: {raised}"
    assert raised.code == code
    assert isinstance(raised.__cause__, cause)
    assert (raised.provider, raised.offering_key, raised.request_id) == (
        "gcp",
        req.offering.key,
        req.request_id,
    )
    assert raised.retryable is (error is TransientError)
    assert gce.instances() == [], "a refused launch leaves nothing behind"
    [instance] = provider.launch(req)  # and the same request goes through once the fault is gone
    assert instance.ownership == req.tags


@pytest.mark.parametrize(
    ("change", "what"),
    [
        ({"off": offering("a2-megagpu-99g")}, "machineTypes/a2-megagpu-99g"),
        ({"config": {"image": f"projects/{PROJECT}/global/images/no-such-image"}}, "no-such-image"),
        (
            {
                "config": {
                    "accelerators": {"n1-standard-8": GcpAccelerator(type="nvidia-h9000", count=1)}
                },
                "off": offering("n1-standard-8"),
            },
            "nvidia-h9000",
        ),
    ],
)
def test_unknown_resources_on_insert_are_invalid(
    make_provider: Callable[..., GcpProvider], change: dict[str, Any], what: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        make_provider(config=change.get("config")).launch(request(change.get("off")))
    assert isinstance(caught.value.__cause__, gexc.NotFound) and what in str(caught.value)


def test_an_unreachable_endpoint_is_transient(make_provider: Callable[..., GcpProvider]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again at once: nothing listens there
    provider = make_provider(config={"api_endpoint": f"http://127.0.0.1:{port}"})
    with pytest.raises(TransientError) as caught:
        provider.launch(request())
    assert isinstance(caught.value.__cause__, OSError)
    with pytest.raises(TransientError):
        provider.list_owned("alpha")


# -- credentials -----------------------------------------------------------------------------------


def test_application_default_credentials_with_a_service_account_key(
    gce: FakeGce,
    key_file: Path,
    make_provider: Callable[..., GcpProvider],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    provider = make_provider(adc=True)
    [instance] = provider.launch(request())
    provider.terminate([instance.id])
    compute = [c for c in gce.calls if c.api.startswith("compute.")]
    assert compute and all(c.auth == "jwt" for c in compute), (
        "self-signed JWTs, verified by the fake"
    )


def test_application_default_credentials_by_workload_identity_federation(
    gce: FakeGce,
    tmp_path: Path,
    make_provider: Callable[..., GcpProvider],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = write_external_account_file(gce, tmp_path)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    provider = make_provider(adc=True)
    provider.launch(request())
    assert [c.query["grant_type"] for c in gce.calls_to("oauth2.token")] == [
        "urn:ietf:params:oauth:grant-type:token-exchange"
    ], "one exchange, then the token is reused"
    compute = [c for c in gce.calls if c.api.startswith("compute.")]
    assert compute and all(c.auth == "token" for c in compute)


def test_a_refused_token_refresh_is_an_auth_error(
    gce: FakeGce,
    tmp_path: Path,
    make_provider: Callable[..., GcpProvider],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, _ = write_external_account_file(gce, tmp_path)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    gce.fail_token(10)
    req = request()
    with pytest.raises(AuthError) as caught:
        make_provider(adc=True).launch(req)
    assert isinstance(caught.value.__cause__, auth_exc.GoogleAuthError)
    assert caught.value.request_id == req.request_id
    assert sent(gce) == [], "nothing reached the compute API without a token"


def test_missing_application_default_credentials_is_an_auth_error(
    tmp_path: Path, make_provider: Callable[..., GcpProvider], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "absent.json"))
    provider = make_provider(adc=True)
    with pytest.raises(AuthError) as caught:
        provider.list_owned("alpha")
    assert isinstance(caught.value.__cause__, auth_exc.DefaultCredentialsError)
    [row] = provider.check()
    assert row.check == "credentials" and not row.ok and "absent.json" in row.detail


def test_no_credential_or_bootstrap_reaches_the_logs(
    gce: FakeGce,
    tmp_path: Path,
    key_file: Path,
    make_provider: Callable[..., GcpProvider],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # An operator who turns on debug logging for the google libraries, in full.
    google_logger = logging.getLogger("google")
    monkeypatch.setattr(google_logger, "propagate", True)
    monkeypatch.setattr(google_logger, "level", logging.DEBUG)
    caplog.set_level(logging.DEBUG)
    path, subject_token = write_external_account_file(gce, tmp_path)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    user_provider = make_provider(adc=True)
    sa_provider = make_provider()
    req = request()
    [instance] = user_provider.launch(req)
    sa_provider.describe([instance.id])
    sa_provider.list_owned("alpha")
    gce.inject("auth")
    with pytest.raises(AuthError):
        sa_provider.launch(request())
    user_provider.terminate([instance.id])

    assert any(r.name.startswith("google") for r in caplog.records), "the library did log"
    logged = "\n".join(f"{r.getMessage()} {r.__dict__!r}" for r in caplog.records)
    assert "<redacted by burst>" in logged, "bodies were logged, and blanked"
    secrets = [
        private_key_marker(),
        subject_token,
        req.user_data,
        req.user_data.split("BURST_JOIN_TOKEN=")[1].strip(),
        *gce.issued_tokens,
        "Bearer ",
    ]
    leaked = [s for s in secrets if s in logged]
    assert leaked == [], f"secrets in the logs: {[s[:12] + '...' for s in leaked]}"


# -- check() ---------------------------------------------------------------------------------------


def test_check_reports_every_row_ok(gce: FakeGce, provider: GcpProvider) -> None:
    rows = provider.check()
    assert [r.check for r in rows] == [
        "credentials",
        f"list instances in {ZONE_A}",
        f"machine types in {ZONE_A}",
        f"list instances in {ZONE_B}",
        f"machine types in {ZONE_B}",
        "boot image",
    ]
    assert all(r.ok for r in rows), rows
    assert "burst-controller@" in rows[0].detail and gce.url in rows[0].detail
    assert "burst-node-v1" in rows[-1].detail


def test_check_reports_what_is_wrong(
    gce: FakeGce, make_provider: Callable[..., GcpProvider]
) -> None:
    del gce.machine_types[ZONE_B]["n1-standard-8"]
    rows = {r.check: r for r in make_provider(config={"image": "global/images/gone"}).check()}
    assert rows["credentials"].ok and rows[f"machine types in {ZONE_A}"].ok
    assert (
        not rows[f"machine types in {ZONE_B}"].ok
        and "n1-standard-8" in rows[f"machine types in {ZONE_B}"].detail
    )
    assert not rows["boot image"].ok and "InvalidRequest" in rows["boot image"].detail
    gce.machine_types[ZONE_B]["n1-standard-8"] = (8, 30720, [])


def test_check_with_credentials_the_api_refuses(
    gce: FakeGce, tmp_path: Path, make_provider: Callable[..., GcpProvider]
) -> None:
    stranger_key = write_service_account_key(
        gce, tmp_path / "k.json", register=False, email="stranger@elsewhere.iam.gserviceaccount.com"
    )
    creds = service_account.Credentials.from_service_account_file(
        str(stranger_key), scopes=list(SCOPES)
    )
    rows = make_provider(credentials=creds).check()
    assert rows[0].ok  # the key loads ...
    assert not any(r.ok for r in rows[1:]) and "AuthError" in rows[1].detail  # ... and is refused


# -- permissions -----------------------------------------------------------------------------------


def test_the_role_grants_exactly_what_the_adapter_calls(
    gce: FakeGce, provider: GcpProvider
) -> None:
    role = yaml.safe_load((REPO_ROOT / "infra/gcp/burst-controller-role.yaml").read_text())
    needed = {p for perms in API_PERMISSIONS.values() for p in perms}
    assert set(role["includedPermissions"]) == needed
    assert len(role["includedPermissions"]) == len(needed), "no duplicates"
    readme = (REPO_ROOT / "infra/gcp/README.md").read_text()
    assert all(method in readme for method in API_PERMISSIONS)

    # Every method the adapter really calls over a whole cycle is one the role covers.
    [instance] = provider.launch(request(offering(market=Market.SPOT)))
    provider.describe([instance.id])
    provider.list_owned("alpha")
    provider.terminate([instance.id, instance.id])
    provider.check()
    called = {c.api for c in gce.calls if c.api != "oauth2.token"}
    assert called <= set(API_PERMISSIONS), called - set(API_PERMISSIONS)
    assert {
        "compute.instances.insert",
        "compute.zoneOperations.wait",
        "compute.instances.delete",
        "compute.instances.list",
        "compute.instances.get",
    } <= called
