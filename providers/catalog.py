"""GPU offering catalogue: bundled AWS and GCP prices, an EC2 spot refresh, and a local override file.

The bundled catalogue is two CSV files in ``providers/data/`` (``aws_gpu_offerings.csv`` and
``gcp_gpu_offerings.csv``), built by ``scripts/build_catalog.py`` from real public price snapshots
and described, with sources, dates and licences, in ``providers/data/CATALOG.md``. Each row is one
(region, instance type, market) with its GPUs and hourly list price; ``price_date`` says how old
each price is (the AWS spot prices are older than the on-demand ones).

Each row also carries the instance type's interconnect (EFA on AWS p4d/p5/p6 and the largest g
types; GPUDirect-TCPX/TCPXO/RDMA on GCP a3-high/a3-mega/a3-ultra and a4) and its bandwidth, from
``providers/data/interconnect.csv`` (:func:`interconnects`), whose every row cites the provider's
published page; a type not listed there has none.

Layers, lowest first:

1. the bundled CSVs (:func:`load_catalog`), read once per process;
2. an override file in the state directory (:func:`write_overrides` / :func:`load_overrides`),
   written by ``burst catalog refresh`` from :func:`refresh_aws`; an override row replaces the
   bundled row with the same offering key and may add new keys.

:func:`offerings_for` returns the layered view for some regions. ``refresh_aws`` asks EC2 for the
current spot price per Availability Zone (``DescribeSpotPriceHistory``) and the GPU facts
(``DescribeInstanceTypes``). EC2 has no on-demand price API (that is the separate AWS Price List /
Pricing service), so on-demand prices always come from the bundled catalogue.

This module imports only the domain, the policy's ``Market`` and the standard library; boto3 is
never imported here: the caller hands in a boto3 session, client or client factory.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import statistics
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from importlib import resources
from pathlib import Path
from typing import Any

from orchestrator.domain.offerings import BillingRule, Offering
from orchestrator.policy.enums import Interconnect
from orchestrator.policy.models import Market

KNOWN_PROVIDERS = ("aws", "gcp")
COLUMNS = (
    "provider", "region", "zone", "instance_type", "market", "gpus", "gpu_model", "vcpus",
    "memory_gib", "price_usd_hour", "price_date", "source",
)
# AWS and GCP bill Linux instances per second with a one-minute minimum.
BILLING = {"aws": BillingRule(minimum_s=60, increment_s=1), "gcp": BillingRule(minimum_s=60, increment_s=1)}
REFRESH_SOURCE = "ec2:DescribeSpotPriceHistory+DescribeInstanceTypes"
# DescribeSpotPriceHistory product descriptions that mean "Linux, no licence surcharge". Accounts
# without EC2-Classic see "Linux/UNIX"; older ones (and moto) also report the VPC variant.
LINUX_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")
_FILTER_CHUNK = 100  # values per DescribeInstanceTypes filter, well inside the API's limits

# GPU model vocabulary shared by AWS and GCP rows (and the refresh), so a policy can say "A100-80GB"
# or "H100" whatever the cloud. Keys are the lower-cased source spellings after vendor prefix and
# " Blackwell" suffix are stripped.
_GPU_MODEL_NAMES = {
    "a100": "A100",
    "a100-80gb": "A100-80GB",
    "h100-80gb": "H100",
    "h100-80gb-mega": "H100",  # GCP a3-megagpu: the same H100 80GB, more network bandwidth
    "l4": "L4",
    "rtx6000": "RTX PRO 6000",  # GCP's key for the RTX PRO 6000 Blackwell (g4 machine types)
    "rtx pro 6000": "RTX PRO 6000",
    "rtx pro server 6000": "RTX PRO 6000",
}


def normalize_gpu_model(name: str, per_gpu_memory_gib: float | None = None) -> str:
    """The catalogue's spelling of a GPU model: ``NVIDIA A100`` -> ``A100``, ``a100-80gb`` ->
    ``A100-80GB``, ``NVIDIA B200 Blackwell`` -> ``B200``, ``h100-80gb`` -> ``H100``.

    An A100 with 80 GB per GPU (AWS p4de; EC2 and the AWS price data call both sizes "A100")
    becomes ``A100-80GB`` when ``per_gpu_memory_gib`` says so.
    """
    text = " ".join(name.split())
    for prefix in ("NVIDIA ", "AMD "):
        if text.upper().startswith(prefix):
            text = text[len(prefix):]
    text = text.removesuffix(" Blackwell")
    text = _GPU_MODEL_NAMES.get(text.lower(), text)
    if text == "A100" and per_gpu_memory_gib is not None and per_gpu_memory_gib >= 60:
        text = "A100-80GB"
    return text


def _check_provider(provider: str) -> str:
    if provider not in KNOWN_PROVIDERS:
        known = ", ".join(repr(p) for p in KNOWN_PROVIDERS)
        raise ValueError(f"no catalogue for provider {provider!r}; known providers: {known}")
    return provider


# --- rows <-> offerings ------------------------------------------------------------------------


def _parse_rows(text: str, where: str) -> Iterator[tuple[Offering, str, str]]:
    """(offering, price_date, source) for each row of a catalogue CSV; a bad row raises ValueError
    naming ``where`` and its line."""
    reader = csv.DictReader(io.StringIO(text))
    if tuple(reader.fieldnames or ()) != COLUMNS:
        raise ValueError(f"{where}: expected columns {','.join(COLUMNS)}, got {reader.fieldnames}")
    return _parse_records(((reader.line_num, row) for row in reader), where)


def _parse_json(text: str, where: str) -> Iterator[tuple[Offering, str, str]]:
    """Like :func:`_parse_rows` for a JSON array of objects keyed by the CSV's column names."""
    try:
        records = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON: {exc}") from exc
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError(f"{where}: expected a JSON array of objects")
    as_text = ({c: "" if r.get(c) is None else str(r.get(c)) for c in COLUMNS} for r in records)
    return _parse_records(((f"row {i}", row) for i, row in enumerate(as_text, 1)), where)


