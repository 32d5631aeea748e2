"""Small builders of domain values for tests, each with keyword overrides.

Policies go through the real loader (YAML text -> ``load_policy_text``), so a test policy is one a
user could have written. The base policy is deliberately "instant": no hysteresis
(``sustained_for: 0s``) and no cooldowns, so a scenario only switches on the mechanism it tests.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from orchestrator.domain import (
    BudgetSpend,
    CapacityBlock,
    Job,
    Node,
    NodeState,
    Offering,
    OnPremState,
    PolicyMemory,
    PoolQueue,
    Snapshot,
)
from orchestrator.domain.plan import ActionReason, Launch
from orchestrator.domain.ports import Instance
from orchestrator.executor import ExecutionReport, Executor, ExecutorConfig
from orchestrator.fabric.builtin import BuiltinFabric
from orchestrator.fabric.tokens import JoinTokens
from orchestrator.lifecycle import NodeEvent, transition
from orchestrator.planner.admission import Admission, NodeAdmitter
from orchestrator.policy import Market, Policy, load_policy_text
from orchestrator.reconciler import Reconciler, ReconcilerConfig
from orchestrator.sources.builtin import BuiltinQueue
from orchestrator.store import Store
from tests.fakes.provider import FakeProvider

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
POOL = "gpu"
POLICY = "train"
PROVIDER = "aws"
REGION = "us-east-1"

# The smallest policy the loader accepts, plus the "instant" defaults described above.
BASE_POLICY: dict[str, Any] = {
    "version": 1,
    "name": POLICY,
    "cluster": "burst",
    "pool": {"name": POOL, "onprem": {"nodes": 0, "gpus_per_node": 8}},
    "trigger": {"pending_gpus_above": 0, "oldest_wait_above": "5m", "combine": "any",
                "sustained_for": "0s"},
    "offerings": [
        {"provider": PROVIDER, "region": REGION, "instance_type": "g8", "gpus": 8,
         "price_usd_hour": 10, "gpu_model": "A100"},
    ],
    "limits": {"min_nodes": 0, "max_nodes": 10, "max_concurrent_launches": 10},
    "scale_down": {"idle_for": "10m", "drain_grace": "15m"},
    "cooldowns": {"scale_up": "0s", "scale_down": "0s"},
    "providers": {"aws": {"ami": "ami-0123456789abcdef0"}},
}


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` merged in: mappings merge key by key, anything else (lists
    included) replaces; an override of ``None`` deletes the key."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def policy_dict(**overrides: Any) -> dict[str, Any]:
    return deep_merge(BASE_POLICY, overrides)


def make_policy(**overrides: Any) -> Policy:
    """A policy validated by the real loader; ``overrides`` deep-merge into the base policy."""
    return load_policy_text(yaml.safe_dump(policy_dict(**overrides), sort_keys=False), "<test>")


def offering_spec(instance_type: str = "g8", gpus: int = 8, price: float = 10, **extra: Any) -> dict:
    """One entry of a policy's ``offerings`` list."""
    spec = {"provider": PROVIDER, "region": REGION, "instance_type": instance_type, "gpus": gpus,
            "price_usd_hour": price}
    spec.update(extra)
    return spec


def make_offering(
    instance_type: str = "g8",
    *,
    gpus: int = 8,
    price: float = 10.0,
    market: Market | str = Market.ON_DEMAND,
    provider: str = PROVIDER,
    region: str = REGION,
    zone: str | None = None,
    gpu_model: str = "A100",
) -> Offering:
    return Offering(provider=provider, region=region, zone=zone, instance_type=instance_type,
                    market=Market(market), gpus=gpus, price_usd_hour=price, gpu_model=gpu_model)


def offering_of(policy: Policy, index: int = 0) -> Offering:
    """The Offering the planner resolves from the policy's ``offerings[index]`` (own market)."""
    spec = policy.offerings[index]
    return make_offering(spec.instance_type, gpus=spec.gpus or 8,
                         price=float(spec.price_usd_hour or 0), market=spec.market,
                         provider=str(spec.provider), region=spec.region, zone=spec.zone,
                         gpu_model=spec.gpu_model or "")


