"""Candidate offerings for a policy, and what serving a demand with each would take and cost.

A policy names offerings; the provider catalogue in the snapshot supplies GPUs and prices the
policy leaves out (the policy's values win). A spot offering with ``fallback_on_demand`` also
yields its on-demand twin. Offerings in the negative-capacity cache are rejected with the reason,
so the decision record shows why an obvious choice was not taken.

Packing is first-fit-decreasing on a histogram of job widths, so its cost grows with the number of
distinct widths, not the number of jobs: the planner must stay fast on 100k pending jobs.

Resolving is the same work at every tick (the policy, the catalogue and the capacity blocks
rarely change), so :func:`resolved` memoizes it: a pure memo keyed on the identity of the policy
and of the catalogue tuple (both immutable: policies are frozen models, catalogues tuples of
frozen offerings; the entry keeps them alive, so an id is never reused while it is cached) and on
the *value* of the blocks still in force. Equal inputs give the very same result with or without
the memo; any other catalogue or set of blocks is resolved afresh.
"""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter, is_

from orchestrator.domain.jobs import Job
from orchestrator.domain.offerings import Offering, offering_key
from orchestrator.domain.plan import OfferingOption
from orchestrator.domain.snapshot import CapacityBlock
from orchestrator.policy.models import Market, OfferingSpec, Policy

DEFAULT_JOB_HOURS = 1.0  # assumed runtime of a job with no time limit, for cost estimates


@dataclass(frozen=True, slots=True)
class Candidate:
    """A usable offering with the per-offering node cap from the policy (None: no cap)."""

    offering: Offering
    max_nodes: int | None
    key: str = field(default="", compare=False)  # offering.key, formatted once

    def __post_init__(self) -> None:
        if not self.key:
            object.__setattr__(self, "key", self.offering.key)


@dataclass(frozen=True, slots=True)
class Resolved:
    """A policy's candidates against one catalogue and set of blocks (see :func:`resolved`)."""

    candidates: tuple[Candidate, ...]
    rejected: tuple[OfferingOption, ...]
    # What pricing no demand gives (every option at 0 nodes) and the ranking by hourly price:
    # what a tick with nothing unmet records and ranks with, the same at every such tick.
    idle_options: tuple[OfferingOption, ...]
    by_price: tuple[Candidate, ...]


_MEMO: OrderedDict[tuple, tuple[object, object, tuple, Resolved]] = OrderedDict()
_MEMO_SIZE = 64
_MEMO_LOCK = threading.Lock()  # the API and the loop may plan in two threads


def resolved(policy: Policy, catalogue: tuple[Offering, ...], blocks: tuple[CapacityBlock, ...],
             now: datetime) -> Resolved:
    """:func:`resolve_candidates`, memoized (see the module docstring), with the no-demand
    pricing and ranking computed once per entry."""
    active = tuple(b for b in blocks if b.until > now) if blocks else ()
    specs = tuple(policy.offerings)
    key = (id(policy), id(catalogue), active)
    with _MEMO_LOCK:
        entry = _MEMO.get(key)
        if (entry is not None and entry[0] is policy and entry[1] is catalogue
                and len(entry[2]) == len(specs) and all(map(is_, entry[2], specs))):
            _MEMO.move_to_end(key)
            return entry[3]
    usable, rejected = resolve_candidates(policy, catalogue, active, now)
    result = Resolved(tuple(usable), tuple(rejected), tuple(price_options((), usable)),
                      tuple(sorted(usable, key=lambda c: (c.offering.price_usd_hour, c.key))))
    with _MEMO_LOCK:
        _MEMO[key] = (policy, catalogue, specs, result)
        if len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return result


def resolve_candidates(
    policy: Policy,
    catalogue: tuple[Offering, ...],
    blocks: tuple[CapacityBlock, ...],
    now: datetime,
) -> tuple[list[Candidate], list[OfferingOption]]:
    """Usable candidates, and rejected options with their reasons (for the decision record)."""
    by_key = {o.key: o for o in catalogue}
    blocked = {b.offering_key: b for b in blocks if b.until > now}
    usable: list[Candidate] = []
    rejected: list[OfferingOption] = []
    for spec in policy.offerings:
        markets = [spec.market]
        if spec.market is Market.SPOT and spec.fallback_on_demand:
            markets.append(Market.ON_DEMAND)
        for market in markets:
            key = offering_key(spec.provider, spec.region, spec.zone, spec.instance_type, market)
            # Catalogues price by region; a zone the policy pins takes its region's row.
            listed = by_key.get(key) or by_key.get(
                offering_key(spec.provider, spec.region, None, spec.instance_type, market))
            offering = _resolve(spec, market, listed)
            if offering is None:
                rejected.append(OfferingOption(key, spec.gpus or 0, 0.0, 0, 0.0,
                                               rejected=_unresolved_reason(spec, market)))
                continue
            if not spec.interconnect.met_by(offering.interconnect):
                rejected.append(OfferingOption(key, offering.gpus, offering.price_usd_hour, 0, 0.0,
                                               rejected=f"interconnect {spec.interconnect} asked for, "
                                               f"the catalogue gives {offering.interconnect}"))
                continue
            block = blocked.get(key)
            if block is not None:
                rejected.append(OfferingOption(key, offering.gpus, offering.price_usd_hour, 0, 0.0,
                                               rejected=f"capacity error, excluded until "
                                               f"{block.until.isoformat()}: {block.reason}"))
                continue
            usable.append(Candidate(offering, spec.max_nodes))
    return usable, rejected


