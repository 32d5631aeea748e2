"""Integration tests of the AWS provider: our AwsProvider and real boto3 against moto over HTTP.

moto's answers are trusted only as a peer: every assertion is about what *our* adapter does
(which parameters it sent, how it mapped an error, how often it called). boto3 is used directly
only to set the peer up and to inspect what the adapter created. EC2's failures that moto cannot
produce (capacity, quota, auth, throttling) come from the fault-injecting middleware in front of it
as the exact error documents EC2 sends.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

import providers.aws as aws_module
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
from providers import load_provider_class
from providers.aws import ERROR_CODES, IAM_ACTIONS, AwsProvider, classify_error, client_token
from tests.contract.adapters.aws import aws_config, linux_ami, read_user_data
from tests.providers_support import point_boto3_at, shared_moto
from tests.servers.moto_ec2 import TEST_REGION, TEST_SECRET_KEY, MotoEC2Server

REPO_ROOT = Path(__file__).resolve().parents[2]
POLICY_FILE = REPO_ROOT / "infra" / "aws" / "iam-controller-policy.json"
JOIN_TOKEN = "bjt_do-not-log-9c41"
USER_DATA = f"#!/bin/sh\nexport BURST_JOIN_TOKEN={JOIN_TOKEN}\necho burst node\n"


def offering(instance_type: str = "g5.xlarge", market: Market = Market.ON_DEMAND,
             zone: str | None = None, gpus: int = 1, region: str = TEST_REGION) -> Offering:
    return Offering(provider="aws", region=region, zone=zone, instance_type=instance_type,
                    market=market, gpus=gpus, price_usd_hour=1.0, gpu_model="A10G")


G5 = offering()
P4D_SPOT = offering("p4d.24xlarge", Market.SPOT, zone="us-east-1b", gpus=8)
_n = iter(range(1_000_000))


def request(cluster: str, off: Offering = G5, *, request_id: str | None = None) -> LaunchRequest:
    n = next(_n)
    node_id = f"node-{n:04d}"
    rid = request_id or f"req-{n:04d}"
    return LaunchRequest(rid, off, OwnershipTags(cluster, "pol", node_id, rid), USER_DATA)


@pytest.fixture(scope="module")
def server() -> MotoEC2Server:
    """The session's moto server, wiped once for this module.

    Not per test: after a reset moto rebuilds a region's backend (≈1200 default AMIs) on first
    use, about half a second each time. Tests are kept apart by their own cluster name instead.
    """
    server = shared_moto()
    server.reset()
    return server


@pytest.fixture
def cluster() -> str:
    """A cluster name of this test's own: what other tests launched is never listed."""
    return f"aws-it-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def peer(server: MotoEC2Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[MotoEC2Server]:
    """moto without pending faults or counts, and boto3's standard chain pointed at it (this test only)."""
    server.clear()
    server.faults.reset_counts()
    point_boto3_at(server, monkeypatch)
    yield server
    server.clear()


@pytest.fixture
def make(peer: MotoEC2Server):
    """Builds AwsProviders against the peer; keyword arguments override the config."""

    def build(*, catalog: list[Offering] | None = None, regions: set[str] | None = None,
              **overrides: object) -> AwsProvider:
        return AwsProvider(aws_config(peer, **overrides), regions=regions or {TEST_REGION},
                           catalog=catalog if catalog is not None else [G5, P4D_SPOT])

    return build


def ec2_instance(peer: MotoEC2Server, instance_id: str) -> dict:
    [reservation] = peer.client().describe_instances(InstanceIds=[instance_id])["Reservations"]
    return reservation["Instances"][0]


# -- registry and shape -----------------------------------------------------------------------


def test_registered_and_a_provider(make):
    assert load_provider_class("aws") is AwsProvider
    provider = make()
    assert isinstance(provider, Provider)
    assert provider.name == "aws"


def test_offerings_come_from_the_catalogue_for_the_regions_in_use(make):
    elsewhere = offering(region="eu-west-1")
    provider = make(catalog=[G5, P4D_SPOT, elsewhere], regions={TEST_REGION})
    assert {o.key for o in provider.offerings()} == {G5.key, P4D_SPOT.key}


def test_offerings_without_a_catalogue_use_the_bundled_one(peer):
    pytest.importorskip("providers.catalog", reason="the bundled catalogue is not in this build yet")
    provider = AwsProvider(aws_config(peer), regions={TEST_REGION})
    found = provider.offerings()
    assert found and all(o.provider == "aws" and o.region == TEST_REGION for o in found)


