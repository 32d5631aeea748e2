"""Learned capacity: per-offering preemption hazard and stockout odds from node events, decayed.

A :class:`CapacityLearner` is fed what happens to nodes (a launch went through or failed for lack
of capacity; a node ran for so many hours and ended interrupted or not) and answers, at any time,
an :class:`~orchestrator.domain.snapshot.OfferingHealth` per offering: the planner's hazard and
stockout odds (:mod:`orchestrator.planner.spot`). Every count decays with ``half_life_h`` (capacity
moves: what held yesterday counts half today), and sits on a prior that does not decay:

* hazard = (prior hazard x ``prior_hours`` + decayed interruptions) / (``prior_hours`` + decayed
  node-hours), the prior hazard being the catalogue's published interruption bucket for the
  offering (:func:`bucket_hazard`; none: 0);
* stockout odds = decayed refusals / (``prior_launches`` + decayed launch attempts).

The node-hours include the exposure of nodes still alive (:meth:`CapacityLearner.started`: launch
to now, not decayed): counted only at their end, the hours would lag the interruptions (a reclaim
ends a node early, a long survivor counts only when it ends), and the hazard would be
over-stated while survivors run.

With ``pool_by`` (:func:`region_market`: provider, region and market), the counts of every
offering of a group are pooled: an interruption or a refusal of one instance type in a region
says the same of its other types there (spot capacity in a region moves together: one crunch
reclaims them all), so a type not yet tried is not planned at its published prior alone while its
region is being reclaimed. Each offering keeps its own prior.

O(1) per event and O(group) per query of one offering, so the simulator can feed it every node
event of a full trace. The observer (production) and the simulator's controller build the snapshot's
``offering_health`` from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from orchestrator.domain.snapshot import OfferingHealth

# AWS Spot Advisor's buckets: the share of instances Spot reclaimed over the trailing month
# (0: <5 %, 1: 5-10 %, 2: 10-15 %, 3: 15-20 %, 4: >20 %); the bucket's middle (25 % for the
# open-ended last one), as a constant hazard over a month of 720 h.
BUCKET_SHARE = (0.025, 0.075, 0.125, 0.175, 0.25)
MONTH_H = 720.0


UNLISTED_BUCKET = 2  # a spot offering with no published bucket (GCP publishes none): the middle one


def bucket_prior(buckets: dict[tuple[str, str], int]) -> Callable[[str], float]:
    """Offering key -> the published prior hazard: a spot offering's bucket (by region and
    instance type; unlisted: :data:`UNLISTED_BUCKET`), 0 for on-demand."""
    def prior(key: str) -> float:
        parts = key.split("/")
        if len(parts) != 5 or parts[4] != "spot":
            return 0.0
        return bucket_hazard(buckets.get((parts[1], parts[3]), UNLISTED_BUCKET))
    return prior


def region_market(key: str) -> str:
    """An offering key's (provider, region, market): the group whose capacity moves together."""
    parts = key.split("/")
    return "/".join((parts[0], parts[1], parts[-1])) if len(parts) == 5 else key


def bucket_hazard(bucket: int) -> float:
    """Interruptions per instance-hour that a Spot Advisor bucket implies."""
    share = BUCKET_SHARE[min(max(bucket, 0), len(BUCKET_SHARE) - 1)]
    return -math.log1p(-share) / MONTH_H


def _figures(value: float) -> float:
    """Two significant figures: what the estimate is worth, and values that repeat tick to tick
    (the planner memoizes its pricing on them)."""
    return float(f"{value:.2g}")


@dataclass(slots=True)
class _Decayed:
    value: float = 0.0
    at_h: float = 0.0

    def at(self, now_h: float, half_life_h: float) -> float:
        if now_h <= self.at_h:
            return self.value
        return self.value * 0.5 ** ((now_h - self.at_h) / half_life_h)

    def add(self, amount: float, now_h: float, half_life_h: float) -> None:
        self.value = self.at(now_h, half_life_h) + amount
        self.at_h = max(now_h, self.at_h)


@dataclass(slots=True)
class _Stats:
    hours: _Decayed = field(default_factory=_Decayed)
    interruptions: _Decayed = field(default_factory=_Decayed)
    launches: _Decayed = field(default_factory=_Decayed)
    refusals: _Decayed = field(default_factory=_Decayed)
    live: int = 0  # nodes alive now (started, not yet ended)
    live_since_h: float = 0.0  # the sum of their start times

    def live_hours(self, now_h: float) -> float:
        return max(self.live * now_h - self.live_since_h, 0.0)


