"""The reconciler: makes what burst believes agree with what really exists.

Two phases, as in Ray's autoscaler v2:

``sync(observed, now)`` only *records* reality, from each provider's ``list_owned`` view:

* ``requested`` -> ``launching``: an instance carries the node's request id (adopted after a crash
  between the provider call and recording its outcome);
* ``launching`` -> ``booting``: the instance is running;
* ``terminating``/``failed`` -> ``terminated``: the provider shows the instance gone;
* ``launching``..``draining`` -> ``failed``: the instance vanished (e.g. a spot interruption);
  the node's work goes back to the queue.

``step(now)`` then *decides* corrective actions for the executor:

* leaked instances (owned by our cluster, no live node record) older than the leak grace ->
  ``Terminate`` by instance id;
* nodes stuck past a per-state timeout (data from :func:`orchestrator.lifecycle.state_timeouts`),
  joined nodes whose agent went silent, failed nodes with an instance -> ``Terminate``; a draining
  node whose agent confirmed the release (and so stopped heartbeating) is closed as ``drained``,
  never failed, when no planner tick terminated it within the heartbeat timeout;
* ``requested`` nodes whose launch outcome was never recorded -> the same ``Launch`` again (same
  request id, so the provider creates nothing twice).

A missing instance is only trusted after ``vanish_grace``: providers are eventually consistent.

Liveness is judged on the controller's own observation window (``step(now, observing_since)``):
a controller that was not running, or not leading, or whose API was down, heard nothing, and its
silence is not the nodes'. So after a start or a leader change a node's heartbeat age counts only
from when this controller could have heard it: ``observing_since`` plus the agent's documented
retry behaviour (:data:`HEARD_WITHIN`: its backoff cap plus one request timeout). Per-state
timeouts likewise count only time inside the window (from the later of ``state_since`` and
``observing_since``): a node cannot register, or be seen booted, while nobody listens.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from orchestrator.domain.agent_contract import HEARTBEAT_REQUEST_TIMEOUT_S, HEARTBEAT_RETRY_MAX_S
from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.offerings import offering_from_key
from orchestrator.domain.plan import Action, ActionReason, Launch, Terminate
from orchestrator.domain.ports import Fabric, Instance, InstanceState
from orchestrator.lifecycle import NodeEvent, state_timeouts, transition
from orchestrator.policy.models import Policy
from orchestrator.store import Store

log = logging.getLogger(__name__)

_GONE = {InstanceState.TERMINATED}
#: Once a controller listens again, a live agent is heard within this long (agent_contract).
HEARD_WITHIN = timedelta(seconds=HEARTBEAT_RETRY_MAX_S + HEARTBEAT_REQUEST_TIMEOUT_S)
_ALIVE_STATES = (NodeState.LAUNCHING, NodeState.BOOTING, NodeState.JOINING, NodeState.READY,
                 NodeState.DRAINING)


@dataclass(frozen=True, slots=True)
class ReconcilerConfig:
    leak_grace: timedelta = timedelta(seconds=60)  # Karpenter waits 30 s, slurm-gcp 90 s
    vanish_grace: timedelta = timedelta(seconds=30)
    relaunch_after: timedelta = timedelta(seconds=15)  # a requested node this old is re-issued


class Reconciler:
    """See the module docstring."""

    def __init__(self, store: Store, fabric: Fabric, policies: Mapping[str, Policy],
                 config: ReconcilerConfig = ReconcilerConfig()):
        self.store = store
        self.fabric = fabric
        self.policies = policies
        self.config = config
        self._last_seen: dict[str, list[Instance]] = {}
        # node id -> first sync that did not see its instance. A missing instance is only trusted
        # once it has been missing for vanish_grace (kept in memory: a restart only delays it).
        self._missing_since: dict[str, datetime] = {}

    # -- phase 1: record reality ----------------------------------------------------------------
    def sync(self, observed: Mapping[str, list[Instance]], now: datetime) -> list[NodeEvent]:
        """Record what the providers show; ``observed`` maps provider name to owned instances.

        Providers missing from ``observed`` (their listing failed) are left untouched.
        """
        self._last_seen = {name: list(items) for name, items in observed.items()}
        events: list[NodeEvent] = []
        for node in self.store.nodes():
            if node.provider not in observed:
                continue
            instances = observed[node.provider]
            by_id = {i.id: i for i in instances}
            instance = by_id.get(node.instance_id) if node.instance_id else None
            if node.instance_id is None:
                instance = next((i for i in instances if i.tags.get("burst:request-id") == node.request_id), None)
            event = self._sync_node(node, instance, now)
            if event is not None:
                events.append(event)
        return events

    def _sync_node(self, node: Node, instance: Instance | None, now: datetime) -> NodeEvent | None:
        state = node.state
        if state not in _ALIVE_STATES:
            self._missing_since.pop(node.id, None)
        if state is NodeState.REQUESTED:
            if instance is not None and instance.state not in _GONE:
                adopted = replace(node, instance_id=instance.id)
                return self._save(node, adopted, NodeState.LAUNCHING, now,
                                  "adopted instance carrying the request id", instance_id=instance.id)
            return None
        if state in (NodeState.TERMINATING, NodeState.FAILED):
            if instance is None or instance.state in _GONE:
                if node.instance_id is None and now - node.state_since < self.config.vanish_grace:
                    return None  # the launch may still surface an instance: wait it out
                return self._save(node, node, NodeState.TERMINATED, now, "provider confirms the instance is gone")
            if state is NodeState.FAILED and node.instance_id is None:
                adopted = replace(node, instance_id=instance.id)
                return self._update(node, adopted)
            return None
        if state in _ALIVE_STATES:
            if instance is not None and instance.state is InstanceState.RUNNING and state is NodeState.LAUNCHING:
                return self._save(node, node, NodeState.BOOTING, now, "instance running")
            # Eventually consistent listings: one sync without the instance proves nothing. It
            # vanished only once it has been missing for vanish_grace (measuring from state_since
            # alone failed a node ready for an hour on the first listing that lagged).
            vanished = False
            if instance is None:
                missing_since = self._missing_since.setdefault(node.id, now)
                vanished = (now - missing_since >= self.config.vanish_grace
                            and now - node.state_since >= self.config.vanish_grace)
            else:
                self._missing_since.pop(node.id, None)
            if (instance is not None and instance.state in (_GONE | {InstanceState.STOPPING})) or vanished:
                self._missing_since.pop(node.id, None)
                event = self._save(node, node, NodeState.FAILED, now, "instance vanished at the provider")
                if event is not None:
                    requeued = self.fabric.node_gone(node, now)
                    if requeued:
                        log.warning("node %s vanished: %d job(s) handed back to the queue", node.id, requeued)
                return event
        return None

    def _save(self, old: Node, changed: Node, to: NodeState, now: datetime, reason: str, **details) -> NodeEvent | None:
        new, event = transition(changed, to, at=now, reason=reason, **details)
        if self.store.save_transition(old, new, event):
            log.info("node %s: %s -> %s (%s)", old.id, old.state, to, reason)
            return event
        return None  # someone else changed the node first; next sync sees their version

    def _update(self, old: Node, changed: Node) -> None:
        self.store.update_node(old, instance_id=changed.instance_id)

    # -- phase 2: corrective actions ----------------------------------------------------------------
    def step(self, now: datetime, observing_since: datetime | None = None) -> list[Action]:
        """Corrective actions for the executor (see the module docstring).

        ``observing_since``: since when this controller could have heard agents (its lease
        tenure, the API's presence window); None judges from the records alone."""
        actions: list[Action] = []
        nodes = self.store.nodes(include_terminated=True)
        by_id = {n.id: n for n in nodes}
        retry_gone = getattr(self.fabric, "retry_gone", None)
        if retry_gone is not None:
            # Fabric clean-ups a departure could not finish (e.g. Slurm unreachable then).
            try:
                retry_gone(by_id, now)
            except Exception:  # noqa: BLE001 - a fabric outage must not stop the reconciler
                log.warning("fabric clean-up retry failed; tried again next pass", exc_info=True)
        for provider, instances in self._last_seen.items():
            for instance in instances:
                if instance.state in _GONE:
                    continue
                tags = instance.ownership
                node = by_id.get(tags.node_id) if tags else None
                if (node is not None and node.state is not NodeState.TERMINATED
                        and node.instance_id in (None, instance.id)):
                    continue  # the node's own instance (or one it may still adopt)
                # Otherwise a leak: no live record, or a second instance of a node whose record
                # names another one (e.g. a launch repeated after the provider forgot the token);
                # nothing would ever terminate it.
                age = now - instance.launched_at if instance.launched_at else self.config.leak_grace
                if age < self.config.leak_grace:
                    continue
                actions.append(Terminate(None, ActionReason.LEAKED, instance_id=instance.id, provider=provider))

        for node in nodes:
            policy = self.policies.get(node.policy)
            if node.state is NodeState.TERMINATED or policy is None:
                continue
            actions.extend(self._node_actions(node, policy, now, observing_since))
        return actions

    def _node_actions(self, node: Node, policy: Policy, now: datetime,
                      observing_since: datetime | None = None) -> list[Action]:
        age = now - node.state_since
        # Time counts against a node only while this controller could observe it.
        watched = now - max(node.state_since, observing_since) if observing_since else age
        for timeout in state_timeouts(policy):
            if node.state is timeout.state and watched >= timeout.limit:
                return [Terminate(node.id, timeout.reason)]
        # Re-issue a launch whose outcome was never recorded; after transient errors, back off
        # exponentially (15 s, 30 s, 60 s, ...) until the launch timeout fails the node.
        backoff = self.config.relaunch_after * (2 ** min(node.launch_attempts, 6))
        if node.state is NodeState.REQUESTED and age >= backoff:
            return [self._relaunch(node)]
        if node.state in (NodeState.JOINING, NodeState.READY, NodeState.DRAINING):
            last = node.last_heartbeat or node.state_since
            if observing_since is not None:
                # A heartbeat sent while nobody listened was lost by us, not by the node.
                last = max(last, observing_since + HEARD_WITHIN)
            if now - last >= policy.timeouts.heartbeat:
                if node.state is NodeState.DRAINING and node.released:
                    # Its agent confirmed the drain and exited: the silence is expected, not a
                    # failure. The planner terminates released nodes each tick; when no tick ran
                    # for a heartbeat timeout (workers down, broker restarting), close it here as
                    # drained instead of failing a node that did everything right.
                    return [Terminate(node.id, ActionReason.DRAINED)]
                return [Terminate(node.id, ActionReason.HEARTBEAT_LOST)]
        if node.state is NodeState.FAILED and node.instance_id is not None:
            return [Terminate(node.id, ActionReason.FAILED)]
        return []

    def _relaunch(self, node: Node) -> Launch:
        policy = self.policies[node.policy]
        # Keep the catalogue details (GPU model) where the policy has them.
        gpu_model = next((s.gpu_model for s in policy.offerings
                          if s.instance_type == node.instance_type and s.gpu_model), "")
        offering = offering_from_key(node.offering_key, node.gpus, node.price_usd_hour, gpu_model)
        return Launch(policy=node.policy, pool=node.pool, node_id=node.id, request_id=node.request_id,
                      offering=offering, reason=ActionReason.RETRY_LAUNCH, project=node.project)
