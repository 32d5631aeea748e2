"""Sim provider: a simulated cloud on a virtual clock, for ``burst simulate``.

It keeps the whole ``Provider`` contract (idempotent ``launch`` on the request id, ownership by
tags, idempotent ``terminate``, typed errors) so the executor drives it exactly as it drives a
cloud, but nothing leaves the process and time is whatever the injected clock says:

* **offerings and prices**: the catalogue is handed in (the composition root relabels the bundled
  AWS/GCP catalogue rows, the local provider's offerings or libcloud sizes that the policies name
  as ``sim``). Any ``sim`` offering may be launched, and an instance is billed at the price of the
  offering in its launch request, which is the price the planner planned with (the policy's
  ``price_usd_hour`` where it gives one, else the catalogue's), under the offering's billing rule;
* **boot time**: a launched instance turns ``running`` after a draw from a log-normal boot-time
  distribution (:class:`BootTime`, clipped to ``[min_s, max_s]``);
* **capacity errors**: a launch fails with :class:`CapacityError` with a configurable
  probability per market (:class:`SimRates`);
* **spot interruptions**: a running spot instance is taken away after an exponential lifetime
  with a configurable rate per hour; it then lists as ``terminated`` (the reconciler's "vanished");
* **spot markets** (:class:`SpotMarket`, per offering key, replacing the flat rates for that
  offering): a measured availability time series (1 = capacity there / instance alive). A launch
  in a tick with no capacity fails with :class:`CapacityError`, and a running instance is
  interrupted at the series' next drop (alive -> gone); each such event applies with probability
  ``keep`` (how much of the measured disruption this offering sees), drawn per request;
* **forgetting**: an instance terminated more than an hour ago is no longer listed, and later
  (swept once an hour of virtual time) no longer described: only its bill is kept.

Every random draw for a launch comes from a generator seeded with ``(seed, request id)``, so the
same inputs give the same instances, boot times and interruptions whatever else happened before
(runs of different policies see common random numbers where they make the same request).

Extras beyond the Protocol, for the simulator: :meth:`SimProvider.timeline` (when an instance
turns running and when it would be interrupted) and :meth:`SimProvider.bills` (what each instance
cost, in integer micro-dollars, under its offering's billing rule); for tests:
:meth:`SimProvider.fail_next` (the next launch calls fail with a given kind of error) and
:meth:`SimProvider.user_data` (what an instance was launched with).
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from orchestrator.domain.offerings import Offering
from orchestrator.domain.ports import (
    AuthError,
    CapacityError,
    Instance,
    InstanceState,
    InvalidRequest,
    LaunchRequest,
    ProviderError,
    QuotaError,
    TransientError,
)
from orchestrator.policy.models import Market

PROVIDER_NAME = "sim"
CLUSTER_TAG = "burst:cluster"
# A terminated instance stays listed this long (EC2 lists terminated instances for about an hour).
LISTED_AFTER_TERMINATION = timedelta(hours=1)


@dataclass(frozen=True, slots=True)
class BootTime:
    """Launch-to-running time: log-normal around ``median_s``, clipped to ``[min_s, max_s]``.

    The default median (200 s) is the median VM deployment time measured on Azure in 2018
    (171-299 s across 25 VM sizes; ``azure-vm-deploy-times-2018`` in the shared data), plus the
    spread a GPU image's start-up adds.
    """

    median_s: float = 200.0
    sigma: float = 0.25
    min_s: float = 60.0
    max_s: float = 900.0

    def __post_init__(self) -> None:
        if not (0 < self.min_s <= self.median_s <= self.max_s):
            raise ValueError(f"boot time needs 0 < min_s <= median_s <= max_s, got {self}")
        if self.sigma < 0:
            raise ValueError(f"boot time sigma must be >= 0, got {self.sigma}")

    def draw(self, rng: random.Random) -> float:
        value = self.median_s * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        return round(min(max(value, self.min_s), self.max_s), 3)


@dataclass(frozen=True, slots=True)
class SimRates:
    """How often the simulated cloud says no, or takes a node back.

    ``capacity_error``: probability that one launch fails for lack of capacity, per market.
    ``interruptions_per_hour``: rate of spot interruptions per running spot instance-hour
    (exponential lifetimes); on-demand instances are never interrupted.
    """

    spot_capacity_error: float = 0.0
    on_demand_capacity_error: float = 0.0
    interruptions_per_hour: float = 0.0

    def __post_init__(self) -> None:
        for name in ("spot_capacity_error", "on_demand_capacity_error"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} is a probability in [0, 1], got {value}")
        if self.interruptions_per_hour < 0:
            raise ValueError(f"interruptions_per_hour must be >= 0, got {self.interruptions_per_hour}")

    def capacity_error(self, market: Market) -> float:
        return self.spot_capacity_error if market is Market.SPOT else self.on_demand_capacity_error


@dataclass(frozen=True, slots=True)
class SpotMarket:
    """One spot offering's capacity over time (see the module docstring): ``alive[i]`` for the
    tick ``[i, i+1) x gap_s`` of the series, looped, read from ``phase`` ticks in at time 0."""

    gap_s: float
    alive: bytes
    phase: int = 0
    keep: float = 1.0
    source: str = ""
    drops: tuple[int, ...] = field(default=(), compare=False)  # ticks where alive turns gone

    def __post_init__(self) -> None:
        if self.gap_s <= 0 or not self.alive or not 0.0 <= self.keep <= 1.0:
            raise ValueError(f"spot market needs gap_s > 0, a series and keep in [0, 1]: {self.source}")
        if not self.drops:
            n = len(self.alive)
            drops = tuple(i for i in range(n) if self.alive[i - 1] and not self.alive[i])
            object.__setattr__(self, "drops", drops)

    def tick(self, t_s: float) -> int:
        return int(t_s // self.gap_s) + self.phase

    def available(self, t_s: float) -> bool:
        return bool(self.alive[self.tick(t_s) % len(self.alive)])

    def next_interruption(self, t_s: float, rng: random.Random) -> float | None:
        """When an instance running from ``t_s`` is taken: the first drop after it that applies
        (``keep``), at most one pass of the series on; None: it survives that long."""
        if not self.drops or self.keep <= 0:
            return None
        n = len(self.alive)
        start = self.tick(t_s)
        loop, pos = divmod(start, n)
        index = bisect.bisect_right(self.drops, pos)
        for _ in range(len(self.drops) * 2):
            if index == len(self.drops):
                loop, index = loop + 1, 0
            tick = loop * n + self.drops[index]
            if tick - start > n:
                return None
            if rng.random() < self.keep:
                return (tick - self.phase) * self.gap_s
            index += 1
        return None


@dataclass(frozen=True, slots=True)
class Timeline:
    """When a simulated instance turns running, and when a spot interruption would take it."""

    launched_at: datetime
    running_at: datetime
    interrupt_at: datetime | None


@dataclass(frozen=True, slots=True)
class Bill:
    """What one instance cost: billed seconds and integer micro-dollars (no float sums)."""

    instance_id: str
    offering_key: str
    gpus: int
    price_usd_hour: float
    launched_at: datetime
    ended_at: datetime | None
    billed_s: float
    cost_micro_usd: int


class SimApiError(Exception):
    """The simulated cloud API's own error, kept as the typed error's ``__cause__``."""


_FAULTS: dict[str, tuple[type[ProviderError], str]] = {
    "capacity": (CapacityError, "InsufficientInstanceCapacity"),
    "quota": (QuotaError, "QuotaExceeded"),
    "auth": (AuthError, "Unauthorized"),
    "transient": (TransientError, "ServiceUnavailable"),
    "invalid": (InvalidRequest, "InvalidParameter"),
}


@dataclass(slots=True)
class _Record:
    instance: Instance
    offering: Offering
    request_id: str
    timeline: Timeline
    user_data: str = ""
    terminated_at: datetime | None = None
    interrupted: bool = False


@dataclass
class SimProvider:
    """The ``Provider`` of the simulator (see the module docstring).

    ``clock`` is any object with ``now() -> datetime`` (the simulator's virtual clock).
    """

    catalogue: Iterable[Offering]
    clock: object
    seed: int = 0
    boot: BootTime = field(default_factory=BootTime)
    rates: SimRates = field(default_factory=SimRates)
    name: str = PROVIDER_NAME
    markets: dict[str, SpotMarket] = field(default_factory=dict)  # spot offering key -> market

    def __post_init__(self) -> None:
        offerings = list(self.catalogue)
        foreign = sorted(o.key for o in offerings if o.provider != PROVIDER_NAME)
        if foreign:
            raise ValueError(f"SimProvider offerings must have provider 'sim': {foreign[:5]}")
        self._catalogue = {o.key: o for o in offerings}
        self._now: Callable[[], datetime] = self.clock.now  # type: ignore[attr-defined]
        self._records: dict[str, _Record] = {}
        # Instances gone longer than LISTED_AFTER_TERMINATION, as the API forgets them: only
        # their final bills are kept (a replay launches thousands; their user data and records
        # would hold tens of MiB to the end).
        self._settled: dict[str, Bill] = {}
        self._swept_at: datetime | None = None
        self._by_request: dict[str, str] = {}
        self._next = 0
        self._faults: list[str] = []
        self.capacity_errors = 0
        self.interruptions = 0

    # -- Provider -------------------------------------------------------------------------------

    def offerings(self) -> list[Offering]:
        return list(self._catalogue.values())

    def launch(self, req: LaunchRequest) -> list[Instance]:
        offering = req.offering
        if offering.provider != PROVIDER_NAME or offering.gpus < 1 or not offering.price_usd_hour > 0:
            raise InvalidRequest(f"offering {offering.key} is not a sim offering with GPUs and a price",
                                 provider=self.name, offering_key=offering.key,
                                 request_id=req.request_id, code="UnknownOffering")
        existing = self._by_request.get(req.request_id)
        if existing is not None:
            return [self._observe(self._records[existing])]  # already done: the same instance
        if self._faults:
            kind = self._faults.pop(0)
            error, code = _FAULTS[kind]
            raise error(f"simulated {kind} error for {offering.key}", provider=self.name,
                        offering_key=offering.key, request_id=req.request_id,
                        code=code) from SimApiError(code)
        now = self._now()
        self._sweep(now)
        # One generator per request: a request's fate does not depend on what ran before it.
        rng = random.Random(f"{self.seed}|{req.request_id}")
        refused = rng.random() < self.rates.capacity_error(offering.market)
        boot_s = self.boot.draw(rng)
        life_h = rng.expovariate(self.rates.interruptions_per_hour) if (
            offering.market is Market.SPOT and self.rates.interruptions_per_hour > 0) else None
        market = self.markets.get(offering.key) if offering.market is Market.SPOT else None
        if market is not None:
            t_s = now.timestamp()
            refused = not market.available(t_s) and rng.random() < market.keep
            ends = market.next_interruption(t_s + boot_s, rng)
            life_h = None if ends is None else max(ends - t_s - boot_s, 1.0) / 3600.0
        if refused:
            self.capacity_errors += 1
            raise CapacityError(f"simulated capacity error for {offering.key}", provider=self.name,
                                offering_key=offering.key, request_id=req.request_id,
                                code="InsufficientInstanceCapacity"
                                ) from SimApiError("InsufficientInstanceCapacity")
        self._next += 1
        instance_id = f"sim-{self._next:07d}"
        running_at = now + timedelta(seconds=boot_s)
        interrupt_at = running_at + timedelta(hours=life_h) if life_h is not None else None
        instance = Instance(id=instance_id, provider=self.name, state=InstanceState.PENDING,
                            tags=req.tags.as_dict(), offering_key=offering.key, launched_at=now)
        self._records[instance_id] = _Record(instance, offering, req.request_id,
                                             Timeline(now, running_at, interrupt_at), req.user_data)
        self._by_request[req.request_id] = instance_id
        return [instance]

    def describe(self, ids: list[str]) -> list[Instance]:
        return [self._observe(self._records[i]) for i in ids if i in self._records]

    def list_owned(self, cluster: str) -> list[Instance]:
        now = self._now()
        listed = []
        for record in self._records.values():
            instance = self._observe(record)
            if instance.tags.get(CLUSTER_TAG) != cluster:
                continue
            if (record.terminated_at is not None
                    and now - record.terminated_at > LISTED_AFTER_TERMINATION):
                continue
            listed.append(instance)
        return listed

    def terminate(self, ids: list[str]) -> None:
        now = self._now()
        for instance_id in ids:
            record = self._records.get(instance_id)
            if record is None:
                continue  # unknown: already gone, as far as the contract cares
            self._observe(record)
            if record.terminated_at is None:
                record.terminated_at = now

    # -- extras for the simulator ---------------------------------------------------------------

    def timeline(self, instance_id: str) -> Timeline:
        """When the instance turns running and when (spot) it would be interrupted."""
        return self._records[instance_id].timeline

    def fail_next(self, kind: str, times: int = 1) -> None:
        """The next ``times`` launch calls fail with the typed error of ``kind`` (capacity, quota,
        auth, transient, invalid), before anything is created."""
        if kind not in _FAULTS:
            raise ValueError(f"unknown fault {kind!r}; known: {', '.join(_FAULTS)}")
        self._faults.extend([kind] * times)

    def clear_faults(self) -> None:
        self._faults.clear()

    def user_data(self, instance_id: str) -> str:
        """The bootstrap an instance was launched with."""
        return self._records[instance_id].user_data

    def bills(self, until: datetime | None = None) -> list[Bill]:
        """Each instance's billed time and cost, in launch order (the forgotten ones' too).
        Instances still running are billed up to ``until`` (default: now)."""
        end_default = until or self._now()
        bills = list(self._settled.values())
        for record in self._records.values():
            self._observe(record)
            bills.append(_bill(record, end_default))
        # Ids count launches up: their order (shorter first) is the launch order.
        bills.sort(key=lambda bill: (len(bill.instance_id), bill.instance_id))
        return bills

    # -- internals ------------------------------------------------------------------------------

    def _sweep(self, now: datetime) -> None:
        """Forget the instances terminated longer than LISTED_AFTER_TERMINATION ago, keeping
        their bills (final: their billing ended); at most once a LISTED_AFTER_TERMINATION of
        virtual time, so a sweep's cost is spread over that time's launches."""
        if self._swept_at is not None and now - self._swept_at < LISTED_AFTER_TERMINATION:
            return
        self._swept_at = now
        gone = [instance_id for instance_id, record in self._records.items()
                if record.terminated_at is not None
                and now - record.terminated_at > LISTED_AFTER_TERMINATION]
        for instance_id in gone:
            record = self._records.pop(instance_id)
            self._by_request.pop(record.request_id, None)  # (its idempotency token lapses too)
            self._settled[instance_id] = _bill(record, now)


    def _observe(self, record: _Record) -> Instance:
        """The instance as it is now (state follows the virtual clock)."""
        now = self._now()
        timeline = record.timeline
        if (record.terminated_at is None and timeline.interrupt_at is not None
                and now >= timeline.interrupt_at):
            record.terminated_at = timeline.interrupt_at  # the spot reclaim ended the billing
            record.interrupted = True
            self.interruptions += 1
        if record.terminated_at is not None and now >= record.terminated_at:
            state = InstanceState.TERMINATED
        elif now >= timeline.running_at:
            state = InstanceState.RUNNING
        else:
            state = InstanceState.PENDING
        if record.instance.state is not state:
            record.instance = replace(record.instance, state=state)
        return record.instance


def _bill(record: _Record, until: datetime) -> Bill:
    """What the record's instance cost: to its termination, else to ``until``."""
    ended = record.terminated_at
    seconds = ((ended or until) - record.timeline.launched_at).total_seconds()
    billed = record.offering.billing.billed_seconds(max(seconds, 0.0))
    micro = round(billed * record.offering.price_usd_hour * 1_000_000 / 3600)
    return Bill(record.instance.id, record.offering.key, record.offering.gpus,
                record.offering.price_usd_hour, record.timeline.launched_at, ended, billed, micro)


def as_sim(offering: Offering) -> Offering:
    """The same offering (region, zone, type, market, GPUs, price, billing) sold by the sim."""
    return replace(offering, provider=PROVIDER_NAME)
