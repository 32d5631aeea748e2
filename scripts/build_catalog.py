"""Build the bundled GPU offering catalogue in ``providers/data/`` from real public price snapshots.

Run from the repository root (rerunnable; the output is deterministic, byte for byte)::

    python scripts/build_catalog.py --data ../shared/data --out providers/data
    python scripts/build_catalog.py --data ../shared/data --out providers/data --check

``--check`` builds into a temporary directory and exits 1 if any file differs from ``--out``.

Writes ``aws_gpu_offerings.csv`` and ``gcp_gpu_offerings.csv`` (columns ``provider, region, zone,
instance_type, market, gpus, gpu_model, vcpus, memory_gib, price_usd_hour, price_date, source``;
one row per region, instance type and market, sorted), ``CATALOG.md`` (sources, dates, licences,
row counts), ``NOTICE`` and ``LICENSE-Apache-2.0.txt`` (the GCP source's licence).

Inputs (under ``--data``; each directory's ``SOURCE.md`` gives provenance):

* ``aws-ondemand-prices/aws_gpu_ondemand_by_region_2026-01-21.csv``: AWS on-demand (Linux) prices.
  Kept: family "GPU instance" with an NVIDIA or AMD GPU and a whole number of GPUs (>= 1), in
  standard regions. Dropped: ML ASICs (Inferentia, Trainium, Gaudi, Qualcomm AI 100), g5g (an
  arm64 Graviton host, labelled with an ARM Mali GPU upstream), fractional-GPU slices (g6f, gr6f),
  and Local Zone / Wavelength keys (``us-east-1-atl-1``, ``...-wl1-...``), which are not regions.
* ``aws-spot-price-snapshot-2022-05-31/aws_spot_prices_gpu_linux_2022-05-31.csv``: AWS spot
  prices per Availability Zone ID. The zone-ID prefix gives the region (``use1`` -> ``us-east-1``);
  per (type, AZ) the latest price in the window is taken, then the **median over the region's
  AZs** (the typical price a launch in an unpinned AZ meets; the maximum would over-state it from
  one outlier AZ). The zone column stays empty: AZ IDs are not the account-specific zone names.
  A spot row is written only where the same type has a 2026 on-demand row in that region (the
  newer file says where the type is still sold); no spot price is ever invented.
* ``gcp-gpu-prices-cyclenerd/gcp_gpu_machine_prices_latest.csv``: GCP on-demand and Spot prices per
  region of machine types with built-in GPUs; fractional-GPU g4 slices are dropped.
"""

from __future__ import annotations

import argparse
import csv
import filecmp
import io
import re
import shutil
import statistics
import sys
import tempfile
from collections import Counter
from datetime import datetime
from decimal import Decimal
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from providers.catalog import COLUMNS, normalize_gpu_model

COMMAND = "python scripts/build_catalog.py --data ../shared/data --out providers/data"

AWS_OD_FILE = "aws-ondemand-prices/aws_gpu_ondemand_by_region_2026-01-21.csv"
AWS_OD_DATE = "2026-01-21"
AWS_OD_SOURCE = "tsaol/aws-gpu@7412fd2"
AWS_SPOT_FILE = "aws-spot-price-snapshot-2022-05-31/aws_spot_prices_gpu_linux_2022-05-31.csv"
AWS_SPOT_DATE = "2022-05-31"
AWS_SPOT_SOURCE = "ericpauley/aws-spot-price-history@99042f7"
GCP_FILE = "gcp-gpu-prices-cyclenerd/gcp_gpu_machine_prices_latest.csv"
GCP_LICENSE = "gcp-gpu-prices-cyclenerd/LICENSE-Apache-2.0.txt"
GCP_REPO = "Cyclenerd/google-cloud-pricing-cost-calculator"

