"""Policies checked against the provider catalogues, and ``accelerators:`` expanded from them.

The policy models check a policy's shape; only the catalogue knows whether ``p4d.24xlrge``,
``a2-highgpu-9g`` or ``us-east-9`` exist. For a provider with a bundled catalogue (AWS, GCP) an
unknown instance type, region or zone is an **error** at the policy's ``FILE:LINE:COL`` with a
did-you-mean from the catalogue, because at run time it would only ever be "no usable offering".
(An offering the policy describes fully, with ``gpus`` and a price, is only warned about: it can
be planned without the catalogue, e.g. a type newer than the bundled snapshot.) What the policy
leaves out and the catalogue fills (``gpus``, ``gpu_model``, the price) is
reported as **info**, with the catalogue's price date. A price older than :data:`STALE_AFTER` and
a libcloud provider (whose sizes only its driver knows) are **warnings**: reported, not fatal.

:func:`resolve_policies` is what every command that *uses* policies calls after loading them
(the CLI's policy loading, the Celery/API runtime): it expands accelerators into offerings and
refuses the policy on any error. ``burst policy validate`` shows every finding.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from enum import StrEnum
from pathlib import Path

from orchestrator.domain.offerings import Offering
from orchestrator.policy import Policy, PolicyError, Problem
from orchestrator.policy.accelerators import gpu_key
from orchestrator.policy.loader import format_loc, parse_yaml
from orchestrator.policy.enums import Interconnect, InterconnectNeed
from orchestrator.policy.models import OfferingSpec, ProviderName

#: A bundled or refreshed price older than this is reported (run `burst catalog refresh`).
STALE_AFTER = timedelta(days=365)

CATALOGUED = (ProviderName.AWS, ProviderName.GCP)


class Level(StrEnum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the catalogue says about a policy, at a field of it."""

    level: Level
    loc: tuple[str | int, ...]
    message: str


@dataclass(frozen=True, slots=True)
class Row:
    """A catalogue row with its price date."""

    offering: Offering
    price_date: str


# provider -> its rows; None where the provider has no bundled catalogue.
Catalogue = Callable[[str], list[Row] | None]


def bundled_catalogue(overrides_path: Path | None = None) -> Catalogue:
    """The bundled catalogues (refreshed rows from ``overrides_path`` on top), read once."""
    from providers import catalog

    cache: dict[str, list[Row] | None] = {}

    def rows(provider: str) -> list[Row] | None:
        if provider not in cache:
            if provider not in CATALOGUED:
                cache[provider] = None
            else:
                found = {o.key: Row(o, d) for o, d, _ in catalog.catalog_rows(provider)}
                if overrides_path is not None and overrides_path.exists():
                    for o, d in catalog.override_rows(overrides_path):
                        if o.provider == provider:
                            found[o.key] = Row(o, d)
                cache[provider] = list(found.values())
        return cache[provider]

    return rows


def expand(policy: Policy, catalogue: Catalogue) -> tuple[Policy, list[Finding]]:
    """``policy`` with each ``accelerators`` entry replaced by the offerings it stands for."""
    if not policy.accelerators:
        return policy, []
    findings: list[Finding] = []
    offerings = list(policy.offerings)
    keys = {o.key for o in offerings}
    for index, spec in enumerate(policy.accelerators):
        loc: tuple[str | int, ...] = ("accelerators", index, "accelerator")
        matches: list[OfferingSpec] = []
        models_seen: set[str] = set()
        for provider in spec.providers:
            for row in catalogue(str(provider)) or ():
                o = row.offering
                if o.region not in spec.regions or o.market is not spec.market:
                    continue
                models_seen.add(o.gpu_model)
                if gpu_key(o.gpu_model) != gpu_key(spec.model) or o.gpus != spec.count:
                    continue
                offering = OfferingSpec(provider=provider, region=o.region,
                                        instance_type=o.instance_type, market=spec.market,
                                        fallback_on_demand=spec.fallback_on_demand,
                                        max_nodes=spec.max_nodes)
                if offering.key not in keys:
                    keys.add(offering.key)
                    matches.append(offering)
        if not matches:
            counts = sorted({row.offering.gpus for provider in spec.providers
                             for row in catalogue(str(provider)) or ()
                             if row.offering.region in spec.regions
                             and row.offering.market is spec.market
                             and gpu_key(row.offering.gpu_model) == gpu_key(spec.model)})
            if counts:
                hint = f"; {spec.model} comes {' or '.join(map(str, counts))} per node there"
            else:
                near = difflib.get_close_matches(spec.model, sorted(models_seen), n=3, cutoff=0.4)
                hint = f"; did you mean {' or '.join(near)}?" if near else ""
            findings.append(Finding(Level.ERROR, loc, (
                f"no {spec.market} offering with {spec.count}x {spec.model} in "
                f"{'/'.join(map(str, spec.providers))} {', '.join(spec.regions)}{hint} "
                f"(GPU models there: {', '.join(sorted(models_seen)) or 'none'})")))
            continue
        findings.append(Finding(Level.INFO, loc, (
            f"{spec.accelerator} expands to {len(matches)} offering(s): "
            + ", ".join(m.key for m in sorted(matches, key=lambda m: m.key)))))
        offerings.extend(sorted(matches, key=lambda m: m.key))
    expanded = policy.model_copy(update={"offerings": offerings, "accelerators": []})
    return expanded, findings


