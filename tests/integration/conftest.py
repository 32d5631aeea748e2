"""Fixtures of the API tests (tests/integration/test_api_*.py): a rig on the ``store`` fixture
(SQLite and PostgreSQL), a runtime over it, the API served by uvicorn with a client, and tokens of
every role. A module that needs another rig defines its own ``rig``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.store import Store
from orchestrator.wiring import Runtime
from tests.builders import Rig, make_rig
from tests.integration.api_support import Tokens, make_tokens, runtime_of, served



@pytest.fixture
def rig(store: Store) -> Rig:
    return make_rig(store)


@pytest.fixture
def rt(rig: Rig, tmp_path: Path) -> Runtime:
    return runtime_of(rig, tmp_path)


@pytest.fixture
def tokens(store: Store, rig: Rig) -> Tokens:
    return make_tokens(store, rig)


@pytest.fixture
def client(rt: Runtime) -> Iterator[httpx.Client]:
    with served(rt) as c:
        yield c
