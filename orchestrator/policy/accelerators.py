"""The ``accelerators:`` shorthand of a policy, and one spelling for each GPU model.

Instead of listing instance types, a policy may ask for GPUs by part and count::

    accelerators:
      - {accelerator: "A100-80GB:8", providers: [aws, gcp], regions: [us-east-1, us-central1],
         market: spot, fallback_on_demand: true}

which stands for every catalogue offering of that many of that part, in those providers and
regions, in that market. The expansion needs the provider catalogues, which this package may not
import: :mod:`orchestrator.catalogue_check` does it when a policy is loaded for use, and
``burst policy validate`` / ``burst plan`` show what it expanded to.

GPU model names are compared by :func:`gpu_key`, so that the same part has one name across the
AWS and GCP catalogues and whatever a user types: ``a100 80gb``, ``NVIDIA A100-80G`` and
``A100-80GB`` are one part, spelled ``A100-80GB`` (:func:`normalise_gpu_model`).
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from orchestrator.policy.base import CloudName, PolicyModel, Text, field_problem
from orchestrator.policy.bounds import MAX_NODES
from orchestrator.policy.enums import Market, ProviderName

# Spellings seen in the wild for parts whose catalogue name differs, by squashed key (see
# gpu_key): the key of the catalogue's own name is the value.
_ALIASES = {
    "A10040GB": "A100",
    "A10040G": "A100",
    "A10080G": "A10080GB",
    "A100SXM480GB": "A10080GB",
    "H10080GB": "H100",
    "H100SXM": "H100",
    "H100MEGA": "H100",
    "H200141GB": "H200",
    "TESLAT4": "T4",
    "TESLAV100": "V100",
}

_VENDOR = re.compile(r"^(NVIDIA|AMD)[-\s_]+", re.IGNORECASE)


def gpu_key(name: str) -> str:
    """What identifies a GPU part whatever the spelling: upper case letters and digits only, no
    vendor prefix, known aliases mapped (``nvidia a100 80gb``, ``A100-80G``, ``A100-80GB`` all
    give the key of ``A100-80GB``). Two names are the same part when their keys are equal."""
    key = re.sub(r"[^0-9A-Z]", "", _VENDOR.sub("", name.strip()).upper())
    return _ALIASES.get(key, key)


def normalise_gpu_model(name: str) -> str:
    """``name`` spelled as the catalogues spell the part, where the part is a known one."""
    key = gpu_key(name)
    return _CANONICAL.get(key, name.strip())


# The catalogues' spellings (AWS and GCP agree on these; tests check every catalogue name is one).
_CANONICAL = {gpu_key(n): n for n in (
    "A100", "A100-80GB", "A10G", "B200", "B300", "GRID K520", "H100", "H200", "K80", "L4",
    "L40S", "M60", "RTX PRO 6000", "Radeon Pro V520", "T4", "V100")}


def parse_accelerator(text: str) -> tuple[str, int]:
    """``"A100-80GB:8"`` -> ``("A100-80GB", 8)``; a count is required."""
    model, sep, count = text.rpartition(":")
    if not sep or not model.strip():
        raise ValueError(f"{text!r} is not MODEL:COUNT, e.g. A100-80GB:8")
    if not count.isdigit() or not 1 <= int(count) <= 64:
        raise ValueError(f"{text!r}: the GPU count after ':' must be a whole number 1-64")
    return normalise_gpu_model(model), int(count)


class AcceleratorSpec(PolicyModel):
    """GPUs asked for by part and count; expands to every matching catalogue offering."""

    accelerator: Text = Field(
        description="MODEL:COUNT, e.g. A100-80GB:8 (GPUs per node; model names as in "
        "`burst catalog list`, case and vendor prefix ignored).")
    providers: list[ProviderName] = Field(
        min_length=1, description="Providers whose bundled catalogue is searched (aws, gcp).")
    regions: list[CloudName] = Field(
        min_length=1, description="Regions searched, in any of the providers.")
    market: Market = Field(default=Market.ON_DEMAND, description="spot or on-demand.")
    fallback_on_demand: bool = Field(
        default=False, description="For spot: also consider each type's on-demand market.")
    max_nodes: int | None = Field(
        default=None, ge=0, le=MAX_NODES, description="Most nodes of each expanded offering at once.")

    @field_validator("accelerator")
    @classmethod
    def _parses(cls, value: str) -> str:
        parse_accelerator(value)
        return value

    @field_validator("providers")
    @classmethod
    def _catalogued(cls, value: list[ProviderName]) -> list[ProviderName]:
        others = [str(p) for p in value if p not in (ProviderName.AWS, ProviderName.GCP)]
        if others:
            raise ValueError(f"{', '.join(others)}: only aws and gcp have a bundled catalogue to "
                             "expand from; list other providers' sizes under offerings")
        return value

    @model_validator(mode="after")
    def _fallback_only_for_spot(self) -> AcceleratorSpec:
        if self.fallback_on_demand and self.market is not Market.SPOT:
            raise field_problem("fallback_on_demand", "only applies to market: spot")
        return self

    @property
    def model(self) -> str:
        return parse_accelerator(self.accelerator)[0]

    @property
    def count(self) -> int:
        return parse_accelerator(self.accelerator)[1]