def check(policy: Policy, catalogue: Catalogue, today: date) -> list[Finding]:
    """What the catalogues say about each offering of ``policy`` (after expansion)."""
    findings: list[Finding] = []
    libcloud_noted = False
    for index, spec in enumerate(policy.offerings):
        rows = catalogue(str(spec.provider))
        if spec.provider is ProviderName.LIBCLOUD and not libcloud_noted:
            libcloud_noted = True
            findings.append(Finding(Level.WARNING, ("offerings", index, "instance_type"), (
                "libcloud sizes are planned as declared under providers.libcloud.sizes: no "
                "bundled catalogue checks them; `burst provider check libcloud` asks the driver")))
        if rows is None:
            continue
        findings.extend(_check_offering(index, spec, rows, today))
    findings.extend(_check_interconnects(policy, catalogue))
    return findings


def _fabric_of(spec: OfferingSpec, catalogue: Catalogue) -> Interconnect | None:
    """The catalogue's interconnect for ``spec``'s instance type; None where no catalogue lists it
    (libcloud, local, a type newer than the bundled snapshot: planned as the policy says)."""
    for row in catalogue(str(spec.provider)) or ():
        if row.offering.instance_type == spec.instance_type:
            return row.offering.interconnect
    return None


def _check_interconnects(policy: Policy, catalogue: Catalogue) -> list[Finding]:
    """An offering asking for an interconnect its type lacks, and a ``multi_node_requires`` no
    listed offering meets, are errors naming the offering(s) and what they have."""
    findings: list[Finding] = []
    have: list[tuple[OfferingSpec, Interconnect | None]] = []
    for index, spec in enumerate(policy.offerings):
        fabric = _fabric_of(spec, catalogue)
        have.append((spec, fabric))
        if fabric is not None and not spec.interconnect.met_by(fabric):
            findings.append(Finding(Level.ERROR, ("offerings", index, "interconnect"), (
                f"{spec.key} asks for interconnect {spec.interconnect}, but the {spec.provider} "
                f"catalogue gives {spec.instance_type} {fabric} (see providers/data/interconnect.csv)")))
    need = policy.multi_node_requires
    if need is not InterconnectNeed.NONE and have and not any(
            need.met_by(f) if f is not None else spec.interconnect.met_by_need(need)
            for spec, f in have):
        listed = ", ".join(f"{spec.key} ({f or 'not catalogued'})" for spec, f in have)
        findings.append(Finding(Level.ERROR, ("multi_node_requires",), (
            f"multi_node_requires: {need}, but no listed offering has it: {listed}; jobs wider "
            "than one node could never be launched for")))
    return findings


def _check_offering(index: int, spec: OfferingSpec, rows: list[Row], today: date) -> list[Finding]:
    at = ("offerings", index)
    provider = str(spec.provider)
    # An offering the policy describes fully (gpus and price) can be planned without the
    # catalogue (a type newer than the bundled snapshot, say): unknown to it is a warning. One
    # that needs the catalogue to be planned at all is an error.
    described = spec.gpus is not None and spec.price_usd_hour is not None
    unknown = Level.WARNING if described else Level.ERROR
    planned = "; planned with the policy's gpus and price" if described else ""
    regions = sorted({r.offering.region for r in rows})
    if spec.region not in regions:
        return [Finding(unknown, (*at, "region"),
                        f"{provider} has no GPU offerings in region {spec.region!r}"
                        + _did_you_mean(spec.region, regions) + planned)]
    types = sorted({r.offering.instance_type for r in rows})
    if spec.instance_type not in types:
        return [Finding(unknown, (*at, "instance_type"),
                        f"{spec.instance_type!r} is not a GPU instance type of {provider}"
                        + _did_you_mean(spec.instance_type, types) + planned)]
    here = [r for r in rows if r.offering.region == spec.region
            and r.offering.instance_type == spec.instance_type]
    if not here:
        where = sorted({r.offering.region for r in rows if r.offering.instance_type == spec.instance_type})
        return [Finding(unknown, (*at, "instance_type"),
                        f"{spec.instance_type} is not offered in {spec.region}; it is in "
                        + ", ".join(where[:8]) + (" ..." if len(where) > 8 else "") + planned)]
    findings: list[Finding] = []
    if spec.zone is not None and not _zone_in(provider, spec.zone, spec.region):
        example = f"{spec.region}a" if provider == ProviderName.AWS else f"{spec.region}-a"
        findings.append(Finding(Level.ERROR, (*at, "zone"),
                                f"zone {spec.zone!r} is not in region {spec.region} "
                                f"(a zone there looks like {example})"))
    row = next((r for r in here if r.offering.market is spec.market), None)
    if row is None:
        markets = sorted(str(r.offering.market) for r in here)
        findings.append(Finding(unknown, (*at, "market"),
                                f"{spec.instance_type} in {spec.region} is sold only as "
                                f"{', '.join(markets)} in the catalogue" + planned))
        return findings
    o = row.offering
    if spec.gpus is not None and spec.gpus != o.gpus:
        findings.append(Finding(Level.WARNING, (*at, "gpus"),
                                f"the catalogue says {spec.instance_type} has {o.gpus} GPU(s); "
                                f"the policy's {spec.gpus} is planned with"))
    filled = [f"gpus={o.gpus}"] if spec.gpus is None else []
    if spec.gpu_model is None and o.gpu_model:
        filled.append(f"gpu_model={o.gpu_model}")
    if spec.price_usd_hour is None:
        filled.append(f"price_usd_hour={o.price_usd_hour:g}")
    if filled:
        findings.append(Finding(Level.INFO, at, (
            f"{spec.key}: {', '.join(filled)} filled from the {provider} catalogue "
            f"(price of {row.price_date})")))
    if spec.price_usd_hour is None and _stale(row.price_date, today):
        findings.append(Finding(Level.WARNING, at, (
            f"{spec.key}: the catalogue's price is from {row.price_date}, over "
            f"{STALE_AFTER.days} days old; run `burst catalog refresh` or give price_usd_hour")))
    return findings


