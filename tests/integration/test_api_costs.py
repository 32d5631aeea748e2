"""``GET /v1/costs`` and ``GET /v1/budgets`` over real HTTP on a real store (SQLite and
PostgreSQL), with a ledger written by a real roll-up: the report the CLI prints, JSON or CSV, and
a project token that sees its own projects' numbers and nothing it could deduce another's from.
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import httpx
import pytest

from orchestrator.costs.ledger import roll_up
from orchestrator.costs.report import CostQuery, cost_report, parse_group_by
from orchestrator.domain import NodeState
from orchestrator.store import Store
from tests.builders import T0, Rig, make_policy, make_rig
from tests.integration.api_support import (
    Tokens,
    bearer,
)

S = NodeState
DAY0 = T0.replace(hour=0)
WINDOW = {"from": "2025-03-01T00:00:00Z", "to": "2025-03-03T00:00:00Z"}
BUDGETS = [
    {"name": "research-monthly", "project": "research", "limit_usd": 3100},
    {"name": "pool-monthly", "limit_usd": 10000},
]


@pytest.fixture
def rig(store: Store) -> Rig:
    """$10/h nodes from T0 (12:00, 1 March) for research (n1), vision (n2) and no project (n3),
    rolled up 30 h later: $120 each on the 1st, $180 each on the 2nd."""
    rig = make_rig(store, policy=make_policy(budgets=BUDGETS))
    for n, project in ((1, "research"), (2, "vision"), (3, None)):
        rig.executor.run([rig.launch_action(n, project=project)])
        rig.move(f"n{n}", S.BOOTING, S.JOINING, S.READY)
    rig.clock.advance(hours=30)
    roll_up(store, [rig.policy], rig.now)
    return rig


def costs(client: httpx.Client, secret: str, **params: str) -> dict:
    response = client.get("/v1/costs", params={**WINDOW, **params}, headers=bearer(secret))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    return response.json()


def by_keys(report: dict, *keys: str) -> dict[tuple[str, ...], Decimal]:
    return {tuple(r[k] for k in keys): Decimal(r["cost_usd"]) for r in report["rows"]}


def test_admin_sees_every_projects_spend(client: httpx.Client, store: Store, tokens: Tokens) -> None:
    report = costs(client, tokens.admin, group_by="project,day")
    expected = cost_report(store, CostQuery(since=DAY0, until=DAY0.replace(day=3),
                                            group_by=parse_group_by("project,day")))
    assert report == expected.as_json()
    assert by_keys(report, "project", "day") == {
        (p, d): Decimal(c) for p in ("-", "research", "vision")
        for d, c in (("2025-03-01", "120.00"), ("2025-03-02", "180.00"))}
    assert report["total"]["cost_usd"] == "900.00"
    assert by_keys(costs(client, tokens.admin, project="research,vision"), "project") == {
        ("research",): Decimal("300.00"), ("vision",): Decimal("300.00")}
    assert by_keys(costs(client, tokens.admin, project="-"), "project") == {("-",): Decimal("300.00")}


def test_a_project_token_sees_only_its_projects_numbers(
        client: httpx.Client, tokens: Tokens) -> None:
    mine = costs(client, tokens.viewer, group_by="project,day")
    assert {r["project"] for r in mine["rows"]} == {"research"}
    assert mine["total"]["cost_usd"] == "300.00"
    # Grouped by something else, the rows and total are still research's spend only: nothing of
    # vision's or the project-less node's can be deduced from them.
    for group_by in ("provider", "day", "instance_type,market", "kind"):
        report = costs(client, tokens.viewer, group_by=group_by)
        assert report["total"]["cost_usd"] == "300.00", (group_by, report)
        assert "vision" not in str(report)
    assert costs(client, tokens.other_viewer)["total"]["cost_usd"] == "300.00"
    assert costs(client, tokens.submitter, project="research")["total"]["cost_usd"] == "300.00"

    for project in ("vision", "research,vision", "-"):
        refused = client.get("/v1/costs", params={**WINDOW, "project": project},
                             headers=bearer(tokens.viewer))
        assert refused.status_code == 403, refused.text
        assert refused.headers["content-type"].startswith("application/problem+json")
        assert "300" not in refused.text and "cost_usd" not in refused.text


def test_csv_when_the_client_accepts_it(client: httpx.Client, tokens: Tokens) -> None:
    def get(secret: str, accept: str) -> httpx.Response:
        return client.get("/v1/costs", params={**WINDOW, "group_by": "project,day"},
                          headers={**bearer(secret), "Accept": accept})

    response = get(tokens.admin, "text/csv")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert {(r["project"], r["day"], r["cost_usd"]) for r in rows} == {
        (p, d, c) for p in ("-", "research", "vision")
        for d, c in (("2025-03-01", "120.00"), ("2025-03-02", "180.00"))}
    viewer_rows = list(csv.DictReader(io.StringIO(get(tokens.viewer, "text/csv").text)))
    assert {r["project"] for r in viewer_rows} == {"research"}
    for accept in ("application/json", "text/csv;q=0.5, application/json", "*/*", ""):
        assert get(tokens.admin, accept).headers["content-type"].startswith("application/json")
    assert get(tokens.admin, "application/json;q=0.1, text/csv").headers[
        "content-type"].startswith("text/csv")


def test_the_window_defaults_to_this_month_until_now(
        client: httpx.Client, rig: Rig, tokens: Tokens) -> None:
    response = client.get("/v1/costs", headers=bearer(tokens.admin))
    assert response.status_code == 200
    report = response.json()
    assert (report["from"], report["to"]) == ("2025-03-01T00:00:00Z", "2025-03-02T18:00:00Z")
    assert report["group_by"] == ["project"]


def test_budgets_are_scoped_like_the_costs(client: httpx.Client, tokens: Tokens) -> None:
    def budgets(secret: str, **params: str) -> list[dict]:
        response = client.get("/v1/budgets", params=params, headers=bearer(secret))
        assert response.status_code == 200, response.text
        return response.json()["budgets"]

    everything = budgets(tokens.admin)
    assert [(b["budget"], b["project"]) for b in everything] == [
        ("research-monthly", "research"), ("pool-monthly", None)]
    research, pool = everything
    assert Decimal(research["limit_usd"]) == 3100 and Decimal(research["spent_usd"]) == 300
    assert Decimal(pool["spent_usd"]) == 900  # every project's spend, and the project-less node's
    for field in ("remaining_usd", "forecast_usd", "committed_usd", "burn_usd_hour", "grade",
                  "used_fraction", "window_start", "window_end"):
        assert field in research
    assert research["window_start"] == "2025-03-01T00:00:00Z"

    assert budgets(tokens.viewer) == [research]  # the pool-wide budget sums other projects
    assert budgets(tokens.other_viewer) == []
    assert budgets(tokens.admin, project="research") == [research]
    assert budgets(tokens.admin, policy="elsewhere") == []
    refused = client.get("/v1/budgets", params={"project": "vision"}, headers=bearer(tokens.viewer))
    assert refused.status_code == 403 and "vision" in refused.json()["detail"]


def test_the_window_takes_dates_and_spans_back_from_the_clock(
        client: httpx.Client, rig: Rig, tokens: Tokens) -> None:
    explicit = costs(client, tokens.admin, group_by="project,day")
    assert costs(client, tokens.admin, group_by="project,day",
                 **{"from": "2025-03-01", "to": "2025-03-03"}) == explicit
    # The runtime's clock is 18:00 on 2 March: 42h back is midnight on the 1st, 0m is now.
    spans = costs(client, tokens.admin, group_by="project", **{"from": "42h", "to": "0m"})
    assert spans["from"] == "2025-03-01T00:00:00Z" and spans["to"] == "2025-03-02T18:00:00Z"
    assert spans["total"]["cost_usd"] == explicit["total"]["cost_usd"]
    bad = client.get("/v1/costs", params={"from": "last tuesday"}, headers=bearer(tokens.admin))
    assert bad.status_code == 422
    assert "from" in bad.text and "a date (2026-12-01: UTC midnight)" in bad.text
