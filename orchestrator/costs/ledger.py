"""The roll-up: writes the cost ledger from node lifecycle events, job runs and captured prices.

``roll_up(store, policies, now)`` brings every subject (each burst node, and each pool's on-prem
work) up to ``now``:

* Buckets before a subject's mark (``ledger_marks.final_through``) are final: never recomputed.
* Buckets from the mark to ``now`` are computed afresh and replace what the ledger holds for
  them, in one transaction per subject; the open bucket's lines are provisional (``final``
  false) and replaced on every run.
* A bucket becomes final once it has been closed for :data:`SETTLE` (late job reports still land
  in it), or at once for a node whose termination is confirmed: its lines are then final through
  its end, and it is never looked at again.
* Idempotent: a second run at the same ``now`` writes nothing (the store compares first); two
  runs at once converge (lines are upserted on their unique key; a mark never moves back).
* ``skip_fresh`` (the control loop's tick): a live node for which only the clock moved since its
  last roll-up is left as it is. Its lines reach that roll-up's ``now`` (``LedgerNode.reach``)
  and budgets add price x time past that reach (:mod:`orchestrator.costs.spend`), which is what
  rewriting its open bucket would have added; rewriting 10,000 live nodes' open buckets, one
  transaction each, cost tens of seconds of CPU every tick. A node is rolled up as before when a
  bucket of it becomes final (its mark moves), a new hour bucket opened since its reach, a run on
  it started or ended after its reach, it ended or was terminated, its reach is unknown, it was
  within its billing minimum at its reach, or it is billed by increments over a second. Its
  open bucket's provisional lines then lag by up to an hour; final lines are unchanged (they
  are written only by a roll-up that moves the mark, which reads every run as it is then).
  The spend report and the roll-up task roll every node (no ``skip_fresh``).
* The two clock-driven reasons (a bucket becoming final, a new hour bucket) fall on the same
  instant for every live node: hour buckets are the clock's hours. Each node takes them
  :func:`spread_lag` later (0 to :data:`ROLL_SPREAD`, fixed per node id), so a tick over 10,000
  live nodes rolls up a thirtieth of them at 10-second ticks, not all of them twice an hour.
  Event-driven reasons (a run started or ended, the node ended) are never delayed: a budget
  must see an ended node's end, and the lag only delays when a closed bucket's lines become
  final (by at most ROLL_SPREAD past SETTLE) and where provisional lines sit, not what spend
  totals (price x time past the reach covers the rest).

Jobs that ran on a burst node of a policy declaring ``storage`` also get an ``egress`` line (data
staged in, checkpoints brought back; :mod:`orchestrator.costs.egress`).

Nodes get lines from their own row (price captured at launch, project, offering, GPUs), whether
their policy is still loaded or not. The billing rule comes from the provider's offering
(``billing``, by offering key) and defaults to per second with a one-minute minimum (AWS and GCP
Linux instances). Loaded policies give each pool's on-prem rate (``pool.onprem.gpu_hour_usd``):
on-prem lines are written for pools that set it, and burst usage lines carry its equivalent.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from orchestrator.costs.attribution import (
    NodeBilling,
    hour_ceil,
    hour_floor,
    node_lines,
    onprem_lines,
)
from orchestrator.costs.egress import egress_lines
from orchestrator.domain.costs import JobUsage
from orchestrator.domain.nodes import NodeState
from orchestrator.domain.offerings import BillingRule, Offering
from orchestrator.policy.models import Policy
from orchestrator.store import Store
from orchestrator.store.accrual import epoch_us, from_us
from orchestrator.store.base import require_aware
from orchestrator.store.ledger import ONPREM_SUBJECT, FreshNode, FreshTest, LedgerNode
from orchestrator.store.ledger_batch import LedgerWrite, Written
from orchestrator.store.ticknodes import TickNodes

log = logging.getLogger(__name__)

SETTLE = timedelta(minutes=5)  # a closed bucket stays provisional this long (late job reports)
# Where a subject without a mark is rewritten from: nothing of it is final, so all of it.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
DEFAULT_BILLING = BillingRule()  # per second, one-minute minimum
_TERMINATED = NodeState.TERMINATED.value
# Lines per transaction of the batched writer: a roll-up of 10,000 live nodes (30,000-40,000
# lines) is one; a first roll-up of days of backlog is several, each whole.
BATCH_LINES = 200_000
# How far the tick's clock-driven roll-ups of live nodes are spread (the module docstring): at
# 10-second ticks, thirty ticks share what would otherwise be one tick's roll-up of every node.
ROLL_SPREAD = timedelta(minutes=5)


def spread_lag(node_id: str, spread: timedelta = ROLL_SPREAD) -> timedelta:
    """How long after the hour (or after the hour plus SETTLE) the tick rolls ``node_id`` up
    for the clock alone: fixed per node id (CRC-32, the same in every process and on every
    controller), spread evenly over ``spread``."""
    return timedelta(milliseconds=_lag_ms(node_id, int(spread / timedelta(milliseconds=1))))


def _lag_ms(node_id: str, spread_ms: int) -> int:
    # spread_lag in whole milliseconds: the roll-up's test of every live node calls this.
    return zlib.crc32(node_id.encode()) % spread_ms if spread_ms > 0 else 0


@dataclass(frozen=True, slots=True)
class RollupResult:
    """What one roll-up did: subjects whose lines changed, lines written and deleted, and the
    subjects it had to skip (with why)."""

    nodes: int = 0
    pools: int = 0
    lines_written: int = 0
    lines_deleted: int = 0
    skipped: tuple[str, ...] = field(default_factory=tuple)

    def as_json(self) -> dict:
        return {"nodes": self.nodes, "pools": self.pools, "lines_written": self.lines_written,
                "lines_deleted": self.lines_deleted, "skipped": list(self.skipped)}


def billing_rules(offerings: Iterable[Offering]) -> dict[str, BillingRule]:
    """Offering key -> the provider's billing rule, from a provider catalogue."""
    return {o.key: o.billing for o in offerings}


