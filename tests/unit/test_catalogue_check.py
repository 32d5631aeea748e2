"""Policies checked against the bundled catalogues; the accelerators shorthand; GPU model names."""

from __future__ import annotations

import csv
from datetime import date
from pathlib import Path

import pytest

from orchestrator.catalogue_check import Level, bundled_catalogue, check, expand, resolve_policies
from orchestrator.policy import PolicyError, load_policy_text
from orchestrator.policy.accelerators import gpu_key, normalise_gpu_model, parse_accelerator

ROOT = Path(__file__).resolve().parents[2]
TODAY = date(2026, 12, 2)
CATALOGUE = bundled_catalogue()

HEAD = """\
version: 1
name: t
pool: {name: gpu, onprem: {nodes: 1, gpus_per_node: 4}}
providers:
  aws: {ami: ami-0a1b2c3d4e5f67890}
  gcp: {project: p, image: projects/p/global/images/i}
"""


def policy(body: str):
    return load_policy_text(HEAD + body, "t.yaml")


def findings(body: str):
    expanded, found = expand(policy(body), CATALOGUE)
    return found + check(expanded, CATALOGUE, TODAY)


def errors(body: str) -> list[str]:
    return [f.message for f in findings(body) if f.level is Level.ERROR]


@pytest.mark.parametrize(("offering", "where", "needle"), [
    ("{provider: aws, region: us-east-1, instance_type: p4d.24xlrge}", "instance_type",
     "did you mean 'p4d.24xlarge'"),
    ("{provider: gcp, region: us-central1, zone: us-central1-a, instance_type: a2-highgpu-9g}",
     "instance_type", "did you mean 'a2-highgpu-8g'"),
    ("{provider: aws, region: us-east-9, instance_type: p4d.24xlarge}", "region",
     "did you mean 'us-east-2' or 'us-east-1'"),
    ("{provider: aws, region: us-east-1, zone: us-west-2a, instance_type: p4d.24xlarge}", "zone",
     "not in region us-east-1"),
    ("{provider: gcp, region: us-central1, zone: us-central1a, instance_type: a2-highgpu-8g}",
     "zone", "looks like us-central1-a"),
])
def test_unknown_type_region_or_zone_is_an_error_with_a_suggestion(offering, where, needle):
    found = [f for f in findings(f"offerings:\n  - {offering}\n") if f.level is Level.ERROR]
    [error] = found
    assert error.loc == ("offerings", 0, where)
    assert needle in error.message


def test_what_the_catalogue_fills_is_reported_with_its_date():
    found = findings("offerings:\n  - {provider: aws, region: us-east-1, instance_type: p5.48xlarge}\n")
    [info] = [f for f in found if f.level is Level.INFO]
    assert "gpus=8, gpu_model=H100, price_usd_hour=" in info.message
    assert "filled from the aws catalogue (price of 2026-01-21)" in info.message
    assert not [f for f in found if f.level is Level.ERROR]


def test_a_stale_price_is_a_warning_not_a_pass():
    policy_ = policy("offerings:\n  - {provider: aws, region: us-east-1, instance_type: p5.48xlarge}\n")
    later = check(policy_, CATALOGUE, date(2028, 1, 1))
    [warning] = [f for f in later if f.level is Level.WARNING]
    assert "burst catalog refresh" in warning.message


def test_a_market_the_catalogue_does_not_sell_is_an_error():
    rows = [r for r in CATALOGUE("aws") if r.offering.instance_type == "p4d.24xlarge"]
    only_od = {r.offering.region for r in rows} - {r.offering.region for r in rows
                                                   if str(r.offering.market) == "spot"}
    if not only_od:
        pytest.skip("every region sells p4d.24xlarge on both markets")
    region = sorted(only_od)[0]
    errs = errors(f"offerings:\n  - {{provider: aws, region: {region}, instance_type: p4d.24xlarge, market: spot}}\n")
    assert errs and "sold only as on-demand" in errs[0]


def test_libcloud_sizes_are_a_warning():
    body = """\
offerings:
  - {provider: libcloud, region: r1, instance_type: gpu.large}
"""
    text = HEAD.replace("  gcp:", "  libcloud: {driver: openstack, key: admin, image: img, sizes: {gpu.large: {gpus: 4, price_usd_hour: 3}}}\n  gcp:") + body
    found = check(load_policy_text(text, "t.yaml"), CATALOGUE, TODAY)
    assert [f.level for f in found] == [Level.WARNING]


def test_accelerator_shorthand_expands_to_every_matching_offering():
    body = """\
accelerators:
  - {accelerator: "nvidia a100 80gb:8", providers: [aws, gcp], regions: [us-east-1, us-central1], market: on-demand}
"""
    expanded, found = expand(policy(body), CATALOGUE)
    keys = {o.key for o in expanded.offerings}
    assert "aws/us-east-1/-/p4de.24xlarge/on-demand" in keys
    assert "gcp/us-central1/-/a2-ultragpu-8g/on-demand" in keys
    assert expanded.accelerators == []
    [info] = found
    assert info.level is Level.INFO and "expands to" in info.message
    assert not [f for f in check(expanded, CATALOGUE, TODAY) if f.level is Level.ERROR]


def test_accelerator_with_no_match_says_what_there_is():
    errs = errors('accelerators:\n  - {accelerator: "A100-80GB:16", providers: [aws], regions: [us-east-1]}\n')
    assert errs == [errs[0]] and "A100-80GB comes 8 per node there" in errs[0]


def test_accelerator_parsing_and_provider_checks():
    assert parse_accelerator("A100-80GB:8") == ("A100-80GB", 8)
    for bad in ("A100", "A100:x", "A100:0", ":8"):
        with pytest.raises(ValueError):
            parse_accelerator(bad)
    with pytest.raises(PolicyError) as caught:
        policy('accelerators:\n  - {accelerator: "A100:8", providers: [libcloud], regions: [r]}\n')
    assert "only aws and gcp" in str(caught.value.problems[0])
    with pytest.raises(PolicyError) as caught:
        policy("limits: {max_nodes: 2}\n")
    assert "at least one offering" in str(caught.value.problems[0])


def test_gpu_model_names_are_one_per_part_across_catalogues():
    names: dict[str, set[str]] = {}
    for provider in ("aws", "gcp"):
        with open(ROOT / "providers" / "data" / f"{provider}_gpu_offerings.csv") as f:
            for row in csv.DictReader(f):
                names.setdefault(provider, set()).add(row["gpu_model"])
    for provider, models in names.items():
        for model in models:
            assert normalise_gpu_model(model) == model, (provider, model)
    # The same parts are spelled the same in both catalogues.
    assert {"A100", "A100-80GB", "H100", "L4"} <= names["aws"] & names["gcp"]
    assert gpu_key("NVIDIA A100-80G") == gpu_key("a100 80gb") == gpu_key("A100-80GB")
    assert gpu_key("A100-40GB") == gpu_key("A100") != gpu_key("A100-80GB")


def test_a_fully_described_offering_unknown_to_the_catalogue_is_a_warning():
    found = findings("offerings:\n  - {provider: aws, region: us-east-1, instance_type: p9.new, "
                     "gpus: 8, price_usd_hour: 40}\n")
    [warning] = found
    assert warning.level is Level.WARNING
    assert "planned with the policy's gpus and price" in warning.message
