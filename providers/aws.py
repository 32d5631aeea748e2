"""AWS provider: burst nodes are EC2 instances, launched and observed through boto3.

``AwsProvider`` keeps the ``Provider`` contract of ``orchestrator.domain.ports`` for EC2:

* **Launch** is one ``RunInstances`` call (one instance, on-demand or one-time spot), tagged at
  creation with the ownership tags on the instance and its root volume. It is idempotent on the
  request id in two layers: before launching, the adapter looks for an instance already tagged
  ``burst:request-id=<id>`` and returns it; and ``ClientToken`` is derived from the request id, so
  EC2 itself dedupes a retry that races the tag lookup (EC2's describe is eventually consistent,
  and its ``ClientToken`` memory is not forever, so neither layer suffices alone).
* **Observation** (``describe``, ``list_owned``) uses ``DescribeInstances`` with filters only
  (filters never fail on unknown ids, whereas ``InstanceIds=`` fails the whole call), in every
  region in use: the regions given (else the catalogue's, else the session's default region) and
  any region launched in. One failing region fails the call: a partial view would look to the
  reconciler like vanished nodes.
* **Terminate** is idempotent: ids that EC2 does not know are skipped (an unknown id fails a
  whole TerminateInstances batch at EC2, so a failed batch is retried id by id).
* **Errors** are mapped by the explicit table :data:`ERROR_CODES` (then by HTTP status) to the
  typed errors of the ports, with the botocore exception as ``__cause__``.

Retries are explicit: ``RunInstances`` is attempted exactly once by botocore (EC2 reports
InsufficientInstanceCapacity as HTTP 500, which botocore would otherwise retry: the orchestrator
fails over to the next offering instead), read and terminate calls get a small bounded retry.

The endpoint is boto3's own business: it honours ``AWS_ENDPOINT_URL_EC2`` (how tests reach a moto
server), so this module has no test hook. Credentials come from the standard chain (or the named
profile) and are never logged; neither is user data, which holds a join token, so a filter on
botocore's request logger redacts it even at DEBUG.

Configuration (duck-typed, the policy's ``AwsConfig``): ``ami``, ``subnet_id``,
``security_group_ids``, ``iam_instance_profile``, ``key_name``, ``root_volume_gb``,
``spot_max_price_usd_hour``, ``profile``. It holds one AMI id and one subnet, and both are
regional at AWS: a policy whose AWS offerings span regions fails to launch outside the AMI's
region with ``InvalidRequest`` (InvalidAMIID.NotFound), so keep one region per policy.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
import botocore.exceptions as bce
from botocore.config import Config

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.offerings import Offering, offering_key
from orchestrator.domain.ports import (
    AuthError,
    CapacityError,
    CheckRow,
    Instance,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    ProviderError,
    QuotaError,
    TransientError,
)

log = logging.getLogger(__name__)

PROVIDER_NAME = "aws"
OFFERING_TAG = "burst:offering"  # the offering key a node was launched for

# Every EC2/IAM API action the adapter needs, i.e. exactly what infra/aws/iam-controller-policy.json
# grants (a test checks both directions, and checks the client calls in this file against it).
# CreateTags is not called directly: EC2 authorises TagSpecifications of RunInstances as
# ec2:CreateTags. iam:PassRole is what handing the node its instance profile requires.
IAM_ACTIONS = frozenset({
    "ec2:RunInstances",
    "ec2:CreateTags",
    "ec2:DescribeInstances",
    "ec2:DescribeImages",
    "ec2:TerminateInstances",
    "iam:PassRole",
})

# -- error mapping ----------------------------------------------------------------------------
# EC2 error codes -> typed errors, from the EC2 API reference's error-code page:
# https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html
# Codes not listed fall back on the HTTP status (see classify_error): 5xx and 429 are transient,
# 401/403 are auth, every other 4xx is an invalid request (a bug or a bad policy).
ERROR_CODES: dict[str, type[ProviderError]] = {
    # No capacity for this offering now: the executor tries the next offering.
    "InsufficientInstanceCapacity": CapacityError,  # sent with HTTP 500
    "InsufficientHostCapacity": CapacityError,
    "InsufficientReservedInstanceCapacity": CapacityError,
    "InsufficientCapacity": CapacityError,
    "SpotMaxPriceTooLow": CapacityError,  # spot price above our max: this offering is out of reach
    "Unsupported": CapacityError,  # type/market not offered in this AZ: try another offering
    # Account limits: retrying will not help until the quota is raised.
    "InstanceLimitExceeded": QuotaError,
    "VcpuLimitExceeded": QuotaError,
    "MaxSpotInstanceCountExceeded": QuotaError,
    "InsufficientFreeAddressesInSubnet": QuotaError,
    # Credentials or permissions: stop using the provider and alert.
    "AuthFailure": AuthError,
    "UnauthorizedOperation": AuthError,
    "InvalidClientTokenId": AuthError,
    "SignatureDoesNotMatch": AuthError,
    "ExpiredToken": AuthError,
    "OptInRequired": AuthError,  # region or service not enabled for the account
    "Blocked": AuthError,  # account suspended
    # Temporary: retry with backoff (the same request id).
    "RequestLimitExceeded": TransientError,  # EC2's throttling code
    "Throttling": TransientError,
    "ServiceUnavailable": TransientError,
    "InternalError": TransientError,
    "InternalFailure": TransientError,
    "Unavailable": TransientError,
}

# botocore's own (non-HTTP) failures. Checked in order; anything else from botocore is transient.
_BOTOCORE_ERRORS: tuple[tuple[type[Exception], type[ProviderError]], ...] = (
    (bce.NoCredentialsError, AuthError),
    (bce.PartialCredentialsError, AuthError),
    (bce.ProfileNotFound, AuthError),
    (bce.CredentialRetrievalError, AuthError),
    (bce.TokenRetrievalError, AuthError),
    (bce.ParamValidationError, InvalidRequest),
    (bce.NoRegionError, InvalidRequest),
    # EndpointConnectionError, ConnectTimeoutError, ReadTimeoutError, ConnectionClosedError:
    (bce.ConnectionError, TransientError),
    (bce.HTTPClientError, TransientError),
)

_NOT_FOUND_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})


def classify_error(code: str, http_status: int | None) -> type[ProviderError]:
    """The typed error for an EC2 error ``code`` sent with ``http_status``."""
    if code in ERROR_CODES:
        return ERROR_CODES[code]
    status = http_status or 0
    if status >= 500 or status == 429:
        return TransientError
    if status in (401, 403):
        return AuthError
    return InvalidRequest


# -- states -----------------------------------------------------------------------------------
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

# -- botocore client settings -----------------------------------------------------------------
_TIMEOUTS = {"connect_timeout": 5, "read_timeout": 30}
# One attempt: a capacity 500 must reach the executor at once, which fails over to the next
# offering. A lost response is safe to retry at the executor's level (same request id).
_LAUNCH_CONFIG = Config(retries={"total_max_attempts": 1, "mode": "standard"}, **_TIMEOUTS)
# Reads and terminate are idempotent: absorb a blip, but stay bounded so a tick is not stalled.
_READ_CONFIG = Config(retries={"total_max_attempts": 3, "mode": "standard"}, **_TIMEOUTS)

_CLIENT_TOKEN_MAX = 64  # EC2's limit on ClientToken
_FILTER_VALUES_MAX = 100  # ids per instance-id filter, well inside EC2's per-filter limit
_TERMINATE_BATCH = 1000  # EC2's limit on ids per TerminateInstances



@dataclass(frozen=True, slots=True)
class _Context:
    """What an error is about, for the typed error's attributes."""

    offering_key: str | None = None
    request_id: str | None = None