# -- launching --------------------------------------------------------------------------------


def test_launch_on_demand_sends_the_configured_instance(make, peer, cluster):
    provider = make()
    req = request(cluster, G5)
    [instance] = provider.launch(req)
    assert instance.provider == "aws"
    assert instance.state in (InstanceState.PENDING, InstanceState.RUNNING)
    assert instance.ownership == req.tags
    assert instance.offering_key == G5.key  # the catalogue's offering is regional (no zone)
    assert instance.launched_at is not None and instance.launched_at.utcoffset().total_seconds() == 0
    raw = ec2_instance(peer, instance.id)
    config = provider.config
    assert raw["InstanceType"] == "g5.xlarge"
    assert raw["ImageId"] == config.ami
    assert raw["SubnetId"] == config.subnet_id
    assert [g["GroupId"] for g in raw["SecurityGroups"]] == config.security_group_ids
    assert "InstanceLifecycle" not in raw
    assert raw["ClientToken"] == req.request_id
    # The root volume is resized on the AMI's own root device, not added as a second disk.
    [mapping] = raw["BlockDeviceMappings"]
    assert mapping["DeviceName"] == raw["RootDeviceName"]
    [volume] = peer.client().describe_volumes(VolumeIds=[mapping["Ebs"]["VolumeId"]])["Volumes"]
    assert volume["Size"] == 200 and volume["VolumeType"] == "gp3"
    behaviour = peer.client().describe_instance_attribute(
        InstanceId=instance.id, Attribute="instanceInitiatedShutdownBehavior")
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"


