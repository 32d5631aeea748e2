"""What burst writes on EC2 and reads back: tags, RunInstances parameters, states, client tokens.

The ownership tags (``burst:cluster`` ...) go on the instance and its root volume at creation,
with the console ``Name``, ``burst:offering`` (the offering key the node was launched for) and the
cost-allocation tags (``burst:project``, ``burst:user``, the policy's ``tags:``), so Cost Explorer
and the Cost and Usage Report split the instance's and its volume's cost by them.
Imports ``orchestrator.domain`` and the standard library only.
"""

from __future__ import annotations

import hashlib
from typing import Any

from orchestrator.domain.ports import InstanceState, LaunchRequest

PROVIDER_NAME = "aws"
OFFERING_TAG = "burst:offering"  # the offering key a node was launched for
_CLIENT_TOKEN_MAX = 64  # EC2's limit on ClientToken
_TAG_VALUE_MAX = 256  # EC2's limit on a tag value

# EC2 instance state name -> ours.
STATES: dict[str, InstanceState] = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    # A stopped instance runs nothing for us but still exists (and bills its volume): it is on
    # its way out as far as burst is concerned.
    "shutting-down": InstanceState.STOPPING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPING,
    "terminated": InstanceState.TERMINATED,
}


def client_token(request_id: str) -> str:
    """EC2's idempotency token for a request id: the id itself when it fits, else its digest."""
    if len(request_id) <= _CLIENT_TOKEN_MAX and request_id.isascii() and request_id.isprintable():
        return request_id
    return "burst-" + hashlib.sha256(request_id.encode()).hexdigest()[: _CLIENT_TOKEN_MAX - 6]


def launch_tags(req: LaunchRequest) -> dict[str, str]:
    """The tags a node's instance and root volume get at creation."""
    # Besides the ownership tags: the console name, and the offering the node was launched
    # for, so a restarted controller maps the instance back to the policy's exact offering
    # (zonal or regional) without having to guess from type, market and zone.
    # Cost tags first: a policy tag can never overwrite an ownership tag (the policy refuses
    # burst: keys anyway). Values from jobs (project, user) are cut to EC2's length limit.
    cost = {key: value[:_TAG_VALUE_MAX] for key, value in req.cost_tags.items()}
    return {**cost, **req.tags.as_dict(), "Name": req.tags.node_id,
            OFFERING_TAG: req.offering.key}


def run_params(
    cfg: Any, req: LaunchRequest, root_device: str, *, dry_run: bool = False
) -> dict[str, Any]:
    """RunInstances' parameters for ``req``: one instance, tagged at creation, root volume sized."""
    offering = req.offering
    tags = [{"Key": k, "Value": v} for k, v in launch_tags(req).items()]
    params: dict[str, Any] = {
        "ImageId": cfg.ami,
        "InstanceType": offering.instance_type,
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": client_token(req.request_id),
        "TagSpecifications": [
            {"ResourceType": "instance", "Tags": tags},
            {"ResourceType": "volume", "Tags": tags},
        ],
        "BlockDeviceMappings": [{
            "DeviceName": root_device,
            "Ebs": {"VolumeSize": int(cfg.root_volume_gb), "VolumeType": "gp3",
                    "DeleteOnTermination": True},
        }],
        # Terminating (not stopping) on an OS shutdown: a node that halts is gone for good.
        "InstanceInitiatedShutdownBehavior": "terminate",
    }
    if dry_run:
        params.pop("ClientToken")  # a dry run creates nothing to dedupe
    if req.user_data:
        params["UserData"] = req.user_data  # boto3 base64-encodes it
    if getattr(cfg, "subnet_id", None):
        params["SubnetId"] = cfg.subnet_id
    if getattr(cfg, "security_group_ids", None):
        params["SecurityGroupIds"] = list(cfg.security_group_ids)
    profile = getattr(cfg, "iam_instance_profile", None)
    if profile:
        params["IamInstanceProfile"] = {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
    if getattr(cfg, "key_name", None):
        params["KeyName"] = cfg.key_name
    if offering.zone:
        params["Placement"] = {"AvailabilityZone": offering.zone}
    if req.placement_group:
        # One cluster placement group per launch group (providers.aws.placement)
        params.setdefault("Placement", {})["GroupName"] = req.placement_group
    if offering.market == "spot":
        spot: dict[str, Any] = {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        }
        max_price = getattr(cfg, "spot_max_price_usd_hour", None)
        if max_price is not None:
            spot["MaxPrice"] = str(max_price)  # unset: EC2 caps at the on-demand price
        params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
    return params
