"""The fabric section of a policy: how burst nodes join the training fabric and leave it.

``fabric.kind`` picks the fabric: ``builtin`` (agents run jobs of burst's own queue), ``slurm``
(burst nodes become Slurm nodes of the cluster the queue is read from) or ``torch-elastic``
(burst nodes join a running ``torchrun`` elastic job). Unset, it follows ``queue.source``.
Checkpoint-aware drains, the spot/preemption notice and their deadlines are configured here too;
docs/fabric.md explains each mechanism.
"""

from __future__ import annotations

import re
from datetime import timedelta
from enum import StrEnum

from pydantic import Field, model_validator

from orchestrator.policy.base import PolicyModel, field_problem
from orchestrator.policy.bounds import MAX_NODES
from orchestrator.policy.units import Duration

SLURM_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}(\[[0-9]{1,9}-[0-9]{1,9}\])?$"
SIGNAL_PATTERN = r"^[A-Z][A-Z0-9]*$"


class FabricKind(StrEnum):
    """The fabric burst nodes join."""

    BUILTIN = "builtin"  # the node agent runs jobs of burst's built-in queue
    SLURM = "slurm"  # the node becomes a Slurm node (slurmd) with the burst feature
    TORCH_ELASTIC = "torch-elastic"  # the node joins a running torchrun elastic job


class SlurmJoinMode(StrEnum):
    """How a burst node becomes a Slurm node."""

    DYNAMIC = "dynamic"  # `slurmd -Z`: registers itself (production default; one per host in 22.05)
    SLOT = "slot"  # fills a pre-declared State=FUTURE node of slurm.conf (`slurmd -N burst-k`)
    # Slurm's power save decides: a State=CLOUD node named by ResumeProgram (`burst slurm resume`)
    POWER_SAVE = "power-save"


class NoticeKind(StrEnum):
    """Whose instance-metadata format the spot/preemption notice endpoint speaks."""

    AWS = "aws"  # spot/instance-action: 404 until a notice, then {"action", "time"}
    GCP = "gcp"  # instance/preempted: "FALSE" until preempted, then "TRUE"


DEFAULT_NOTICE_URLS = {
    NoticeKind.AWS: "http://169.254.169.254/latest/meta-data/spot/instance-action",
    NoticeKind.GCP: "http://metadata.google.internal/computeMetadata/v1/instance/preempted",
}