def _parse_records(
    records: Iterable[tuple[int | str, dict[str, str]]], where: str,
) -> Iterator[tuple[Offering, str, str]]:
    for line, row in records:
        try:
            provider = _check_provider(row["provider"])
            gpus = int(row["gpus"])
            price = float(row["price_usd_hour"])
            if gpus < 1:
                raise ValueError(f"gpus must be >= 1, got {gpus}")
            if not price > 0:
                raise ValueError(f"price_usd_hour must be > 0, got {price}")
            if not row["region"] or not row["instance_type"]:
                raise ValueError("region and instance_type are required")
            offering = Offering(
                provider=provider,
                region=row["region"],
                zone=row["zone"] or None,
                instance_type=row["instance_type"],
                market=Market(row["market"]),
                gpus=gpus,
                price_usd_hour=price,
                gpu_model=row["gpu_model"],
                vcpus=int(row["vcpus"]) if row["vcpus"] else None,
                memory_gib=float(row["memory_gib"]) if row["memory_gib"] else None,
                billing=BILLING[provider],
            )
            offering = with_interconnect(offering)
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{where}:{line}: {exc}") from exc
        yield offering, row["price_date"], row["source"]


def _format_number(value: float | None) -> str:
    if value is None:
        return ""
    if float(value).is_integer():
        return str(int(value))
    return format(Decimal(repr(float(value))).normalize(), "f")


def _row(offering: Offering, price_date: str, source: str) -> list[str]:
    return [
        offering.provider, offering.region, offering.zone or "", offering.instance_type,
        str(offering.market), str(offering.gpus), offering.gpu_model,
        "" if offering.vcpus is None else str(offering.vcpus),
        _format_number(offering.memory_gib), _format_number(offering.price_usd_hour),
        price_date, source,
    ]


def _json_record(row: list[str]) -> dict[str, Any]:
    record: dict[str, Any] = dict(zip(COLUMNS, row, strict=True))
    record["zone"] = record["zone"] or None
    record["gpus"] = int(record["gpus"])
    record["vcpus"] = int(record["vcpus"]) if record["vcpus"] else None
    record["memory_gib"] = float(record["memory_gib"]) if record["memory_gib"] else None
    record["price_usd_hour"] = float(record["price_usd_hour"])
    return record


# --- the bundled catalogue ---------------------------------------------------------------------


def _data_file(provider: str) -> Any:
    return resources.files("providers").joinpath("data", f"{provider}_gpu_offerings.csv")


@functools.cache
def _bundled(provider: str) -> tuple[tuple[Offering, str, str], ...]:
    resource = _data_file(provider)
    return tuple(_parse_rows(resource.read_text(encoding="utf-8"), f"providers/data/{resource.name}"))


