"""Repeated decisions over the API (real HTTP, SQLite and PostgreSQL): ``GET /v1/decisions`` and
``/v1/decisions/{id}`` show how many ticks a stored decision stands for and when it was last
made; ``since`` and the order go by that time; the latest repeat's id finds the decision."""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx

from orchestrator.domain import Rule
from orchestrator.domain.plan import Decision
from orchestrator.store import Store
from tests.builders import T0
from tests.integration.api_support import Tokens, bearer


def z(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def test_decisions_show_repeats_and_last_seen(
        client: httpx.Client, store: Store, tokens: Tokens) -> None:
    def held(i: int) -> Decision:
        return Decision(id=f"d-{i}", policy="train", at=T0 + timedelta(minutes=i),
                        rule=Rule.LIMITED, summary="8 unmet GPU(s) but held back by limits.max_nodes",
                        held_back_by=("limits.max_nodes",))

    store.add_decision(Decision(id="d-0", policy="infer", at=T0 + timedelta(minutes=2),
                                rule=Rule.NO_DEMAND, summary="nothing pending"))
    for i in (1, 2, 3, 4):
        store.add_decision(held(i))
    admin = bearer(tokens.admin)
    listed = client.get("/v1/decisions", headers=admin).json()
    assert [(d["id"], d["repeats"]) for d in listed] == [("d-1", 4), ("d-0", 1)]
    first = listed[0]
    assert first["at"] == z(T0 + timedelta(minutes=1))
    assert first["last_seen_at"] == z(T0 + timedelta(minutes=4))
    assert listed[1]["last_seen_at"] == listed[1]["at"]

    since = z(T0 + timedelta(minutes=3))
    recent = client.get("/v1/decisions", params={"since": since}, headers=admin).json()
    assert [d["id"] for d in recent] == ["d-1"]  # made again at minute 4, though first at 1
    by_latest = client.get("/v1/decisions/d-4", headers=admin)
    assert by_latest.status_code == 200 and by_latest.json() == first
