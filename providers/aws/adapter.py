"""AWS adapter: ``AwsProvider``, burst nodes as EC2 instances, launched and observed through boto3.

The rules (idempotent launch, observation by filters in every region in use, idempotent
terminate, explicit retries, configuration) are in the package docstring, ``providers.aws``. Tags
and launch parameters live in ``tags``, the error table in ``errors``, sessions and client
settings in ``clients``, the provider check in ``checks``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from orchestrator.domain.offerings import Offering, offering_key
from orchestrator.domain.ports import (
    CheckRow,
    Instance,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    ProviderError,
)
from providers.aws.checks import check_rows
from providers.aws.clients import LAUNCH_CONFIG, READ_CONFIG, install_log_redaction, make_session
from providers.aws.errors import NOT_FOUND_CODES, Context, ec2_errors
from providers.aws.placement import AwsPlacement
from providers.aws.tags import OFFERING_TAG, PROVIDER_NAME, STATES, launch_tags, run_params

log = logging.getLogger(__package__)

# Every EC2/IAM API action the adapter needs, i.e. exactly what infra/aws/iam-controller-policy.json
# grants (a test checks both directions, and checks the client calls in this package against it).
# CreateTags is not called directly: EC2 authorises TagSpecifications of RunInstances as
# ec2:CreateTags. iam:PassRole is what handing the node its instance profile requires.
IAM_ACTIONS = frozenset({
    "ec2:RunInstances",
    "ec2:CreateTags",
    "ec2:DescribeInstances",
    "ec2:DescribeImages",
    "ec2:TerminateInstances",
    "ec2:CreatePlacementGroup",
    "ec2:DeletePlacementGroup",
    "ec2:DescribePlacementGroups",
    "iam:PassRole",
})

_FILTER_VALUES_MAX = 100  # ids per instance-id filter, well inside EC2's per-filter limit
_TERMINATE_BATCH = 1000  # EC2's limit on ids per TerminateInstances


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
    # Nodes boot stock images with cloud-init: the executor hands them a #cloud-config that
    # installs the pinned burst and starts the agent's systemd unit (infra/bootstrap/).
    cloud_init = True

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
        # Cluster placement groups for launch groups (the Placement port; providers.aws.placement).
        self.placement = AwsPlacement(self)
        install_log_redaction()

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
        ctx = Context(offering.key, req.request_id)
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
            with ec2_errors(ctx):
                reply = ec2.run_instances(**params)
        instances = []
        for raw in reply.get("Instances", []):
            # The reply's tags may be partial; the ones we asked for are what the instance has.
            raw.setdefault("Tags", [])
            have = {t["Key"] for t in raw["Tags"]}
            raw["Tags"] += [{"Key": k, "Value": v} for k, v in launch_tags(req).items() if k not in have]
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
                for instance in self._describe(region, filters, Context()):
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
            owned.extend(self._describe(region, filters, Context()))
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
            with ec2_errors(Context()):
                found = self._client_session().get_credentials()
        except ProviderError as exc:
            return str(exc)
        return None if found is not None else "NoCredentialsError: Unable to locate credentials"

    def check(self, dry_run: bool = True, offerings: list[Offering] | None = None) -> list[CheckRow]:
        """What ``burst provider check`` reports (``providers.aws.checks``); failures are rows."""
        return check_rows(self, dry_run, offerings)

    # -- launching ----------------------------------------------------------------------------

    def _run_params(self, req: LaunchRequest, *, dry_run: bool = False) -> dict[str, Any]:
        root = self._root_device(req.offering.region, Context(req.offering.key, req.request_id))
        return run_params(self.config, req, root, dry_run=dry_run)

    def _find_by_request(self, request_id: str, ctx: Context) -> list[Instance]:
        # Terminated ones too: "already done" returns the first call's instance whatever its state.
        # Every region in use, not only this offering's: a retry of the request may name another.
        filters = [{"Name": "tag:burst:request-id", "Values": [request_id]}]
        found = [i for region in self._regions_in_use() for i in self._describe(region, filters, ctx)]
        return sorted(found, key=lambda i: (i.launched_at or datetime.min.replace(tzinfo=UTC), i.id))

    def _root_device(self, region: str, ctx: Context) -> str:
        """The AMI's root device name: the root volume is sized by a mapping on that exact name."""
        with self._lock:
            cached = self._root_devices.get(region)
        if cached:
            return cached
        ec2 = self._client(region)
        with ec2_errors(ctx):
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

    def _describe(self, region: str, filters: list[dict[str, Any]], ctx: Context) -> list[Instance]:
        ec2 = self._client(region)
        instances = []
        with ec2_errors(ctx):
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
            with ec2_errors(Context()):
                ec2.terminate_instances(InstanceIds=ids)
            log.info("terminate sent for %s in %s", ", ".join(ids), region)
            return
        except ProviderError as exc:
            if exc.code not in NOT_FOUND_CODES:
                raise
        # One unknown id fails the whole batch: go one by one, skipping the ids EC2 does not know.
        for instance_id in ids:
            try:
                with ec2_errors(Context()):
                    ec2.terminate_instances(InstanceIds=[instance_id])
                log.info("terminate sent for %s in %s", instance_id, region)
            except ProviderError as exc:
                if exc.code not in NOT_FOUND_CODES:
                    raise
                log.info("terminate %s: %s; nothing to do", instance_id, exc.code)

    # -- plumbing -----------------------------------------------------------------------------

    def _client(self, region: str, *, launch: bool = False) -> Any:
        key = (region, "launch" if launch else "read")
        with self._lock:
            client = self._clients.get(key)
            if client is not None:
                return client
            # Session and client creation are not thread-safe in boto3; the lock covers both.
            session = self._client_session(locked=True)
            with ec2_errors(Context()):
                client = session.client(
                    "ec2", region_name=region, config=LAUNCH_CONFIG if launch else READ_CONFIG)
            self._clients[key] = client
            return client

    def _client_session(self, *, locked: bool = False) -> Any:
        """The boto3 Session (the standard credential chain, or the configured profile)."""
        if not locked:
            with self._lock:
                return self._client_session(locked=True)
        if self._session is None:
            with ec2_errors(Context()):
                self._session = make_session(getattr(self.config, "profile", None))
        return self._session


def _chunks(items: list[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]
