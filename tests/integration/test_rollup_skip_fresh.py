"""The tick's roll-up leaves live nodes for which only the clock moved (``skip_fresh``): on
generated histories, on real stores, a store rolled up that way at every tick and one rolled up
in full at the same ticks agree at every tick: every final line of the first is the second's,
its marks are where the second's were at most ``ROLL_SPREAD`` earlier (a node's clock-driven
roll-up comes ``spread_lag`` after the hour) and no later than the second's now, budgets' spend
within a second's price per live node; and, after one full roll-up, the same ledger."""

from __future__ import annotations

import random
from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from orchestrator.costs.ledger import ROLL_SPREAD, roll_up, spread_lag
from orchestrator.costs.spend import spend
from orchestrator.store import Store
from tests.builders import POOL, T0
from tests.integration.test_ledger import H, M, launch, onprem_policy, run_job, terminate


def _history(store: Store, seed: int, first_tick) -> int:
    """Nodes launched before ``first_tick``, some ending during the ticks, with jobs; returns
    how many never end."""
    rng = random.Random(seed)
    live = 0
    for i in range(10):
        launched = first_tick - timedelta(seconds=rng.uniform(30, 5 * 3600))
        price = rng.choice([4.1, 32.77, 0.35, 12.0, 98.32])
        launch(store, f"g{i}", launched, price=price, gpus=8,
               project=rng.choice(["vision", "nlp", None]), pool=rng.choice([POOL, "other"]))
        for _ in range(rng.randint(0, 3)):
            start = launched + timedelta(seconds=rng.uniform(0, 4 * 3600))
            end = start + timedelta(seconds=rng.uniform(60, 3 * 3600))
            run_job(store, rng.choice(["vision", "nlp"]), rng.choice([1, 2, 4]), start,
                    end if rng.random() < 0.7 else None, node_id=f"g{i}")
        if rng.random() < 0.3:
            terminate(store, f"g{i}", first_tick + timedelta(seconds=rng.uniform(60, 3 * 3600)))
        else:
            live += 1
    return live


def _lines(store: Store, final_only: bool = False) -> dict:
    """The lines summed per node, bucket, end and finality: job ids are random per store, and
    so is which job (and project) a bucket's remainder micro-dollar goes to."""
    sums: dict = {}
    for x in store.ledger_lines():
        if x.final or not final_only:
            key = (x.subject, x.period_start, x.final, x.period_end)
            cost, gpu_s, count = sums.get(key, (0, 0.0, 0))
            sums[key] = (cost + x.cost_micros, round(gpu_s + x.gpu_seconds, 6), count + 1)
    return sums


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_tick_roll_up_keeps_final_lines_and_spend_of_a_full_one(store: Store, tmp_path: Path,
                                                                   seed: int) -> None:
    full = Store(f"sqlite:///{tmp_path / 'full.db'}")
    full.upgrade()
    try:
        first = T0 + 6 * H + 7 * M
        live = _history(store, seed, first)
        assert _history(full, seed, first) == live
        policies = [onprem_policy(None)]
        rng = random.Random(seed)
        tick, skipped = first, 0
        window = {"since": T0 - 24 * H, "until": T0 + 48 * H}
        history: list = []  # (tick, the full store's marks then)
        while tick < first + 3 * H:
            fresh = roll_up(store, policies, tick, skip_fresh=True)
            whole = roll_up(full, policies, tick)
            skipped += whole.nodes - fresh.nodes
            full_final = _lines(full, final_only=True)
            assert all(full_final.get(k) == v
                       for k, v in _lines(store, final_only=True).items())
            marks, full_marks = store.ledger_marks(), full.ledger_marks()
            history.append((tick, full_marks))
            assert all(mark <= full_marks[subject] for subject, mark in marks.items())
            then = [m for t, m in history if t <= tick - ROLL_SPREAD]
            for subject, mark in (then[-1] if then else {}).items():
                assert marks.get(subject) is not None and marks[subject] >= mark, subject
            gap = abs(spend(store, now=tick, **window) - spend(full, now=tick, **window))
            assert gap <= live * Decimal("0.03")  # a second of the dearest node, each
            tick += timedelta(seconds=rng.choice([10, 10, 60, 7 * 60, 20 * 60]))
        assert skipped > 0  # the tick's roll-up did leave nodes
        roll_up(store, policies, tick)
        roll_up(full, policies, tick)
        assert _lines(store) == _lines(full)
    finally:
        full.close()


def test_spread_lag_is_fixed_per_node_and_spread_over_the_window() -> None:
    lags = [spread_lag(f"burst-{i:05d}") for i in range(3000)]
    assert lags == [spread_lag(f"burst-{i:05d}") for i in range(3000)]
    assert all(timedelta(0) <= lag < ROLL_SPREAD for lag in lags)
    # Roughly even: each fifth of the window holds a fifth of the nodes (3000 / 5 = 600).
    fifths = [0] * 5
    for lag in lags:
        fifths[int(lag / ROLL_SPREAD * 5)] += 1
    assert all(480 < count < 720 for count in fifths), fifths
    assert spread_lag("any", timedelta(0)) == timedelta(0)


def test_the_tick_test_uses_each_nodes_spread_lag() -> None:
    # The roll-up's integer test and spread_lag agree on every node's lag: a node is due for its
    # new hour bucket exactly from the hour plus its lag.
    from orchestrator.costs.ledger import _clock_only_test
    from orchestrator.store.accrual import epoch_us

    hour = T0.replace(minute=0, second=0, microsecond=0) + H
    for i in range(50):
        node_id = f"burst-{i:03d}"
        lag = spread_lag(node_id)
        reach = epoch_us(hour - M)

        def due(at, node_id=node_id, reach=reach) -> bool:
            fresh = _clock_only_test(at, timedelta(minutes=5), {})
            return not fresh(node_id, "k", "ready", epoch_us(hour - H), reach,
                             epoch_us(hour - 2 * H), None)

        assert not due(hour + lag - timedelta(milliseconds=1))
        assert due(hour + lag)