def make_session(profile: str | None = None) -> Any:
    """A boto3 Session on the standard credential chain, or on the named profile.

    For callers outside this module that need EC2 with the policy's credentials (e.g. the catalogue
    refresh) without importing boto3 themselves.
    """
    return boto3.session.Session(profile_name=profile) if profile else boto3.session.Session()


def typed_error(exc: BaseException, what: str = "EC2") -> ProviderError | None:
    """The typed error for a botocore exception raised outside the adapter (e.g. by the catalogue
    refresh, which drives EC2 with a session of :func:`make_session`); None for anything else."""
    if isinstance(exc, bce.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "Unknown")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        message = error.get("Message") or str(exc)
        return classify_error(code, status)(f"{what} {exc.operation_name}: {code}: {message}",
                                            provider="aws", code=code)
    if isinstance(exc, bce.BotoCoreError):
        kind = next((k for t, k in _BOTOCORE_ERRORS if isinstance(exc, t)), TransientError)
        return kind(f"{what} client: {type(exc).__name__}: {exc}", provider="aws",
                    code=type(exc).__name__)
    return None


def client_token(request_id: str) -> str:
    """EC2's idempotency token for a request id: the id itself when it fits, else its digest."""
    if len(request_id) <= _CLIENT_TOKEN_MAX and request_id.isascii() and request_id.isprintable():
        return request_id
    return "burst-" + hashlib.sha256(request_id.encode()).hexdigest()[: _CLIENT_TOKEN_MAX - 6]


