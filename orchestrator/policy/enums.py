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


class Interconnect(StrEnum):
    """The node-to-node fabric an instance type has, as its provider publishes it."""

    NONE = "none"  # ordinary VPC networking only
    EFA = "efa"  # AWS Elastic Fabric Adapter (SRD; GPUDirect RDMA on p4d/p5/p6)
    GPUDIRECT_TCPX = "gpudirect-tcpx"  # GCP a3-highgpu-8g: GPU-to-NIC over TCP, no RDMA
    GPUDIRECT_TCPXO = "gpudirect-tcpxo"  # GCP a3-megagpu-8g: TCPX with NIC offload
    GPUDIRECT_RDMA = "gpudirect-rdma"  # GCP a3-ultragpu/a4: RDMA over converged Ethernet


class InterconnectNeed(StrEnum):
    """What a policy requires of an offering's interconnect."""

    NONE = "none"  # nothing: any offering will do
    ANY = "any"  # some GPU fabric (EFA or any GPUDirect flavour)
    RDMA = "rdma"  # remote DMA between GPUs: EFA or GPUDirect-RDMA (not the TCP flavours)
    EFA = "efa"  # AWS EFA exactly

    def met_by(self, have: Interconnect) -> bool:
        """Whether an offering with interconnect ``have`` satisfies this need."""
        if self is InterconnectNeed.NONE:
            return True
        if self is InterconnectNeed.ANY:
            return have is not Interconnect.NONE
        if self is InterconnectNeed.RDMA:
            return have in (Interconnect.EFA, Interconnect.GPUDIRECT_RDMA)
        return have is Interconnect.EFA

    def met_by_need(self, other: InterconnectNeed) -> bool:
        """Whether an uncatalogued offering the policy declares with this need (planned as having
        it) meets ``other``: the need implies it (efa implies rdma implies any)."""
        order = (InterconnectNeed.NONE, InterconnectNeed.ANY, InterconnectNeed.RDMA, InterconnectNeed.EFA)
        if other is InterconnectNeed.NONE:
            return True
        if other is InterconnectNeed.EFA:
            return self is InterconnectNeed.EFA
        return order.index(self) >= order.index(other)

    def assumed(self, provider: str) -> Interconnect:
        """The interconnect an uncatalogued offering that declares this need is planned with."""
        if self is InterconnectNeed.NONE:
            return Interconnect.NONE
        if self is InterconnectNeed.EFA or provider == "aws":
            return Interconnect.EFA
        return Interconnect.GPUDIRECT_RDMA if self is InterconnectNeed.RDMA else Interconnect.GPUDIRECT_TCPX