class SlurmFabric(PolicyModel):
    """Joining burst nodes to the Slurm cluster of ``queue`` and draining them out of it."""

    join: SlurmJoinMode = Field(
        default=SlurmJoinMode.DYNAMIC,
        description="dynamic (`slurmd -Z`, each node on its own host), slot (pre-declared "
        "State=FUTURE nodes of slurm.conf, listed in slots) or power-save (State=CLOUD nodes "
        "Slurm resumes through `burst slurm resume`; docs/slurm-power-save.md).",
    )
    slots: list[str] = Field(
        default_factory=list,
        description="Slot node names for join: slot (State=FUTURE) or join: power-save "
        "(State=CLOUD), as declared in slurm.conf; a range such as burst-[1-4] stands for "
        "burst-1 ... burst-4.",
    )
    feature: str = Field(
        default="burst", pattern=r"^[A-Za-z0-9_\-]+$",
        description="Slurm feature burst nodes carry (it tells them apart from on-prem nodes).",
    )
    checkpoint_signal: str = Field(
        default="USR1", pattern=SIGNAL_PATTERN,
        description="Signal sent to a running job when its node drains (`scancel --signal`), so it "
        "writes a checkpoint before it is requeued.",
    )
    signal_batch_only: bool = Field(
        default=True,
        description="Signal only the batch shell (`scancel --batch`), not every step.",
    )
    checkpoint_wait: Duration = Field(
        default=timedelta(seconds=60),
        description="How long a signalled job may take to checkpoint before it is requeued; a job "
        "that confirms earlier (comment burst:checkpointed) is requeued at once.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SlurmFabric:
        for index, name in enumerate(self.slots):
            if not re.match(SLURM_NAME_PATTERN, name):
                raise field_problem(f"slots[{index}]", f"{name!r} is not a node name or name-[a-b]")
        total = 0
        for index, name in enumerate(self.slots):
            if name.endswith("]") and "[" in name:
                first, last = (int(x) for x in name[:-1].split("[", 1)[1].split("-"))
                total += max(last - first + 1, 0)
            else:
                total += 1
            if total > MAX_NODES:  # checked before slot_names() expands the ranges
                raise field_problem(f"slots[{index}]", f"the slots name more than {MAX_NODES} "
                                    "nodes")
        if self.join is SlurmJoinMode.SLOT and not self.slots:
            raise field_problem("slots", "join: slot needs the slot names (e.g. burst-[1-4])")
        if self.join is SlurmJoinMode.POWER_SAVE and not self.slots:
            raise field_problem("slots", "join: power-save needs the State=CLOUD node names of "
                                "slurm.conf (e.g. cloud-[1-8])")
        if self.checkpoint_wait < timedelta(0):
            raise field_problem("checkpoint_wait", "must not be negative")
        return self

    def slot_names(self) -> list[str]:
        """The slots with ranges expanded, in order."""
        names: list[str] = []
        for entry in self.slots:
            if entry.endswith("]") and "[" in entry:
                prefix, span = entry[:-1].split("[", 1)
                first, last = (int(x) for x in span.split("-"))
                names.extend(f"{prefix}{i}" for i in range(first, last + 1))
            else:
                names.append(entry)
        return list(dict.fromkeys(names))


class CheckpointHook(StrEnum):
    """How a torch-elastic drain asks the training job to checkpoint."""

    FILE = "file"  # the agent writes a request file; the job answers with a done file
    HTTP = "http"  # the agent POSTs to the job's local checkpoint endpoint


class TorchElasticFabric(PolicyModel):
    """Joining burst nodes to a running torchrun elastic job (c10d rendezvous, gloo or NCCL)."""

    rdzv_endpoint: str = Field(
        pattern=r"^[A-Za-z0-9_.\-]+:[0-9]{1,5}$",
        description="host:port of the c10d rendezvous store, hosted by the controller "
        "(`burst fabric torch-store`), so no training node's departure takes it down.",
    )
    run_id: str = Field(
        pattern=r"^[A-Za-z0-9_.\-]+$", description="Rendezvous id of the training job."
    )
    min_nodes: int = Field(default=1, ge=1, description="--nnodes minimum of the job.")
    max_nodes: int = Field(default=4, ge=1, description="--nnodes maximum of the job.")
    nproc_per_node: int = Field(default=1, ge=1, description="Worker processes per node.")
    entrypoint: list[str] = Field(
        min_length=1,
        description="The training script and its arguments, as torchrun runs them on each node.",
    )
    checkpoint_hook: CheckpointHook = Field(
        default=CheckpointHook.FILE, description="How a drain asks the job to checkpoint."
    )
    checkpoint_wait: Duration = Field(
        default=timedelta(seconds=60),
        description="How long a drain waits for the job to confirm its checkpoint.",
    )
    local_addr: str | None = Field(
        default=None, description="Address torchrun and gloo use on the node (default: its own)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> TorchElasticFabric:
        if self.min_nodes > self.max_nodes:
            raise field_problem(
                "min_nodes", f"{self.min_nodes} is more than max_nodes ({self.max_nodes})")
        return self


class SpotNotice(PolicyModel):
    """Spot/preemption notices: the agent polls the instance metadata and drains at once."""

    kind: NoticeKind = Field(description="aws or gcp metadata format.")
    url: str | None = Field(
        default=None, pattern=r"^https?://",
        description="Notice endpoint (default: the provider's metadata URL). {node_id} and "
        "{instance_id} in it are filled in by the agent, for test servers.",
    )
    poll: Duration = Field(default=timedelta(seconds=5), description="How often the agent polls.")
    deadline: Duration = Field(
        default=timedelta(seconds=30),
        description="Drain deadline after a notice that gives no time (GCP gives 30 s).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> SpotNotice:
        if self.poll <= timedelta(0):
            raise field_problem("poll", "must be longer than 0s")
        return self

    @property
    def endpoint(self) -> str:
        return self.url or DEFAULT_NOTICE_URLS[self.kind]


class FabricConfig(PolicyModel):
    """How burst nodes join the fabric and leave it without losing work."""

    kind: FabricKind | None = Field(
        default=None,
        description="builtin, slurm or torch-elastic (unset: slurm when queue.source is slurm, "
        "else builtin).",
    )
    slurm: SlurmFabric = Field(default_factory=SlurmFabric, description="Slurm join and drain.")
    torch: TorchElasticFabric | None = Field(
        default=None, description="The torchrun elastic job burst nodes join (kind: torch-elastic)."
    )
    spot_notice: SpotNotice | None = Field(
        default=None, description="Poll the instance metadata for spot/preemption notices."
    )
