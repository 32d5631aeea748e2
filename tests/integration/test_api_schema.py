"""Schemathesis against the served ``/openapi.json`` (real HTTP, real store on SQLite and
PostgreSQL): every operation, the node agents' included, fuzzed with valid and invalid inputs under
an admin token (the agents' routes answer it 401: a node credential is not a user token, but
their request validation runs first and is fuzzed too), bounded
(``MAX_EXAMPLES`` per operation and mode, derandomized so a run is reproducible); no answer may
be a 5xx, and every error must be a problem document.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from orchestrator.api.limits import Rate
from orchestrator.domain import NodeState
from orchestrator.fabric.tokens import new_credential
from orchestrator.store import Store
from tests.builders import POOL, make_rig
from tests.integration.api_support import PROBLEM_JSON, add_node, make_tokens, runtime_of, served

MAX_EXAMPLES = 12


def test_fuzzing_the_schema_finds_no_server_error(store: Store, tmp_path: Path) -> None:
    _fuzz_the_schema(store, tmp_path, MAX_EXAMPLES)


@pytest.mark.long
def test_fuzzing_the_schema_at_length_with_a_node_credential(tmp_path: Path) -> None:
    """The same, 30 examples per operation and mode, the agents' routes fuzzed with a real node
    credential (of node n2: a case naming it gets past the credential check) instead of a user
    token, and the registration rate limit opened so that it does not answer in the fuzzer's
    place; SQLite only, to fit the long step (about 45 s)."""
    with Store(f"sqlite:///{tmp_path / 'fuzz.db'}") as store:
        store.upgrade()
        _fuzz_the_schema(store, tmp_path, 30, node_credential=True)


def _fuzz_the_schema(store: Store, tmp_path: Path, max_examples: int, *,
                     node_credential: bool = False) -> None:
    rig = make_rig(store)
    rt = runtime_of(rig, tmp_path)
    tokens = make_tokens(store, rig)
    add_node(rig, 1, "research", NodeState.BOOTING)
    store.submit_job("research", POOL, 8, 0, 600.0, None, rig.now - timedelta(minutes=5))
    auth = {"Authorization": f"Bearer {tokens.admin}"}
    agent_auth = auth
    if node_credential:
        add_node(rig, 2, "research", NodeState.BOOTING, NodeState.JOINING, NodeState.READY)
        credential, credential_hash = new_credential()
        store.set_credential("n2", credential_hash)
        agent_auth = {"Authorization": f"Bearer {credential}"}
    failures: list[str] = []
    unfuzzable: list[str] = []
    calls = 0
    options = {"register_rate": Rate(burst=10_000, per_s=100)} if node_credential else {}
    with served(rt, **options) as client:
        base = str(client.base_url).rstrip("/")
        schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
        operations = [r.ok() for r in schema.get_all_operations()]
        assert len(operations) >= 10, [op.label for op in operations]
        for operation in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

                headers = agent_auth if operation.path.startswith("/v1/agent/") else auth

                @given(case=operation.as_strategy(generation_mode=mode, headers=headers))
                @settings(max_examples=max_examples, deadline=None, database=None,
                          derandomize=True, suppress_health_check=list(HealthCheck))
                def fuzz(case: schemathesis.Case) -> None:
                    nonlocal calls
                    calls += 1
                    response = case.call(base_url=base, timeout=10)
                    content_type = ",".join(response.headers.get("content-type", []))
                    if response.status_code >= 500:
                        failures.append(f"{case.operation.label} -> {response.status_code}: "
                                        f"{case.as_curl_command()}")
                    elif response.status_code >= 400 and not content_type.startswith(PROBLEM_JSON):
                        failures.append(f"{case.operation.label} -> {response.status_code} "
                                        f"{content_type}, not a problem document")

                try:
                    fuzz()
                except Unsatisfiable:
                    # An operation with nothing to get wrong (no parameters, no body) has no
                    # invalid inputs to generate.
                    assert mode is GenerationMode.NEGATIVE, operation.label
                    unfuzzable.append(operation.label)
    assert not failures, "\n".join(failures[:20])
    assert calls >= len(operations) * max_examples // 2, calls
    assert set(unfuzzable) <= {"GET /healthz", "GET /readyz", "GET /metrics"}, unfuzzable


def test_the_schema_declares_bearer_auth(store: Store, tmp_path: Path) -> None:
    rig = make_rig(store)
    with served(runtime_of(rig, tmp_path)) as client:
        schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["token"] == {
        "type": "http", "scheme": "bearer",
        "description": "An API token from `burst token create` (roles: admin, viewer, submitter)."}
