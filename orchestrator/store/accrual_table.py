"""The reach's accrual groups as columns: each window's micro-dollars per (pool, project) worked
out for every group at once, exact to the integer micro-dollar.

A budget's status adds to the ledger's lines what each group of nodes that accrue alike
(:class:`~orchestrator.store.accrual.AccrualGroup`) cost past where its lines reach, up to now.
At a running site's 1,500 groups the per-group Python (one ``_accrued_us`` call a group and
window, ``orchestrator.costs.spend``) was about a millisecond of every request. An
:class:`AccrualTable` holds the groups as integer columns, sorted by (pool, project), built once
per group set (the store keeps it with the groups it read, :class:`ReachGroupSet`, until their
version moves: :mod:`orchestrator.store.reach_version`); a window is then a few numpy operations
over the columns and one sum per (pool, project).

Exact: the same integers as the scalar derivation, step by step: the end of unbilled time is the
earlier of the node's end and the window's stop, its start the later of the group's start and
the window's start; a group never covered by lines whose span starts at its launch is billed at
least the provider's minimum, rounded up to its increment (``billed_micros``); micro-dollars are
``price x span / 3600``, rounded half to even on the exact fraction of the price (``rate``,
passed in: the store does not import the costs layer), then times the group's node count. Where
a product could leave 63 bits (a price of many decimals over a long span) the same operations
run on Python integers (numpy's object arrays) instead of int64: never a wrapped value. The unit
test compares it with the scalar derivation on random groups and windows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from orchestrator.domain.offerings import BillingRule

if TYPE_CHECKING:
    from orchestrator.store.accrual import AccrualGroup

_US_PER_S = 1_000_000
_I64_MAX = 2**63 - 1
_NEVER = 2**62  # an end of unbilled time for nodes not ended: later than any stop


class AccrualTable:
    """``groups`` as columns (see the module): :meth:`accrued` of any window."""

    __slots__ = ("keys", "_starts", "_base", "_unbilled", "_ended", "_num", "_whole",
                 "_count", "_minimum", "_increment", "_big_num", "_big_count", "_np")

    def __init__(self, groups: Sequence[AccrualGroup], rate: Callable[[float], Fraction],
                 billing: BillingRule) -> None:
        import numpy as np  # here, not at import: the CLI's start-up does not pay for it

        self._np = np
        order = sorted(range(len(groups)), key=lambda i: (groups[i][0], groups[i][1] is None,
                                                          groups[i][1] or ""))
        keys: list[tuple[str, str | None]] = []
        starts: list[int] = []
        base, unbilled, ended, num, whole, count = [], [], [], [], [], []
        for at, i in enumerate(order):
            pool, project, price, launched_us, ended_us, covered_us, n = groups[i]
            if not keys or keys[-1] != (pool, project):
                keys.append((pool, project))
                starts.append(at)
            fraction = rate(price)
            base.append(launched_us if covered_us is None else covered_us)
            unbilled.append(covered_us is None)
            ended.append(_NEVER if ended_us is None else min(ended_us, _NEVER))
            num.append(fraction.numerator)
            whole.append(fraction.denominator * 3600)
            count.append(n)
        self.keys = keys
        self._starts = np.array(starts, dtype=np.intp)
        self._base = np.array(base, dtype=np.int64)
        self._unbilled = np.array(unbilled, dtype=bool)
        self._ended = np.array(ended, dtype=np.int64)
        self._big_num = any(v > _I64_MAX or w > 2**40 for v, w in zip(num, whole))
        self._big_count = max(count, default=0)
        self._num = np.array(num, dtype=object if self._big_num else np.int64)
        self._whole = np.array(whole, dtype=object if self._big_num else np.int64)
        self._count = np.array(count, dtype=np.int64)
        self._minimum = billing.minimum_s * _US_PER_S
        self._increment = billing.increment_s * _US_PER_S

    def __len__(self) -> int:
        return len(self._base)

    def accrued(self, since_us: int, stop_us: int) -> dict[tuple[str, str | None], int]:
        """Micro-dollars accrued in [since_us, stop_us) per (pool, project), each group's one
        node rounded on its own times its count; (pool, project)s that accrued nothing left out
        (as the scalar walk leaves them)."""
        np = self._np
        if not self.keys:
            return {}
        end = np.minimum(self._ended, stop_us)
        start = np.maximum(self._base, since_us)
        span = end - start
        span[span < 0] = 0
        # Never covered by lines and counted from its launch: the provider's minimum and
        # increment (billed_micros), where there is any span at all.
        floor_at = self._unbilled & (start == self._base) & (span > 0)
        if floor_at.any():
            billed = np.maximum(span, self._minimum)
            if self._increment > 0:
                billed = -(-billed // self._increment) * self._increment
            span = np.where(floor_at, billed, span)
        widest = int(span.max())
        num, whole = self._num, self._whole
        if self._big_num or widest and int(num.max()) * widest > _I64_MAX:
            num, whole, span = num.astype(object), whole.astype(object), span.astype(object)
        product = num * span
        floor = product // whole
        twice = 2 * (product - floor * whole)
        micros = floor + ((twice > whole) | ((twice == whole) & (floor % 2 == 1)))
        if micros.dtype != object and widest and (
                int(micros.max()) * self._big_count * len(micros) > _I64_MAX):
            micros = micros.astype(object)  # a group's total, or a (pool, project)'s sum of them
        totals = np.add.reduceat(micros * self._count.astype(micros.dtype), self._starts)
        return {key: int(v) for key, v in zip(self.keys, totals.tolist()) if v}


class ReachGroupSet:
    """The reach's groups as read at one version of them (:mod:`orchestrator.store.reach_version`),
    parsed once: the accrual groups, the live nodes' price counts, and the accrual tables built
    from them (:meth:`table`), kept by the store until the version moves."""

    __slots__ = ("version", "accrual", "live", "_tables", "_derived")

    def __init__(self, version: int | None, accrual: list[AccrualGroup],
                 live: list[tuple[str, str | None, float, int]]) -> None:
        self.version = version
        self.accrual = accrual
        self.live = live
        self._tables: dict[Any, AccrualTable] = {}
        self._derived: dict[str, Any] = {}

    def derived(self, name: str, build: Callable[[ReachGroupSet], Any]) -> Any:
        """``build(self)``, worked out on the first call for ``name`` and kept with the groups
        (a caller's sums of them: the live nodes' burn per project, say). What it returns is
        shared by every later caller until the version moves: read it, never change it. A race
        of two threads builds it twice, the same."""
        value = self._derived.get(name)
        if value is None:
            value = self._derived[name] = build(self)
        return value

    def table(self, rate: Callable[[float], Fraction], billing: BillingRule) -> AccrualTable:
        """The accrual groups' :class:`AccrualTable`, built on the first call (a race of two
        threads builds it twice, the same)."""
        key = (rate, billing)
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = AccrualTable(self.accrual, rate, billing)
        return table


__all__ = ["AccrualTable", "ReachGroupSet"]