class AwsProvider:
    """The ``Provider`` whose nodes are EC2 instances.

    ``config``: the policy's ``AwsConfig`` (any object with its attributes). ``regions``: where the
    policy's AWS offerings are; ``list_owned`` looks in each of them (and in any region launched
    in). Unset: the regions of ``catalog`` if given, else the session's default region.
    ``catalog``: the offerings to report (unset: the bundled catalogue, ``providers.catalog``).
    ``session``: a ``boto3.Session`` to use (unset: one on the standard chain or ``profile``).
    """

    name = PROVIDER_NAME
    # Instances launch with InstanceInitiatedShutdownBehavior=terminate: a halt ends the instance
    # (the node agent's dead-man switch uses this when the controller has been gone too long).
    self_terminate_command = "shutdown -h now"

    def __init__(
        self,
        config: Any,
        *,
        regions: set[str] | None = None,
        catalog: list[Offering] | None = None,
        session: Any = None,
    ):
        self.config = config
        self._catalog = list(catalog) if catalog is not None else None
        if self._catalog is not None:
            foreign = [o.key for o in self._catalog if o.provider != PROVIDER_NAME]
            if foreign:
                raise ValueError(f"AwsProvider catalogue offerings must have provider 'aws': {foreign}")
        if regions is None and self._catalog is not None:
            regions = {o.region for o in self._catalog}
        self._regions: set[str] = set(regions or ())
        self._session = session
        self._lock = threading.Lock()  # guards the caches below and session/client creation
        self._clients: dict[tuple[str, str], Any] = {}
        self._instance_regions: dict[str, str] = {}  # instance id -> region, learnt on the way
        self._root_devices: dict[str, str] = {}  # region -> the AMI's root device name
        self._known_offerings: dict[str, Offering] = {o.key: o for o in self._catalog or ()}
        self._request_locks: dict[str, tuple[threading.Lock, int]] = {}  # id -> (lock, users)
        _install_log_redaction()

    def __repr__(self) -> str:
        return f"AwsProvider(regions={sorted(self._regions)})"

    # -- Provider -----------------------------------------------------------------------------

    def offerings(self) -> list[Offering]:
        regions = set(self._regions_in_use())
        if self._catalog is not None:
            catalogue = self._catalog
        else:
            # Imported here: the bundled price catalogue is only needed once offerings are asked.
            from providers.catalog import offerings_for

            catalogue = offerings_for(PROVIDER_NAME, regions)
        found = [o for o in catalogue if o.provider == PROVIDER_NAME and o.region in regions]
        with self._lock:
            self._known_offerings.update((o.key, o) for o in found)
        return found

    def launch(self, req: LaunchRequest) -> list[Instance]:
        offering = req.offering
        ctx = _Context(offering.key, req.request_id)
        if offering.provider != PROVIDER_NAME or not offering.region:
            raise InvalidRequest(
                f"offering {offering.key} is not an AWS offering with a region",
                provider=self.name, offering_key=offering.key, request_id=req.request_id,
                code="UnknownOffering",
            )
        with self._lock:
            self._regions.add(offering.region)
            self._known_offerings.setdefault(offering.key, offering)
        # Serialises launches of one request id within this process; across processes the
        # ClientToken does (at real EC2).
        with self._request_lock(req.request_id):
            existing = self._find_by_request(req.request_id, ctx)
            if existing:
                log.info("launch %s already done: %s", req.request_id,
                         ", ".join(i.id for i in existing))
                return existing
            params = self._run_params(req)
            ec2 = self._client(offering.region, launch=True)
            with self._errors(ctx):
                reply = ec2.run_instances(**params)
        instances = []
        for raw in reply.get("Instances", []):
            # The reply's tags may be partial; the ones we asked for are what the instance has.
            raw.setdefault("Tags", [])
            have = {t["Key"] for t in raw["Tags"]}
            raw["Tags"] += [{"Key": k, "Value": v} for k, v in self._tags(req).items() if k not in have]
            instances.append(self._instance(raw, offering.region))
        log.info("launched %s for request %s on %s", ", ".join(i.id for i in instances),
                 req.request_id, offering.key)
        return instances

    def describe(self, ids: list[str]) -> list[Instance]:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return []
        by_region = self._group_by_region(wanted)
        found: dict[str, Instance] = {}
        for region, region_ids in by_region.items():
            for chunk in _chunks(region_ids, _FILTER_VALUES_MAX):
                filters = [{"Name": "instance-id", "Values": chunk}]
                for instance in self._describe(region, filters, _Context()):
                    found[instance.id] = instance
        return [found[i] for i in wanted if i in found]

    def list_owned(self, cluster: str) -> list[Instance]:
        filters = [
            # No state filter: terminated instances included. EC2 lists one for about an hour,
            # which is the contract's "recently terminated".
            {"Name": "tag:burst:cluster", "Values": [cluster]},
        ]
        owned: list[Instance] = []
        # Every region or none: a partial view would make the reconciler think nodes vanished.
        for region in self._regions_in_use():
            owned.extend(self._describe(region, filters, _Context()))
        return owned

    def terminate(self, ids: list[str]) -> None:
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return
        with self._lock:
            unplaced = [i for i in wanted if i not in self._instance_regions]
        if unplaced:
            self.describe(unplaced)  # learns the region of every id EC2 knows
        by_region: dict[str, list[str]] = {}
        with self._lock:
            for instance_id in wanted:
                region = self._instance_regions.get(instance_id)
                if region is None:
                    log.info("terminate %s: unknown to EC2 in %s; nothing to do", instance_id,
                             ", ".join(sorted(self._regions)) or "no region")
                    continue
                by_region.setdefault(region, []).append(instance_id)
        for region, region_ids in by_region.items():
            for chunk in _chunks(region_ids, _TERMINATE_BATCH):
                self._terminate(region, chunk)

    # -- extras (not part of the Protocol) -----------------------------------------------------

    def credentials_problem(self) -> str | None:
        """Why the credential chain yields no credentials (None: it yields some). No API call is
        made: the chain (environment, profile files, instance role) is only resolved."""
        try:
            with self._errors(_Context()):
                found = self._client_session().get_credentials()
        except ProviderError as exc:
            return str(exc)
        return None if found is not None else "NoCredentialsError: Unable to locate credentials"

    def check(self, dry_run: bool = True, offerings: list[Offering] | None = None) -> list[CheckRow]:
        """What ``burst provider check`` reports: can this account launch and see burst nodes?

        Per region: ``DescribeInstances`` (as a dry run when ``dry_run``) and the AMI. With
        ``dry_run`` (the default) also a ``DryRun`` ``RunInstances`` of every offering (or of
        ``offerings``) with the real launch parameters: EC2 answers ``DryRunOperation`` when the
        call would have been allowed, so permissions, AMI, subnet and instance profile are all
        checked without launching. With ``dry_run=False`` only read calls are made. Failures are
        rows naming the typed error (e.g. ``AuthError``), never exceptions.
        """
        rows: list[CheckRow] = []
        try:
            if offerings is None:
                offerings = self.offerings()
            regions = sorted(set(self._regions_in_use()) | {o.region for o in offerings})
        except ProviderError as exc:
            return [CheckRow("offerings", False, _describe_error(exc))]
        for region in regions:
            rows.append(self._check_call(
                f"describe-instances {region}",
                lambda r=region: self._client(r).describe_instances(DryRun=dry_run, MaxResults=5),
                dry_run,
            ))
            rows.append(self._check_ami(region))
        if dry_run:
            for offering in offerings:
                req = LaunchRequest(request_id=_CHECK_ID, offering=offering, tags=_CHECK_TAGS,
                                    user_data="")
                rows.append(self._check_call(
                    f"run-instances {offering.key}",
                    lambda o=offering, rq=req: self._client(o.region, launch=True).run_instances(
                        DryRun=True, **self._run_params(rq, dry_run=True)),
                    True,
                    _Context(offering.key),
                ))
        return rows

    # -- launching ----------------------------------------------------------------------------

    def _run_params(self, req: LaunchRequest, *, dry_run: bool = False) -> dict[str, Any]:
        cfg = self.config
        offering = req.offering
        tags = [{"Key": k, "Value": v} for k, v in self._tags(req).items()]
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
                "DeviceName": self._root_device(offering.region, _Context(offering.key, req.request_id)),
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

    def _tags(self, req: LaunchRequest) -> dict[str, str]:
        # Besides the ownership tags: the console name, and the offering the node was launched
        # for, so a restarted controller maps the instance back to the policy's exact offering
        # (zonal or regional) without having to guess from type, market and zone.
        return {**req.tags.as_dict(), "Name": req.tags.node_id, OFFERING_TAG: req.offering.key}

    def _find_by_request(self, request_id: str, ctx: _Context) -> list[Instance]:
        # Terminated ones too: "already done" returns the first call's instance whatever its state.
        # Every region in use, not only this offering's: a retry of the request may name another.
        filters = [{"Name": "tag:burst:request-id", "Values": [request_id]}]
        found = [i for region in self._regions_in_use() for i in self._describe(region, filters, ctx)]
        return sorted(found, key=lambda i: (i.launched_at or datetime.min.replace(tzinfo=UTC), i.id))

    def _root_device(self, region: str, ctx: _Context) -> str:
        """The AMI's root device name: the root volume is sized by a mapping on that exact name."""
        with self._lock:
            cached = self._root_devices.get(region)
        if cached:
            return cached
        ec2 = self._client(region)
        with self._errors(ctx):
            images = ec2.describe_images(ImageIds=[self.config.ami]).get("Images", [])
        if not images:
            raise InvalidRequest(
                f"AMI {self.config.ami} not found in {region}", provider=self.name,
                offering_key=ctx.offering_key, request_id=ctx.request_id, code="InvalidAMIID.NotFound",
            )
        device = images[0].get("RootDeviceName") or "/dev/xvda"
        with self._lock:
            self._root_devices[region] = device
        return device

    @contextmanager
    def _request_lock(self, request_id: str) -> Iterator[None]:
        with self._lock:
            lock, users = self._request_locks.get(request_id, (threading.Lock(), 0))
            self._request_locks[request_id] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._lock:
                lock, users = self._request_locks[request_id]
                if users <= 1:
                    del self._request_locks[request_id]  # nobody else waits on it
                else:
                    self._request_locks[request_id] = (lock, users - 1)

    # -- observing ----------------------------------------------------------------------------

    def _describe(self, region: str, filters: list[dict[str, Any]], ctx: _Context) -> list[Instance]:
        ec2 = self._client(region)
        instances = []
        with self._errors(ctx):
            for page in ec2.get_paginator("describe_instances").paginate(Filters=filters):
                for reservation in page.get("Reservations", []):
                    for raw in reservation.get("Instances", []):
                        instances.append(self._instance(raw, region))
        return instances

    def _instance(self, raw: dict[str, Any], region: str) -> Instance:
        instance_id = raw["InstanceId"]
        with self._lock:
            self._instance_regions[instance_id] = region
        tags = {t["Key"]: t.get("Value", "") for t in raw.get("Tags", [])}
        # moto cannot filter on instance-lifecycle, and real EC2 needs no filter: read the field.
        market = "spot" if raw.get("InstanceLifecycle") == "spot" else "on-demand"
        zone = (raw.get("Placement") or {}).get("AvailabilityZone") or None
        state_name = (raw.get("State") or {}).get("Name", "pending")
        launched = raw.get("LaunchTime")
        return Instance(
            id=instance_id,
            provider=self.name,
            state=STATES.get(state_name, InstanceState.PENDING),
            tags=tags,
            offering_key=tags.get(OFFERING_TAG)
            or self._offering_key(region, zone, raw.get("InstanceType", ""), market),
            launched_at=launched.astimezone(UTC) if isinstance(launched, datetime) else None,
        )

    def _offering_key(self, region: str, zone: str | None, instance_type: str, market: str) -> str:
        """The key of the offering an instance without ``burst:offering`` tag belongs to.

        Offerings may be per zone or per region (zone unset); an instance always has a zone, so it
        is matched to the zonal offering if one is known, else to the regional one if known.
        """
        zonal = offering_key(PROVIDER_NAME, region, zone, instance_type, market)
        regional = offering_key(PROVIDER_NAME, region, None, instance_type, market)
        with self._lock:
            if zonal not in self._known_offerings and regional in self._known_offerings:
                return regional
        return zonal

    def _regions_in_use(self) -> list[str]:
        """The regions to look in; with none given, the session's default region (or an error).

        Never an empty list: listing no region would report "nothing exists" to the reconciler.
        """
        with self._lock:
            regions = sorted(self._regions)
        if regions:
            return regions
        region = self._client_session().region_name
        if not region:
            raise InvalidRequest(
                "no AWS region: give AwsProvider regions, or set AWS_DEFAULT_REGION / a profile region",
                provider=self.name, code="NoRegion")
        with self._lock:
            self._regions.add(region)
        return [region]

    def _group_by_region(self, ids: list[str]) -> dict[str, list[str]]:
        """Ids by the region they live in; ids of unknown region are looked for everywhere."""
        groups: dict[str, list[str]] = {}
        regions = self._regions_in_use()
        with self._lock:
            for instance_id in ids:
                region = self._instance_regions.get(instance_id)
                targets = [region] if region else regions
                for target in targets:
                    groups.setdefault(target, []).append(instance_id)
        return groups

    # -- terminating --------------------------------------------------------------------------

    def _terminate(self, region: str, ids: list[str]) -> None:
        ec2 = self._client(region)
        try:
            with self._errors(_Context()):
                ec2.terminate_instances(InstanceIds=ids)
            log.info("terminate sent for %s in %s", ", ".join(ids), region)
            return
        except ProviderError as exc:
            if exc.code not in _NOT_FOUND_CODES:
                raise
        # One unknown id fails the whole batch: go one by one, skipping the ids EC2 does not know.
        for instance_id in ids:
            try:
                with self._errors(_Context()):
                    ec2.terminate_instances(InstanceIds=[instance_id])
                log.info("terminate sent for %s in %s", instance_id, region)
            except ProviderError as exc:
                if exc.code not in _NOT_FOUND_CODES:
                    raise
                log.info("terminate %s: %s; nothing to do", instance_id, exc.code)

    # -- checks -------------------------------------------------------------------------------

    def _check_call(self, name: str, call: Any, dry_run: bool, ctx: _Context = _Context()) -> CheckRow:
        try:
            with self._errors(ctx, dry_run_ok=dry_run):
                call()
        except _DryRunOk:
            return CheckRow(name, True, "allowed (DryRunOperation)")
        except ProviderError as exc:
            return CheckRow(name, False, _describe_error(exc))
        return CheckRow(name, True, "ok")

    def _check_ami(self, region: str) -> CheckRow:
        name = f"ami {self.config.ami} {region}"
        with self._lock:
            self._root_devices.pop(region, None)  # look again: the check is about now
        try:
            device = self._root_device(region, _Context())
        except ProviderError as exc:
            return CheckRow(name, False, _describe_error(exc))
        return CheckRow(name, True, f"found, root device {device}")

    # -- plumbing -----------------------------------------------------------------------------

    def _client(self, region: str, *, launch: bool = False) -> Any:
        key = (region, "launch" if launch else "read")
        with self._lock:
            client = self._clients.get(key)
            if client is not None:
                return client
            # Session and client creation are not thread-safe in boto3; the lock covers both.
            session = self._client_session(locked=True)
            with self._errors(_Context()):
                client = session.client(
                    "ec2", region_name=region, config=_LAUNCH_CONFIG if launch else _READ_CONFIG)
            self._clients[key] = client
            return client

    def _client_session(self, *, locked: bool = False) -> Any:
        """The boto3 Session (the standard credential chain, or the configured profile)."""
        if not locked:
            with self._lock:
                return self._client_session(locked=True)
        if self._session is None:
            with self._errors(_Context()):
                self._session = make_session(getattr(self.config, "profile", None))
        return self._session

    @contextmanager
    def _errors(self, ctx: _Context, *, dry_run_ok: bool = False) -> Iterator[None]:
        """Translate botocore's exceptions into the typed errors, keeping them as the cause."""
        try:
            yield
        except bce.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or "Unknown")
            if dry_run_ok and code == "DryRunOperation":
                raise _DryRunOk() from exc
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            kind = classify_error(code, status)
            message = error.get("Message") or str(exc)
            raise kind(
                f"EC2 {exc.operation_name}: {code}: {message}", provider=self.name,
                offering_key=ctx.offering_key, request_id=ctx.request_id, code=code,
            ) from exc
        except bce.BotoCoreError as exc:
            kind = next((k for t, k in _BOTOCORE_ERRORS if isinstance(exc, t)), TransientError)
            raise kind(
                f"EC2 client: {type(exc).__name__}: {exc}", provider=self.name,
                offering_key=ctx.offering_key, request_id=ctx.request_id, code=type(exc).__name__,
            ) from exc


