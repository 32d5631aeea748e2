"""``burst provider check`` for AWS: can this account launch and see burst nodes?

Per region a (dry-run) ``DescribeInstances`` and the AMI; with ``dry_run`` also a ``DryRun``
``RunInstances`` of every offering with the real launch parameters. Runs on an ``AwsProvider``,
through its clients; each result is a row, never an exception.
"""

from __future__ import annotations

from typing import Any

from orchestrator.domain.nodes import OwnershipTags
from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import CheckRow, LaunchRequest, ProviderError
from providers.aws.errors import Context, DryRunOk, ec2_errors

# Stand-in request of a dry-run launch (nothing is created, nothing is tagged).
_CHECK_ID = "burst-provider-check"
_CHECK_TAGS = OwnershipTags(cluster=_CHECK_ID, policy=_CHECK_ID, node_id=_CHECK_ID, request_id=_CHECK_ID)


def check_rows(
    provider: Any, dry_run: bool = True, offerings: list[Offering] | None = None
) -> list[CheckRow]:
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
            offerings = provider.offerings()
        regions = sorted(set(provider._regions_in_use()) | {o.region for o in offerings})
    except ProviderError as exc:
        return [CheckRow("offerings", False, describe_error(exc))]
    for region in regions:
        rows.append(_check_call(
            f"describe-instances {region}",
            lambda r=region: provider._client(r).describe_instances(DryRun=dry_run, MaxResults=5),
            dry_run,
        ))
        rows.append(_check_ami(provider, region))
    if dry_run:
        for offering in offerings:
            req = LaunchRequest(request_id=_CHECK_ID, offering=offering, tags=_CHECK_TAGS,
                                user_data="")
            rows.append(_check_call(
                f"run-instances {offering.key}",
                lambda o=offering, rq=req: provider._client(o.region, launch=True).run_instances(
                    DryRun=True, **provider._run_params(rq, dry_run=True)),
                True,
                Context(offering.key),
            ))
    return rows


def _check_call(name: str, call: Any, dry_run: bool, ctx: Context = Context()) -> CheckRow:
    try:
        with ec2_errors(ctx, dry_run_ok=dry_run):
            call()
    except DryRunOk:
        return CheckRow(name, True, "allowed (DryRunOperation)")
    except ProviderError as exc:
        return CheckRow(name, False, describe_error(exc))
    return CheckRow(name, True, "ok")


def _check_ami(provider: Any, region: str) -> CheckRow:
    name = f"ami {provider.config.ami} {region}"
    with provider._lock:
        provider._root_devices.pop(region, None)  # look again: the check is about now
    try:
        device = provider._root_device(region, Context())
    except ProviderError as exc:
        return CheckRow(name, False, describe_error(exc))
    return CheckRow(name, True, f"found, root device {device}")


def describe_error(exc: ProviderError) -> str:
    return f"{exc.kind}: {exc}"
