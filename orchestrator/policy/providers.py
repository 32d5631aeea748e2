"""Per-provider settings in a policy: where and how burst nodes are launched at each cloud.

Credentials never appear in a policy. Clouds use their standard credential chains (AWS: env,
profile, instance role; GCP: Application Default Credentials). Where a driver needs a key or
secret (libcloud), the policy names an environment variable as ``env:NAME`` and the value is read
at launch time, never stored, logged or echoed.
"""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import Field

from orchestrator.policy.base import CloudName, PolicyModel, Text
from orchestrator.policy.bounds import MAX_GPUS_PER_NODE, MAX_PRICE_USD_HOUR
from orchestrator.policy.units import Money

ENV_REF_PATTERN = r"^env:[A-Za-z_][A-Za-z0-9_]*$"
EnvRef = Annotated[str, Field(pattern=ENV_REF_PATTERN, description="env:VARIABLE naming a secret")]


def resolve_env_ref(ref: str) -> str:
    """The value of an ``env:NAME`` reference; raises KeyError naming the variable if unset."""
    name = ref.removeprefix("env:")
    try:
        return os.environ[name]
    except KeyError:
        raise KeyError(f"environment variable {name} (named by {ref!r} in the policy) is not set") from None


class AwsConfig(PolicyModel):
    """EC2 settings. Credentials come from the standard AWS chain (env, profile, instance role)."""

    ami: str = Field(min_length=1, description="AMI of burst nodes (cloud-init and burst installed).")
    subnet_id: str | None = Field(default=None, description="Subnet to launch into (default VPC if unset).")
    security_group_ids: list[str] = Field(default_factory=list, description="Security groups of burst nodes.")
    iam_instance_profile: str | None = Field(
        default=None, description="IAM instance profile name or ARN given to burst nodes.")
    key_name: str | None = Field(default=None, description="EC2 key pair for SSH, if any.")
    root_volume_gb: int = Field(default=200, ge=8, le=65_536, description="Root EBS volume size (GiB).")
    spot_max_price_usd_hour: Money | None = Field(
        default=None, le=MAX_PRICE_USD_HOUR,
        description="Highest spot price to pay (unset: up to the on-demand price).")
    profile: str | None = Field(default=None, description="Named AWS profile (unset: the default chain).")


class GcpAccelerator(PolicyModel):
    """GPUs attached to a machine type that does not include them (N1 machines)."""

    type: CloudName = Field(description="Accelerator type, e.g. nvidia-tesla-t4.")
    count: int = Field(ge=1, le=MAX_GPUS_PER_NODE, description="How many per node.")


class GcpConfig(PolicyModel):
    """Compute Engine settings. Credentials come from Application Default Credentials."""

    project: str = Field(min_length=1, description="GCP project id.")
    image: str = Field(min_length=1, description="Boot image (URL or projects/P/global/images/family/F).")
    network: str = Field(default="global/networks/default", description="VPC network.")
    subnetwork: str | None = Field(default=None, description="Subnetwork (regional), if any.")
    service_account: str | None = Field(default=None, description="Service account e-mail of nodes.")
    disk_size_gb: int = Field(default=200, ge=10, le=65_536, description="Boot disk size (GB).")
    disk_type: str = Field(default="pd-balanced", description="Boot disk type (A3/A4 may need hyperdisk-balanced).")
    external_ip: bool = Field(
        default=False,
        description="Give nodes an external IP (off: nodes reach the controller through Cloud NAT "
        "or a private route).")
    api_endpoint: str | None = Field(
        default=None,
        description="Compute API endpoint, e.g. a Private Service Connect address (unset: Google's).")
    accelerators: dict[CloudName, GcpAccelerator] = Field(
        default_factory=dict,
        description="GPUs to attach per machine type that has none built in (e.g. n1-standard-8).")


class LibcloudSize(PolicyModel):
    """GPU facts and price of a libcloud size, which drivers do not report."""

    gpus: int = Field(ge=1, le=MAX_GPUS_PER_NODE, description="GPUs per node.")
    gpu_model: Text = Field(default="", description="GPU model.")
    price_usd_hour: Money = Field(le=MAX_PRICE_USD_HOUR, description="Hourly price.")
    billing_minimum_s: int = Field(
        default=60, ge=0, le=86_400,
        description="Shortest time the cloud bills (AWS/GCP Linux: 60 s; an hourly cloud: 3600).")
    billing_increment_s: int = Field(
        default=1, ge=1, le=86_400,
        description="Billing granularity in seconds after the minimum (per second: 1; hourly: 3600).")


class LibcloudConfig(PolicyModel):
    """Any apache-libcloud compute driver, by name and arguments."""

    driver: str = Field(min_length=1, description="libcloud Provider name, e.g. openstack.")
    key: str | EnvRef = Field(description="Driver key / user name, or env:VAR holding it.")
    secret: EnvRef | None = Field(default=None, description="env:VAR holding the driver secret.")
    args: dict[str, str | int | bool] = Field(
        default_factory=dict,
        description="Extra driver arguments (e.g. ex_force_auth_url); strings may be env:VAR.")
    image: str = Field(min_length=1, description="Image id (or name) of burst nodes.")
    sizes: dict[CloudName, LibcloudSize] = Field(
        min_length=1, description="The sizes burst may launch, with their GPUs and price.")


class ProviderSettings(PolicyModel):
    """Settings per provider adapter; needed for each provider the offerings use (not local)."""

    aws: AwsConfig | None = Field(default=None, description="EC2 settings.")
    gcp: GcpConfig | None = Field(default=None, description="Compute Engine settings.")
    libcloud: LibcloudConfig | None = Field(default=None, description="libcloud driver settings.")