def make_job(
    id: str = "j1",
    *,
    gpus: int = 1,
    project: str | None = "research",
    pool: str = POOL,
    submitted_at: datetime | None = None,
    wait: timedelta = timedelta(minutes=1),
    priority: int = 0,
    duration_s: float | None = None,
    user: str | None = None,
) -> Job:
    """A pending job; by default submitted ``wait`` before T0."""
    return Job(id=id, project=project, pool=pool, gpus=gpus,
               submitted_at=submitted_at if submitted_at is not None else T0 - wait,
               priority=priority, duration_s=duration_s, user=user)


def make_node(
    id: str = "n1",
    *,
    state: NodeState = NodeState.READY,
    offering: Offering | None = None,
    policy: str = POLICY,
    pool: str = POOL,
    project: str | None = "research",
    state_since: datetime | None = None,
    created_at: datetime | None = None,
    request_id: str | None = None,
    instance_id: str | None = "__auto__",
    gpus_busy: int = 0,
    running_jobs: int = 0,
    idle_since: datetime | None = None,
    last_heartbeat: datetime | None = None,
    drain_deadline: datetime | None = None,
    released: bool = False,
    version: int = 0,
    budget_commit_usd: float = 0.0,
) -> Node:
    offering = offering or make_offering()
    since = state_since if state_since is not None else T0 - timedelta(hours=1)
    if instance_id == "__auto__":
        instance_id = None if state is NodeState.REQUESTED else f"i-{id}"
    return Node(
        id=id, policy=policy, pool=pool, provider=offering.provider, offering_key=offering.key,
        instance_type=offering.instance_type, market=offering.market, gpus=offering.gpus,
        price_usd_hour=offering.price_usd_hour, state=state, state_since=since,
        created_at=created_at if created_at is not None else since,
        request_id=request_id or f"r-{id}", instance_id=instance_id, project=project,
        gpus_busy=gpus_busy, running_jobs=running_jobs, idle_since=idle_since,
        last_heartbeat=last_heartbeat, drain_deadline=drain_deadline, released=released,
        version=version, budget_commit_usd=budget_commit_usd,
    )


def make_snapshot(
    jobs: Iterable[Job] = (),
    *,
    nodes: Iterable[Node] = (),
    offerings: Iterable[Offering] | None = None,
    onprem_free: Iterable[int] = (),
    onprem_total: int | None = None,
    pool: str = POOL,
    taken_at: datetime = T0,
    memory: Mapping[str, PolicyMemory] | None = None,
    capacity_blocks: Iterable[CapacityBlock] = (),
    paused_pools: Iterable[str] = (),
    queue: bool = True,
    budget_spend: Mapping[str, BudgetSpend] | None = None,
) -> Snapshot:
    """A snapshot of one pool. ``onprem_free`` lists free GPUs per on-prem node (total defaults
    to their sum); ``offerings`` is the provider catalogue (default: empty, the policy's own
    gpus/price then describe its offerings); ``queue=False`` leaves the pool unobserved."""
    free = tuple(onprem_free)
    total = onprem_total if onprem_total is not None else sum(free)
    queues = {}
    if queue:
        queues[pool] = PoolQueue(pool=pool, onprem=OnPremState(total, sum(free), free),
                                 pending=tuple(jobs))
    return Snapshot(
        taken_at=taken_at,
        queues=queues,
        nodes=tuple(nodes),
        offerings=tuple(offerings or ()),
        capacity_blocks=tuple(capacity_blocks),
        memory=dict(memory or {}),
        paused_pools=frozenset(paused_pools),
        budget_spend=dict(budget_spend or {}),
    )


class FixedClock:
    """The ``Clock`` port for tests: time moves only when the test says so."""

    def __init__(self, at: datetime = T0):
        self.at = at

    def now(self) -> datetime:
        return self.at

    def advance(self, seconds: float = 0, **delta: float) -> datetime:
        self.at = self.at + timedelta(seconds=seconds, **delta)
        return self.at


CONTROLLER_URL = "http://controller.test:8080"
SECRET = b"k" * 32


