"""One hand-off to the thread pool per request: :class:`OneHopRoute`.

FastAPI hands a sync route to the thread pool up to three times a request: once for each sync
dependency (:data:`~orchestrator.api.auth.Caller`, the store's token check), once for the endpoint
(a store read), and once more to validate what it returned against its return annotation. Each
hand-off is a worker wake-up and an event-loop wake-up, on a machine whose cores the API shares
with its database. Together with the pings only after idle (:mod:`orchestrator.store.engine`)
and two smaller changes, one hand-off took ``/v1/budgets`` from about 3.9 to 2.9 ms of the API's
CPU an answer under 8 clients (docs/performance.md, "one hand-off to the thread pool a request").

A router made with ``route_class=OneHopRoute`` wraps each sync endpoint in a coroutine that hands
one call to the thread pool: the token check (where the endpoint takes ``Caller``) and the
endpoint, in that order. FastAPI then validates the answer on the event loop, as it does for every
async route (and as it serialises every route's answer anyway). ``Caller`` is replaced by the
bearer secret (:data:`~orchestrator.api.auth.Secret`: no I/O, so it runs on the event loop and
still answers 401 to a request without a token before anything else is read), checked against the
store first thing in the worker call (:func:`~orchestrator.api.auth.check_secret`); the endpoint
gets the token as before. What a caller sees is the same, but for one order: a request with a token
that the store refuses *and* a parameter that FastAPI's schema refuses (a pattern, a type) now gets
the 422 naming the parameter (validated on the event loop) rather than the 401; parameters a route
reads itself are still read after the check. Async endpoints are left as they are.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.dependencies.utils import get_typed_return_annotation, get_typed_signature
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from orchestrator.api.auth import Caller, Secret, check_secret

_SECRET = "burst_bearer_secret"  # names of the parameters the rewrite adds (never a query's)
_REQUEST = "burst_request"


class OneHopRoute(APIRoute):
    """An :class:`APIRoute` whose sync endpoint checks its caller's token in its own worker call
    (module docstring)."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint=checked_in_one_hop(endpoint), **kwargs)


def checked_in_one_hop(endpoint: Callable[..., Any]) -> Callable[..., Any]:
    """``endpoint`` run in one hand-off to the thread pool, its ``Caller`` parameter (if any)
    replaced by the bearer secret and checked there first (module docstring); an async
    ``endpoint`` as it is (so the rewrite of a rewritten endpoint changes nothing)."""
    if inspect.iscoroutinefunction(endpoint):
        return endpoint
    signature = get_typed_signature(endpoint)
    callers = [p.name for p in signature.parameters.values() if p.annotation == Caller]
    if len(callers) > 1:
        return endpoint  # (no route takes two; left to FastAPI as written)
    caller = callers[0] if callers else None
    params = [p for p in signature.parameters.values() if p.name != caller]
    request_name = next((p.name for p in params if p.annotation is Request), None)
    added = []
    if caller is not None:
        added.append(inspect.Parameter(_SECRET, inspect.Parameter.KEYWORD_ONLY,
                                       annotation=Secret))
        if request_name is None:  # FastAPI fills one Request parameter only: share the endpoint's
            added.append(inspect.Parameter(_REQUEST, inspect.Parameter.KEYWORD_ONLY,
                                           annotation=Request))

    def call(values: dict[str, Any]) -> Any:
        if caller is not None:
            secret = values.pop(_SECRET)
            request = values[request_name] if request_name is not None else values.pop(_REQUEST)
            values[caller] = check_secret(request, secret)
        return endpoint(**values)

    @functools.wraps(endpoint)
    async def in_one_hop(**values: Any) -> Any:
        return await run_in_threadpool(call, values)

    returns = get_typed_return_annotation(endpoint)
    in_one_hop.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*params, *added],
        return_annotation=inspect.Signature.empty if returns is None else returns)
    return in_one_hop


__all__ = ["OneHopRoute", "checked_in_one_hop"]
