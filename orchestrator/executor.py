"""The executor: turns planned actions into provider and fabric calls, recording each step.

For every side effect the intent is written to the store first and the outcome after, so a crash
between any two lines leaves a record that the reconciler can finish or undo:

* ``Launch``: insert the node in ``requested`` with the action's request id (a repeat of the same
  action inserts nothing), then call ``provider.launch`` with that id as the idempotency token and
  the node's bootstrap (join token included) as user-data, then record ``launching`` with the
  instance id.
* ``Drain``: record ``draining`` with the deadline, then ask the fabric to release the node.
* ``Terminate``: record ``terminating`` (passing through ``failed`` when the reason is a failure),
  hand the node's work back to the queue, then call ``provider.terminate``. Only the provider's
  confirmation (seen by the reconciler) makes the node ``terminated``.

A launch group (``Launch.group``: the nodes of one multi-node job) is carried out as a whole by
:mod:`orchestrator.groups`: its nodes launch together in one provider placement group, and if any
of them cannot be launched none is left running.

Provider errors are handled by kind: a capacity error excludes the offering for a back-off period
(the negative-capacity cache) and tells the caller to re-plan within the same tick; a transient
error leaves the node ``requested`` so the launch is retried with the same request id; quota, auth
and invalid-request errors fail the node, and auth/invalid also disable the provider until restart
with the reason shown in ``burst status``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from orchestrator.domain.evolve import evolve
from orchestrator.domain.nodes import Node, NodeState, OwnershipTags
from orchestrator.domain.offerings import Offering, offering_from_key
from orchestrator.domain.plan import Action, ActionReason, Drain, Launch, Plan, Terminate
from orchestrator.domain.ports import (
    AuthError,
    CapacityError,
    Clock,
    Fabric,
    InvalidRequest,
    LaunchRequest,
    Provider,
    ProviderError,
    QuotaError,
    TransientError,
)
from orchestrator.domain.snapshot import CapacityBlock
from orchestrator.fabric.bootstrap import DEFAULT_CONTROLLER_LEASE_S, Bootstrap, NodeInstall
from orchestrator.fabric.tokens import JoinTokens
from orchestrator.groups import launch_group, launch_recorded_group
from orchestrator.instruments import LEAKED_COLLECTED
from orchestrator.lifecycle import CAS_RETRIES, NodeEvent, transition
from orchestrator.logs import log_context
from orchestrator.policy.models import Policy
from orchestrator.policy.tags import cost_tags
from orchestrator.store import Store

log = logging.getLogger(__name__)

# Reasons that mean the node went wrong (recorded as ``failed`` before it is terminated).
FAILURE_REASONS = frozenset({
    ActionReason.LAUNCH_TIMEOUT, ActionReason.BOOT_TIMEOUT, ActionReason.JOIN_TIMEOUT,
    ActionReason.HEARTBEAT_LOST, ActionReason.TERMINATE_RETRY, ActionReason.FAILED,
    ActionReason.SLURM_RESUME_FAIL,
})


@dataclass(slots=True)
class ExecutionReport:
    """What one execution pass did; ``capacity_errors`` tells the loop to re-plan this tick."""

    launched: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    capacity_errors: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def merge(self, other: ExecutionReport) -> None:
        for name in ("launched", "drained", "terminated", "capacity_errors", "errors"):
            getattr(self, name).extend(getattr(other, name))


@dataclass(slots=True)
class ExecutorConfig:
    controller_url: str
    capacity_backoff: timedelta = timedelta(minutes=3)  # Karpenter's ICE cache TTL
    quota_backoff: timedelta = timedelta(minutes=30)
    boot_delay_s: float = 0.0
    # How cloud nodes (providers with ``cloud_init``) install burst, and the agent's settings
    # their cloud-config writes; None: they get the plain bootstrap script, as local nodes do.
    node_install: NodeInstall | None = None
    node_env: Mapping[str, str] = field(default_factory=dict)


class Executor:
    """Carries out actions through the ports; see the module docstring."""

    def __init__(
        self,
        store: Store,
        providers: Mapping[str, Provider],
        fabric: Fabric,
        clock: Clock,
        tokens: JoinTokens,
        policies: Mapping[str, Policy],
        config: ExecutorConfig,
    ):
        self.store = store
        self.providers = providers
        self.fabric = fabric
        self.clock = clock
        self.tokens = tokens
        self.policies = policies
        self.config = config
        self.disabled: dict[str, str] = {}  # provider name -> why it was stopped

    # -- entry points ------------------------------------------------------------------------
    def execute(self, plan: Plan) -> ExecutionReport:
        """Record the plan's decisions and memory, then carry out its actions."""
        for decision in plan.decisions:
            self.store.add_decision(decision)
        for policy, memory in plan.memory.items():
            self.store.save_memory(policy, memory)
        self._keep_onprem(plan)
        return self.run(plan.actions)

    def _keep_onprem(self, plan: Plan) -> None:
        """Hand each decision's kept jobs to the fabric: their on-prem order
        (``trigger.onprem_order``), which the on-prem scheduler is to start them in (Slurm: their
        nice), and the burst nodes they may not take (``Decision.kept_off``; Slurm: their
        ExcNodeList, the built-in queue: its claim). Best effort: a Slurm that cannot take it now
        is logged there, and the plan's actions go on."""
        apply = getattr(self.fabric, "keep_onprem", None)
        if apply is None:
            return
        for decision in plan.decisions:
            policy = self.policies.get(decision.policy)
            if policy is not None and (decision.onprem_order or decision.kept_off is not None):
                # (an empty kept list too: what an earlier plan kept off is lifted)
                apply(policy, decision.onprem_order, decision.kept_off)

    def run(self, actions: Iterable[Action]) -> ExecutionReport:
        report = ExecutionReport()
        actions = list(actions)
        groups: dict[str, list[Launch]] = {}
        for action in actions:
            if isinstance(action, Launch) and action.group is not None:
                groups.setdefault(action.group, []).append(action)
        for action in actions:
            # Every line logged while carrying out an action names its node and decision.
            with log_context(**_action_ids(action)):
                try:
                    if isinstance(action, Launch) and action.group is not None:
                        members = groups.pop(action.group, None)
                        if members is not None:  # the group goes together, at its first member
                            launch_group(self, members, report)
                    elif isinstance(action, Launch):
                        self._launch(action, report)
                    elif isinstance(action, Drain):
                        self._drain(action, report)
                    elif isinstance(action, Terminate):
                        self._terminate(action, report)
                except ProviderError as exc:
                    report.errors.append(f"{exc.kind}: {exc}")
                    log.warning("%s failed: %s: %s", type(action).__name__, exc.kind, exc)
        return report

    # -- launch --------------------------------------------------------------------------------
    def _launch(self, action: Launch, report: ExecutionReport) -> None:
        node = self.record_launch(action)
        if node is None:
            return
        group = self.store.group_of_node(node.id)
        if group is not None:
            # a re-issued launch of a group's node: the group carries it (into its placement
            # group, falling back as a whole if it cannot be had)
            launch_recorded_group(self, group.group_id, report)
            return
        self._call_launch(node, action.offering, report)

    def record_launch(self, action: Launch) -> Node | None:
        """Write the launch intent (``requested``, with the request id); no provider call.

        Returns the node to launch, or None when this action was carried out before (a duplicate).
        The distributed control plane records intents in the planner's task and calls the provider
        from a task of its own (:meth:`launch_recorded`).
        """
        now = self.clock.now()
        offering = action.offering
        node = Node(
            id=action.node_id, policy=action.policy, pool=action.pool, provider=offering.provider,
            offering_key=offering.key, instance_type=offering.instance_type, market=offering.market,
            gpus=offering.gpus, price_usd_hour=offering.price_usd_hour, state=NodeState.REQUESTED,
            state_since=now, created_at=now, request_id=action.request_id, project=action.project,
            budget_commit_usd=action.budget_commit_usd, launched_for=action.jobs,
        )
        event = NodeEvent(node.id, now, None, NodeState.REQUESTED, str(action.reason),
                          {"decision": action.decision_id, "offering": offering.key,
                           "request_id": action.request_id, "project": action.project,
                           "user": action.user, "jobs": list(action.jobs),
                           "budget_commit_usd": action.budget_commit_usd})
        if not self.store.add_node(node, event):
            existing = self.store.get_node(action.node_id) or self.store.node_by_request(action.request_id)
            if existing is None or existing.state is not NodeState.REQUESTED:
                return None  # already done: a duplicate of an action carried out before
            node = existing  # intent recorded earlier but never completed: resume it
        return node

    def launch_recorded(self, node_id: str, *, raise_transient: bool = False) -> ExecutionReport:
        """Call the provider for a node whose intent is recorded; a no-op unless it is ``requested``.

        Safe to run any number of times (the request id is the provider's idempotency token).
        With ``raise_transient`` a transient error is re-raised after being recorded, so a task
        queue can retry it with its own backoff.
        """
        report = ExecutionReport()
        node = self.store.get_node(node_id)
        if node is None or node.state is not NodeState.REQUESTED:
            return report
        with log_context(policy=node.policy, node=node.id):
            self._launch_stored(node, report, raise_transient=raise_transient)
        return report

    def _launch_stored(self, node: Node, report: ExecutionReport, *, raise_transient: bool) -> None:
        group = self.store.group_of_node(node.id)
        if group is not None:
            launch_recorded_group(self, group.group_id, report)  # see _launch
            return
        self._call_launch(node, self._stored_offering(node), report,
                          raise_transient=raise_transient)

    def _stored_offering(self, node: Node) -> Offering:
        """The offering a recorded node was launched for (GPU model from its policy)."""
        policy = self.policies.get(node.policy)
        gpu_model = next((s.gpu_model for s in (policy.offerings if policy else ())
                          if s.instance_type == node.instance_type and s.gpu_model), "")
        return offering_from_key(node.offering_key, node.gpus, node.price_usd_hour, gpu_model)

    def launch_group_recorded(self, group_id: str) -> ExecutionReport:
        """Carry out a launch group whose intents are recorded (:func:`record_group`): the
        distributed control plane's task for a group; safe to run any number of times."""
        report = ExecutionReport()
        launch_recorded_group(self, group_id, report)
        return report

    def launch_node(self, node: Node, report: ExecutionReport, *,
                    placement_group: str | None = None) -> NodeState:
        """Launch one recorded node (of a launch group); returns its state after the call:
        ``launching`` (accepted), ``requested`` (transient: retried later), else it failed."""
        with log_context(policy=node.policy, node=node.id):
            self._call_launch(node, self._stored_offering(node), report,
                              placement_group=placement_group)
        current = self.store.get_node(node.id)
        return current.state if current is not None else NodeState.FAILED

    def fail_unlaunched(self, node: Node, why: str) -> None:
        """A recorded node that will not be launched: failed, then terminated."""
        self._fail_unlaunched(node, why)

    def _launched_for_user(self, node_id: str) -> str | None:
        """The user the node's launch intent recorded (its ``requested`` event), if one: the
        provider call may run in another task than the one that recorded the intent."""
        for event in self.store.events(node_id, limit=50):
            if event.to_state is NodeState.REQUESTED and event.from_state is None:
                user = (event.details or {}).get("user")
                return user if isinstance(user, str) and user else None
        return None

    def _call_launch(self, node: Node, offering, report: ExecutionReport, *,
                     raise_transient: bool = False, placement_group: str | None = None) -> None:
        provider = self.providers.get(node.provider)
        if provider is None or node.provider in self.disabled:
            why = self.disabled.get(node.provider, "provider not configured")
            self._fail_unlaunched(node, f"provider {node.provider}: {why}")
            report.errors.append(f"{node.id}: {why}")
            return
        policy = self.policies.get(node.policy)
        token, token_hash, expires = self.tokens.issue(node.id, node.request_id, node.created_at)
        self.store.set_join_token(node.id, token_hash, expires)
        bootstrap = Bootstrap(
            node_id=node.id, controller_url=self.config.controller_url, join_token=token,
            cluster=policy.cluster if policy else "burst", policy=node.policy, gpus=node.gpus,
            gpu_model=offering.gpu_model or "unknown", boot_delay_s=self.config.boot_delay_s,
            controller_lease_s=(policy.timeouts.controller_lease.total_seconds() if policy
                                else DEFAULT_CONTROLLER_LEASE_S),
            self_terminate=getattr(provider, "self_terminate_command", None) or "",
            checkpoint_uri=_checkpoint_uri(policy, node.project),
        )
        tags = OwnershipTags(policy.cluster if policy else "burst", node.policy, node.id, node.request_id)
        if getattr(provider, "cloud_init", False) and self.config.node_install is not None:
            user_data = bootstrap.render_cloud_config(self.config.node_install, self.config.node_env)
        else:
            user_data = bootstrap.render()
        request = LaunchRequest(node.request_id, offering, tags, user_data,
                                placement_group=placement_group,
                                cost_tags=cost_tags(policy.tags if policy else {}, node.project,
                                                    self._launched_for_user(node.id)))
        try:
            instances = provider.launch(request)
        except CapacityError as exc:
            block = CapacityBlock(offering.key, self.clock.now() + self.config.capacity_backoff,
                                  f"{exc.code or 'capacity'}: {exc}")
            self.store.add_capacity_block(block, self.clock.now())
            self._fail_unlaunched(node, f"capacity error: {exc}")
            report.capacity_errors.append(offering.key)
            return
        except TransientError as exc:
            # Counted so the reconciler's re-issue backs off exponentially (same request id).
            current = self.store.get_node(node.id)
            if current is not None and current.state is NodeState.REQUESTED:
                self.store.update_node(current, launch_attempts=current.launch_attempts + 1)
            log.warning("launch of %s hit a transient error, will retry: %s", node.id, exc)
            report.errors.append(f"{node.id}: transient: {exc}")
            if raise_transient:
                raise
            return
        except QuotaError as exc:
            block = CapacityBlock(offering.key, self.clock.now() + self.config.quota_backoff,
                                  f"quota: {exc}")
            self.store.add_capacity_block(block, self.clock.now())
            self._fail_unlaunched(node, f"quota error: {exc}")
            report.errors.append(f"{node.id}: quota: {exc}")
            return
        except (AuthError, InvalidRequest) as exc:
            self.disabled[node.provider] = f"{exc.kind}: {exc}"
            self._fail_unlaunched(node, f"{exc.kind}: {exc}")
            report.errors.append(f"{node.id}: {exc.kind}: {exc}")
            log.error("provider %s stopped: %s: %s", node.provider, exc.kind, exc)
            return
        if not instances:
            return  # accepted but not visible yet; the reconciler adopts it by request id
        instance = instances[0]
        current = self.store.get_node(node.id) or node
        if current.state is not NodeState.REQUESTED:
            return
        launched = evolve(current, instance_id=instance.id, launch_attempts=current.launch_attempts + 1)
        new, event = transition(launched, NodeState.LAUNCHING, at=self.clock.now(),
                                reason="provider accepted launch", instance_id=instance.id)
        if self.store.save_transition(current, new, event):
            report.launched.append(node.id)

    def _fail_unlaunched(self, node: Node, why: str) -> None:
        """A launch that created nothing: failed, then terminated (no instance to clean up)."""
        current = self.store.get_node(node.id) or node
        if current.state is not NodeState.REQUESTED:
            return
        failed, event = transition(current, NodeState.FAILED, at=self.clock.now(), reason=why)
        if self.store.save_transition(current, failed, event):
            done, event = transition(failed, NodeState.TERMINATED, at=self.clock.now(),
                                     reason="no instance was created")
            self.store.save_transition(failed, done, event)

    # -- drain -----------------------------------------------------------------------------------
    def _drain(self, action: Drain, report: ExecutionReport) -> None:
        # A lost compare-and-set is retried on the node as it is now: an agent's heartbeat or a
        # usage update bumps the version without changing the state, and must not make the
        # drain vanish (a Celery delivery would answer "not drained" and nobody would retry).
        for _ in range(CAS_RETRIES):
            node = self.store.get_node(action.node_id)
            if node is None or node.state is not NodeState.READY:
                return  # already draining or gone: nothing to do twice
            draining = evolve(node, drain_deadline=action.deadline)
            new, event = transition(draining, NodeState.DRAINING, at=self.clock.now(),
                                    reason=str(action.reason), deadline=action.deadline.isoformat(),
                                    decision=action.decision_id)
            if self.store.save_transition(node, new, event):
                self.fabric.request_release(new, action.deadline)
                report.drained.append(node.id)
                return
        log.warning("node %s: drain not recorded: the node kept changing under %d attempts",
                    action.node_id, CAS_RETRIES)

    # -- terminate -------------------------------------------------------------------------------
    def _terminate(self, action: Terminate, report: ExecutionReport) -> None:
        if action.node_id is None:
            self._terminate_unrecorded(action, report)
            return
        # As for a drain: a compare-and-set lost to a heartbeat is tried again on the node as it
        # is now; one lost to another delivery finds the node terminating and stops there.
        for _ in range(CAS_RETRIES):
            if self._terminate_recorded(action, report):
                return
        log.warning("node %s: terminate not recorded: the node kept changing under %d attempts",
                    action.node_id, CAS_RETRIES)

    def _terminate_recorded(self, action: Terminate, report: ExecutionReport) -> bool:
        """One attempt at a recorded node's terminate. False: a compare-and-set was lost (the
        node changed since it was read), and nothing after it was done."""
        assert action.node_id is not None
        node = self.store.get_node(action.node_id)
        if node is None or node.state is NodeState.TERMINATED:
            return True
        now = self.clock.now()
        if node.state is NodeState.REQUESTED:
            # Never launched as far as we know; fail it so the reconciler can adopt or close it.
            new, event = transition(node, NodeState.FAILED, at=now, reason=str(action.reason))
            return self.store.save_transition(node, new, event)
        if action.reason in FAILURE_REASONS and node.state is not NodeState.FAILED:
            failed, event = transition(node, NodeState.FAILED, at=now, reason=str(action.reason))
            if not self.store.save_transition(node, failed, event):
                return False
            node = failed
        if node.state is NodeState.TERMINATING:
            return True
        if node.instance_id is None:
            new, event = transition(node, NodeState.TERMINATED, at=now, reason="no instance to terminate")
            if not self.store.save_transition(node, new, event):
                return False
            self.fabric.node_gone(new, now)
            return True
        new, event = transition(node, NodeState.TERMINATING, at=now, reason=str(action.reason),
                                decision=action.decision_id)
        if not self.store.save_transition(node, new, event):
            return False
        requeued = self.fabric.node_gone(new, now)
        if requeued:
            log.info("node %s: %d job(s) handed back to the queue", node.id, requeued)
        provider = self.providers.get(node.provider)
        if provider is None:
            report.errors.append(f"{node.id}: provider {node.provider} not configured")
            return True
        provider.terminate([node.instance_id])
        report.terminated.append(node.id)
        return True

    def _terminate_unrecorded(self, action: Terminate, report: ExecutionReport) -> None:
        provider = self.providers.get(action.provider or "")
        if provider is None or action.instance_id is None:
            return
        log.warning("terminating instance %s at %s: %s", action.instance_id, action.provider, action.reason)
        provider.terminate([action.instance_id])
        report.terminated.append(action.instance_id)
        if action.reason is ActionReason.LEAKED:
            LEAKED_COLLECTED.labels(action.provider or "").inc()


def _action_ids(action: Action) -> dict[str, str | None]:
    """The log ids of an action: its policy, node and decision where it has them."""
    return {"policy": getattr(action, "policy", None), "node": getattr(action, "node_id", None),
            "decision": getattr(action, "decision_id", None)}


def _checkpoint_uri(policy: Policy | None, project: str | None) -> str:
    """Where a node's jobs write checkpoints: ``storage.checkpoints`` of the node's project (else
    the pool's); empty when the policy declares none."""
    storage = policy.storage_for(project) if policy is not None else None
    return (storage.checkpoints or "") if storage is not None else ""
