"""The catalogue's interconnect data (cited per row) and the policy errors it backs: an offering
asking for an interconnect its type lacks, a ``multi_node_requires`` no offering meets."""

from __future__ import annotations

import csv
from datetime import date
from pathlib import Path

import pytest

from orchestrator.catalogue_check import bundled_catalogue, resolve_policies
from orchestrator.policy import PolicyError, load_policy_text
from orchestrator.policy.enums import Interconnect, InterconnectNeed
from providers import catalog

ROOT = Path(__file__).resolve().parents[2]
TODAY = date(2026, 12, 2)

HEAD = """\
version: 1
name: t
pool: {name: gpu, onprem: {nodes: 1, gpus_per_node: 4}}
providers:
  aws: {ami: ami-0a1b2c3d4e5f67890}
  gcp: {project: p, image: projects/p/global/images/i}
"""


def resolve(body: str, tmp_path: Path):
    file = tmp_path / "t.yaml"
    file.write_text(HEAD + body)
    return resolve_policies([load_policy_text(HEAD + body, str(file))], [file],
                            bundled_catalogue(), TODAY)


def fabric(provider: str, instance_type: str) -> tuple[Interconnect, int]:
    [o] = {o.interconnect_gbps: o for o in catalog.load_catalog(provider)
           if o.instance_type == instance_type}.values()
    return o.interconnect, o.interconnect_gbps


@pytest.mark.parametrize(("provider", "instance_type", "expected"), [
    ("aws", "p4d.24xlarge", (Interconnect.EFA, 400)),
    ("aws", "p5.48xlarge", (Interconnect.EFA, 3200)),
    ("aws", "g5.xlarge", (Interconnect.NONE, 0)),
    ("gcp", "a3-highgpu-8g", (Interconnect.GPUDIRECT_TCPX, 1000)),
    ("gcp", "a3-megagpu-8g", (Interconnect.GPUDIRECT_TCPXO, 1800)),
    ("gcp", "a2-highgpu-8g", (Interconnect.NONE, 0)),
])
def test_catalogue_rows_carry_the_published_interconnect(provider, instance_type, expected):
    assert fabric(provider, instance_type) == expected


def test_every_interconnect_row_cites_a_provider_page():
    rows = list(csv.DictReader((ROOT / "providers/data/interconnect.csv").open()))
    assert rows and all(r["source"].startswith("https://") for r in rows)
    assert {r["provider"] for r in rows} == {"aws", "gcp"}
    assert all(Interconnect(r["interconnect"]) is not Interconnect.NONE for r in rows)


@pytest.mark.parametrize(("need", "met"), [
    (InterconnectNeed.NONE, set(Interconnect)),
    (InterconnectNeed.ANY, set(Interconnect) - {Interconnect.NONE}),
    (InterconnectNeed.RDMA, {Interconnect.EFA, Interconnect.GPUDIRECT_RDMA}),
    (InterconnectNeed.EFA, {Interconnect.EFA}),
])
def test_what_each_need_accepts(need, met):
    assert {i for i in Interconnect if need.met_by(i)} == met


def test_an_offering_asking_for_an_interconnect_its_type_lacks_is_an_error_at_its_line(tmp_path):
    body = ("offerings:\n"
            "  - {provider: aws, region: us-east-1, instance_type: p4d.24xlarge, interconnect: efa}\n"
            "  - {provider: aws, region: us-east-1, instance_type: g5.xlarge,\n"
            "     interconnect: efa}\n")
    with pytest.raises(PolicyError) as caught:
        resolve(body, tmp_path)
    [problem] = caught.value.problems
    assert (problem.line, problem.column) == (10, 6)  # the `interconnect:` of the second offering
    assert "aws/us-east-1/-/g5.xlarge/on-demand asks for interconnect efa" in problem.message
    assert "gives g5.xlarge none" in problem.message


def test_multi_node_requires_that_no_offering_has_is_an_error_naming_them(tmp_path):
    body = ("multi_node_requires: rdma\n"
            "offerings:\n"
            "  - {provider: gcp, region: us-central1, zone: us-central1-a, instance_type: a3-highgpu-8g}\n"
            "  - {provider: aws, region: us-east-1, instance_type: g5.xlarge}\n")
    with pytest.raises(PolicyError) as caught:
        resolve(body, tmp_path)
    [problem] = caught.value.problems
    assert problem.line == 7 and "multi_node_requires: rdma" in problem.message
    assert "gcp/us-central1/us-central1-a/a3-highgpu-8g/on-demand (gpudirect-tcpx)" in problem.message
    assert "aws/us-east-1/-/g5.xlarge/on-demand (none)" in problem.message


def test_a_policy_whose_offerings_have_the_interconnect_resolves(tmp_path):
    body = ("multi_node_requires: any\n"
            "offerings:\n"
            "  - {provider: gcp, region: us-east4, zone: us-east4-a, instance_type: a3-megagpu-8g}\n"
            "  - {provider: aws, region: us-east-1, instance_type: g5.xlarge}\n")
    [resolved], _ = resolve(body, tmp_path)
    assert resolved.multi_node_requires is InterconnectNeed.ANY