class CapacityLearner:
    """Decayed per-offering counts on top of published priors (module docstring). Times are
    hours on any fixed origin (the caller's clock)."""

    def __init__(self, priors: dict[str, float] | Callable[[str], float] | None = None, *,
                 half_life_h: float = 24.0,
                 prior_hours: float = 24.0, prior_launches: float = 4.0,
                 prior_source: str = "published interruption bucket",
                 pool_by: Callable[[str], str] | None = None):
        if half_life_h <= 0 or prior_hours <= 0 or prior_launches <= 0:
            raise ValueError("half_life_h, prior_hours and prior_launches must be > 0")
        # offering key -> prior hazard (a mapping, or a function of the key)
        self.prior_of: Callable[[str], float] = (
            priors if callable(priors) else (lambda key, table=dict(priors or {}): table.get(key, 0.0)))
        self.half_life_h = half_life_h
        self.prior_hours = prior_hours
        self.prior_launches = prior_launches
        self.prior_source = prior_source
        self._stats: dict[str, _Stats] = {}
        self.pool_by = pool_by
        self._groups: dict[str, list[_Stats]] = {}  # group -> the stats of its offerings
        self._live: dict[str, tuple[_Stats, float]] = {}  # node id -> (its stats, start)
        self.version = 0  # counts the events fed: a HealthView checks it was read before the next

    def _of(self, key: str) -> _Stats:
        stats = self._stats.get(key)
        if stats is None:
            stats = self._stats[key] = _Stats()
            if self.pool_by is not None:
                self._groups.setdefault(self.pool_by(key), []).append(stats)
        return stats

    def _pooled(self, key: str, stats: _Stats | None) -> list[_Stats]:
        if self.pool_by is None:
            return [stats] if stats is not None else []
        return self._groups.get(self.pool_by(key), [])

    def launch(self, key: str, now_h: float, refused: bool) -> None:
        """A launch attempt of ``key``: it went through, or failed for lack of capacity."""
        self.version += 1
        stats = self._of(key)
        stats.launches.add(1.0, now_h, self.half_life_h)
        if refused:
            stats.refusals.add(1.0, now_h, self.half_life_h)

    def started(self, key: str, node_id: str, at_h: float) -> None:
        """A node of ``key`` was launched at ``at_h``: its exposure counts until it ends."""
        if node_id in self._live:
            return
        self.version += 1
        stats = self._of(key)
        stats.live += 1
        stats.live_since_h += at_h
        self._live[node_id] = (stats, at_h)

    def ran(self, key: str, hours: float, now_h: float, interrupted: bool,
            node_id: str | None = None) -> None:
        """A node of ``key`` ran ``hours`` (launch to end) and ended, interrupted or not
        (``node_id``: the node :meth:`started` counted as alive, no longer)."""
        self.version += 1
        stats = self._of(key)
        live = self._live.pop(node_id, None) if node_id is not None else None
        if live is not None:
            live[0].live -= 1
            live[0].live_since_h -= live[1]
        stats.hours.add(max(hours, 0.0), now_h, self.half_life_h)
        if interrupted:
            stats.interruptions.add(1.0, now_h, self.half_life_h)

    def health(self, key: str, now_h: float) -> OfferingHealth:
        prior = self.prior_of(key)
        pooled = self._pooled(key, self._stats.get(key))
        if not pooled:
            return OfferingHealth(key, _figures(prior), 0.0,
                                  prior=self.prior_source if prior else "")
        h = self.half_life_h
        hours = sum(s.hours.at(now_h, h) + s.live_hours(now_h) for s in pooled)
        launches = sum(s.launches.at(now_h, h) for s in pooled)
        interruptions = sum(s.interruptions.at(now_h, h) for s in pooled)
        refusals = sum(s.refusals.at(now_h, h) for s in pooled)
        hazard = (prior * self.prior_hours + interruptions) / (self.prior_hours + hours)
        odds = refusals / (self.prior_launches + launches)
        return OfferingHealth(key, _figures(hazard), _figures(odds), round(hours, 1),
                              round(launches, 1), prior=self.prior_source if prior else "")

    def known(self, key: str) -> bool:
        """Whether ``key`` has a prior or events (the others are left out of a snapshot)."""
        return (key in self._stats or bool(self.prior_of(key))
                or (self.pool_by is not None and self.pool_by(key) in self._groups))

    def snapshot(self, keys, now_h: float) -> dict[str, OfferingHealth]:
        """Health of each of ``keys`` (those with no prior and no events are left out)."""
        return {key: self.health(key, now_h) for key in keys if self.known(key)}

    def view(self, keys: Iterable[str], now_h: float) -> HealthView:
        """:meth:`snapshot` as a mapping that works each offering out when it is first read."""
        return HealthView(self, tuple(keys), now_h)


class HealthView(Mapping[str, OfferingHealth]):
    """A :class:`CapacityLearner`'s :meth:`~CapacityLearner.snapshot` at one moment, each
    offering's health worked out when first read: the simulator takes a snapshot every tick,
    and the planner reads the health only on a tick that launches (spot by expected cost), a
    few in a hundred. The values are the snapshot's; reading one after the learner was fed
    another event is an error (it would no longer be the health at ``now_h``)."""

    __slots__ = ("_learner", "_keys", "_now_h", "_version", "_known", "_cache")

    def __init__(self, learner: CapacityLearner, keys: tuple[str, ...], now_h: float):
        self._learner = learner
        self._keys = keys
        self._now_h = now_h
        self._version = learner.version
        self._known: tuple[str, ...] | None = None
        self._cache: dict[str, OfferingHealth] = {}

    def _fresh(self) -> CapacityLearner:
        if self._learner.version != self._version:
            raise RuntimeError("HealthView read after its learner was fed a newer event")
        return self._learner

    def _keys_known(self) -> tuple[str, ...]:
        if self._known is None:
            learner = self._fresh()
            self._known = tuple(k for k in self._keys if learner.known(k))
        return self._known

    def __getitem__(self, key: str) -> OfferingHealth:
        health = self._cache.get(key)
        if health is None:
            learner = self._fresh()
            if key not in self._keys or not learner.known(key):
                raise KeyError(key)
            health = self._cache[key] = learner.health(key, self._now_h)
        return health

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys_known())

    def __len__(self) -> int:
        return len(self._keys_known())