@dataclass
class Rig:
    """Executor and reconciler wired to a real store, a FakeProvider, the built-in queue and
    fabric, and a FixedClock: the pieces a control-loop tick uses, minus the planner."""

    store: Store
    policy: Policy
    clock: FixedClock
    provider: FakeProvider
    queue: BuiltinQueue
    fabric: BuiltinFabric
    tokens: JoinTokens
    executor: Executor
    reconciler: Reconciler

    @property
    def now(self) -> datetime:
        return self.clock.now()

    def launch_action(self, n: int = 1, *, project: str | None = "research",
                      offering: Offering | None = None) -> Launch:
        """The Launch the planner would emit for node ``n<n>`` (request id ``r-n<n>``)."""
        return Launch(policy=self.policy.name, pool=self.policy.pool.name, node_id=f"n{n}",
                      request_id=f"r-n{n}", offering=offering or offering_of(self.policy),
                      reason=ActionReason.DEMAND, project=project, decision_id="d-test")

    def observed(self) -> dict[str, list[Instance]]:
        return {self.provider.name: self.provider.list_owned(self.policy.cluster)}

    def sync(self) -> list[NodeEvent]:
        return self.reconciler.sync(self.observed(), self.now)

    def reconcile(self) -> ExecutionReport:
        """One reconcile pass as the loop runs it: sync, step, execute the corrective actions."""
        self.sync()
        return self.executor.run(self.reconciler.step(self.now))

    def node(self, node_id: str) -> Node:
        node = self.store.get_node(node_id)
        assert node is not None, f"no node {node_id}"
        return node

    def launched_ready(self, node_id: str, jobs: tuple[str, ...], at: datetime) -> Node:
        """A node the executor recorded as launched for ``jobs`` (as the planner's Launch
        carries them), then walked to ready at ``at`` (what the reconciler records)."""
        policy = self.policy
        assert self.executor.record_launch(Launch(policy.name, policy.pool.name, node_id,
                                                  f"r-{node_id}", offering_of(policy),
                                                  ActionReason.DEMAND, jobs=jobs)) is not None
        node = self.node(node_id)
        for state in (NodeState.LAUNCHING, NodeState.BOOTING, NodeState.JOINING, NodeState.READY):
            new, event = transition(node, state, at=at, reason="test")
            assert self.store.save_transition(node, new, event)
            node = new
        return self.node(node_id)

    def move(self, node_id: str, *states: NodeState, **changes: Any) -> Node:
        """Walk a stored node through ``states`` (legal edges only), then set ``changes``."""
        node = self.node(node_id)
        for state in states:
            new, event = transition(node, state, at=self.now, reason="test")
            assert self.store.save_transition(node, new, event)
            node = new
        if changes:
            updated = self.store.update_node(node, **changes)
            assert updated is not None
            node = updated
        return node

    def transitions(self, node_id: str) -> list[tuple[str | None, str]]:
        return [(str(e.from_state) if e.from_state else None, str(e.to_state))
                for e in self.store.events(node_id)]


def make_rig(store: Store, *, policy: Policy | None = None, clock: FixedClock | None = None,
             reconciler_config: ReconcilerConfig | None = None) -> Rig:
    policy = policy or make_policy()
    clock = clock or FixedClock()
    provider = FakeProvider(name=PROVIDER, now=clock.now)
    queue = BuiltinQueue(store, [policy])
    fabric = BuiltinFabric(queue)
    tokens = JoinTokens(SECRET)
    policies = {policy.name: policy}
    executor = Executor(store, {provider.name: provider}, fabric, clock, tokens, policies,
                        ExecutorConfig(controller_url=CONTROLLER_URL))
    reconciler = Reconciler(store, fabric, policies, reconciler_config or ReconcilerConfig())
    return Rig(store, policy, clock, provider, queue, fabric, tokens, executor, reconciler)


class NaiveAdmitter(NodeAdmitter):
    """The admitter as absorption asked it before its shortcuts: every bin asked one by one
    (never quota-only), and a refusal never remembered (``loosened`` changes on every read), so
    neither the quota shortcuts nor the quota cut apply. Properties check the shortcuts against it."""

    __slots__ = ("_reads",)

    def __init__(self, admission: Admission, nodes) -> None:
        super().__init__(admission, nodes)
        self.quotas_only = False
        self._reads = 0

    @property
    def loosened(self) -> int:
        self._reads += 1
        return self._reads
