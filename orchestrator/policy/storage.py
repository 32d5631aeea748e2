"""Where a pool's or project's data and checkpoints live, and what moving them to the cloud costs.

``pool.storage`` (or ``projects[].storage``, which replaces the pool's for that project's jobs)
tells the planner how many GB a burst job must stage into the cloud region before it can start
(its ``datasets``), how many it brings back when it ends (``checkpoint_size_gb`` to
``checkpoints``), the link's ``bandwidth_gbps`` and the ``egress_usd_per_gb`` each GB moved costs.
The planner prices a burst with them (``orchestrator.planner.staging``), the bootstrap hands
``checkpoints`` to the job as ``BURST_CHECKPOINT_URI``, and the ledger writes an ``egress`` line.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from orchestrator.policy.base import PolicyModel, Text
from orchestrator.policy.units import Money

# A storage location: scheme://rest (s3://, gs://, az://, file://, nfs://, ...).
URI_RE = re.compile(r"^[a-z][a-z0-9+.-]*://\S+$")
MAX_SIZE_GB = 10_000_000.0  # 10 PB: a typo guard, not a limit anyone meets
MAX_BANDWIDTH_GBPS = 10_000.0
DEFAULT_BANDWIDTH_GBPS = 10.0


def _check_uri(value: str) -> str:
    if not URI_RE.match(value):
        raise ValueError(f"{value!r} is not a storage URI (scheme://path, e.g. s3://bucket/data "
                         "or file:///srv/data)")
    return value


class Dataset(PolicyModel):
    """A dataset a job reads: where it lives and how much of it is staged for a burst."""

    uri: Text = Field(description="Where the dataset lives (scheme://path, e.g. nfs://fs/imagenet).")
    size_gb: float = Field(ge=0, le=MAX_SIZE_GB,
                           description="GB copied to the cloud region before a burst job starts.")

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        return _check_uri(value)


class Storage(PolicyModel):
    """Data and checkpoint locations, and the link between the site and the cloud region."""

    datasets: list[Dataset] = Field(
        default_factory=list,
        description="Datasets every job reads: their sizes add up to what a burst stages (a job's "
        "own annotation, burst.dataset_gb, wins).")
    checkpoints: Text | None = Field(
        default=None,
        description="Where jobs write checkpoints (scheme://path): passed to burst jobs as "
        "BURST_CHECKPOINT_URI; a drain waits for the job's final upload there within the grace.")
    checkpoint_size_gb: float = Field(
        default=0.0, ge=0, le=MAX_SIZE_GB,
        description="GB of checkpoints a burst job brings back when it ends (priced as egress).")
    egress_usd_per_gb: Money = Field(
        default=0, description="USD per GB moved between the site and the cloud region, either way "
        "(staging in and checkpoints back).")
    bandwidth_gbps: float = Field(
        default=DEFAULT_BANDWIDTH_GBPS, gt=0, le=MAX_BANDWIDTH_GBPS,
        description="Gbit/s of the link data is staged over: staging takes size_gb x 8 / this "
        "seconds, and a job whose staging would take longer than its predicted on-prem wait is "
        "not burst.")

    @field_validator("checkpoints")
    @classmethod
    def _checkpoint_uri(cls, value: str | None) -> str | None:
        return None if value is None else _check_uri(value)

    @property
    def dataset_gb(self) -> float:
        return float(sum(d.size_gb for d in self.datasets))


__all__ = ["DEFAULT_BANDWIDTH_GBPS", "Dataset", "Storage"]