def _unresolved_reason(spec: OfferingSpec, market: Market) -> str:
    """Why an offering could not be priced: only when the catalogue has no row for it (a listed
    row always gives both), naming exactly what the policy left out."""
    own_price = market is spec.market and spec.price_usd_hour is not None
    missing = [name for name, given in (("gpus", spec.gpus is not None), ("price", own_price))
               if not given]
    return f"not in the provider catalogue, and the policy gives no {' or '.join(missing)} for it"


def _resolve(spec: OfferingSpec, market: Market, listed: Offering | None) -> Offering | None:
    # The policy's gpus/price describe the offering as written; its on-demand twin takes the
    # catalogue's price (a spot price must never be planned as the on-demand one).
    own_market = market is spec.market
    gpus = spec.gpus or (listed.gpus if listed else None)
    price = (float(spec.price_usd_hour) if own_market and spec.price_usd_hour is not None
             else listed.price_usd_hour if listed else None)
    if gpus is None or price is None:
        return None
    return Offering(
        provider=str(spec.provider),
        region=spec.region,
        zone=spec.zone,
        instance_type=spec.instance_type,
        market=market,
        gpus=gpus,
        price_usd_hour=price,
        gpu_model=spec.gpu_model or (listed.gpu_model if listed else ""),
        vcpus=listed.vcpus if listed else None,
        memory_gib=listed.memory_gib if listed else None,
        billing=listed.billing if listed else Offering.__dataclass_fields__["billing"].default,
        # the catalogue's fabric; an offering it does not list is planned as the policy asks
        interconnect=listed.interconnect if listed else spec.interconnect.assumed(str(spec.provider)),
        interconnect_gbps=listed.interconnect_gbps if listed else 0,
    )


def nodes_needed(widths: Counter[int], node_gpus: int) -> int:
    """Nodes of ``node_gpus`` GPUs needed for jobs of the given widths (FFD on a histogram)."""
    nodes = 0
    leftovers: Counter[int] = Counter()  # free GPUs -> number of partly used nodes
    for width in sorted(widths, reverse=True):
        count = widths[width]
        if width >= node_gpus:
            nodes += count * -(-width // node_gpus)
            continue
        # Fill partly used nodes first (largest leftover first), then open new ones.
        for free in sorted(leftovers, reverse=True):
            if count == 0 or free < width:
                break
            per_node = free // width
            placeable = min(count, leftovers[free] * per_node)
            full, last = divmod(placeable, per_node)
            leftovers[free] -= full + (1 if last else 0)
            if leftovers[free] == 0:
                del leftovers[free]
            if full and free - per_node * width:
                leftovers[free - per_node * width] += full
            if last:
                leftovers[free - last * width] += 1
            count -= placeable
        if count:
            per_node = node_gpus // width
            new = -(-count // per_node)
            nodes += new
            full, last = divmod(count, per_node)
            if node_gpus - per_node * width:
                leftovers[node_gpus - per_node * width] += full
            if last:
                leftovers[node_gpus - last * width] += 1
    return nodes


def expected_hours(durations: list[float | None]) -> float:
    """Expected runtime of the work (mean of known time limits; an hour when none is known)."""
    known = list(filter(None, durations))
    return (sum(known) / len(known) / 3600.0) if known else DEFAULT_JOB_HOURS


def expected_cost(offering: Offering, nodes: int, hours: float) -> float:
    """Nodes x price x billed hours (the provider's minimum billing applies)."""
    billed_s = offering.billing.billed_seconds(hours * 3600.0)
    return nodes * offering.price_usd_hour * billed_s / 3600.0


_GPUS = attrgetter("gpus")
_DURATION = attrgetter("duration_s")


def price_options(unmet: tuple[Job, ...], candidates: list[Candidate],
                  widths: Counter[int] | None = None, hours: float | None = None
                  ) -> list[OfferingOption]:
    """Each candidate's node count and expected cost for all unmet demand, cheapest first.
    ``widths`` and ``hours``: the unmet jobs' width histogram and expected hours, when the caller
    tallied them already (:class:`~orchestrator.planner.demand.Demand`); else counted here."""
    if widths is None:
        widths = Counter(map(_GPUS, unmet))
    if hours is None:
        hours = expected_hours(list(map(_DURATION, unmet)))
    options = []
    nodes: dict[int, int] = {}  # node size -> nodes needed: 500 offerings come in a few sizes
    for c in candidates:
        n = nodes.get(c.offering.gpus)
        if n is None:
            n = nodes[c.offering.gpus] = nodes_needed(widths, c.offering.gpus)
        options.append(OfferingOption(c.key, c.offering.gpus, c.offering.price_usd_hour,
                                      n, round(expected_cost(c.offering, n, hours), 4)))
    options.sort(key=lambda o: (o.expected_cost_usd, o.nodes, o.offering_key))
    return options
