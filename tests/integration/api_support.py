"""Support for the API tests: a runtime over the test store, the app served by uvicorn on a free
loopback port (real HTTP, through :class:`orchestrator.api.server.ApiServer`), and a set of tokens.

The runtime is the test rig's (FakeProvider, FixedClock at ``T0``), so a test controls time: an
expiring token expires when the test advances the clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx

from orchestrator.api import create_app
from orchestrator.api.server import ApiServer
from orchestrator.lifecycle import transition
from orchestrator.observe import Observer
from orchestrator.store import Store
from orchestrator.wiring import Runtime, Settings
from tests.builders import Rig

PROBLEM_JSON = "application/problem+json"


def runtime_of(rig: Rig, tmp_path: Path) -> Runtime:
    providers = {rig.provider.name: rig.provider}
    return Runtime(
        settings=Settings(state_dir=tmp_path / "state"), store=rig.store,
        policies={rig.policy.name: rig.policy}, providers=providers, queue=rig.queue,
        fabric=rig.fabric, tokens=rig.tokens, clock=rig.clock, executor=rig.executor,
        reconciler=rig.reconciler, observer=Observer(rig.store, rig.queue, providers),
    )


@contextmanager
def served(runtime: Runtime, **app_options: Any) -> Iterator[httpx.Client]:
    """The app over ``runtime`` (``create_app`` options: ``app_options``) on
    127.0.0.1:<free port>, and an httpx client for it."""
    server = ApiServer(create_app(runtime, **app_options), "127.0.0.1", 0)
    port = server.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            yield client
    finally:
        server.stop()


@dataclass(frozen=True)
class Tokens:
    """Secrets of one token per role: research is the viewer's and submitter's project."""

    admin: str
    viewer: str
    submitter: str
    other_viewer: str  # a viewer of vision only
    ids: dict[str, str]


def make_tokens(store: Store, rig: Rig) -> Tokens:
    made = {
        "admin": store.create_api_token("admin", [], created_at=rig.now),
        "viewer": store.create_api_token("viewer", ["research"], created_at=rig.now),
        "submitter": store.create_api_token("submitter", ["research"], created_at=rig.now),
        "other_viewer": store.create_api_token("viewer", ["vision"], created_at=rig.now),
    }
    return Tokens(**{k: secret for k, (secret, _) in made.items()},
                  ids={k: record.id for k, (_, record) in made.items()})


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def add_node(rig: Rig, n: int, project: str | None, *states, failed_reason: str | None = None):
    """Launch node ``n<n>`` for ``project`` through the executor, then walk it through
    ``states``; ``failed_reason``: end it failed with that event reason."""
    rig.executor.run([rig.launch_action(n, project=project)])
    node = rig.move(f"n{n}", *states) if states else rig.node(f"n{n}")
    if failed_reason is not None:
        from orchestrator.domain.nodes import NodeState

        new, event = transition(node, NodeState.FAILED, at=rig.now, reason=failed_reason)
        assert rig.store.save_transition(node, new, event)
    return rig.node(f"n{n}")


HOUR = timedelta(hours=1)