def _did_you_mean(value: str, known: Iterable[str]) -> str:
    near = difflib.get_close_matches(value, list(known), n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(n) for n in near)}?" if near else ""


def _zone_in(provider: str, zone: str, region: str) -> bool:
    if provider == ProviderName.AWS:
        return zone.startswith(region) and zone[len(region):].isalpha() and len(zone) > len(region)
    suffix = zone[len(region):]
    return zone.startswith(region) and len(suffix) == 2 and suffix[0] == "-" and suffix[1].isalpha()


def _stale(price_date: str, today: date) -> bool:
    try:
        return today - date.fromisoformat(price_date) > STALE_AFTER
    except ValueError:
        return True


def problems(findings: Iterable[Finding], file: str, text: str | None) -> list[Problem]:
    """Findings as ``FILE:LINE:COL`` problems, positioned in the policy's YAML ``text``."""
    positions = None
    if text is not None:
        try:
            _, positions = parse_yaml(text, file)
        except PolicyError:
            positions = None
    out = []
    for finding in findings:
        line, column = positions.find(finding.loc) if positions is not None else (1, 1)
        message = finding.message if finding.level is Level.ERROR else f"{finding.level}: {finding.message}"
        out.append(Problem(file, line, column, format_loc(finding.loc), message))
    return out


def resolve_policies(policies: list[Policy], files: list[Path | str | None], catalogue: Catalogue,
                     today: date) -> tuple[list[Policy], list[Problem]]:
    """Expand and check each policy (``files[i]`` is where ``policies[i]`` was read, or None).

    Returns the usable policies and every finding as a problem; raises PolicyError listing the
    errors if any policy has one (warnings and infos do not stop it)."""
    resolved: list[Policy] = []
    notes: list[Problem] = []
    errors: list[Problem] = []
    for policy, file in zip(policies, files, strict=True):
        expanded, findings = expand(policy, catalogue)
        findings += check(expanded, catalogue, today)
        text = _read(file)
        name = str(file) if file is not None else f"<policy {policy.name}>"
        for finding, problem in zip(findings, problems(findings, name, text), strict=True):
            (errors if finding.level is Level.ERROR else notes).append(problem)
        resolved.append(expanded)
    if errors:
        raise PolicyError(sorted(errors, key=lambda p: (p.file, p.line, p.column)))
    return resolved, notes


def resolve_with_catalogue(policies: list[Policy], files: list[Path | str | None],
                           state_dir: Path | None = None) -> tuple[list[Policy], list[Problem]]:
    """:func:`resolve_policies` against the bundled catalogues, with the prices ``burst catalog
    refresh`` wrote into the state directory on top, checked today. ``state_dir``: the settings'
    (default: ``BURST_STATE_DIR``, else the default state directory)."""
    import os

    from orchestrator.wiring import CATALOG_OVERRIDES, default_state_dir

    state = state_dir or Path(os.environ.get("BURST_STATE_DIR") or default_state_dir())
    catalogue = bundled_catalogue(state / CATALOG_OVERRIDES)
    return resolve_policies(policies, files, catalogue, datetime.now(UTC).date())


def _read(file: Path | str | None) -> str | None:
    if file is None:
        return None
    try:
        return Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


__all__ = ["Finding", "Level", "STALE_AFTER", "bundled_catalogue", "check", "expand",
           "problems", "resolve_policies"]