@functools.cache
def interconnects() -> dict[tuple[str, str], tuple[Interconnect, int]]:
    """(provider, instance type) -> its interconnect and published bandwidth (Gbit/s per node),
    from ``interconnect.csv``: hand-kept from the providers' published pages, cited per row in its
    ``source`` column. A type not listed there has no GPU fabric (``none``)."""
    text = resources.files("providers").joinpath("data", "interconnect.csv").read_text(encoding="utf-8")
    table = {}
    for line, r in enumerate(csv.DictReader(io.StringIO(text)), 2):
        if not r.get("source"):
            raise ValueError(f"providers/data/interconnect.csv:{line}: every row cites its source")
        table[(r["provider"], r["instance_type"])] = (Interconnect(r["interconnect"]),
                                                      int(r["bandwidth_gbps"]))
    return table


def with_interconnect(offering: Offering) -> Offering:
    """``offering`` with its instance type's interconnect from :func:`interconnects`."""
    fabric = interconnects().get((offering.provider, offering.instance_type))
    if fabric is None:
        return offering
    return replace(offering, interconnect=fabric[0], interconnect_gbps=fabric[1])


@functools.cache
def interruption_buckets() -> dict[tuple[str, str], int]:
    """(region, instance type) -> the AWS Spot Advisor interruption bucket (0: <5 % .. 4: >20 %
    of instances reclaimed over the trailing month), bundled in aws_spot_interruption.csv."""
    text = resources.files("providers").joinpath("data", "aws_spot_interruption.csv").read_text(
        encoding="utf-8")
    return {(r["region"], r["instance_type"]): int(r["interruption_bucket"])
            for r in csv.DictReader(io.StringIO(text))}


def load_catalog(provider: str) -> list[Offering]:
    """Every bundled offering of ``provider`` (``"aws"`` or ``"gcp"``), read once and cached."""
    return [offering for offering, _, _ in _bundled(_check_provider(provider))]


def catalog_rows(provider: str) -> tuple[tuple[Offering, str, str], ...]:
    """Every bundled row of ``provider`` as (offering, price_date, source)."""
    return _bundled(_check_provider(provider))


def override_rows(path: str | os.PathLike[str]) -> list[tuple[Offering, str]]:
    """Every row of an override file as (offering, price_date); [] if it is absent."""
    return [(offering, price_date) for offering, price_date, _ in _read_overrides(Path(path))]


def catalog_info(provider: str) -> dict[str, Any]:
    """What the bundled catalogue of ``provider`` holds: file, row counts, price dates, sources."""
    rows = _bundled(_check_provider(provider))
    by_market: dict[str, int] = {}
    dates: dict[str, set[str]] = {}
    for offering, price_date, _ in rows:
        by_market[str(offering.market)] = by_market.get(str(offering.market), 0) + 1
        dates.setdefault(str(offering.market), set()).add(price_date)
    return {
        "provider": provider,
        "file": f"providers/data/{_data_file(provider).name}",
        "rows": len(rows),
        "rows_by_market": dict(sorted(by_market.items())),
        "price_dates": {market: sorted(d) for market, d in sorted(dates.items())},
        "sources": sorted({source for _, _, source in rows}),
        "regions": len({o.region for o, _, _ in rows}),
        "instance_types": len({o.instance_type for o, _, _ in rows}),
    }


def _in_regions(offering: Offering, regions: set[str]) -> bool:
    if offering.region in regions:
        return True
    # A zonal offering also matches its zone, or a region given as the zone's prefix
    # (GCP "us-central1-a" is in "us-central1"; AWS "us-east-1a" in "us-east-1").
    zone = offering.zone
    if not zone:
        return False
    return any(zone == r or zone.startswith(f"{r}-") or (zone[:-1] == r and zone[-1].isalpha())
               for r in regions)


def offerings_for(
    provider: str,
    regions: set[str] | None = None,
    *,
    overrides_path: str | os.PathLike[str] | None = None,
) -> list[Offering]:
    """The offerings of ``provider`` in ``regions`` (None: all), overrides layered over the bundle.

    ``overrides_path`` names a file written by :func:`write_overrides`; its rows of this provider
    replace bundled rows with the same key and add new ones. A missing file means no overrides.
    Sorted by offering key.
    """
    merged = {o.key: o for o in load_catalog(provider)}
    if overrides_path is not None:
        for offering in load_overrides(overrides_path):
            if offering.provider == provider:
                merged[offering.key] = offering
    chosen = merged.values() if regions is None else (
        o for o in merged.values() if _in_regions(o, set(regions)))
    return sorted(chosen, key=lambda o: o.key)


# --- overrides ---------------------------------------------------------------------------------


