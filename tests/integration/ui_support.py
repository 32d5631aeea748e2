"""A seeded store and API server for the dashboard tests (HTTP and browser): two projects'
nodes, jobs, spend, budgets and decisions, so every page has rows and scoping has something to
hide. Built once per module: the dashboard is read-only, so tests share it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx

from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.domain import NodeState
from orchestrator.loop import ControlLoop
from orchestrator.store import Store
from tests.builders import POOL, make_policy, make_rig
from tests.integration.api_support import Tokens, add_node, make_tokens, runtime_of

S = NodeState


@dataclass
class Seeded:
    base: str
    tokens: Tokens
    client: httpx.Client


def seeded_policy():
    return make_policy(
        pool={"name": POOL, "onprem": {"nodes": 2, "gpus_per_node": 8}},
        budgets=[{"name": "research-day", "project": "research", "window": "day",
                  "limit_usd": 200},
                 {"name": "vision-day", "project": "vision", "window": "day", "limit_usd": 100},
                 {"name": "pool-month", "window": "month", "limit_usd": 5000}])


@contextmanager
def seeded_server(tmp: Path) -> Iterator[Seeded]:
    store = Store(f"sqlite:///{tmp / 'ui.db'}")
    store.upgrade()
    rig = make_rig(store, policy=seeded_policy())
    rig.clock.advance(hours=-6)  # 06:00: the nodes' day starts with them
    add_node(rig, 1, "research", S.BOOTING, S.JOINING, S.READY)
    add_node(rig, 2, "vision", S.BOOTING, S.JOINING, S.READY)
    add_node(rig, 3, None, S.BOOTING, S.JOINING, S.READY)  # min_nodes: no project
    rig.clock.advance(hours=5, minutes=30)
    add_node(rig, 4, "vision", S.BOOTING)
    store.submit_job("research", POOL, 8, 0, 3600.0, None, rig.now - timedelta(minutes=40))
    store.submit_job("vision", POOL, 16, 0, 3600.0, None, rig.now - timedelta(minutes=25))
    store.submit_job("vision", POOL, 4, 0, 600.0, None, rig.now - timedelta(minutes=5))
    rt = runtime_of(rig, tmp)
    loop = ControlLoop(rt, 10.0)
    loop.tick()  # rolls up the ledger, decides, records what deserves a notification
    loop.close()
    tokens = make_tokens(store, rig)
    server = ApiServer(create_app(rt), "127.0.0.1", 0)
    port = server.start()
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            yield Seeded(base, tokens, client)
    finally:
        server.stop()
        store.close()


def sign_in(client: httpx.Client, secret: str) -> httpx.Response:
    """POST the sign-in form; the client keeps the cookie."""
    return client.post("/ui/login", data={"token": secret}, follow_redirects=False)


__all__ = ["Seeded", "seeded_server", "sign_in"]
