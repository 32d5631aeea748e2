"""Limits that keep the API standing under abuse: request-body size and a per-source rate on the
anonymous agent route. Pure ASGI middleware, so nothing is parsed before a limit is checked.

* :class:`BodyLimit`: every request body is bounded (64 KiB on ``/v1/agent/*``, 1 MiB elsewhere).
  A ``Content-Length`` over the limit is answered 413 before a byte of the body is read; a body
  without one (chunked) is counted as it streams in and refused as soon as it passes the limit.
  At most the limit is ever held in memory. The 413 closes the connection, since the rest of the
  body is never read.
* :class:`RateLimit`: a token bucket per client address on the routes an anonymous caller may
  reach (``POST /v1/agent/register``); past its burst a source gets 429 with ``Retry-After`` (and
  ``retry_after_s`` in the problem document, which the agent honours). The buckets are bounded
  (least recently seen sources forgotten first), so a spray of addresses cannot grow memory.

Both answer with RFC 9457 problem documents (:mod:`orchestrator.api.problems`).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.api.problems import problem_response

AGENT_PREFIX = "/v1/agent/"
AGENT_BODY_LIMIT = 64 * 1024
BODY_LIMIT = 1024 * 1024
ANONYMOUS_ROUTES = frozenset({"/v1/agent/register"})


def body_limit_for(path: str) -> int:
    """The largest body a request to ``path`` may carry."""
    return AGENT_BODY_LIMIT if path.startswith(AGENT_PREFIX) else BODY_LIMIT


class BodyLimit:
    """Refuse request bodies over :func:`body_limit_for` with 413, reading at most the limit."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int] = body_limit_for) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = self.limit_for(path)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _too_large(scope, receive, send, path, limit, f"Content-Length {declared}")
            return
        # Read the body here, counting, before the app sees any of it; then hand it on whole.
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client went away before its body was complete: nothing to answer.
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _too_large(scope, receive, send, path, limit, f"more than {limit} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # e.g. http.disconnect, for a streaming answer

        await self.app(scope, replay, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # the server refuses a garbled length before we see it
    return None


async def _too_large(scope: Scope, receive: Receive, send: Send, path: str, limit: int,
                     got: str) -> None:
    response = problem_response(
        413, "request body too large",
        f"a request to {path} may carry at most {limit} bytes (got {got})",
        headers={"Connection": "close"}, limit_bytes=limit)
    await response(scope, receive, send)


@dataclass(frozen=True, slots=True)
class Rate:
    """A token bucket's shape: ``burst`` requests at once, refilled at ``per_s`` a second."""

    burst: float = 30.0
    per_s: float = 2.0

    def __post_init__(self) -> None:
        if not (self.burst >= 1 and self.per_s > 0):
            raise ValueError(f"rate: burst must be >= 1 and per_s > 0 (got {self.burst}, "
                             f"{self.per_s})")


class RateLimit:
    """429 for a client address that has used up its bucket on an anonymous route."""

    def __init__(self, app: ASGIApp, rate: Rate = Rate(), *, routes: frozenset[str] = ANONYMOUS_ROUTES,
                 max_sources: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self.rate = rate
        self.routes = routes
        self.max_sources = max_sources
        self.clock = clock
        # source -> (tokens left, when counted); the event loop is single-threaded: no lock.
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") in self.routes:
            client = scope.get("client")
            source = client[0] if client else "-"
            wait_s = self.take(source)
            if wait_s > 0:
                seconds = max(1, math.ceil(wait_s))
                response = problem_response(
                    429, "too many requests",
                    f"too many requests to {scope['path']} from {source}; retry in {seconds}s",
                    headers={"Retry-After": str(seconds)}, retry_after_s=seconds)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def take(self, source: str) -> float:
        """Spend one token of ``source``'s bucket: 0 if there was one, else the seconds until
        there is."""
        now = self.clock()
        tokens, at = self._buckets.pop(source, (self.rate.burst, now))
        tokens = min(self.rate.burst, tokens + (now - at) * self.rate.per_s)
        wait_s = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait_s = (1 - tokens) / self.rate.per_s
        self._buckets[source] = (tokens, now)
        while len(self._buckets) > self.max_sources:
            self._buckets.popitem(last=False)
        return wait_s


__all__ = ["AGENT_BODY_LIMIT", "ANONYMOUS_ROUTES", "BODY_LIMIT", "BodyLimit", "Rate",
           "RateLimit", "body_limit_for"]