def load_overrides(path: str | os.PathLike[str]) -> list[Offering]:
    """The offerings in an override file; [] if it is absent.

    The file has the bundled CSVs' columns: CSV, or a JSON array of objects with those keys when
    its name ends in ``.json``.
    """
    return [offering for offering, _, _ in _read_overrides(Path(path))]


def _read_overrides(file: Path) -> list[tuple[Offering, str, str]]:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    parse = _parse_json if file.suffix.lower() == ".json" else _parse_rows
    return list(parse(text, str(file)))


def write_overrides(
    path: str | os.PathLike[str],
    offerings: Iterable[Offering],
    *,
    price_date: str | None = None,
    source: str = REFRESH_SOURCE,
    merge: bool = True,
) -> int:
    """Store ``offerings`` in the override file at ``path``; returns the number of rows written.

    With ``merge`` (the default) rows already in the file whose key is not among ``offerings``
    are kept, so refreshing one region leaves another region's refresh in place. ``price_date``
    defaults to today (UTC). A name ending in ``.json`` gets a JSON array of objects keyed by the
    column names, any other a CSV like the bundled ones. The file is replaced atomically.
    """
    date = price_date or datetime.now(UTC).date().isoformat()
    file = Path(path)
    rows: dict[str, list[str]] = {}
    if merge:
        for offering, old_date, old_source in _read_overrides(file):
            rows[offering.key] = _row(offering, old_date, old_source)
    for offering in offerings:
        _check_provider(offering.provider)
        if offering.gpus < 1 or not offering.price_usd_hour > 0:
            raise ValueError(f"{offering.key}: needs gpus >= 1 and a positive price")
        rows[offering.key] = _row(offering, date, source)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as out:
            if file.suffix.lower() == ".json":
                records = [_json_record(rows[key]) for key in sorted(rows)]
                out.write(json.dumps(records, indent=1) + "\n")
            else:
                writer = csv.writer(out, lineterminator="\n")
                writer.writerow(COLUMNS)
                writer.writerows(rows[key] for key in sorted(rows))
        os.replace(tmp, file)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(rows)


# --- refresh from EC2 --------------------------------------------------------------------------


def _ec2_clients(session_or_client: Any, regions: set[str]) -> dict[str, Any]:
    """One EC2 client per region from a boto3 Session (or the boto3 module), an EC2 client, or a
    callable ``region -> client``."""
    if hasattr(session_or_client, "describe_spot_price_history"):
        region = session_or_client.meta.region_name
        others = sorted(regions - {region})
        if others:
            raise ValueError(
                f"the EC2 client is bound to {region!r} and cannot read {', '.join(others)}; "
                "pass a boto3 Session to refresh several regions")
        return {region: session_or_client}
    if hasattr(session_or_client, "client"):
        return {r: session_or_client.client("ec2", region_name=r) for r in sorted(regions)}
    if callable(session_or_client):
        return {r: session_or_client(r) for r in sorted(regions)}
    raise TypeError("refresh_aws needs a boto3 Session, an EC2 client or a callable region -> client")


