"""Census: one pass over the snapshot's burst nodes that gathers what every rule of a tick reads.

The planner runs at every tick over up to thousands of nodes, and most ticks decide nothing: the
scale-down rules, absorption onto burst capacity, the pool budget and the decision record each
used to walk the nodes on their own, calling state properties per node. :func:`take_census`
gathers what each of them needs once, with a few comprehension and C-level passes, keeping the
snapshot order (which the absorption's bins and the scale-down's drains depend on).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter

from orchestrator.domain.nodes import Node, NodeState
from orchestrator.domain.utilisation import low_utilisation
from orchestrator.policy.models import Policy

_READY = NodeState.READY
_DRAINING = NodeState.DRAINING
_TERMINATED = NodeState.TERMINATED
_IN_FLIGHT = frozenset(s for s in NodeState if s.in_flight)


@dataclass(slots=True)
class Census:
    """A policy's live burst nodes at one tick, and what the tick's rules read of them."""

    nodes: list[Node] = field(default_factory=list)  # live (not terminated), in snapshot order
    by_state: dict[str, int] = field(default_factory=dict)
    spend_usd_hour: float = 0  # hourly prices of the live nodes (0, an int, when there is none)
    ready: list[Node] = field(default_factory=list)
    draining: list[Node] = field(default_factory=list)
    in_flight: list[Node] = field(default_factory=list)  # requested, launching, booting, joining
    idle: list[Node] = field(default_factory=list)  # ready, running nothing for idle_for
    # ready, running jobs whose GPUs were measured under utilisation.idle_below_percent for
    # utilisation.idle_for (the snapshot's low_utilisation_since; unknown use is never here)
    low_utilisation: list[Node] = field(default_factory=list)
    staying: int = 0  # in flight or ready: what min_nodes and a pre-warm floor count
    staying_gpus: int = 0
    # Burst capacity pending jobs may be fitted onto: free GPUs of ready nodes, all GPUs of
    # nodes in flight, with the node ids, and the largest of those nodes' sizes.
    burst_free: list[int] = field(default_factory=list)
    burst_owners: list[str | None] = field(default_factory=list)
    burst_node_size: int = 0


def take_census(nodes: Iterable[Node], policy: Policy, now: datetime | None,
                only_policy: str | None = None) -> Census:
    """Census of ``nodes`` (those of policy ``only_policy`` when given; terminated ones never).
    Without ``now`` the idle nodes are not looked for (absorption alone does not need them)."""
    # List comprehensions and C-level map/sum/Counter: a plain loop with a branch per state cost
    # about 1 us a node, and the simulator plans over hundreds of nodes at every minute.
    if only_policy is None:
        live = [n for n in nodes if n.state is not _TERMINATED]
    else:
        live = [n for n in nodes if n.policy == only_policy and n.state is not _TERMINATED]
    census = Census(live)
    if not live:
        return census
    # First-seen order, as the decision records it. Counter's C loop pays off past a few dozen
    # nodes; below that its set-up costs more than a dict.
    if len(live) > 32:
        counts = Counter(map(_STATE, live))
    else:
        counts = {}
        for state in map(_STATE, live):
            counts[state] = counts.get(state, 0) + 1
    census.by_state = {str(state): count for state, count in counts.items()}
    census.spend_usd_hour = sum(map(_PRICE, live))
    ready = census.ready = [n for n in live if n.state is _READY] if _READY in counts else []
    if _DRAINING in counts:
        census.draining = [n for n in live if n.state is _DRAINING]
    in_flight = census.in_flight = (
        [n for n in live if n.state in _IN_FLIGHT] if not _IN_FLIGHT.isdisjoint(counts) else [])
    census.staying = len(ready) + len(in_flight)
    census.staying_gpus = sum(map(_GPUS, ready)) + sum(map(_GPUS, in_flight))
    idle_for = policy.scale_down.idle_for
    if now is not None:
        census.idle = [n for n in ready if n.running_jobs == 0 and n.idle_since is not None
                       and now - n.idle_since >= idle_for]
        low_for = policy.utilisation.idle_for
        census.low_utilisation = [
            n for n in ready if n.low_utilisation_since is not None and n.running_jobs > 0
            and low_utilisation(n.low_utilisation_since, low_for, now)]
    # In snapshot order: the absorption's bins are filled lowest index first.
    burst = ([n for n in live if n.state in _IN_FLIGHT or (n.state is _READY and n.gpus > n.gpus_busy)]
             if in_flight else [n for n in ready if n.gpus > n.gpus_busy])
    if burst:
        census.burst_free = [n.gpus if n.state in _IN_FLIGHT else n.gpus - n.gpus_busy for n in burst]
        census.burst_owners = list(map(_ID, burst))
        census.burst_node_size = max(map(_GPUS, burst))
    return census


_STATE = attrgetter("state")
_PRICE = attrgetter("price_usd_hour")
_GPUS = attrgetter("gpus")
_ID = attrgetter("id")
