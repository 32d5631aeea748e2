"""Celery tasks of the control loop: thin adapters that load fresh state by id and call the core.

* ``burst.loop.tick(policy)``: only the holder of the policy's leader lease plans; its writes go
  through a store fenced with the lease's token, so a paused old leader that wakes up is refused.
  Besides the Redis lease (one worker of this deployment at a time), the deployment as a whole
  must lead ``policy:<name>`` in the store (:mod:`orchestrator.leadership`), the lease every
  controller of the pool shares: while an embedded ``burst run`` leads it, the tick (and the
  public ``burst.policy.evaluate``, which runs it) reports that and plans nothing.
  Of the tick messages of one period (two beats send two) only the first plans.
  The tick records intents (decisions, memory, ``requested`` nodes) and hands every provider call
  to a task of its own.
* ``burst.provider.launch(node_id)``: calls the provider for a ``requested`` node, with the node's
  request id as the idempotency token. Late-acknowledged (idempotent): redelivery after a worker
  dies is harmless. Transient errors retry with backoff and jitter; invalid-request and auth errors
  never retry; a capacity error blocks the offering and asks the planner to choose again.
* ``burst.node.drain`` / ``burst.node.terminate``: one node each, idempotent.
* ``burst.reconcile.run``: reality first (sync), then corrective actions, under its own lease and
  the store lease ``reconcile``; liveness is judged on the deployment's observation window.
  It also claims what deserves a notification (:mod:`orchestrator.notify`) and sends each row
  with ``burst.notify.send``: one webhook call, retried with backoff (``DeliveryFailed``).
* ``burst.decisions.prune``: deletes decisions last made before ``decision_retention`` (hourly).
* ``burst.cost.rollup``: brings the whole cost ledger up to now (beat, every ``cost_rollup_s``),
  under its own lease. Each tick also rolls up its policy's nodes before observing, so budgets
  see current spend. Two roll-ups at once are harmless: lines are upserted on unique keys.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime

from celery import shared_task

from orchestrator.automation.leader import lead
from orchestrator.automation.runtime import lease_seconds, redis_client, runtime
from orchestrator.domain.plan import Drain, Launch, Terminate
from orchestrator.domain.ports import AuthError, InvalidRequest, ProviderError, TransientError
from orchestrator.executor import Executor
from orchestrator.groups import record_group, sweep_groups
from orchestrator.leadership import RECONCILE, Controller, Holder, lease_ttl, watch_gap
from orchestrator.logs import log_context
from orchestrator.notify.deliver import DeliveryFailed, NoTarget, attempt
from orchestrator.notify.watch import check
from orchestrator.reconciler import Reconciler
from orchestrator.store.fencing import StaleLeaderError
from orchestrator.tick import fenced_runtime_parts, planning_pass, record_tick, roll_up_costs
from orchestrator.tick import prune_decisions as prune

log = logging.getLogger(__name__)


def controller() -> Controller:
    """This deployment's hold on the store leases: one holder id for every worker on the broker,
    so a tenure carries on from task to task while any worker renews it. One per runtime."""
    rt = runtime()
    ctl = rt.extras.get("controller")
    if ctl is None:
        ctl = rt.extras["controller"] = Controller(
            rt.store, Holder.deployment("celery", rt.settings.broker_url),
            lease_ttl(rt.settings.tick_s), watch_gap(rt.settings.tick_s))
    return ctl


def _controlled(scope: str, token: int, now: datetime) -> tuple[Executor, Reconciler] | str:
    """An executor and reconciler whose writes carry the Redis leader token and the store lease
    of ``scope``; or, when another controller leads ``scope`` in the store, why not."""
    ctl = controller()
    claims = ctl.claim([scope], now)
    if not claims.leads(scope):
        return f"{scope} is led by another live controller ({claims.skipped[scope]})"
    return fenced_runtime_parts(runtime(), ctl.view([scope], runtime().store.fenced(scope, token)))


def _dispatch(actions) -> dict:
    """Record launch intents (already done by the caller) and send each side effect to a task."""
    counts = {"launch": 0, "drain": 0, "terminate": 0}
    groups: set[str] = set()
    for action in actions:
        if isinstance(action, Launch) and action.group is not None:
            if action.group not in groups:  # a launch group is one task: all or nothing
                groups.add(action.group)
                launch_group.delay(action.group)
            counts["launch"] += 1
        elif isinstance(action, Launch):
            launch.delay(action.node_id)
            counts["launch"] += 1
        elif isinstance(action, Drain):
            drain.delay(action.node_id, action.deadline.isoformat(), str(action.reason))
            counts["drain"] += 1
        elif isinstance(action, Terminate):
            terminate.delay(action.node_id, str(action.reason), action.instance_id, action.provider)
            counts["terminate"] += 1
    return counts


TICK_PREFIX = "burst:tick:"


def _claim_tick(policy_name: str, now: datetime, tick_s: float, token: int) -> bool:
    """Claim the tick period that ``now`` falls in (``floor(epoch / tick_s)``) for planning.

    At most one tick task plans per policy per period, however many beats send ticks: the first
    to claim it plans, the others return. The key outlives the period, so a late delivery of the
    same period cannot plan it again; losing the key (a Redis restart) at worst lets one period
    be planned twice, which the fence and the store's idempotent writes make harmless.
    """
    period = int(now.timestamp() // tick_s)
    key = f"{TICK_PREFIX}{policy_name}:{period}"
    return bool(redis_client().set(key, token, nx=True, px=max(1000, int(tick_s * 3000))))


@shared_task(name="burst.loop.tick", ignore_result=False)
def tick(policy_name: str, replan: bool = False) -> dict:
    """Plan ``policy_name`` once for this tick period; ``replan``: plan again within the period
    (sent after a capacity error, so the next offering is chosen without waiting a tick)."""
    rt = runtime()
    policy = rt.policies.get(policy_name)
    if policy is None:
        raise ValueError(f"policy_name: no policy named {policy_name!r} (running: {', '.join(rt.policies)})")
    with log_context(policy=policy_name):
        return _tick(rt, policy, policy_name, replan)


def _tick(rt, policy, policy_name: str, replan: bool) -> dict:
    started = time.perf_counter()
    scope = f"policy:{policy_name}"
    # floor: if Redis lost its counter (a restart without persistence), tokens restart above the
    # highest one the store has seen, instead of being refused forever.
    with lead(redis_client(), scope, lease_seconds(), floor=rt.store.fence_token(scope) or 0) as token:
        if token is None:
            return {"policy": policy_name, "leader": False}
        now = rt.clock.now()
        # The pool's store lease first: a tick refused by it must not claim the period either.
        parts = _controlled(scope, token, now)
        if isinstance(parts, str):
            return {"policy": policy_name, "leader": False, "reason": parts}
        executor, _ = parts
        if not _claim_tick(policy_name, now, rt.settings.tick_s, token) and not replan:
            # Another delivery of this period's tick planned already (two beats for HA each send
            # every tick; the lease alone lets the later one plan again once the first released).
            return {"policy": policy_name, "leader": False, "reason": "tick already planned"}

        def record_and_dispatch(result) -> dict:
            # Intents first (decisions, memory, ``requested`` nodes), then one task per side effect.
            for decision in result.decisions:
                executor.store.add_decision(decision)
            for name, memory in result.memory.items():
                executor.store.save_memory(name, memory)
            to_dispatch = []
            grouped: dict[str, list[Launch]] = {}
            for action in result.actions:
                if isinstance(action, Launch) and action.group is not None:
                    grouped.setdefault(action.group, []).append(action)
            for members in grouped.values():
                if record_group(executor, members) is not None:
                    to_dispatch.extend(members)
            for action in result.actions:
                if isinstance(action, Launch) and action.group is not None:
                    continue  # recorded with its group above
                if isinstance(action, Launch) and executor.record_launch(action) is None:
                    continue  # a duplicate of a launch recorded before
                to_dispatch.append(action)
            return _dispatch(to_dispatch)

        done = planning_pass(rt, [policy], now, record_and_dispatch, store=executor.store)
        record_tick(rt, [policy_name], now, started)
        return {"policy": policy_name, "leader": True, "fence": token, "at": now.isoformat(),
                "decisions": [d.id for d in done.plan.decisions], **done.outcome}


@shared_task(name="burst.cost.rollup", ignore_result=False)
def cost_rollup() -> dict:
    """Roll the whole cost ledger (every node, every pool's on-prem work) up to now."""
    rt = runtime()
    scope = "cost-rollup"
    # The lease spans a roll-up period: a worker that died mid-roll-up delays the next by at
    # most one period, and deliveries within it (two beats) do the work once.
    lease_s = max(rt.settings.cost_rollup_s, lease_seconds())
    with lead(redis_client(), scope, lease_s, floor=rt.store.fence_token(scope) or 0) as token:
        if token is None:
            return {"leader": False}
        now = rt.clock.now()
        try:
            result = roll_up_costs(rt, now, store=rt.store.fenced(scope, token), strict=True)
        except StaleLeaderError as exc:
            # A newer roll-up took over while this one ran past its lease: it writes the same.
            return {"leader": False, "reason": str(exc)}
        return {"leader": True, "fence": token, "at": now.isoformat(), **result.as_json()}


@shared_task(name="burst.reconcile.run", ignore_result=False)
def reconcile() -> dict:
    rt = runtime()
    with lead(redis_client(), "reconcile", lease_seconds(),
              floor=rt.store.fence_token("reconcile") or 0) as token:
        if token is None:
            return {"leader": False}
        now = rt.clock.now()
        parts = _controlled(RECONCILE, token, now)
        if isinstance(parts, str):
            return {"leader": False, "reason": parts}
        _, reconciler = parts
        observed = {}
        clusters = sorted({p.cluster for p in rt.policies.values()})
        for name, provider in rt.providers.items():
            try:
                observed[name] = [i for c in clusters for i in provider.list_owned(c)]
            except ProviderError as exc:
                log.warning("provider %s: cannot list instances: %s", name, exc)
        events = reconciler.sync(observed, now)
        corrective = reconciler.step(now, controller().observing_since(now))
        dispatched = _dispatch(corrective)
        # placement groups whose burst is over, interrupted deletions, leaked groups
        sweep_groups(reconciler.store, rt.providers, set(clusters), now)
        # What deserves a notification, claimed once in the store; each row sent by its own
        # task (retries and backoff there), so a failing webhook never holds this one.
        claimed = check(rt.store, rt.policies.values(), now,
                        [a for a in corrective if isinstance(a, Terminate)])
        for notice_id in claimed:
            send_notification.delay(notice_id)
        return {"leader": True, "events": len(events), "notifications": len(claimed),
                **dispatched}


NOTIFY_RETRIES = 6  # attempts after the first: 2, 4, 8, ... s apart (with jitter), at most 300 s


@shared_task(name="burst.notify.send", bind=True, acks_late=True, ignore_result=False,
             autoretry_for=(DeliveryFailed,), retry_backoff=2, retry_backoff_max=300,
             retry_jitter=True, max_retries=NOTIFY_RETRIES)
def send_notification(self, notice_id: int) -> dict:
    """Send one claimed notification (idempotent: a row already sent is not sent again)."""
    rt = runtime()
    final = self.request.retries >= NOTIFY_RETRIES
    try:
        sent = attempt(rt.store, rt.policies.values(), notice_id, rt.clock.now(), final=final)
    except NoTarget as exc:
        return {"notification": notice_id, "sent": False, "reason": str(exc)}
    return {"notification": notice_id, "sent": sent, "attempt": self.request.retries + 1}


@shared_task(name="burst.provider.launch", bind=True, acks_late=True, ignore_result=False,
             autoretry_for=(TransientError,), dont_autoretry_for=(AuthError, InvalidRequest),
             retry_backoff=2, retry_backoff_max=60, retry_jitter=True, max_retries=6)
def launch(self, node_id: str) -> dict:
    rt = runtime()
    node = rt.store.get_node(node_id)
    if node is None:
        return {"node": node_id, "status": "unknown-node"}
    report = rt.executor.launch_recorded(node_id, raise_transient=True)
    if report.capacity_errors:
        # The offering is in the negative-capacity cache now: let the planner choose again.
        tick.delay(node.policy, replan=True)
        return {"node": node_id, "status": "capacity", "offering": report.capacity_errors[0]}
    status = "launched" if report.launched else ("failed" if report.errors else "already-done")
    return {"node": node_id, "status": status}


@shared_task(name="burst.provider.launch_group", acks_late=True, ignore_result=False)
def launch_group(group_id: str) -> dict:
    """Launch a recorded launch group together (orchestrator.groups); idempotent. A transient
    error leaves its nodes ``requested``: the reconciler re-issues them into the group."""
    rt = runtime()
    record = rt.store.get_group(group_id)
    if record is None:
        return {"group": group_id, "status": "unknown-group"}
    report = rt.executor.launch_group_recorded(group_id)
    if report.capacity_errors:
        tick.delay(record.policy, replan=True)  # the group fell back: the planner chooses again
        return {"group": group_id, "status": "capacity", "offering": report.capacity_errors[0]}
    status = "launched" if report.launched else ("failed" if report.errors else "already-done")
    return {"group": group_id, "status": status, "nodes": report.launched}


@shared_task(name="burst.node.drain", acks_late=True, ignore_result=False)
def drain(node_id: str, deadline: str, reason: str = "idle") -> dict:
    from orchestrator.domain.plan import ActionReason

    from orchestrator.policy.timefmt import parse_aware

    report = runtime().executor.run([Drain(node_id, ActionReason(reason),
                                           parse_aware(deadline, "deadline"))])
    return {"node": node_id, "drained": bool(report.drained)}


@shared_task(name="burst.node.terminate", acks_late=True, ignore_result=False)
def terminate(node_id: str | None, reason: str, instance_id: str | None = None,
              provider: str | None = None) -> dict:
    from orchestrator.domain.plan import ActionReason

    report = runtime().executor.run([Terminate(node_id, ActionReason(reason), instance_id=instance_id,
                                               provider=provider)])
    return {"node": node_id, "instance": instance_id, "terminated": report.terminated}


@shared_task(name="burst.decisions.prune", ignore_result=False)
def prune_decisions() -> dict:
    """Delete decisions last made longer than ``decision_retention`` ago (beat, hourly).

    No lease: two beats pruning at once delete the same rows, which is harmless."""
    rt = runtime()
    now = rt.clock.now()
    removed = prune(rt, now)
    return {"pruned": removed, "before": (now - rt.settings.decision_retention).isoformat()}


@shared_task(name="burst.catalog.refresh", ignore_result=False)
def refresh_catalog() -> dict:
    from orchestrator.wiring import ProviderUnavailable, refresh_catalog as refresh

    rt = runtime()
    try:
        count, path = refresh(rt.settings, list(rt.policies.values()))
    except ProviderUnavailable as exc:
        return {"refreshed": 0, "note": str(exc)}
    return {"refreshed": count, "path": str(path)}
