"""Contract environment of the AWS provider: the real AwsProvider and boto3 against moto over HTTP.

One moto server serves the whole test session (started on first use, stopped at exit); each
environment resets its state, so environments never see each other's instances. boto3 finds the
server the way production finds EC2, through the standard settings (``AWS_ENDPOINT_URL_EC2`` and
credentials in the environment), set only while the environment is open.

Faults are EC2's own errors, sent by the middleware in front of moto for the next RunInstances
calls: capacity is InsufficientInstanceCapacity over HTTP 500 (which botocore would retry if the
adapter let it), quota VcpuLimitExceeded (400), auth UnauthorizedOperation (403), transient
RequestLimitExceeded (503) and invalid InvalidParameterValue (400).
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.domain.offerings import Offering
from orchestrator.policy.models import Market
from providers.aws import AwsProvider
from tests.contract.env import ContractEnv
from tests.providers_support import point_boto3_at, shared_moto
from tests.servers.moto_ec2 import TEST_REGION, MotoEC2Server

CLUSTER = "contract"

# fault kind -> (HTTP status, EC2 error code, message) as EC2 sends them.
FAULTS: dict[str, tuple[int, str, str]] = {
    "capacity": (500, "InsufficientInstanceCapacity",
                 "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone you requested."),
    "quota": (400, "VcpuLimitExceeded",
              "You have requested more vCPU capacity than your current vCPU limit of 0 allows."),
    "auth": (403, "UnauthorizedOperation", "You are not authorized to perform this operation."),
    "transient": (503, "RequestLimitExceeded", "Request limit exceeded."),
    "invalid": (400, "InvalidParameterValue", "Value (zz) for parameter instanceType is invalid."),
}

# Used when the bundled catalogue (providers/catalog.py) is missing from a build.
FALLBACK_OFFERING = Offering(provider="aws", region=TEST_REGION, zone=None, instance_type="p4d.24xlarge",
                    market=Market.SPOT, gpus=8, price_usd_hour=9.8, gpu_model="A100-40GB",
                    vcpus=96, memory_gib=1152.0)

def linux_ami(server: MotoEC2Server, region: str = TEST_REGION) -> str:
    """An Amazon Linux 2 AMI of the ones moto ships in every region.

    Filtered by name: listing all ~1200 default images takes moto a second or two.
    """
    images = server.client(region=region).describe_images(
        Owners=["amazon"], Filters=[{"Name": "name", "Values": ["amzn2-ami-hvm-*"]}])["Images"]
    return min(images, key=lambda i: i["ImageId"])["ImageId"]


def aws_config(server: MotoEC2Server, **overrides: object) -> SimpleNamespace:
    """An AwsConfig-shaped object launching into moto's default VPC."""
    ec2 = server.client()
    subnet = min(ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])["Subnets"],
                 key=lambda s: s["AvailabilityZone"])
    group = ec2.describe_security_groups(Filters=[{"Name": "group-name", "Values": ["default"]},
                                                  {"Name": "vpc-id", "Values": [subnet["VpcId"]]}])
    values: dict[str, object] = {
        "ami": linux_ami(server), "subnet_id": subnet["SubnetId"],
        "security_group_ids": [group["SecurityGroups"][0]["GroupId"]], "iam_instance_profile": None,
        "key_name": None, "root_volume_gb": 200, "spot_max_price_usd_hour": None, "profile": None,
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def catalogue_offering() -> tuple[Offering, list[Offering] | None]:
    """The offering the suite launches, and the catalogue to hand the provider (None: bundled)."""
    try:
        from providers.catalog import offerings_for
    except ImportError:
        return FALLBACK_OFFERING, [FALLBACK_OFFERING]
    bundled = offerings_for("aws", {TEST_REGION})
    chosen = next((o for o in bundled if o.instance_type == "p4d.24xlarge" and o.market == Market.SPOT
                   and o.region == TEST_REGION), None)
    return (chosen, None) if chosen else (FALLBACK_OFFERING, [FALLBACK_OFFERING])


def read_user_data(server: MotoEC2Server, instance_id: str) -> str:
    attr = server.client().describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(attr["UserData"]["Value"]).decode()


@contextlib.contextmanager
def make_env(tmp_path: Path) -> Iterator[ContractEnv]:
    server = shared_moto()
    server.reset()
    with pytest.MonkeyPatch.context() as mp:
        point_boto3_at(server, mp)
        offering, catalog = catalogue_offering()
        provider = AwsProvider(aws_config(server), regions={TEST_REGION}, catalog=catalog)

        def inject(kind: str, times: int) -> None:
            status, code, message = FAULTS[kind]
            server.inject("RunInstances", status, code, message, times)

        env = ContractEnv("aws", provider, offering, CLUSTER,
                          lambda instance_id: read_user_data(server, instance_id), inject, server.clear)
        try:
            yield env
        finally:
            server.clear()
