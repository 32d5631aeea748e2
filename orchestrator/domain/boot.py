"""Learned boot time: each offering's launch-to-ready distribution from node events, decayed.

The wait-aware rule bursts a late job at ``submit + wait_slo - expected_boot``; a constant
``expected_boot`` has to cover the slowest boots of every offering, so it is usually too
pessimistic (on-prem had more time than the rule allowed it) or, for a slow region, too
optimistic. A :class:`BootLearner` is fed each node's observed launch-to-ready time and answers a
:class:`~orchestrator.domain.snapshot.BootEstimate` per offering: the weighted ``percentile``
(p90 by default) of its latest :data:`KEEP` boots, each weighted ``0.5 ** (age / half_life_h)``,
with the decayed number of boots it rests on, and the same percentile for launch groups of
:data:`GROUP_SIZES` nodes: a group is ready when its slowest node is, so a group of ``n``'s
percentile ``p`` is one boot's ``p ** (1/n)`` quantile (the p90 of 8 boots is one boot's p98.7; of
:data:`KEEP` boots, the slowest few). Whether there are enough of them (else the policy's
``expected_boot`` stands) is the planner's call (:mod:`orchestrator.planner.boot`), so the choice
is recorded with the decision.

Fed by the observer in production (the store's node events: ``-> launching`` then ``-> ready``)
and by the simulator's engine when a node it launched turns ready (its boot model's draw, seen
only once it has happened). O(:data:`KEEP`) per query, cached until the next boot of the offering
or an hour of decay. Times are hours on the caller's clock; no clock of its own.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from orchestrator.domain.snapshot import BootEstimate

KEEP = 64  # boots kept per offering (older ones have decayed to little anyway)
GROUP_SIZES = (2, 4, 8, 16, 32, 64)  # launch-group sizes whose boot an estimate works out
RECOMPUTE_H = 1.0  # a cached estimate is recomputed after this much decay even without a boot


@dataclass(slots=True)
class BootLearner:
    """Per offering, the latest boots (hours at which they were seen, seconds they took)."""

    half_life_h: float = 24.0
    percentile: float = 0.9
    _boots: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    _cache: dict[str, tuple[float, BootEstimate]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.half_life_h > 0 and 0 < self.percentile <= 1):
            raise ValueError("half_life_h must be > 0 and percentile within (0, 1]")

    def booted(self, key: str, boot_s: float, t_h: float) -> None:
        """A node of offering ``key`` turned ready ``boot_s`` seconds after its launch, at
        ``t_h``."""
        self._boots.setdefault(key, deque(maxlen=KEEP)).append((t_h, max(float(boot_s), 0.0)))
        self._cache.pop(key, None)

    def estimate(self, key: str, t_h: float) -> BootEstimate | None:
        """The offering's estimate at ``t_h``; None if no boot of it was seen."""
        cached = self._cache.get(key)
        if cached is not None and t_h - cached[0] < RECOMPUTE_H:
            return cached[1]
        boots = self._boots.get(key)
        if not boots:
            return None
        weighted = sorted((s, 0.5 ** (max(t_h - t, 0.0) / self.half_life_h)) for t, s in boots)
        total = sum(w for _, w in weighted)

        def quantile(q: float) -> float:
            target = q * total
            running = 0.0
            for seconds, weight in weighted:
                running += weight
                if running >= target - 1e-12:
                    return seconds
            return weighted[-1][0]

        # A group of n is ready when its slowest node is: P(max of n <= t) = F(t)^n, so the
        # group's percentile p is one boot's p ** (1/n) quantile (independent boots).
        groups = tuple((n, round(quantile(self.percentile ** (1.0 / n)), 1)) for n in GROUP_SIZES)
        estimate = BootEstimate(key, round(quantile(self.percentile), 1), round(total, 2),
                                self.percentile, groups)
        self._cache[key] = (t_h, estimate)
        return estimate

    def keys(self) -> list[str]:
        """The offerings with a boot seen, sorted."""
        return sorted(self._boots)

    def snapshot(self, keys, t_h: float) -> dict[str, BootEstimate]:
        """The snapshot's ``boot_estimates``: the estimate of every key with a boot seen."""
        out = {}
        for key in keys:
            estimate = self.estimate(key, t_h)
            if estimate is not None:
                out[key] = estimate
        return out


__all__ = ["GROUP_SIZES", "KEEP", "BootLearner"]
