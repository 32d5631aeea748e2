"""Observe: build the planner's Snapshot from the queue source, the store and provider catalogues.

Everything in the Snapshot is a copy taken now; the planner never sees a live object. Node usage
(GPUs busy, idle since when, heartbeat) comes from the queue/fabric's view and is folded into the
node copies here, so the planner reads one consistent value per node. Operator pool controls
(paused pools, pre-warm floors still in force) come from the store's ``pool_controls``. Spend per
budget of the policies (``Snapshot.budget_spend``) comes from the cost ledger
(:mod:`orchestrator.costs.spend`), for each budget's window at ``now``. A tick hands in the
built-in queue as on-prem dispatch read it, so the queue is read once per tick, and the nodes
as the tick read them once (``Store.tick_nodes``, shared with the cost roll-up). A node whose row
and usage are those of the last snapshot is the last snapshot's ``Node`` (frozen, so sharing it
is as good as a copy; :mod:`orchestrator.kept`): 10,000 unchanged nodes are not built again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields
from datetime import datetime

from orchestrator.costs.spend import budget_spend
from orchestrator.kept import Kept

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import Provider, ProviderError, QueueSource
from orchestrator.domain.boot import BootLearner
from orchestrator.domain.capacity import CapacityLearner, region_market
from orchestrator.domain.snapshot import (
    BootEstimate,
    BudgetSpend,
    OfferingHealth,
    PrewarmRequest,
    Snapshot,
)
from orchestrator.policy.models import Policy
from orchestrator.sources.builtin import NodeUsage
from orchestrator.store import Store
from orchestrator.store.queueread import QueueRead
from orchestrator.store.ticknodes import TickNodes, node_values

log = logging.getLogger(__name__)
# Nodes whose hours do not count as exposure to a reclaim (never launched, or already ended).
_NOT_EXPOSED = frozenset({NodeState.REQUESTED, NodeState.TERMINATED, NodeState.FAILED})
HEALTH_EVENTS = 20_000  # the latest node events the learned capacity reads (days of a busy pool)

# The nodes are read as the driver's rows (the tick's one read, Store.tick_nodes), given what
# each runs, and made into Nodes once: a copy of each with its usage (``dataclasses.replace``,
# or a positional rebuild) cost as much again as reading them, 0.1-0.3 s of a tick at 10,000
# nodes. A Node made from the same row and usage last tick is reused (orchestrator.kept).
_NODE_NAMES = tuple(f.name for f in fields(Node))
_N = len(_NODE_NAMES)
_ID_AT, _STATE_AT, _SINCE_AT, _BUSY_AT, _JOBS_AT, _IDLE_AT = (
    _NODE_NAMES.index(name) for name in ("id", "state", "state_since", "gpus_busy",
                                         "running_jobs", "idle_since"))
_WITH_USAGE = frozenset({NodeState.READY.value, NodeState.DRAINING.value})  # as the rows say


class Observer:
    """Builds snapshots; caches provider catalogues (they change rarely and may be slow)."""

    def __init__(self, store: Store, queue: QueueSource, providers: Mapping[str, Provider],
                 overrides: tuple[Offering, ...] = (), policies: Iterable[Policy] = (),
                 capacity_prior: Callable[[str], float] | None = None):
        self.store = store
        self.queue = queue
        self.providers = providers
        self.overrides = overrides  # refreshed prices (`burst catalog refresh`) win over bundled ones
        self.policies = tuple(policies)  # whose budgets' spend each snapshot carries
        self._catalogue: tuple[Offering, ...] | None = None
        # The last snapshot's Nodes, by id, with the row and usage each was made from.
        self._nodes: Kept[Node] = Kept()
        # Learned capacity (offering_health) is computed when a policy chooses by expected cost.
        self.capacity_prior = capacity_prior or (lambda key: 0.0)
        self.learns = any(p.spot.by_expected_cost for p in self.policies)
        self.learns_boot = any(p.trigger.learn_boot or p.spot.learn_restart_wait
                               for p in self.policies)

    def catalogue(self) -> tuple[Offering, ...]:
        if self._catalogue is None:
            offerings: list[Offering] = []
            for name, provider in self.providers.items():
                try:
                    offerings.extend(provider.offerings())
                except ProviderError as exc:
                    log.warning("provider %s: cannot list offerings: %s", name, exc)
            by_key = {o.key: o for o in offerings}
            for override in self.overrides:
                if override.provider in self.providers:
                    by_key[override.key] = override
            self._catalogue = tuple(by_key.values())
        return self._catalogue

    def snapshot(self, now: datetime, paused_pools: frozenset[str] = frozenset(),
                 policies: Iterable[Policy] | None = None,
                 queue_read: QueueRead | None = None, read_queues: bool = True,
                 nodes: TickNodes | None = None) -> Snapshot:
        """The world at ``now``. ``paused_pools`` adds to the pools paused in the store;
        ``policies`` (default: those the observer was built with) name the budgets to observe;
        ``queue_read``: the built-in queue as this tick read it already (on-prem dispatch's read,
        see :meth:`BuiltinQueue.dispatch`), so the queue is read once per tick.
        ``read_queues=False``: no queue source is asked (no queues, node usage or burst runs):
        a Slurm power-save resume brings its own demand, and must not fail with squeue.
        ``nodes``: the tick's one read of the nodes (``Store.tick_nodes``), which the live nodes
        are taken from; by default they are read here."""
        controls = self.store.pool_controls()
        paused = frozenset(paused_pools) | {pool for pool, c in controls.items() if c.paused}
        prewarm: dict[str, PrewarmRequest] = {}
        for pool, control in controls.items():
            request = control.prewarm(now)  # None once ``until`` has passed
            if request is not None:
                prewarm[pool] = request
        shared = {} if queue_read is None else {"read": queue_read}
        queues = self.queue.observe(now, **shared) if read_queues else {}
        rows = nodes.live() if nodes is not None else self.store.live_node_rows()
        usage: dict[str, NodeUsage] = {}
        node_usage = getattr(self.queue, "node_usage", None) if read_queues else None
        if node_usage is not None:
            usage = node_usage([r[_ID_AT] for r in rows if r[_STATE_AT] in _WITH_USAGE],
                               **shared)
        # whose work runs on which burst node
        runs = getattr(self.queue, "burst_runs", None) if read_queues else None
        observed = []
        kept = self._nodes
        kept.round()
        for row in rows:
            node_id = row[_ID_AT]
            u = usage.get(node_id)
            # A Node is made of its row and its usage alone: the same two, the same Node.
            source = (row[:_N], None if u is None else (u.gpus_busy, u.running_jobs,
                                                        u.last_busy_at))
            node = kept.get(node_id, source)
            if node is None:
                node = kept.put(node_id, source, Node(*self._node_values(row, u)))
            observed.append(node)
        return Snapshot(
            taken_at=now,
            queues=queues,
            nodes=tuple(observed),
            offerings=self.catalogue(),
            capacity_blocks=tuple(self.store.capacity_blocks(now)),
            memory=self.store.load_memory(),
            paused_pools=paused,
            prewarm=prewarm,
            budget_spend=self.budget_spend(now, self.policies if policies is None else policies,
                                           nodes),
            burst_runs=runs(**shared) if runs is not None else (),
            offering_health=self.offering_health(now) if self.learns else {},
            boot_estimates=self.boot_estimates(now) if self.learns_boot else {},
        )

    @staticmethod
    def _node_values(row: tuple, u: NodeUsage | None) -> list:
        """A node row's field values, with what it runs (``u``) folded in."""
        values = node_values(row)
        if u is not None:
            idle_since = None
            if u.running_jobs == 0:
                # Idle since the later of: becoming ready, finishing its last job.
                stored, since = values[_IDLE_AT], values[_SINCE_AT]
                idle_since = max(t for t in (stored, u.last_busy_at, since) if t)
                if values[_STATE_AT] is NodeState.DRAINING:
                    idle_since = stored or u.last_busy_at or since
            values[_BUSY_AT], values[_JOBS_AT] = u.gpus_busy, u.running_jobs
            values[_IDLE_AT] = idle_since
        return values

    def boot_estimates(self, now: datetime) -> dict[str, BootEstimate]:
        """Each offering's learned launch-to-ready time (:class:`~orchestrator.domain.boot.
        BootLearner`, decayed p90) from the latest node events: a node's first ``-> launching``
        to its first ``-> ready``."""
        learner = BootLearner()
        nodes = {n.id: n for n in self.store.nodes(include_terminated=True)}
        launched: dict[str, datetime] = {}
        ready: set[str] = set()
        for event in self.store.events(limit=HEALTH_EVENTS):  # oldest first
            node = nodes.get(event.node_id)
            if node is None or event.node_id in ready:
                continue
            if event.to_state is NodeState.LAUNCHING:
                launched.setdefault(event.node_id, event.at)
            elif event.to_state is NodeState.READY and event.node_id in launched:
                ready.add(event.node_id)
                learner.booted(node.offering_key,
                               (event.at - launched[event.node_id]).total_seconds(),
                               event.at.timestamp() / 3600.0)
        return learner.snapshot(learner.keys(), now.timestamp() / 3600.0)

    def offering_health(self, now: datetime) -> dict[str, OfferingHealth]:
        """Each offering's preemption hazard and stockout odds, learned from the latest node
        events (:class:`~orchestrator.domain.capacity.CapacityLearner`, decayed, on the published
        prior): a launch that went through (-> launching) or failed for lack of capacity, and a
        node's end after its launch (terminated, or failed: interrupted when the instance
        vanished at the provider, the reconciler's record of a spot reclaim)."""
        learner = CapacityLearner(self.capacity_prior, pool_by=region_market)
        nodes = {n.id: n for n in self.store.nodes(include_terminated=True)}
        keys = {o.key for o in self.catalogue()}
        keys.update(spec.key for p in self.policies for spec in p.offerings)
        ended: set[str] = set()  # a node's first end counts (failed, then terminated: one end)
        for event in self.store.events(limit=HEALTH_EVENTS):
            node = nodes.get(event.node_id)
            if node is None or event.node_id in ended:
                continue
            key, t = node.offering_key, event.at.timestamp() / 3600.0
            keys.add(key)
            if event.to_state is NodeState.LAUNCHING:
                learner.launch(key, t, refused=False)
            elif event.to_state is NodeState.FAILED and event.reason.startswith("capacity error"):
                learner.launch(key, t, refused=True)
            elif (event.to_state in (NodeState.TERMINATED, NodeState.FAILED)
                  and event.from_state not in (None, NodeState.REQUESTED)):
                ended.add(event.node_id)
                learner.ran(key, (event.at - node.created_at).total_seconds() / 3600.0, t,
                            interrupted=event.reason.startswith("instance vanished"))
        for node in nodes.values():  # the exposure of nodes still alive (launch to now)
            if node.id not in ended and node.state not in _NOT_EXPOSED:
                learner.started(node.offering_key, node.id, node.created_at.timestamp() / 3600.0)
        return learner.snapshot(sorted(keys), now.timestamp() / 3600.0)

    def budget_spend(self, now: datetime, policies: Iterable[Policy],
                     nodes: TickNodes | None = None) -> dict[str, BudgetSpend]:
        """Spend of every budget of ``policies`` in its window at ``now``, from the cost ledger
        (:func:`orchestrator.costs.spend.budget_spend`: a failure to read it is not hidden);
        the live nodes' prices (burn rates) from ``nodes``, the tick's read, where given."""
        policies = list(policies)
        prices = None
        if nodes is not None and any(p.budgets for p in policies):
            prices = nodes.live_prices_by_group()
        return budget_spend(self.store, policies, now, prices)
