"""``burst provider check`` for GCP: can these credentials do what launches need?

Each probe is one row (never raises): credentials, listing instances and machine types in each
zone (every offered type must exist there), reading the boot image. Runs on a ``GcpProvider``,
through its clients and error mapping.
"""

from __future__ import annotations

from typing import Any

from google.cloud import compute_v1

from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import CheckRow, ProviderError
from providers.gcp.labels import IMAGE_RE


def check_rows(provider: Any) -> list[CheckRow]:
    """What ``burst provider check`` prints: can these credentials do what launches need?

    Lists instances in each zone, lists the machine types of each zone (every offered type must
    exist there) and reads the boot image. Never raises; each failure is a row.
    """
    rows: list[CheckRow] = []
    try:
        with provider._errors("credentials"):
            creds = provider._resolved_credentials()
        who = getattr(creds, "service_account_email", None) or type(creds).__name__
        rows.append(
            CheckRow("credentials", True, f"{who}; endpoint {provider._endpoint_text()}")
        )
    except ProviderError as error:
        rows.append(CheckRow("credentials", False, str(error)))
        return rows
    offered = _safe_offerings(provider, rows)
    for zone in sorted(provider.zones):
        rows.append(
            _check_row(f"list instances in {zone}", lambda z=zone: _check_list(provider, z))
        )
        wanted = {o.instance_type for o in offered if o.zone in (zone, None)}
        wanted |= set(getattr(provider.config, "accelerators", {}) or {})
        rows.append(
            _check_row(
                f"machine types in {zone}", lambda z=zone, w=wanted: _check_types(provider, z, w)
            )
        )
    rows.append(_check_row("boot image", lambda: _check_image(provider)))
    return rows


def _check_row(check: str, probe: Any) -> CheckRow:
    try:
        return CheckRow(check, *probe())
    except ProviderError as error:
        return CheckRow(check, False, f"{error.kind}: {error}")


def _safe_offerings(provider: Any, rows: list[CheckRow]) -> list[Offering]:
    try:
        return provider.offerings()
    except (ImportError, OSError, ValueError, KeyError) as exc:  # report it, as a row
        rows.append(CheckRow("offerings", False, f"{type(exc).__name__}: {exc}"))
        return []


def _check_list(provider: Any, zone: str) -> tuple[bool, str]:
    request = compute_v1.ListInstancesRequest(project=provider.project, zone=zone, max_results=1)
    with provider._errors(f"list instances in {zone}"):
        pager = provider._client("instances").list(
            request=request, retry=None, timeout=provider.call_timeout_s
        )
    return True, f"instances.list allowed ({'some' if pager.items else 'no'} instances)"


def _check_types(provider: Any, zone: str, wanted: set[str]) -> tuple[bool, str]:
    request = compute_v1.ListMachineTypesRequest(project=provider.project, zone=zone)
    with provider._errors(f"list machine types in {zone}"):
        names = {
            mt.name
            for mt in provider._client("machine_types").list(
                request=request, retry=None, timeout=provider.call_timeout_s
            )
        }
    missing = sorted(wanted - names)
    if missing:
        return False, f"not offered in {zone}: {', '.join(missing)}"
    return True, f"{len(wanted)} machine types used, all offered"


def _check_image(provider: Any) -> tuple[bool, str]:
    match = IMAGE_RE.search(provider.config.image)
    if match is None:
        return False, f"unrecognised image reference {provider.config.image!r}"
    project = match["project"] or provider.project
    with provider._errors(f"read image {provider.config.image}"):
        images = provider._client("images")
        if match["family"]:
            image = images.get_from_family(
                project=project, family=match["family"], retry=None, timeout=provider.call_timeout_s
            )
        else:
            image = images.get(
                project=project, image=match["name"], retry=None, timeout=provider.call_timeout_s
            )
    ok = image.status in ("", "READY")
    return ok, f"{image.name} ({image.status or 'status unknown'})"