# Stand-in request of a dry-run launch (nothing is created, nothing is tagged).
_CHECK_ID = "burst-provider-check"
_CHECK_TAGS = OwnershipTags(cluster=_CHECK_ID, policy=_CHECK_ID, node_id=_CHECK_ID, request_id=_CHECK_ID)


class _DryRunOk(Exception):
    """A dry run EC2 would have allowed."""


def _describe_error(exc: ProviderError) -> str:
    return f"{exc.kind}: {exc}"


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


# -- log redaction ----------------------------------------------------------------------------
# botocore's request logger prints the whole request at DEBUG, user data (with its join token)
# included. This filter blanks it in both forms botocore logs: the params dict and the encoded body.
_USER_DATA_BODY = re.compile(r"(UserData=)[^&'\"\s]*")
_USER_DATA_PARAM = re.compile(r"('UserData':\s*)(b?'[^']*'|b?\"[^\"]*\")")


class _RedactUserData(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except (TypeError, ValueError):  # a record that cannot format is not ours to fix
            return True
        if "UserData" in text:
            text = _USER_DATA_BODY.sub(r"\1<redacted>", text)
            text = _USER_DATA_PARAM.sub(r"\1'<redacted>'", text)
            record.msg, record.args = text, ()
        return True


_REDACTOR = _RedactUserData()


def _install_log_redaction() -> None:
    for name in ("botocore.endpoint", "botocore.parsers", "botocore.hooks"):
        logger = logging.getLogger(name)
        if _REDACTOR not in logger.filters:
            logger.addFilter(_REDACTOR)
