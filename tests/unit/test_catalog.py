"""Tests of the bundled GPU offering catalogue (providers/catalog.py, providers/data/).

The bundle loads and is sane, the build script reproduces it byte for byte from the shared source
data, overrides layer over it, and ``refresh_aws`` reads spot prices and GPU facts through boto3
from a moto EC2 server (skipped when moto or boto3 is not installed).
"""

from __future__ import annotations

import filecmp
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from orchestrator.domain.offerings import BillingRule, Offering
from orchestrator.policy.enums import Interconnect
from orchestrator.policy.models import Market
from providers import catalog
from providers.catalog import (
    catalog_info,
    load_catalog,
    load_overrides,
    offerings_for,
    refresh_aws,
    write_overrides,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"
BUILD_OUTPUTS = ("aws_gpu_offerings.csv", "gcp_gpu_offerings.csv", "CATALOG.md", "NOTICE",
                 "LICENSE-Apache-2.0.txt")


def _find(offerings: list[Offering], region: str, instance_type: str, market: Market) -> Offering:
    matches = [o for o in offerings
               if o.region == region and o.instance_type == instance_type and o.market is market]
    assert len(matches) == 1, (region, instance_type, market, matches)
    return matches[0]


@pytest.mark.parametrize("provider", ["aws", "gcp"])
def test_bundled_catalogue_loads_and_is_sane(provider: str) -> None:
    offerings = load_catalog(provider)
    assert len(offerings) > 500
    keys = [o.key for o in offerings]
    assert len(keys) == len(set(keys))
    for o in offerings:
        assert o.provider == provider
        assert o.gpus >= 1 and isinstance(o.gpus, int), o.key
        assert o.price_usd_hour > 0, o.key
        assert o.gpu_model, o.key
        assert o.vcpus and o.vcpus > 0 and o.memory_gib and o.memory_gib > 0, o.key
        assert o.billing == BillingRule(60, 1)
    assert {o.market for o in offerings} == {Market.ON_DEMAND, Market.SPOT}


def test_aws_p4d_in_us_east_1() -> None:
    p4d = _find(load_catalog("aws"), "us-east-1", "p4d.24xlarge", Market.ON_DEMAND)
    assert p4d.gpus == 8 and p4d.gpu_model == "A100" and p4d.price_usd_hour > 0
    assert p4d.zone is None and p4d.vcpus == 96
    p4de = _find(load_catalog("aws"), "us-east-1", "p4de.24xlarge", Market.ON_DEMAND)
    assert p4de.gpu_model == "A100-80GB"


def test_aws_excludes_asics_fractions_and_local_zones() -> None:
    aws = load_catalog("aws")
    families = {o.instance_type.split(".")[0] for o in aws}
    assert not families & {"inf1", "inf2", "trn1", "trn1n", "dl2q", "g5g", "g6f", "gr6f"}
    assert all(o.region.count("-") in (2, 3) and o.region[-1].isdigit() for o in aws)
    assert not any("-wl1" in o.region or o.region.endswith("-atl-1") for o in aws)


def test_gcp_a2_highgpu_8g_spot_is_cheaper() -> None:
    gcp = load_catalog("gcp")
    od = _find(gcp, "us-central1", "a2-highgpu-8g", Market.ON_DEMAND)
    spot = _find(gcp, "us-central1", "a2-highgpu-8g", Market.SPOT)
    assert od.gpus == spot.gpus == 8 and od.gpu_model == "A100"
    assert 0 < spot.price_usd_hour < od.price_usd_hour


def test_catalog_info_reports_sources_and_dates() -> None:
    aws = catalog_info("aws")
    assert aws["rows"] == len(load_catalog("aws"))
    assert aws["price_dates"] == {"on-demand": ["2026-01-21"], "spot": ["2022-05-31"]}
    assert any("tsaol/aws-gpu" in s for s in aws["sources"])
    gcp = catalog_info("gcp")
    assert gcp["price_dates"]["spot"] == ["2026-07-30"]
    assert sum(gcp["rows_by_market"].values()) == gcp["rows"]


def test_unknown_provider_names_the_known_ones() -> None:
    for call in (load_catalog, catalog_info, offerings_for):
        with pytest.raises(ValueError, match="'aws', 'gcp'"):
            call("azure")


def test_offerings_for_filters_regions() -> None:
    assert offerings_for("aws") == sorted(load_catalog("aws"), key=lambda o: o.key)
    some = offerings_for("aws", {"us-east-1", "eu-west-1"})
    assert some and {o.region for o in some} == {"us-east-1", "eu-west-1"}
    assert offerings_for("gcp", {"nowhere-1"}) == []


def test_zonal_offerings_match_their_region(tmp_path: Path) -> None:
    zonal = Offering("gcp", "us-central1", "us-central1-a", "a2-highgpu-8g", Market.SPOT, 8, 9.0,
                     "A100", 96, 680.0)
    path = tmp_path / "overrides.csv"
    write_overrides(path, [zonal], price_date="2026-08-01")
    found = offerings_for("gcp", {"us-central1"}, overrides_path=path)
    assert zonal in found
    assert zonal in offerings_for("gcp", {"us-central1-a"}, overrides_path=path)
    assert zonal not in offerings_for("gcp", {"us-east1"}, overrides_path=path)


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_overrides_layer_over_the_bundle(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / "state" / f"catalog-overrides{suffix}"
    assert load_overrides(path) == []  # absent file: no overrides
    bundled = _find(load_catalog("aws"), "us-east-1", "p4d.24xlarge", Market.SPOT)
    cheaper = replace(bundled, price_usd_hour=3.25)
    new = Offering("aws", "us-east-1", None, "p5.48xlarge", Market.SPOT, 8, 20.5, "H100", 192,
                   2048.0, BillingRule(60, 1))
    # read back with its type's interconnect, from providers/data/interconnect.csv
    new = replace(new, interconnect=Interconnect.EFA, interconnect_gbps=3200)
    assert write_overrides(path, [cheaper, new], price_date="2026-08-01") == 2
    assert set(load_overrides(path)) == {cheaper, new}

    layered = offerings_for("aws", {"us-east-1"}, overrides_path=path)
    assert _find(layered, "us-east-1", "p4d.24xlarge", Market.SPOT).price_usd_hour == 3.25
    assert _find(layered, "us-east-1", "p5.48xlarge", Market.SPOT).price_usd_hour == 20.5
    assert len(layered) == len({o.key for o in layered})
    # The bundle itself is untouched, and another provider ignores AWS overrides.
    assert _find(load_catalog("aws"), "us-east-1", "p4d.24xlarge", Market.SPOT) == bundled
    assert offerings_for("gcp", overrides_path=path) == offerings_for("gcp")

    # A later write merges by key; merge=False replaces the file.
    newer = replace(new, price_usd_hour=19.0)
    assert write_overrides(path, [newer], price_date="2026-08-02") == 2
    assert set(load_overrides(path)) == {cheaper, newer}
    assert write_overrides(path, [newer], merge=False) == 1
    assert load_overrides(path) == [newer]


def test_bad_override_rows_are_reported_with_their_line(tmp_path: Path) -> None:
    path = tmp_path / "o.csv"
    path.write_text(",".join(catalog.COLUMNS) + "\n"
                    "aws,us-east-1,,p4d.24xlarge,spot,0,A100,96,1152,1.0,2026-08-01,x\n")
    with pytest.raises(ValueError, match=r"o\.csv:2: gpus must be >= 1"):
        load_overrides(path)
    bad_json = tmp_path / "o.json"
    bad_json.write_text('[{"provider": "aws", "region": "us-east-1", "instance_type": "x",'
                        ' "market": "spot", "gpus": 8, "price_usd_hour": -1}]')
    with pytest.raises(ValueError, match=r"o\.json:row 1: price_usd_hour must be > 0"):
        load_overrides(bad_json)


@pytest.mark.skipif(not SHARED_DATA.is_dir(),
                    reason=f"source data {SHARED_DATA} not present (needs the shared data sets)")
def test_build_script_reproduces_the_bundle(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "build_catalog.py"),
         "--data", str(SHARED_DATA), "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    committed = ROOT / "providers" / "data"
    for name in BUILD_OUTPUTS:
        assert filecmp.cmp(tmp_path / name, committed / name, shallow=False), (
            f"providers/data/{name} differs from a fresh build: rerun "
            "python scripts/build_catalog.py --data ../shared/data --out providers/data")


def test_bundle_is_small() -> None:
    data = ROOT / "providers" / "data"
    assert sum(f.stat().st_size for f in data.iterdir()) < 1_000_000


# --- refresh_aws against a moto EC2 server -----------------------------------------------------


@pytest.fixture
def ec2_endpoint(monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("boto3", reason="boto3 is not installed (pip install 'burst[aws]')")
    server_mod = pytest.importorskip(
        "moto.server", reason="moto server is not installed (pip install 'moto[server,ec2]')")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_EC2", url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    try:
        yield url
    finally:
        server.stop()


def test_refresh_aws_takes_spot_prices_from_the_api(ec2_endpoint: str) -> None:
    import boto3

    session = boto3.Session(region_name="us-east-1")
    types = {"p4d.24xlarge", "g5.xlarge"}
    refreshed = refresh_aws(session, {"us-east-1", "us-west-2"}, types)

    # What DescribeSpotPriceHistory reports (moto: a fixed price in every AZ).
    client = session.client("ec2", region_name="us-east-1")
    history = client.describe_spot_price_history(InstanceTypes=["p4d.24xlarge"],
                                                 ProductDescriptions=["Linux/UNIX"])
    api_prices = {float(h["SpotPrice"]) for h in history["SpotPriceHistory"]}
    assert len(api_prices) == 1
    api_price = api_prices.pop()

    spot = _find(refreshed, "us-east-1", "p4d.24xlarge", Market.SPOT)
    assert spot.price_usd_hour == api_price
    bundled_spot = _find(load_catalog("aws"), "us-east-1", "p4d.24xlarge", Market.SPOT)
    assert spot.price_usd_hour != bundled_spot.price_usd_hour
    assert spot.zone is None and spot.gpus == 8 and spot.gpu_model == "A100"
    assert spot.vcpus == 96 and spot.memory_gib == 1152.0

    # On-demand stays the bundled price; GPU facts come from DescribeInstanceTypes.
    od = _find(refreshed, "us-east-1", "p4d.24xlarge", Market.ON_DEMAND)
    bundled_od = _find(load_catalog("aws"), "us-east-1", "p4d.24xlarge", Market.ON_DEMAND)
    assert od.price_usd_hour == bundled_od.price_usd_hour
    g5 = _find(refreshed, "us-west-2", "g5.xlarge", Market.SPOT)
    assert (g5.gpus, g5.gpu_model, g5.vcpus, g5.memory_gib) == (1, "A10G", 4, 16.0)
    assert {o.region for o in refreshed} == {"us-east-1", "us-west-2"}
    assert len({o.key for o in refreshed}) == len(refreshed)


def test_refresh_aws_with_a_client_and_stored_as_overrides(ec2_endpoint: str,
                                                          tmp_path: Path) -> None:
    import boto3

    client = boto3.client("ec2", region_name="us-east-1")
    with pytest.raises(ValueError, match="bound to 'us-east-1'"):
        refresh_aws(client, {"us-east-1", "eu-west-1"}, {"p4d.24xlarge"})
    refreshed = refresh_aws(client, {"us-east-1"}, {"p4d.24xlarge", "no-such.type"})
    assert {o.instance_type for o in refreshed} == {"p4d.24xlarge"}

    path = tmp_path / "catalog-overrides.json"  # the name orchestrator.wiring uses
    write_overrides(path, refreshed)
    layered = offerings_for("aws", {"us-east-1"}, overrides_path=path)
    assert _find(layered, "us-east-1", "p4d.24xlarge", Market.SPOT) == \
        _find(refreshed, "us-east-1", "p4d.24xlarge", Market.SPOT)
    assert len(layered) == len(offerings_for("aws", {"us-east-1"}))