def onprem_rates(policies: Iterable[Policy]) -> dict[str, tuple[str, Decimal]]:
    """Pool -> (policy, on-prem USD per GPU-hour) for pools whose policy sets one (the first
    policy by name, should several burst one pool)."""
    rates: dict[str, tuple[str, Decimal]] = {}
    for policy in sorted(policies, key=lambda p: p.name):
        usd = policy.pool.onprem.gpu_hour_usd
        if usd is not None and policy.pool.name not in rates:
            rates[policy.pool.name] = (policy.name, Decimal(usd))
    return rates


def roll_up(store: Store, policies: Iterable[Policy] | Mapping[str, Policy], now: datetime, *,
            billing: Mapping[str, BillingRule] | None = None,
            only_policies: Collection[str] | None = None,
            settle: timedelta = SETTLE, skip_fresh: bool = False,
            nodes: TickNodes | None = None) -> RollupResult:
    """Bring the ledger up to ``now`` (see the module docstring). ``only_policies``: roll up only
    the nodes of these policies and the on-prem work of their pools (a policy's tick).
    ``skip_fresh``: leave live nodes for which only the clock moved (the module docstring).
    ``nodes``: the tick's one read of the nodes (``Store.tick_nodes``), which the candidates
    are taken from instead of a read of their own."""
    require_aware(now, "now")
    loaded = list(policies.values() if isinstance(policies, Mapping) else policies)
    rates = onprem_rates(loaded)
    # Policies whose jobs move data (egress lines), worked out once, not once per node.
    movers = {p.name: p for p in loaded if _moves_data(p)}
    billing = billing or {}
    rolled = pools = written = deleted = 0
    skipped: list[str] = []

    batch = _Batch(store, now)
    # With skip_fresh, a live node whose own facts say only the clock moved comes as its row
    # (FreshNode): most of them are left below, and making each a LedgerNode cost more than
    # the rest of a tick's roll-up.
    candidates = store.ledger_candidates(
        only_policies, _clock_only_test(now, settle, billing) if skip_fresh else None,
        nodes=nodes)
    launched = [n for n in candidates if isinstance(n, FreshNode) or n.launched is not None]
    usages: dict[str, list[JobUsage]] = {}
    for node in candidates:
        if isinstance(node, LedgerNode) and node.launched is None and node.state.is_terminal:
            # Never launched (the provider refused, or it failed first): it cost nothing.
            batch.add(LedgerWrite(node.node_id, (), since=node.state_since,
                                  mark=node.state_since))
    if launched:
        since = from_us(min(_since_us(n) for n in launched))
        usages = store.burst_job_usages([n.node_id for n in launched], since)
    for item in launched:
        if isinstance(item, FreshNode):
            if _runs_within(usages.get(item.node_id, ()), item.reach_us):
                continue  # only the clock moved: left as it is
            node = store.ledger_node(item.row)
        else:
            node = item
        try:
            write = _node_write(node, usages.get(node.node_id, []), rates, billing, now,
                                settle, movers.get(node.policy))
        except ValueError as exc:
            # Bad data in one node (a negative price) must not stop the ledger of every other.
            log.warning("cost roll-up skipped node %s: %s", node.node_id, exc)
            skipped.append(f"{node.node_id}: {exc}")
            continue
        batch.add(write)

    wanted = set(rates)
    if only_policies is not None:
        wanted &= {p.pool.name for p in loaded if p.name in only_policies}
    if wanted:
        marks = store.ledger_marks([ONPREM_SUBJECT + pool for pool in wanted])
        pool_marks = {pool: marks.get(ONPREM_SUBJECT + pool) for pool in wanted}
        known = [m for m in pool_marks.values() if m is not None]
        since = min(known) if len(known) == len(wanted) else None
        jobs = store.onprem_job_usages(wanted, since)
        for pool in sorted(wanted):
            policy, usd = rates[pool]
            mark = pool_marks[pool]
            runs = [j for j in jobs.get(pool, []) if mark is None or j.end is None or j.end > mark]
            if mark is None and not runs:
                # No on-prem work yet (e.g. a Slurm pool: its on-prem work is not in this queue):
                # mark the settled past as done, or every roll-up would read all on-prem jobs.
                settled = hour_floor(now - settle)
                batch.add(LedgerWrite(ONPREM_SUBJECT + pool, (), since=settled, mark=settled))
                continue
            start = mark or min(hour_floor(j.start) for j in runs)
            final = max(hour_floor(now - settle), start)
            lines = onprem_lines(pool, policy, usd, runs, start=start, until=now,
                                 final_through=final)
            batch.add(LedgerWrite(ONPREM_SUBJECT + pool, lines, since=mark or _EPOCH,
                                  mark=final if final > start else None))
    batch.flush()
    for subject, done in batch.done:
        if subject.startswith(ONPREM_SUBJECT):
            pools += bool(done)
        else:
            rolled += bool(done)
        written += done.lines_written
        deleted += done.lines_deleted
    return RollupResult(rolled, pools, written, deleted, tuple(skipped))