def _chunks(items: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _pages(client: Any, operation: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
    if client.can_paginate(operation):
        yield from client.get_paginator(operation).paginate(**kwargs)
    else:  # pragma: no cover - botocore paginates both operations used here
        yield getattr(client, operation)(**kwargs)


def _gpu_facts(client: Any, instance_types: list[str]) -> dict[str, tuple[int, str, int | None, float | None]]:
    """instance type -> (gpus, gpu_model, vcpus, memory_gib) for whole-GPU types EC2 knows here."""
    facts: dict[str, tuple[int, str, int | None, float | None]] = {}
    for chunk in _chunks(instance_types, _FILTER_CHUNK):
        # A filter, not InstanceTypes=: an unknown type is skipped instead of failing the call.
        pages = _pages(client, "describe_instance_types",
                       Filters=[{"Name": "instance-type", "Values": chunk}])
        for page in pages:
            for info in page.get("InstanceTypes", []):
                gpus = (info.get("GpuInfo") or {}).get("Gpus") or []
                if not gpus or any(float(g.get("GpuPartitionSize", 1.0)) < 1.0 for g in gpus):
                    continue  # no GPU, or a fractional GPU slice (g6f): not a whole-GPU node
                count = sum(int(g.get("Count", 0)) for g in gpus)
                if count < 1:
                    continue
                first = gpus[0]
                memory_mib = (first.get("MemoryInfo") or {}).get("SizeInMiB")
                model = normalize_gpu_model(
                    str(first.get("Name", "")), memory_mib / 1024 if memory_mib else None)
                vcpus = (info.get("VCpuInfo") or {}).get("DefaultVCpus")
                memory = (info.get("MemoryInfo") or {}).get("SizeInMiB")
                facts[info["InstanceType"]] = (
                    count, model, int(vcpus) if vcpus is not None else None,
                    memory / 1024 if memory is not None else None)
    return facts


def _spot_medians(client: Any, instance_types: list[str], now: datetime) -> dict[str, float]:
    """instance type -> median over the region's AZs of the latest Linux spot price per AZ."""
    latest: dict[tuple[str, str], tuple[datetime, Decimal]] = {}
    for chunk in _chunks(instance_types, _FILTER_CHUNK):
        # StartTime=now returns, per AZ, the price in effect now (the last change before it).
        pages = _pages(client, "describe_spot_price_history", InstanceTypes=chunk,
                       ProductDescriptions=list(LINUX_PRODUCTS), StartTime=now)
        for page in pages:
            for item in page.get("SpotPriceHistory", []):
                if item.get("ProductDescription") not in LINUX_PRODUCTS:
                    continue
                try:
                    price = Decimal(str(item["SpotPrice"]))
                except (KeyError, InvalidOperation):
                    continue
                if price <= 0:
                    continue
                stamp = item.get("Timestamp") or datetime.min.replace(tzinfo=UTC)
                key = (item["InstanceType"], item["AvailabilityZone"])
                if key not in latest or stamp >= latest[key][0]:
                    latest[key] = (stamp, price)
    per_type: dict[str, list[Decimal]] = {}
    for (instance_type, _), (_, price) in latest.items():
        per_type.setdefault(instance_type, []).append(price)
    return {t: float(statistics.median(prices)) for t, prices in per_type.items()}


def refresh_aws(
    session_or_client: Any,
    regions: Iterable[str],
    instance_types: Iterable[str] | None = None,
    *,
    now: datetime | None = None,
) -> list[Offering]:
    """Current AWS spot prices and GPU facts for ``instance_types`` in ``regions``, as Offerings.

    ``session_or_client``: a ``boto3.Session`` (or the ``boto3`` module), an EC2 client (then
    ``regions`` may only hold its region), or a callable ``region -> EC2 client``. Endpoints follow
    boto3's configuration (``AWS_ENDPOINT_URL_EC2`` points it at a local server).
    ``instance_types`` None means every AWS type of the bundled catalogue in those regions.

    For each region and type it returns:

    * the spot offering (zone None) priced at the median over the region's Availability Zones of
      the latest ``DescribeSpotPriceHistory`` price per AZ for Linux/UNIX; no spot price, no spot
      offering (a price is never invented);
    * the on-demand offering with the bundled on-demand price (EC2 has no on-demand price API; the
      AWS Price List service is separate and not used) when the bundle has one.

    GPUs, GPU model, vCPUs and memory come from ``DescribeInstanceTypes`` when EC2 reports a whole
    GPU for the type, else from the bundled catalogue; types with neither are left out. SDK errors
    propagate unchanged. Pass the result to :func:`write_overrides` to keep it.
    """
    wanted_regions = set(regions)
    bundled = load_catalog("aws")
    if instance_types is None:
        types = sorted({o.instance_type for o in bundled if o.region in wanted_regions})
    else:
        types = sorted(set(instance_types))
    moment = now or datetime.now(UTC)
    bundled_facts = {o.instance_type: (o.gpus, o.gpu_model, o.vcpus, o.memory_gib) for o in bundled}
    on_demand = {(o.region, o.instance_type): o for o in bundled if o.market is Market.ON_DEMAND}
    result: list[Offering] = []
    if not types or not wanted_regions:
        return result
    for region, client in _ec2_clients(session_or_client, wanted_regions).items():
        api_facts = _gpu_facts(client, types)
        spot = _spot_medians(client, types, moment)
        for instance_type in types:
            facts = api_facts.get(instance_type) or bundled_facts.get(instance_type)
            if facts is None:
                continue
            gpus, model, vcpus, memory = facts
            listed = on_demand.get((region, instance_type))
            if listed is not None:
                result.append(replace(listed, gpus=gpus, gpu_model=model, vcpus=vcpus,
                                      memory_gib=memory))
            if instance_type in spot:
                result.append(with_interconnect(Offering(
                    provider="aws", region=region, zone=None, instance_type=instance_type,
                    market=Market.SPOT, gpus=gpus, price_usd_hour=spot[instance_type],
                    gpu_model=model, vcpus=vcpus, memory_gib=memory, billing=BILLING["aws"])))
    return sorted(result, key=lambda o: o.key)
