"""Several queue sources behind one: each pool is observed from the source its policy names.

The built-in queue always runs (``burst submit`` and the agent API use it); Slurm pools are read
from Slurm instead and override what the built-in queue reports for them. Node usage is merged the
same way: a node the Slurm source knows (it holds a Slurm node name) takes Slurm's view.
"""

from __future__ import annotations

from datetime import datetime

from orchestrator.domain.snapshot import PoolQueue
from orchestrator.sources.builtin import BuiltinQueue, NodeUsage
from orchestrator.sources.slurm import SlurmQueue
from orchestrator.store.queueread import QueueRead


class QueueSources:
    """The built-in queue plus an optional Slurm source (see the module docstring)."""

    def __init__(self, builtin: BuiltinQueue, slurm: SlurmQueue | None = None):
        self.builtin = builtin
        self.slurm = slurm

    def observe(self, now: datetime, read: QueueRead | None = None) -> dict[str, PoolQueue]:
        queues = self.builtin.observe(now, read)
        if self.slurm is not None and self.slurm.policies:
            queues.update(self.slurm.observe(now))
        return queues

    def node_usage(self, node_ids: list[str], read: QueueRead | None = None) -> dict[str, NodeUsage]:
        usage = self.builtin.node_usage(node_ids, read)
        if self.slurm is not None and self.slurm.policies:
            usage.update(self.slurm.node_usage(node_ids))
        return usage