_HOUR_US = 3_600_000_000  # (UTC hours: the epoch is on one)


def _since_us(node: LedgerNode | FreshNode) -> int:
    if isinstance(node, FreshNode):
        return node.since_us
    return epoch_us(node.mark or node.launched)  # type: ignore[arg-type]


def _clock_only_test(now: datetime, settle: timedelta, billing: Mapping[str, BillingRule]
                     ) -> FreshTest:
    """Whether rolling a node up at ``now`` would only extend its open bucket's provisional lines
    to ``now``, by the node's own facts (see ``skip_fresh`` in the module docstring); its runs
    are checked after (:func:`_runs_within`). Times in whole microseconds since the epoch."""
    now_us, settle_us = epoch_us(now), settle // _US
    spread_ms = int(ROLL_SPREAD / timedelta(milliseconds=1))

    def fresh(node_id: str, offering_key: str, state: str, mark_us: int | None,
              reach_us: int | None, launched_us: int | None, ended_us: int | None) -> bool:
        if (reach_us is None or launched_us is None or ended_us is not None
                or state == _TERMINATED or reach_us > now_us):
            return False
        rule = billing.get(offering_key, DEFAULT_BILLING)
        if rule.increment_s > 1 or reach_us - launched_us < rule.minimum_s * 1_000_000:
            # Its last bucket's minimum line was billed up to an increment or the minimum past
            # its reach: price x time past the reach is not what it costs by now.
            return False
        start_us = launched_us - launched_us % _HOUR_US if mark_us is None else mark_us
        # The clock-driven reasons, this node's lag later (spread_lag: not every node at one
        # tick). (Hour floors inline: x - x % hour; this runs for every live node each tick.)
        lag_us = _lag_ms(node_id, spread_ms) * 1000
        moment = now_us - settle_us - lag_us
        if moment - moment % _HOUR_US > start_us:
            return False  # a bucket becomes final: the mark moves
        # The bucket its last line is in (a reach on the hour ends the bucket before: the one
        # that starts there has no line yet).
        moment, last = now_us - lag_us, reach_us - 1
        return moment - moment % _HOUR_US <= last - last % _HOUR_US

    return fresh


