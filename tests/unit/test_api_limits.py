"""The API limits' pure parts: the per-source token bucket on an injected clock, the body limit
per route, and the agent's reading of a 429's ``retry_after_s``."""

from __future__ import annotations

import pytest

from orchestrator.api.limits import AGENT_BODY_LIMIT, BODY_LIMIT, Rate, RateLimit, body_limit_for
from orchestrator.fabric.agent import RETRY_AFTER_MAX_S, _retry_after


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _limiter(clock: Clock, **kwargs) -> RateLimit:
    async def app(scope, receive, send) -> None:  # never called here
        raise AssertionError

    return RateLimit(app, Rate(burst=3, per_s=0.5), clock=clock, **kwargs)


def test_a_bucket_allows_its_burst_then_refills_at_its_rate() -> None:
    clock = Clock()
    limiter = _limiter(clock)
    assert [limiter.take("10.0.0.1") for _ in range(3)] == [0, 0, 0]
    assert limiter.take("10.0.0.1") == pytest.approx(2.0)  # one token at 0.5/s
    assert limiter.take("10.0.0.2") == 0  # per source
    clock.t = 2.0
    assert limiter.take("10.0.0.1") == 0
    assert limiter.take("10.0.0.1") > 0
    clock.t = 1000.0
    assert [limiter.take("10.0.0.1") for _ in range(4)][-1] > 0  # refilled to the burst, no more


def test_the_buckets_are_bounded() -> None:
    limiter = _limiter(Clock(), max_sources=100)
    for i in range(1000):
        limiter.take(f"10.0.{i // 256}.{i % 256}")
    assert len(limiter._buckets) == 100


def test_a_rate_needs_a_burst_and_a_refill() -> None:
    with pytest.raises(ValueError, match="burst must be >= 1"):
        Rate(burst=0, per_s=1)
    with pytest.raises(ValueError, match="per_s > 0"):
        Rate(burst=1, per_s=0)


def test_agent_routes_get_the_small_limit() -> None:
    assert body_limit_for("/v1/agent/register") == AGENT_BODY_LIMIT == 64 * 1024
    assert body_limit_for("/v1/jobs") == BODY_LIMIT == 1024 * 1024


@pytest.mark.parametrize(("body", "wait"), [
    ({"retry_after_s": 3}, 3.0), ({"retry_after_s": "2.5"}, 2.5), ({}, 0.0),
    ({"retry_after_s": -4}, 0.0), ({"retry_after_s": 1e9}, RETRY_AFTER_MAX_S),
    ({"retry_after_s": "nan"}, 0.0), ({"retry_after_s": [1]}, 0.0),
])
def test_the_agent_bounds_the_wait_a_429_asks_for(body: dict, wait: float) -> None:
    assert _retry_after(body) == wait