def test_launch_spot_in_a_zone_with_max_price(make, peer, cluster):
    provider = make(spot_max_price_usd_hour=Decimal("12.50"), subnet_id=None, security_group_ids=[])
    [instance] = provider.launch(request(cluster, P4D_SPOT))
    raw = ec2_instance(peer, instance.id)
    assert raw["InstanceLifecycle"] == "spot"
    assert raw["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert instance.offering_key == P4D_SPOT.key
    # A fresh provider (another process) maps the listed instance back to the same offering.
    [listed] = make().list_owned(cluster)
    assert listed.offering_key == P4D_SPOT.key


def test_tags_on_instance_and_volume(make, peer, cluster):
    req = request(cluster)
    [instance] = make().launch(req)
    expected = {**req.tags.as_dict(), "Name": req.tags.node_id, "burst:offering": G5.key}
    raw = ec2_instance(peer, instance.id)
    assert {t["Key"]: t["Value"] for t in raw["Tags"]} == expected
    volume_id = raw["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
    [volume] = peer.client().describe_volumes(VolumeIds=[volume_id])["Volumes"]
    assert {t["Key"]: t["Value"] for t in volume["Tags"]} == expected


def test_cost_allocation_tags_on_instance_and_volume(make, peer, cluster):
    cost = {"burst:project": "research", "burst:user": "ada.l@lab", "team": "ml",
            "CostCenter": "CC 42/gpu"}
    req = replace(request(cluster), cost_tags=cost)
    [instance] = make().launch(req)
    raw = ec2_instance(peer, instance.id)
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert cost.items() <= tags.items()  # AWS keeps keys and values as given
    assert instance.ownership == req.tags  # the reconciler still finds it as before
    volume_id = raw["BlockDeviceMappings"][0]["Ebs"]["VolumeId"]
    [volume] = peer.client().describe_volumes(VolumeIds=[volume_id])["Volumes"]
    assert {t["Key"]: t["Value"] for t in volume["Tags"]} == tags  # the volume bills by them too
    # What a cost tag can never do: replace an ownership tag.
    forged = replace(request(cluster), cost_tags={"burst:cluster": "someone-else"})
    [other] = make().launch(forged)
    assert other.ownership == forged.tags


def test_the_cloud_config_the_executor_renders_reaches_the_instance(make, peer, cluster):
    from orchestrator.fabric.bootstrap import Bootstrap, NodeInstall

    boot = Bootstrap(node_id="n-cc", controller_url="https://burst.example", join_token="bjt_x",
                     cluster=cluster, policy="pol", gpus=1, gpu_model="A10G",
                     self_terminate=AwsProvider.self_terminate_command)
    assert AwsProvider.cloud_init is True  # the executor renders the cloud-config for it
    text = boot.render_cloud_config(NodeInstall("0.1.0"))
    [instance] = make().launch(replace(request(cluster), user_data=text))
    got = read_user_data(peer, instance.id)
    assert got == text and got.startswith("#cloud-config") and Bootstrap.parse(got) == boot


def test_user_data_round_trip(make, peer, cluster):
    [instance] = make().launch(request(cluster))
    assert read_user_data(peer, instance.id) == USER_DATA


def test_instance_profile_by_name_or_arn_and_key_pair(make, peer, cluster):
    iam = peer.client("iam")
    name = f"burst-node-{cluster}"
    arn = iam.create_instance_profile(InstanceProfileName=name)["InstanceProfile"]["Arn"]
    for profile in (name, arn):
        [instance] = make(iam_instance_profile=profile, key_name="ops").launch(request(cluster))
        raw = ec2_instance(peer, instance.id)
        assert raw["IamInstanceProfile"]["Arn"] == arn
        assert raw["KeyName"] == "ops"
    with pytest.raises(InvalidRequest) as caught:  # moto's IAM answers 404 NoSuchEntity
        make(iam_instance_profile="missing").launch(request(cluster))
    assert isinstance(caught.value.__cause__, ClientError)


def test_launch_is_idempotent_on_the_request_id(make, peer, cluster):
    provider = make()
    req = request(cluster)
    [first] = provider.launch(req)
    [again] = provider.launch(req)
    # A new provider object has no memory of the first launch: only the tag lookup can find it.
    [from_elsewhere] = make().launch(req)
    assert first.id == again.id == from_elsewhere.id
    # moto ignores ClientToken (a second RunInstances would create a second instance): the single
    # call proves the adapter's own dedupe.
    assert peer.calls("RunInstances") == 1
    assert [i.id for i in provider.list_owned(cluster)] == [first.id]


def test_relaunch_after_terminate_returns_the_terminated_instance(make, peer, cluster):
    provider = make()
    req = request(cluster)
    [first] = provider.launch(req)
    provider.terminate([first.id])
    [again] = provider.launch(req)
    assert again.id == first.id and again.state is InstanceState.TERMINATED
    assert peer.calls("RunInstances") == 1


def test_concurrent_launches_of_one_request_create_one_instance(make, peer, cluster):
    provider = make()
    req = request(cluster)
    results: list[str] = []

    def go() -> None:
        results.extend(i.id for i in provider.launch(req))

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 4
    assert peer.calls("RunInstances") == 1


def test_client_token_fits_ec2s_limit():
    assert client_token("req-1") == "req-1"
    long_id = "r" * 100
    token = client_token(long_id)
    assert len(token) <= 64 and token == client_token(long_id) and token != client_token(long_id + "x")
    assert len(client_token("réq-ü")) <= 64 and client_token("réq-ü").isascii()


# -- observing --------------------------------------------------------------------------------


def test_list_owned_filters_by_cluster_and_describe_omits_unknown(make, cluster):
    provider = make()
    [mine] = provider.launch(request(cluster))
    [theirs] = provider.launch(request(f"{cluster}-other"))
    assert [i.id for i in provider.list_owned(cluster)] == [mine.id]
    assert [i.id for i in provider.list_owned(f"{cluster}-other")] == [theirs.id]
    assert provider.list_owned("nobody") == []
    described = provider.describe([mine.id, "i-0123456789abcdef0", "not-an-id", mine.id])
    assert [d.id for d in described] == [mine.id]
    assert described[0].state is InstanceState.RUNNING  # moto runs instances at once
    assert provider.describe([]) == []


def test_list_owned_covers_every_region_in_use(make, peer, cluster):
    west = offering(region="us-west-2")
    regions = {TEST_REGION, "us-west-2"}
    provider = make(catalog=[G5, west], regions=regions)
    [east_i] = provider.launch(request(cluster, G5))
    # AMI and security-group ids are regional and the config holds one of each: a launch in
    # another region is refused, as an invalid request naming one of them (which EC2 checks
    # first is its own business: moto 5.2.6 checks the group, 5.2.5 the image)...
    with pytest.raises(InvalidRequest) as caught:
        provider.launch(request(cluster, west))
    assert caught.value.code in {"InvalidAMIID.NotFound", "InvalidGroup.NotFound"}
    # ...but what exists there (launched under another config) is still seen and terminated.
    west_ec2 = peer.client(region="us-west-2")
    west_ami = linux_ami(peer, "us-west-2")
    tags = request(cluster, west).tags.as_dict()
    west_id = west_ec2.run_instances(
        ImageId=west_ami, InstanceType="g5.xlarge", MinCount=1, MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance",
                            "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )["Instances"][0]["InstanceId"]
    fresh = make(catalog=[G5, west], regions=regions)
    owned = {i.id: i.offering_key for i in fresh.list_owned(cluster)}
    assert owned == {east_i.id: G5.key, west_id: west.key}
    make(catalog=[G5, west], regions=regions).terminate([west_id])
    assert ec2_instance(peer, east_i.id)["State"]["Name"] == "running"
    [west_raw] = west_ec2.describe_instances(InstanceIds=[west_id])["Reservations"][0]["Instances"]
    assert west_raw["State"]["Name"] == "terminated"


def test_without_regions_the_sessions_default_region_is_used(peer, monkeypatch, cluster):
    [instance] = AwsProvider(aws_config(peer), catalog=[G5]).launch(request(cluster))
    assert [i.id for i in AwsProvider(aws_config(peer)).list_owned(cluster)] == [instance.id]
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(InvalidRequest, match="no AWS region"):
        AwsProvider(aws_config(peer)).list_owned(cluster)  # never "nothing exists" by default


def test_read_calls_retry_a_blip_but_stay_bounded(make, peer, cluster):
    provider = make()
    # InternalError rather than a throttling code: botocore backs off ~20x longer on throttling,
    # which would only make this test slow; the retry budget is the same.
    peer.inject("DescribeInstances", 500, "InternalError", times=1)
    assert provider.list_owned(cluster) == []
    assert peer.calls("DescribeInstances") == 2
    peer.inject("DescribeInstances", 500, "InternalError", times=5)
    with pytest.raises(TransientError) as caught:
        provider.list_owned(cluster)
    assert caught.value.code == "InternalError"
    assert peer.calls("DescribeInstances") == 5  # three more attempts, then the typed error


# -- terminating ------------------------------------------------------------------------------


def test_terminate_is_idempotent_and_skips_unknown_ids(make, peer, cluster):
    provider = make()
    [a] = provider.launch(request(cluster))
    [b] = provider.launch(request(cluster))
    provider.terminate([a.id, "i-0123456789abcdef0", "not-an-id"])
    provider.terminate([a.id])
    provider.terminate([])
    states = {i.id: i.state for i in provider.list_owned(cluster)}
    assert states == {a.id: InstanceState.TERMINATED, b.id: InstanceState.RUNNING}
    # A provider that never saw the instance finds its region first.
    make().terminate([b.id, "i-0fedcba9876543210"])
    assert ec2_instance(peer, b.id)["State"]["Name"] == "terminated"


def test_terminate_failure_is_typed(make, peer, cluster):
    provider = make()
    [a] = provider.launch(request(cluster))
    peer.inject("TerminateInstances", 403, "UnauthorizedOperation", times=10)
    with pytest.raises(AuthError):
        provider.terminate([a.id])


# -- errors -----------------------------------------------------------------------------------

FAULTS = [
    # (HTTP status, EC2 code, typed error)
    (500, "InsufficientInstanceCapacity", CapacityError),
    (500, "InsufficientHostCapacity", CapacityError),
    (400, "SpotMaxPriceTooLow", CapacityError),
    (400, "Unsupported", CapacityError),
    (400, "VcpuLimitExceeded", QuotaError),
    (400, "InstanceLimitExceeded", QuotaError),
    (400, "MaxSpotInstanceCountExceeded", QuotaError),
    (401, "AuthFailure", AuthError),
    (403, "UnauthorizedOperation", AuthError),
    (400, "OptInRequired", AuthError),
    (503, "RequestLimitExceeded", TransientError),
    (503, "ServiceUnavailable", TransientError),
    (500, "InternalError", TransientError),
    (502, "SomethingNewAndBroken", TransientError),  # an unlisted 5xx
    (400, "InvalidParameterValue", InvalidRequest),
    (400, "InvalidAMIID.NotFound", InvalidRequest),
    (400, "IdempotentParameterMismatch", InvalidRequest),  # an unlisted 4xx
]


def test_errors_map_to_typed_errors_and_run_instances_is_tried_once(make, peer, cluster):
    # One provider for the whole table: building boto3 clients is the slow part of these tests.
    provider = make()
    for status, code, error in FAULTS:
        req = request(cluster, P4D_SPOT)
        peer.faults.reset_counts()
        peer.inject("RunInstances", status, code, f"injected {code}", times=5)
        with pytest.raises(ProviderError) as caught:
            provider.launch(req)
        exc = caught.value
        assert type(exc) is error, f"{status} {code} -> {type(exc).__name__}, expected {error.__name__}"
        assert isinstance(exc.__cause__, ClientError), code
        assert exc.__cause__.response["Error"]["Code"] == code
        assert (exc.provider, exc.offering_key, exc.request_id, exc.code) == (
            "aws", P4D_SPOT.key, req.request_id, code)
        assert exc.retryable is (error is TransientError), code
        # RunInstances is attempted exactly once, 5xx included: botocore must not retry a capacity
        # 500 (the executor fails over to the next offering instead).
        assert peer.calls("RunInstances") == 1, f"{code}: {peer.calls('RunInstances')} attempts"
    peer.clear()
    assert provider.list_owned(cluster) == [], "a refused launch leaves nothing behind"


def test_error_table_is_explicit_and_falls_back_on_status():
    assert ERROR_CODES["InsufficientInstanceCapacity"] is CapacityError
    assert classify_error("NeverHeardOfIt", 500) is TransientError
    assert classify_error("NeverHeardOfIt", 429) is TransientError
    assert classify_error("NeverHeardOfIt", 403) is AuthError
    assert classify_error("NeverHeardOfIt", 400) is InvalidRequest
    assert classify_error("InsufficientInstanceCapacity", 500) is CapacityError  # table first


def test_unknown_instance_type_is_an_invalid_request(make, peer, monkeypatch, cluster):
    import moto.settings

    # The in-process form of MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION (read at each call).
    monkeypatch.setattr(moto.settings, "EC2_ENABLE_INSTANCE_TYPE_VALIDATION", True)
    with pytest.raises(InvalidRequest) as caught:
        make().launch(request(cluster, offering("zz9.mega")))
    assert caught.value.code == "InvalidInstanceType.NotFound"


def test_unreachable_endpoint_is_transient(make, monkeypatch, cluster):
    provider = make()
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", "http://127.0.0.1:9")  # discard port: refused
    with pytest.raises(TransientError) as caught:
        provider.list_owned(cluster)
    assert caught.value.code == "EndpointConnectionError"


def test_missing_credentials_or_profile_is_an_auth_error(make, monkeypatch, cluster):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(AuthError) as caught:
        make().launch(request(cluster))
    assert caught.value.code == "NoCredentialsError"
    with pytest.raises(AuthError) as caught:
        make(profile="no-such-profile").list_owned(cluster)
    assert caught.value.code == "ProfileNotFound"


def test_a_non_aws_offering_is_refused(make, cluster):
    with pytest.raises(InvalidRequest):
        make().launch(request(cluster, Offering("gcp", "us-central1", None, "a2-highgpu-1g", Market.SPOT, 1, 1.0)))


# -- provider check ---------------------------------------------------------------------------


def test_check_dry_runs_every_offering(make, peer):
    provider = make()
    rows = provider.check()
    assert rows and all(row.ok for row in rows), rows
    names = [row.check for row in rows]
    assert f"run-instances {G5.key}" in names and f"run-instances {P4D_SPOT.key}" in names
    assert make().list_owned("burst-provider-check") == []  # a dry run creates nothing
    assert peer.calls("RunInstances") == 2


def test_check_reports_missing_permissions(make, peer):
    peer.inject("RunInstances", 403, "UnauthorizedOperation",
                "You are not authorized to perform this operation.", times=10)
    rows = {row.check: row for row in make().check()}
    denied = rows[f"run-instances {G5.key}"]
    assert not denied.ok and denied.detail.startswith("AuthError: ") and "UnauthorizedOperation" in denied.detail
    assert rows[f"describe-instances {TEST_REGION}"].ok


def test_check_without_dry_run_only_reads(make, peer):
    rows = make().check(dry_run=False)
    assert rows and all(row.ok for row in rows)
    assert peer.calls("RunInstances") == 0


def test_check_reports_a_missing_ami(make):
    rows = {row.check: row for row in make(ami="ami-12345678").check()}
    ami_row = rows[f"ami ami-12345678 {TEST_REGION}"]
    assert not ami_row.ok and ami_row.detail.startswith("InvalidRequest")


# -- secrets stay out of logs -----------------------------------------------------------------


def test_credentials_and_user_data_never_logged(make, peer, caplog, cluster):
    caplog.set_level(logging.DEBUG)  # botocore logs whole requests at DEBUG
    provider = make()
    [instance] = provider.launch(request(cluster))
    provider.list_owned(cluster)
    peer.inject("RunInstances", 401, "AuthFailure", times=1)
    with pytest.raises(AuthError):
        provider.launch(request(cluster))
    provider.check()
    provider.terminate([instance.id])
    assert "RunInstances" in caplog.text, "the test must see botocore's request logging"
    for secret in (TEST_SECRET_KEY, JOIN_TOKEN, base64.b64encode(USER_DATA.encode()).decode()):
        assert secret not in caplog.text
    assert "testing-secret" not in repr(provider)


# -- IAM policy -------------------------------------------------------------------------------


def _policy_actions() -> tuple[set[str], list[dict]]:
    statements = json.loads(POLICY_FILE.read_text())["Statement"]
    actions: set[str] = set()
    for statement in statements:
        assert statement["Effect"] == "Allow"
        listed = statement["Action"]
        actions.update([listed] if isinstance(listed, str) else listed)
    return actions, statements


def _ec2_actions_named_in(path: Path) -> set[str]:
    """Every EC2 operation whose boto3 method name appears in a module's (or package's) source.

    Names are matched against boto3's own method -> API mapping, whether called (``ec2.x(``),
    paginated (``get_paginator("x")``) or passed as a string (the catalogue's ``_pages(c, "x")``).
    """
    mapping = boto3.client("ec2", region_name=TEST_REGION, aws_access_key_id="x",
                           aws_secret_access_key="x").meta.method_to_api_mapping
    files = sorted(path.glob("*.py")) if path.is_dir() else [path]
    text = "\n".join(f.read_text() for f in files)
    words = set(re.findall(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b", text))
    return {f"ec2:{mapping[word]}" for word in words if word in mapping}


ADAPTER_CALLS = {"ec2:RunInstances", "ec2:DescribeInstances", "ec2:DescribeImages",
                 "ec2:TerminateInstances", "ec2:CreatePlacementGroup", "ec2:DeletePlacementGroup",
                 "ec2:DescribePlacementGroups"}
REFRESH_CALLS = {"ec2:DescribeSpotPriceHistory", "ec2:DescribeInstanceTypes"}


def test_iam_policy_grants_exactly_what_burst_calls():
    actions, statements = _policy_actions()
    called = _ec2_actions_named_in(Path(aws_module.__file__).parent)  # the whole package
    assert called == ADAPTER_CALLS
    # CreateTags (TagSpecifications) and iam:PassRole (the instance profile) are implied by
    # RunInstances' parameters, not called: everything else the adapter is granted, it calls.
    assert called == {a for a in IAM_ACTIONS if a.startswith("ec2:")} - {"ec2:CreateTags"}
    # `burst catalog refresh` (providers/catalog.py) runs with the controller's credentials too.
    catalog_file = REPO_ROOT / "providers" / "catalog.py"
    refresh = _ec2_actions_named_in(catalog_file) if catalog_file.exists() else REFRESH_CALLS
    assert refresh == REFRESH_CALLS
    assert actions == set(IAM_ACTIONS) | refresh, "the policy grants exactly what burst calls"
    by_action: dict[str, list[dict]] = {}
    for statement in statements:
        listed = statement["Action"]
        for action in [listed] if isinstance(listed, str) else listed:
            by_action.setdefault(action, []).append(statement)
    [tagging] = by_action["ec2:CreateTags"]
    assert tagging["Condition"] == {
        "StringEquals": {"ec2:CreateAction": ["RunInstances", "CreatePlacementGroup"]}}
    [grouping] = by_action["ec2:CreatePlacementGroup"]
    assert "aws:RequestTag/burst:cluster" in grouping["Condition"]["Null"]
    [ungrouping] = by_action["ec2:DeletePlacementGroup"]
    assert "aws:ResourceTag/burst:cluster" in ungrouping["Condition"]["Null"]
    [terminating] = by_action["ec2:TerminateInstances"]
    assert "aws:ResourceTag/burst:cluster" in terminating["Condition"]["Null"]
    [passing] = by_action["iam:PassRole"]
    assert passing["Condition"]["StringEquals"]["iam:PassedToService"] == "ec2.amazonaws.com"
    launching = by_action["ec2:RunInstances"]
    assert any("aws:RequestTag/burst:cluster" in s.get("Condition", {}).get("Null", {}) for s in launching)


def test_node_profile_is_a_trust_policy_for_ec2():
    doc = json.loads((REPO_ROOT / "infra" / "aws" / "iam-node-profile.json").read_text())
    [statement] = doc["Statement"]
    assert statement["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert statement["Action"] == "sts:AssumeRole"