def _runs_within(jobs: Iterable[JobUsage], reach_us: int) -> bool:
    """Whether every run on a node started, and every ended one ended, by its reach."""
    reach: datetime | None = None
    for job in jobs:
        reach = reach or from_us(reach_us)
        if job.start > reach or (job.end is not None and job.end > reach):  # type: ignore[operator]
            return False
    return True


def _node_write(node: LedgerNode, jobs: list[JobUsage],
                rates: Mapping[str, tuple[str, Decimal]], billing: Mapping[str, BillingRule],
                now: datetime, settle: timedelta, movers: Policy | None = None) -> LedgerWrite:
    """What rolling ``node`` up at ``now`` writes: its lines from its mark on, and its mark.
    ``movers``: the node's policy if its jobs move data (egress lines), else None."""
    assert node.launched is not None
    if node.ended is None and node.state.is_terminal:
        node = replace(node, ended=node.state_since)  # terminated without its event: trust the row
    billed = _billing(node, rates, billing)
    start = node.mark or hour_floor(node.launched)
    if node.ended is not None:
        until = node.ended
        final = max(hour_ceil(node.ended), node.state_since)  # done: final through its end
    else:
        until = max(now, node.launched)
        final = hour_floor(now - settle)
    if until < start or (until == start and node.mark is not None):
        # The ledger is final past its end already: only the mark may have to catch up.
        return LedgerWrite(node.node_id, (), since=start, mark=final)
    lines = node_lines(billed, jobs, start=start, until=until, final_through=final)
    if movers is not None:
        lines += egress_lines(billed, jobs, movers.storage_for, start=start, until=until,
                              final_through=final)
    return LedgerWrite(node.node_id, lines, since=node.mark or _EPOCH,
                       mark=final if final > start else None)


class _Batch:
    """The roll-up's writes, handed to the store's batched writer
    (:meth:`~orchestrator.store.ledger_batch.LedgerBatch.write_ledgers`) in one transaction, or
    one per :data:`BATCH_LINES` lines when there are more (a first roll-up of days of
    backlog): ``done`` says what each subject's write did."""

    def __init__(self, store: Store, now: datetime) -> None:
        self.store, self.now = store, now
        self.writes: list[LedgerWrite] = []
        self.lines = 0
        self.done: list[tuple[str, Written]] = []

    def add(self, write: LedgerWrite) -> None:
        self.writes.append(write)
        self.lines += len(write.lines)
        if self.lines >= BATCH_LINES:
            self.flush()

    def flush(self) -> None:
        if self.writes:
            done = self.store.write_ledgers(self.writes, at=self.now)
            self.done += zip((w.subject for w in self.writes), done, strict=True)
        self.writes, self.lines = [], 0


def _moves_data(policy: Policy) -> bool:
    return policy.pool.storage is not None or any(p.storage is not None for p in policy.projects)


def _billing(node: LedgerNode, rates: Mapping[str, tuple[str, Decimal]],
             billing: Mapping[str, BillingRule]) -> NodeBilling:
    parts = node.offering_key.split("/")
    region = parts[1] if len(parts) == 5 and parts[1] else "-"
    onprem = rates.get(node.pool)
    return NodeBilling(
        node_id=node.node_id, policy=node.policy, pool=node.pool, provider=node.provider,
        region=region, instance_type=node.instance_type, market=node.market,
        project=node.project, gpus=node.gpus, price_usd_hour=node.price_usd_hour,
        launched=node.launched,  # type: ignore[arg-type]
        ended=node.ended, rule=billing.get(node.offering_key, DEFAULT_BILLING),
        onprem_gpu_hour_usd=onprem[1] if onprem else None)


__all__ = ["BATCH_LINES", "DEFAULT_BILLING", "SETTLE", "RollupResult", "billing_rules",
           "onprem_rates", "roll_up"]