# AZ-ID prefix -> region, as listed in the spot snapshot's SOURCE.md. An unknown prefix is an error.
AZ_PREFIX_REGION = {
    "use1": "us-east-1", "use2": "us-east-2", "usw1": "us-west-1", "usw2": "us-west-2",
    "cac1": "ca-central-1", "sae1": "sa-east-1", "euc1": "eu-central-1", "euw1": "eu-west-1",
    "euw2": "eu-west-2", "euw3": "eu-west-3", "eun1": "eu-north-1", "apne1": "ap-northeast-1",
    "apne2": "ap-northeast-2", "apne3": "ap-northeast-3", "aps1": "ap-south-1",
    "apse1": "ap-southeast-1", "apse2": "ap-southeast-2",
}
# A standard AWS region code (us-east-1, us-gov-west-1, ap-southeast-5), not a Local/Wavelength zone.
AWS_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d+$")
AWS_GPU_VENDORS = ("NVIDIA ", "AMD ")

Row = list[str]


def _dec(text: str) -> str:
    """A price as plain decimal text without trailing zeros: ``4.426400`` -> ``4.4264``."""
    return format(Decimal(text).normalize(), "f")


def _whole(text: str) -> int | None:
    value = Decimal(text)
    return int(value) if value == value.to_integral_value() else None


def _memory_gib(text: str) -> str:
    """``30.5 GB`` / ``1152 GiB`` -> ``30.5`` / ``1152`` (ec2instances' GB are GiB)."""
    number, _, unit = text.strip().partition(" ")
    if unit not in ("GB", "GiB"):
        raise ValueError(f"unexpected memory {text!r}")
    return _dec(number)


def _per_gpu_memory_gib(text: str, gpus: int) -> float | None:
    match = re.match(r"^(\d+(?:\.\d+)?) GB", text)
    return float(match.group(1)) / gpus if match else None


