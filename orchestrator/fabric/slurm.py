"""The Slurm fabric, controller side: burst nodes become Slurm nodes and drain out of Slurm.

Joining (driven by the node agent, see :mod:`orchestrator.fabric.slurm_node`): at registration
the controller gives the node its Slurm identity (:meth:`SlurmFabric.join_spec`):

* ``join: slot``: a pre-declared ``State=FUTURE`` node of slurm.conf, claimed race-free through
  the store (:mod:`orchestrator.store.slots`); the agent runs ``slurmd -D -N burst-k``.
* ``join: dynamic`` (production default): the node registers itself with ``slurmd -D -Z -N <node
  id> --conf "Gres=gpu:N Feature=burst"``; Slurm 22.05 allows one dynamic node per host.
* ``join: power-save``: a ``State=CLOUD`` node Slurm resumed; the name was bound to the burst node
  when ``burst slurm resume`` launched it (:mod:`orchestrator.fabric.powersave`); the agent runs
  ``slurmd -D -b -N <name>``. Slurm powers the name down itself, so leaving touches no Slurm state.

The agent reports ``joined`` once slurmd runs; the controller believes it only when Slurm shows
the node usable (:meth:`confirm_joined`), and then the node is ``ready``.

Draining is checkpoint-aware: :meth:`request_release` drains the node in Slurm at once (no new
job lands on it), and the agent then signals its jobs to checkpoint, requeues them, waits until
the node runs nothing (or the deadline), stops slurmd, returns the slot to FUTURE or deletes the
dynamic node, and reports ``released``. :meth:`node_gone` is the backstop for a node that goes
without finishing that (agent dead, deadline passed, instance vanished): it requeues whatever
Slurm still runs there, takes the node out of Slurm and frees its name.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.fabric.kept_off import JOINING_REASON, exclusions, held_joining, keeps_jobs_off
from orchestrator.fabric.onprem_order import base_id, nice_values
from orchestrator.policy.fabric import SlurmJoinMode
from orchestrator.policy.models import Policy
from orchestrator.sources.slurm import (  # the queue source observes runs per scope
    in_partition,
    slurm_scope,
)
from orchestrator.sources.slurm_cli import (
    UNUSABLE_NODE_FLAGS,
    USABLE_NODE_STATES,
    SlurmCli,
    SlurmError,
)
from orchestrator.store import Store
from orchestrator.store.slots import CLOUD, SLOT

log = logging.getLogger(__name__)

# A node in these states is leaving for good: its Slurm name must be cleaned up and freed.
GONE_STATES = frozenset({NodeState.TERMINATING, NodeState.TERMINATED, NodeState.FAILED})
CLEANUP_PATIENCE_S = 10.0  # how long node_gone retries taking a busy node out of Slurm


class FabricJoinError(Exception):
    """The node cannot join the fabric (no free slot, Slurm unreachable); the message says why."""


def dynamic_name(node_id: str) -> str:
    """A dynamic node is named after the burst node (Slurm names: letters, digits, - _ .)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", node_id)


