"""One hand-off to the thread pool per authenticated request (``orchestrator.api.one_hop``), over
real HTTP against a real store: a sync ``/v1`` route checks its caller's token in its own worker
call, a request without a token is refused on the event loop before anything else, and the
rewrite keeps what FastAPI reads of an endpoint (its parameters, a ``Request`` it takes, async
endpoints and ones without ``Caller`` untouched)."""

from __future__ import annotations

import inspect
import threading
from typing import Any

import anyio.to_thread
import httpx
import pytest
from fastapi import Request

from orchestrator.api import one_hop
from orchestrator.api.auth import Caller
from orchestrator.api.one_hop import checked_in_one_hop
from orchestrator.costs import budgets
from orchestrator.store import Store
from tests.integration.api_support import Tokens, bearer

ROUTES = ["/v1/budgets", "/v1/costs", "/v1/nodes", "/v1/queue", "/v1/decisions", "/metrics"]


@pytest.fixture
def hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the functions handed to the thread pool (every such call of the process)."""
    calls: list[str] = []
    real = anyio.to_thread.run_sync

    async def counted(func: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(getattr(func, "__name__", repr(func)))
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    return calls


@pytest.mark.parametrize("path", ROUTES)
def test_an_authenticated_read_is_one_hand_off(client: httpx.Client, tokens: Tokens,
                                               hand_offs: list[str], path: str) -> None:
    assert client.get(path, headers=bearer(tokens.admin)).status_code == 200
    hand_offs.clear()
    response = client.get(path, headers=bearer(tokens.admin))
    assert response.status_code == 200, response.text
    assert len(hand_offs) == 1, hand_offs
    assert "current_token" not in hand_offs


def test_a_public_route_is_one_hand_off(client: httpx.Client, hand_offs: list[str]) -> None:
    assert client.get("/healthz").status_code == 200
    hand_offs.clear()
    assert client.get("/readyz").status_code in (200, 503)
    assert len(hand_offs) == 1, hand_offs


def test_the_token_is_checked_in_the_routes_worker_call(
        client: httpx.Client, tokens: Tokens, store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: dict[str, int] = {}
    real_check = store.check_api_token
    real_statuses = budgets.budget_statuses

    def check(*args: Any, **kwargs: Any) -> Any:
        threads["check"] = threading.get_ident()
        return real_check(*args, **kwargs)

    def statuses(*args: Any, **kwargs: Any) -> Any:
        threads["route"] = threading.get_ident()
        return real_statuses(*args, **kwargs)

    monkeypatch.setattr(store, "check_api_token", check)
    monkeypatch.setattr(budgets, "budget_statuses", statuses)
    assert client.get("/v1/budgets", headers=bearer(tokens.admin)).status_code == 200
    assert threads["check"] == threads["route"] != threading.main_thread().ident


def test_refusals_and_their_order(client: httpx.Client, tokens: Tokens,
                                  hand_offs: list[str]) -> None:
    # No token: 401 on the event loop, before the parameters are read and before any worker.
    missing = client.get("/v1/costs", params={"group_by": "nonsense"})
    assert missing.status_code == 401 and "missing token" in missing.text
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert hand_offs == []
    # A token the store refuses: 401 from the worker call, nothing of the route run.
    bad = client.get("/v1/costs", headers=bearer("burst_not-a-token"))
    assert bad.status_code == 401 and "invalid_token" in bad.headers["www-authenticate"]
    assert len(hand_offs) == 1
    # A refused token and a parameter the route itself reads: the 401 first, as before.
    route_read = client.get("/v1/costs", params={"group_by": "nonsense"},
                            headers=bearer("burst_not-a-token"))
    assert route_read.status_code == 401
    # A refused token and a parameter FastAPI's own schema refuses: the 422 naming it (checked
    # on the event loop, before the worker call).
    both = client.get("/v1/budgets", params={"policy": "not a name!"},
                      headers=bearer("burst_not-a-token"))
    assert both.status_code == 422 and "policy" in both.text
    # A viewer on an admin route: the role is the route's check, after the token's.
    assert client.get("/v1/decisions", headers=bearer(tokens.viewer)).status_code == 403


def test_the_rewrite_keeps_what_fastapi_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    async def asynchronous(token: Caller) -> None: ...

    assert checked_in_one_hop(asynchronous) is asynchronous

    def no_caller(limit: int = 3) -> int:
        return limit

    plain = checked_in_one_hop(no_caller)
    assert inspect.iscoroutinefunction(plain)
    assert list(inspect.signature(plain).parameters) == ["limit"]
    assert anyio.run(lambda: plain(limit=4)) == 4

    seen: dict[str, Any] = {}

    def route(token: Caller, request: Request, limit: int = 3) -> dict:
        """Docs kept."""
        seen.update(token=token, request=request, limit=limit, thread=threading.get_ident())
        return {}

    checked = checked_in_one_hop(route)
    assert checked_in_one_hop(checked) is checked  # (an included router rewrites again)
    signature = inspect.signature(checked)
    assert list(signature.parameters) == ["request", "limit", "burst_bearer_secret"]
    assert signature.return_annotation is dict
    assert checked.__doc__ == "Docs kept." and checked.__name__ == "route"

    checks: list[tuple[Any, str, int]] = []

    def check_secret(request: Any, secret: str) -> str:
        checks.append((request, secret, threading.get_ident()))
        return "the token"

    monkeypatch.setattr(one_hop, "check_secret", check_secret)
    assert anyio.run(lambda: checked(request="the request", limit=5,
                                     burst_bearer_secret="s3cret")) == {}
    assert checks == [("the request", "s3cret", seen["thread"])]
    assert seen["thread"] != threading.get_ident()  # in a worker, with the check
    assert {k: seen[k] for k in ("token", "request", "limit")} == {
        "token": "the token", "request": "the request", "limit": 5}