def build_aws(data: Path) -> tuple[list[Row], dict[str, object]]:
    facts: dict[str, tuple[str, ...]] = {}
    on_demand: dict[tuple[str, str], Row] = {}
    dropped: Counter[str] = Counter()
    dropped_region_keys: set[str] = set()
    with (data / AWS_OD_FILE).open(newline="", encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            itype = rec["instance_type"]
            gpus = _whole(rec["gpu_count"])
            if rec["family"] != "GPU instance":
                dropped[f"{itype} (ML ASIC: {rec['gpu_model']})"] += 1
                continue
            if not rec["gpu_model"].startswith(AWS_GPU_VENDORS):
                dropped[f"{itype} (not an NVIDIA/AMD GPU: {rec['gpu_model']})"] += 1
                continue
            if gpus is None or gpus < 1:
                dropped[f"{itype} (fractional GPU: {rec['gpu_count']})"] += 1
                continue
            if not AWS_REGION.match(rec["region"]):
                dropped_region_keys.add(rec["region"])
                continue
            shape = (
                str(gpus),
                normalize_gpu_model(rec["gpu_model"], _per_gpu_memory_gib(rec["gpu_memory"], gpus)),
                str(int(rec["vcpus"])),
                _memory_gib(rec["memory"]),
            )
            if facts.setdefault(itype, shape) != shape:
                raise ValueError(f"{itype}: shape differs between regions: {facts[itype]} {shape}")
            on_demand[(rec["region"], itype)] = [
                "aws", rec["region"], "", itype, "on-demand", *shape,
                _dec(rec["ondemand_hourly_usd"]), AWS_OD_DATE, AWS_OD_SOURCE,
            ]

    latest: dict[tuple[str, str], tuple[datetime, Decimal, str]] = {}
    with (data / AWS_SPOT_FILE).open(newline="", encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            if rec["product_description"] != "Linux/UNIX":
                continue
            region = AZ_PREFIX_REGION[rec["region_code_prefix"]]
            if not rec["availability_zone_id"].startswith(rec["region_code_prefix"] + "-"):
                raise ValueError(f"AZ id {rec['availability_zone_id']} outside its prefix")
            stamp = datetime.fromisoformat(rec["timestamp_utc"])
            key = (rec["instance_type"], rec["availability_zone_id"])
            if key not in latest or stamp > latest[key][0]:
                latest[key] = (stamp, Decimal(rec["spot_price_usd_per_hour"]), region)
    per_region: dict[tuple[str, str], list[Decimal]] = {}
    for (itype, _az), (_stamp, price, region) in latest.items():
        if price > 0:
            per_region.setdefault((region, itype), []).append(price)
    spot: dict[tuple[str, str], Row] = {}
    spot_unmatched: set[str] = set()
    for (region, itype), prices in sorted(per_region.items()):
        if (region, itype) not in on_demand:
            spot_unmatched.add(itype if itype not in facts else f"{itype} in {region}")
            continue
        median = statistics.median(sorted(prices))
        spot[(region, itype)] = [
            "aws", region, "", itype, "spot", *facts[itype],
            _dec(str(median)), AWS_SPOT_DATE, AWS_SPOT_SOURCE,
        ]
    rows = sorted([*on_demand.values(), *spot.values()], key=lambda r: (r[1], r[3], r[4]))
    spot_above = sorted(
        f"{r} {t}" for (r, t), row in spot.items()
        if Decimal(row[9]) >= Decimal(on_demand[(r, t)][9]))
    stats = {
        "dropped_types": sorted(dropped),
        "dropped_region_keys": len(dropped_region_keys),
        "spot_unmatched": sorted(spot_unmatched),
        "spot_at_or_above_on_demand": spot_above,
    }
    return rows, stats


def build_gcp(data: Path) -> tuple[list[Row], dict[str, object]]:
    rows: list[Row] = []
    dropped: set[str] = set()
    generated: set[str] = set()
    with (data / GCP_FILE).open(newline="", encoding="utf-8") as f:
        for rec in csv.DictReader(f):
            gpus = _whole(rec["gpu_count"])
            if gpus is None or gpus < 1:
                dropped.add(f"{rec['machine_type']} (fractional GPU: {rec['gpu_count']})")
                continue
            date = datetime.strptime(rec["snapshot_generated"], "%a %b %d %H:%M:%S %Y").date()
            generated.add(rec["snapshot_generated"])
            shape = [str(gpus), normalize_gpu_model(rec["gpu_model"]), str(int(rec["vcpus"])),
                     _dec(rec["ram_gb"])]
            source = f"{GCP_REPO}@{rec['commit'][:7]}"
            for market, price in (("on-demand", rec["ondemand_hourly_usd"]),
                                  ("spot", rec["spot_hourly_usd"])):
                if price and Decimal(price) > 0:
                    rows.append(["gcp", rec["region"], "", rec["machine_type"], market, *shape,
                                 _dec(price), date.isoformat(), source])
    rows.sort(key=lambda r: (r[1], r[3], r[4]))
    return rows, {"dropped_types": sorted(dropped), "generated": sorted(generated)}


def _csv_text(rows: list[Row]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(rows)
    return out.getvalue()


def _counts(rows: list[Row]) -> str:
    markets = Counter(r[4] for r in rows)
    return (f"{len(rows)} rows ({markets['on-demand']} on-demand, {markets['spot']} spot), "
            f"{len({r[1] for r in rows})} regions, {len({r[3] for r in rows})} instance types")


def _catalog_md(aws: list[Row], aws_stats: dict, gcp: list[Row], gcp_stats: dict) -> str:
    def bullets(items: object) -> str:
        return "\n".join(f"  - {item}" for item in items) or "  - none"  # type: ignore[union-attr]

    return f"""# Bundled GPU offering catalogue

Generated by `scripts/build_catalog.py`; do not edit by hand. Rebuild from the repository root with

    {COMMAND}

| file | contents |
|---|---|
| `aws_gpu_offerings.csv` | {_counts(aws)} |
| `gcp_gpu_offerings.csv` | {_counts(gcp)} |
| `aws_spot_interruption.csv` | AWS Spot Advisor interruption bucket (0: <5 %, 1: 5-10 %, 2: 10-15 %, 3: 15-20 %, 4: >20 % of instances reclaimed over the trailing month) and savings % per region and GPU instance type, Linux, snapshot 2025-06-28 (`aws-spot-advisor/` of the shared data: spotinfo, Apache-2.0); the observer's published prior of each spot offering's preemption hazard |

Columns: `{",".join(COLUMNS)}`. One row per (region, instance type, market). Prices are public
Linux list prices in USD per hour (no Savings Plans, committed-use, sustained-use or negotiated
discounts, no taxes). `price_date` is the date of the snapshot the price comes from; `source` names
the upstream repository and commit. `zone` is empty: prices are per region. `memory_gib` is the
instance memory as published (AWS and GCP "GB" here are GiB). GPU models use one vocabulary for
both clouds (`A100`, `A100-80GB`, `H100`, `H200`, `B200`, `L4`, `L40S`, `A10G`, `T4`, `V100`,
`RTX PRO 6000`, ...). Billing for both: per second with a one-minute minimum (Linux).

## AWS
- **On-demand** (`price_date` {AWS_OD_DATE}): `{AWS_OD_FILE}`, from
  https://github.com/tsaol/aws-gpu (commit `7412fd256c5eda04a70a17742a68e8e44824b2cb`,
  `data/all_gpu_instances.js`), itself generated from instances.vantage.sh / ec2instances.info
  data (AWS Price List API). Licence: MIT as declared in the upstream README (see `NOTICE`).
- **Spot** (`price_date` {AWS_SPOT_DATE}): `{AWS_SPOT_FILE}`, real `DescribeSpotPriceHistory`
  output archived by Eric Pauley, https://github.com/ericpauley/aws-spot-price-history (file
  `prices/2022/05.tsv.zst` at commit `99042f7`; data now at Zenodo, DOI 10.5281/zenodo.14198917).
  No licence is stated upstream (AWS public API output); attributed here. **These spot prices are
  from 2022, four years older than the on-demand prices**; run `burst catalog refresh` for
  current ones.
  Per (instance type, Availability Zone ID) the latest price of the 2022-05-31 window is taken;
  the zone-ID prefix gives the region (`use1` -> `us-east-1`, ...); the row's price is the
  **median over the region's AZs**. A spot row exists only where the type also has an on-demand
  row in that region. Spot rows at or above the on-demand price (2022 spot against 2026
  on-demand, e.g. after AWS's 2025 P4/P5 price cuts; kept as published): {len(aws_stats["spot_at_or_above_on_demand"])}
{bullets(aws_stats["spot_at_or_above_on_demand"])}
- Kept: instance family "GPU instance" with an NVIDIA or AMD GPU and a whole number of GPUs, in
  standard regions ({aws_stats["dropped_region_keys"]} Local Zone / Wavelength keys dropped).
  Dropped instance types:
{bullets(aws_stats["dropped_types"])}
- Spot-snapshot types left out (not kept above, or absent from the on-demand file, such as the
  f1 FPGA, vt1 video-transcoder and dl1 Gaudi types) and types without an on-demand row in a
  region (listed as "type in region"):
{bullets(aws_stats["spot_unmatched"])}

## GCP
- **On-demand and Spot** (`price_date` = the snapshot's `generated` date,
  {", ".join(gcp_stats["generated"])} UTC): `{GCP_FILE}`, derived from `pricing.yml` of
  https://github.com/{GCP_REPO} (commit in each row's `source`), generated from Google's Cloud
  Billing Catalog API. Licence: Apache-2.0 (`LICENSE-Apache-2.0.txt`; changes listed in `NOTICE`).
- Only machine types with built-in GPUs (A2, A3, G2, G4); attachable N1 GPUs are not priced
  upstream. Dropped (fractional GPU slices):
{bullets(gcp_stats["dropped_types"])}
"""


NOTICE = f"""burst — bundled GPU price catalogue (providers/data/)

The files aws_gpu_offerings.csv, gcp_gpu_offerings.csv and CATALOG.md in this directory are
generated by scripts/build_catalog.py from third-party data. Prices are the public list prices of
Amazon Web Services and Google Cloud; the providers' own terms apply to them.

1. AWS on-demand prices
   Derived from data/all_gpu_instances.js of https://github.com/tsaol/aws-gpu (commit
   7412fd256c5eda04a70a17742a68e8e44824b2cb, 2026-01-21), whose README declares the MIT licence
   (the repository publishes no LICENSE file or copyright line). Upstream states its data are
   generated from instances.vantage.sh (https://github.com/vantage-sh/ec2instances.info), which
   is MIT-licensed: "Copyright (c) 2013 Garret Heaton (powdahound.com)".
   Changes: selected GPU instance types in standard regions; normalised GPU model names and
   memory units; reformatted as CSV.

   MIT licence terms (as they apply to both): Permission is hereby granted, free of charge, to
   any person obtaining a copy of this software and associated documentation files (the
   "Software"), to deal in the Software without restriction, including without limitation the
   rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the
   Software, and to permit persons to whom the Software is furnished to do so, subject to the
   following conditions: The above copyright notice and this permission notice shall be included
   in all copies or substantial portions of the Software. THE SOFTWARE IS PROVIDED "AS IS",
   WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES
   OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
   AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN
   ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE
   OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.

2. AWS spot prices (2022-05-31)
   Derived from prices/2022/05.tsv.zst of https://github.com/ericpauley/aws-spot-price-history
   (commit 99042f7), by Eric Pauley; dataset DOI 10.5281/zenodo.14198917. Raw output of the EC2
   DescribeSpotPriceHistory API; no licence is stated upstream. Changes: Linux/UNIX GPU rows only,
   latest price per Availability Zone, median per region.

3. GCP on-demand and Spot prices
   Derived from pricing.yml of https://github.com/{GCP_REPO}
   by Nils Knieling, licensed under the Apache License, Version 2.0 (LICENSE-Apache-2.0.txt in
   this directory). Changes: selected machine types with whole built-in GPUs; took the hourly
   on-demand and Spot price per region; normalised GPU model names; reformatted as CSV.

4. AWS Spot Advisor interruption buckets (2025-06-28)
   aws_spot_interruption.csv is derived from internal/spot/data/spot-advisor-data.json of
   https://github.com/alexei-led/spotinfo (commit 5eedf20), licensed under the Apache License,
   Version 2.0; the feed content is AWS's public Spot Instance Advisor data. Changes: Linux GPU
   instance types only; reformatted as CSV.
"""


def build(data: Path, out: Path) -> dict[str, str]:
    """Write every catalogue file into ``out``; returns file name -> one-line summary."""
    aws, aws_stats = build_aws(data)
    gcp, gcp_stats = build_gcp(data)
    out.mkdir(parents=True, exist_ok=True)
    texts = {
        "aws_gpu_offerings.csv": _csv_text(aws),
        "gcp_gpu_offerings.csv": _csv_text(gcp),
        "CATALOG.md": _catalog_md(aws, aws_stats, gcp, gcp_stats),
        "NOTICE": NOTICE,
        "aws_spot_interruption.csv": _interruption_csv(data),
    }
    for name, text in texts.items():
        (out / name).write_text(text, encoding="utf-8", newline="")
    shutil.copyfile(data / GCP_LICENSE, out / "LICENSE-Apache-2.0.txt")
    return {"aws_gpu_offerings.csv": _counts(aws), "gcp_gpu_offerings.csv": _counts(gcp)}


OUTPUT_FILES = ("aws_gpu_offerings.csv", "gcp_gpu_offerings.csv", "CATALOG.md", "NOTICE",
                "LICENSE-Apache-2.0.txt", "aws_spot_interruption.csv")
SPOT_ADVISOR = Path("aws-spot-advisor") / "aws_spot_advisor_gpu_2025-06-28.csv"


def _interruption_csv(data: Path) -> str:
    """The Spot Advisor's bucket and savings per (region, GPU instance type), Linux."""
    with open(data / SPOT_ADVISOR, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["os"] == "Linux"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["region", "instance_type", "interruption_bucket", "interruption_frequency",
                "savings_vs_ondemand_pct"])
    for r in sorted(rows, key=lambda r: (r["region"], r["instance_type"])):
        w.writerow([r["region"], r["instance_type"], r["interruption_bucket_index"],
                    r["interruption_frequency"], r["savings_vs_ondemand_pct"]])
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                        help="directory holding the source data sets (default: ../shared/data)")
    parser.add_argument("--out", type=Path, default=ROOT / "providers" / "data",
                        help="output directory (default: providers/data)")
    parser.add_argument("--check", action="store_true",
                        help="build into a temporary directory and compare with --out")
    args = parser.parse_args(argv)
    if not args.check:
        for name, summary in build(args.data, args.out).items():
            print(f"{args.out / name}: {summary}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(args.data, Path(tmp))
        differ = [n for n in OUTPUT_FILES
                  if not (args.out / n).exists()
                  or not filecmp.cmp(Path(tmp) / n, args.out / n, shallow=False)]
    for name in differ:
        print(f"{args.out / name}: differs from a fresh build")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