class SlurmFabric:
    """Fabric port for policies whose fabric is Slurm (see the module docstring)."""

    name = "slurm"

    def __init__(self, store: Store, policies: Mapping[str, Policy], clock: Any,
                 cli_factory: Callable[[str | None], SlurmCli] = SlurmCli):
        self.store = store
        self.policies = dict(policies)
        self.clock = clock
        self._cli_factory = cli_factory
        self._clis: dict[str | None, SlurmCli] = {}
        self._raised: dict[str, set[str]] = {}  # policy -> jobs its last on-prem order raised

    def cli(self, policy: Policy) -> SlurmCli:
        conf = policy.queue.slurm_conf
        if conf not in self._clis:
            self._clis[conf] = self._cli_factory(conf)
        return self._clis[conf]

    def _policy(self, node: Node) -> Policy:
        policy = self.policies.get(node.policy)
        if policy is None:
            raise FabricJoinError(f"node {node.id}: policy {node.policy} has no Slurm fabric here")
        return policy

    # -- joining -----------------------------------------------------------------------------
    def join_spec(self, node: Node, gpus: int) -> dict[str, Any]:
        """The Slurm identity and drain settings handed to the node's agent at registration."""
        policy = self._policy(node)
        config = policy.fabric.slurm
        scope = slurm_scope(policy)
        now = self.clock.now()
        resume_at: float | None = None
        if config.join is SlurmJoinMode.POWER_SAVE:
            member = self.store.fabric_member(node.id)
            if member is None or member.kind != CLOUD:
                raise FabricJoinError(
                    f"node {node.id} holds no Slurm CLOUD node name: a power-save node is "
                    "launched by `burst slurm resume` only")
            if member.claimed_at is not None:
                resume_at = member.claimed_at.timestamp()
        elif config.join is SlurmJoinMode.SLOT:
            self.store.seed_fabric_slots(scope, config.slot_names())
            member = self.store.claim_fabric_slot(scope, node.id, now)
            if member is None:
                raise FabricJoinError(
                    f"every Slurm slot of policy {policy.name} is taken "
                    f"({', '.join(config.slot_names())}); raise fabric.slurm.slots or lower "
                    "limits.max_nodes")
        else:
            try:
                member = self.store.add_fabric_member(scope, dynamic_name(node.id), node.id, now)
            except ValueError as exc:
                raise FabricJoinError(str(exc)) from None
        return {
            "kind": "slurm",
            "mode": str(config.join),
            "node_name": member.name,
            "feature": config.feature,
            "gpus": gpus,
            "slurm_conf": policy.queue.slurm_conf,
            "checkpoint_signal": config.checkpoint_signal,
            "signal_batch_only": config.signal_batch_only,
            "checkpoint_wait_s": config.checkpoint_wait.total_seconds(),
            "respect_running_jobs": policy.scale_down.respect_running_jobs,
            "resume_requested_at": resume_at,
            # trigger.spare_room or onprem_order: longest-first: a dynamic node registers
            # drained until the kept jobs exclude it (orchestrator.fabric.kept_off); a slot or
            # CLOUD name is excluded beforehand.
            "hold_reason": (JOINING_REASON if keeps_jobs_off(policy)
                            and config.join is SlurmJoinMode.DYNAMIC else None),
        }

    def confirm_joined(self, node: Node) -> bool:
        """True when Slurm shows the node's name up and able to take work."""
        member = self.store.fabric_member(node.id)
        if member is None:
            return False
        try:
            state = self.cli(self._policy(node)).node_state(member.name)
        except SlurmError as exc:
            log.warning("node %s: cannot check its Slurm state: %s", node.id, exc)
            return False
        return (state is not None and state[0] in USABLE_NODE_STATES
                and not (state[1] & UNUSABLE_NODE_FLAGS))

    def slurm_name(self, node: Node) -> str | None:
        member = self.store.fabric_member(node.id)
        return None if member is None else member.name

    # -- the kept jobs: their on-prem order (trigger.onprem_order), off burst nodes -----------
    def keep_onprem(self, policy: Policy, order: tuple[str, ...], kept: Any) -> int:
        """The fabric's part of a decision's kept jobs: their on-prem order (``order``,
        :meth:`order_onprem`) and their exclusion from burst nodes (``kept``, None: not asked;
        :meth:`keep_off_burst`), on one read of the partition's pending jobs. Returns how many
        job updates were made."""
        pending = None
        if order and kept is not None:
            try:
                pending = self._pending(policy)
            except SlurmError as exc:
                log.warning("policy %s: the kept jobs were not applied: %s", policy.name, exc)
                return 0
        done = self.order_onprem(policy, order, pending)
        if kept is not None:
            done += self.keep_off_burst(policy, kept, pending)
        return done

    def _pending(self, policy: Policy) -> dict[str, dict[str, Any]]:
        """The policy partition's pending jobs by id (their ``squeue --json`` records)."""
        partition = policy.queue.partition
        return {str(job.get("job_id")): job for job in self.cli(policy).jobs()
                if job.get("job_state") == "PENDING" and in_partition(job, partition)}

    def order_onprem(self, policy: Policy, order: tuple[str, ...],
                     pending: dict[str, dict[str, Any]] | None = None) -> int:
        """Have Slurm start the jobs the policy keeps for on-prem in ``order`` (first first):
        their nice set so their priorities come first, in that order
        (:mod:`orchestrator.fabric.onprem_order`). ``pending``: the partition's pending jobs
        where already read. Returns how many jobs were updated."""
        if not order:
            return 0
        cli = self.cli(policy)
        raised = self._raised.setdefault(policy.name, set())
        try:
            if pending is None:
                pending = self._pending(policy)
            changes = nice_values(pending, order, raised)
            for job_id, nice in changes.items():
                cli.set_nice(job_id, nice)
        except SlurmError as exc:
            # Best effort: the order only steers which kept job starts first; the next plan's
            # order is applied afresh (what was set stays, what was not is set then).
            log.warning("policy %s: the on-prem order was not applied: %s", policy.name, exc)
            return 0
        raised.clear()
        raised.update(base_id(job_id) for job_id in order if base_id(job_id) in pending)
        if changes:
            log.info("policy %s: %d job(s) reordered for on-prem (%d kept, first %s)",
                     policy.name, len(changes), len(order), order[0])
        return len(changes)

    def keep_off_burst(self, policy: Policy, kept: Any,
                       pending: dict[str, dict[str, Any]] | None = None) -> int:
        """Keep the jobs the policy keeps for on-prem off the burst nodes they may not take
        (``kept``: the decision's :class:`~orchestrator.planner.spare_room.KeptOnPrem`), lift
        that from jobs no longer kept, then resume the dynamic nodes held drained until now
        (:mod:`orchestrator.fabric.kept_off`). ``pending``: the partition's pending jobs where
        already read. Returns how many jobs were updated; best effort (a Slurm error is logged,
        the next plan writes its exclusions afresh)."""
        cli = self.cli(policy)
        config = policy.fabric.slurm
        try:
            present = {str(n.get("name")): n for n in cli.nodes()}
            members = {m.node_id: m.name for m in self.store.fabric_members(slurm_scope(policy))
                       if m.node_id is not None}
            burst = set(config.slot_names()) | {name for name in members.values()
                                                 if name in present}
            if pending is None:
                pending = self._pending(policy)
            allowed: dict[str, set[str]] = {}
            if kept is not None:
                for job_id, nodes in kept.allowed_nodes().items():
                    allowed[job_id] = {members[n] for n in nodes if n in members}
            changes = exclusions(pending, burst, kept.kept if kept is not None else (),
                                 allowed, cli.hostnames)
            updated = 0
            for names, job_ids in changes.items():
                cli.set_excluded(job_ids, list(names))
                updated += len(job_ids)
            for name in sorted(burst):
                node = present.get(name)
                if node is not None and held_joining(node):
                    cli.resume(name)  # its exclusions are written: it may take work now
        except SlurmError as exc:
            log.warning("policy %s: the kept jobs' exclusions were not written: %s",
                        policy.name, exc)
            return 0
        if updated:
            log.info("policy %s: %d job(s)' burst exclusions written (%d kept)", policy.name,
                     updated, len(kept.kept) if kept is not None else 0)
        return updated

    # -- Fabric port ---------------------------------------------------------------------------
    def request_release(self, node: Node, deadline: datetime) -> None:
        """Drain the node in Slurm now; its agent does the checkpoint-and-requeue."""
        member = self.store.fabric_member(node.id)
        if member is None:
            return
        try:
            self.cli(self._policy(node)).drain(
                member.name, f"burst drain until {deadline.strftime('%H:%M:%S')}")
        except (SlurmError, FabricJoinError) as exc:
            # The agent drains too; a node not in Slurm yet has nothing to drain.
            log.warning("node %s: Slurm drain of %s failed: %s", node.id, member.name, exc)

    def is_released(self, node: Node) -> bool:
        return node.released

    def node_gone(self, node: Node, at: datetime) -> int:
        """Requeue what Slurm still runs on the node, take it out of Slurm, free its name.
        Returns how many jobs were requeued."""
        member = self.store.fabric_member(node.id)
        if member is None:
            return 0
        policy = self.policies.get(node.policy)
        if policy is None:
            self.store.release_fabric_member(node.id)
            return 0
        cli = self.cli(policy)
        requeued: list[str] = []
        try:
            if member.kind == CLOUD:
                # Slurm powered the name down (SuspendProgram) or gave up on it
                # (ResumeFailProgram): draining it would stop its next resume.
                self.store.release_fabric_member(node.id)
                return 0
            state = cli.node_state(member.name)
            if state is not None and state[0] != "future":
                cli.drain(member.name, "burst: node gone")
                for job in cli.live_jobs_on(member.name):
                    try:
                        cli.requeue(job["job_id"])
                        requeued.append(str(job["job_id"]))
                    except SlurmError as exc:
                        log.warning("job %s on %s: requeue failed: %s", job.get("job_id"),
                                    member.name, exc)
                self._remove(cli, member.name, member.kind)
                self._lift_holds(cli, requeued)
        except SlurmError as exc:
            # Keep the name held: freeing it while Slurm still has the node (drained, or with
            # jobs to requeue) would hand a new node a broken slot. The reconciler retries
            # (:meth:`retry_gone`) until Slurm answers.
            log.warning("node %s: Slurm clean-up of %s incomplete, retried at the next reconcile: "
                        "%s", node.id, member.name, exc)
            return len(requeued)
        self.store.release_fabric_member(node.id)
        if requeued:
            log.info("node %s gone: Slurm job(s) %s requeued from %s", node.id,
                     ", ".join(requeued), member.name)
        return len(requeued)

    def retry_gone(self, nodes: Mapping[str, Node], now: datetime) -> int:
        """Finish the Slurm clean-up of nodes that are gone (terminating, terminated, failed or
        unknown) but still hold a Slurm name because Slurm did not answer before. Returns how
        many were retried."""
        retried = 0
        for member in self.store.fabric_members():
            if member.node_id is None:
                continue
            node = nodes.get(member.node_id)
            if node is not None and node.state not in GONE_STATES:
                continue
            if node is None or node.policy not in self.policies:
                self.store.release_fabric_member(member.node_id)  # nothing left to ask Slurm for
                continue
            self.node_gone(node, now)
            retried += 1
        return retried

    @staticmethod
    def _lift_holds(cli: SlurmCli, job_ids: list[str]) -> None:
        """Requeued jobs may start again at once rather than after Slurm's ~2 minute hold."""
        left = set(job_ids)
        end = time.monotonic() + CLEANUP_PATIENCE_S
        while left and time.monotonic() < end:
            for job in cli.jobs():
                if str(job["job_id"]) in left and cli.lift_hold(job):
                    left.discard(str(job["job_id"]))
            if left:
                time.sleep(0.3)

    @staticmethod
    def _remove(cli: SlurmCli, name: str, kind: str) -> None:
        """Slot back to FUTURE, or dynamic node deleted; retried while jobs finish leaving."""
        end = time.monotonic() + CLEANUP_PATIENCE_S
        while True:
            try:
                if kind == SLOT:
                    cli.set_future(name)
                else:
                    cli.delete_node(name)
                return
            except SlurmError:
                if time.monotonic() >= end:
                    raise
                time.sleep(0.5)
