"""Enumerations shared by the policy models (kept apart so every policy module can use them)."""

from __future__ import annotations

from enum import StrEnum


class ProviderName(StrEnum):
    """The provider adapters burst ships. ``local`` and ``sim`` need no cloud account."""

    LOCAL = "local"  # nodes are local processes running the node agent (embedded default)
    SIM = "sim"  # simulated cloud on a virtual clock, for the simulator
    AWS = "aws"  # EC2 through boto3
    GCP = "gcp"  # Compute Engine through google-cloud-compute
    LIBCLOUD = "libcloud"  # any apache-libcloud compute driver


class Market(StrEnum):
    """How an instance is bought."""

    SPOT = "spot"  # interruptible, cheaper; may fail for lack of capacity more often
    ON_DEMAND = "on-demand"  # regular price, not interrupted
