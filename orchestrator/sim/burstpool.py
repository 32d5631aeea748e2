"""The ready burst nodes of a simulated run, and how a job may spread over them.

A :class:`BurstPool` is a :class:`~orchestrator.sim.pool.GpuPool` of the burst nodes that take
work, which also keeps each node's offering (one pool per offering, mirrored on every change), so
that a job wider than one node can be given whole nodes of **one** offering. What a job may use
is the run's :class:`Spread`, set by whoever decides about burst nodes:

* ``one-node`` (a policy whose fabric is the built-in queue): a job runs on one node or not at all,
  as the built-in queue's dispatcher starts it (:mod:`orchestrator.sources.builtin`); the planner
  holds wider jobs on-prem (``placement.one_node_per_job``).
* ``one-offering`` (a policy whose fabric spans nodes: Slurm, torch elastic;
  :func:`orchestrator.planner.placement.spans_nodes`): a job that fits on one node goes there
  (best fit); a wider one (or one no single node has room for) takes ``ceil(gpus / node GPUs)``
  whole free nodes of one offering, as the planner grants it a launch group of one offering
  (:mod:`orchestrator.planner.scaleup`): never split across offerings, never mixed with on-prem.
* ``any`` (the baselines, pending-pod autoscalers): whole free nodes, largest first, whatever
  their offering (the baselines launch one offering anyway).
"""

from __future__ import annotations

from enum import StrEnum

from orchestrator.planner.placement import nodes_for
from orchestrator.sim.pool import Allocation, GpuPool


class Spread(StrEnum):
    """How one job may use burst nodes (module docstring)."""

    ONE_NODE = "one-node"
    ONE_OFFERING = "one-offering"
    ANY = "any"


class BurstPool(GpuPool):
    """Ready burst nodes by offering; see the module docstring."""

    __slots__ = ("spread", "_offers", "_offer_of")

    def __init__(self, spread: Spread = Spread.ANY) -> None:
        super().__init__()
        self.spread = spread
        self._offers: dict[str, GpuPool] = {}  # offering key -> its nodes (same indexes)
        self._offer_of: dict[int, str] = {}

    def add_node(self, index: int, gpus: int, offering: str = "") -> None:
        super().add_node(index, gpus)
        self._offer_of[index] = offering
        self._offers.setdefault(offering, GpuPool()).add_node(index, gpus)

    def remove_node(self, index: int) -> None:
        super().remove_node(index)
        offering = self._offer_of.pop(index)
        pool = self._offers[offering]
        pool.remove_node(index)
        if not len(pool):
            del self._offers[offering]

    def offering_of(self, index: int) -> str:
        """The offering key of node ``index`` (a launch group's nodes share one)."""
        return self._offer_of[index]

    def _move(self, index: int, free: int) -> None:
        super()._move(index, free)
        self._offers[self._offer_of[index]]._move(index, free)

    def fits_job(self, gpus: int) -> bool:
        """Whether a job of ``gpus`` can start on these nodes now, under :attr:`spread`."""
        if gpus > self.free_total:
            return False
        if gpus <= self.max_size and self.fits(gpus):
            return True  # on one node (fits() looks at single nodes for such a width)
        if self.spread is Spread.ANY:
            return self.fits(gpus)
        if self.spread is Spread.ONE_NODE:
            return False
        return any(gpus > pool.max_size and pool.fits(gpus) for pool in self._offers.values())

    def find_job(self, gpus: int) -> Allocation | None:
        """Where a job of ``gpus`` would start under :attr:`spread` (None: nowhere now): one node
        by best fit if one has room, else (``one-offering``) the whole free nodes of the offering
        that takes the fewest GPUs for it (then the fewest nodes, then the offering's key)."""
        if gpus > self.free_total:
            return None
        if gpus <= self.max_size:
            alloc = self.find(gpus)
            if alloc is not None or self.spread is Spread.ONE_NODE:
                return alloc
        elif self.spread is Spread.ONE_NODE:
            return None
        if self.spread is Spread.ANY:
            return self.find(gpus)
        best = None
        for key, pool in self._offers.items():
            if gpus <= pool.max_size or not pool.fits(gpus):
                continue  # (a width one node of it holds was tried above, on one node)
            nodes = nodes_for(gpus, pool.max_size)
            rank = (nodes * pool.max_size, nodes, key)
            if best is None or rank < best[0]:
                best = (rank, pool)
        return best[1].find(gpus) if best is not None else None
