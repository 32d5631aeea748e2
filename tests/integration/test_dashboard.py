"""The dashboard over real HTTP (no browser; tests/e2e/test_dashboard_browser.py drives Chromium):
sign-in and its cookie, every page for every role, the same numbers as the API, tenant scoping
on every page and on the CSV download."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.integration.api_support import bearer
from tests.integration.ui_support import Seeded, seeded_server, sign_in

PAGES = ("fleet", "queue", "budgets", "spend")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    with seeded_server(tmp_path_factory.mktemp("ui")) as s:
        yield s


@contextmanager
def session(seeded: Seeded, secret: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=seeded.base, timeout=30) as client:
        done = sign_in(client, secret)
        assert done.status_code == 303 and done.headers["location"] == "/ui/fleet", done.text
        yield client


def test_sign_in_sets_a_strict_http_only_cookie_and_refuses_bad_tokens(seeded: Seeded) -> None:
    with httpx.Client(base_url=seeded.base, timeout=30) as anon:
        assert anon.get("/ui/fleet").headers["location"] == "/ui/login"
        refused = sign_in(anon, "not-a-token")
        assert refused.status_code == 401 and "That token is not valid." in refused.text
        assert "set-cookie" not in refused.headers
        assert anon.get("/ui/fleet").status_code == 303
    with httpx.Client(base_url=seeded.base, timeout=30) as client:
        done = sign_in(client, seeded.tokens.admin)
        cookie = done.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
        assert seeded.tokens.admin not in done.headers["location"]
        page = client.get("/ui/fleet")
        assert page.status_code == 200 and "no-store" in page.headers["cache-control"]
        client.post("/ui/logout")
        assert client.get("/ui/fleet").status_code == 303


def test_pages_show_what_the_api_serves(seeded: Seeded) -> None:
    admin = bearer(seeded.tokens.admin)
    with session(seeded, seeded.tokens.admin) as ui:
        fleet = ui.get("/ui/fleet").text
        pools = re.search(r'<table id="pools">.*?</table>', fleet, re.S).group(0)
        assert '<td class="num">12</td>' in pools  # on-prem GPUs busy: 8 + 4 running there
        for node in seeded.client.get("/v1/nodes", headers=admin).json()["nodes"]:
            row = re.search(rf'<tr data-node="{node["id"]}">(.*?)</tr>', fleet, re.S)
            assert row, node["id"]
            assert f'{node["price_usd_hour"]:.2f}' in row.group(1)
            assert node["state"] in row.group(1)
            measured = node["gpu_utilisation_percent"]
            assert (f"{measured:.0f}%" if measured is not None else "unknown") in row.group(1)
        budgets = ui.get("/ui/budgets").text
        for b in seeded.client.get("/v1/budgets", headers=admin).json()["budgets"]:
            section = budgets.split(f'data-budget="{b["policy"]}/{b["budget"]}"')[1]
            section = section.split("</section>")[0]
            for key in ("spent_usd", "limit_usd", "forecast_usd"):
                assert f"${float(b[key]):,.2f}" in section, (b["budget"], key)
        spend = ui.get("/ui/spend?by=project&days=30").text
        costs = seeded.client.get("/v1/costs", headers=admin,
                                  params={"group_by": "day,project", "from": "30d"}).json()
        assert costs["rows"] and f'${float(costs["total"]["cost_usd"]):,.2f}' in spend
        decisions = ui.get("/ui/decisions").text
        listed = seeded.client.get("/v1/decisions", headers=admin).json()
        assert listed and all(d["id"] in decisions for d in listed)
        one = ui.get(f"/ui/decisions/{listed[0]['id']}").text
        assert listed[0]["rule"] in one and "Offerings weighed" in one
        queue = ui.get("/ui/queue").text
        api_queue = seeded.client.get("/v1/queue", headers=admin).json()
        for job in api_queue["jobs"]:
            row = re.search(rf'<tr data-project="[^"]+" data-job="{job["id"]}">(.*?)</tr>',
                            queue, re.S)
            assert row and f'<td>{job["user"] or "-"}</td>' in row.group(1), job["id"]
        assert "What holds launches back" in queue


def test_a_viewer_sees_only_its_projects_rows_everywhere(seeded: Seeded) -> None:
    with session(seeded, seeded.tokens.viewer) as ui:  # a viewer of research
        fleet = ui.get("/ui/fleet").text
        assert 'data-node="n1"' in fleet
        assert not re.search(r'data-node="n[234]"', fleet)
        queue = ui.get("/ui/queue").text
        assert 'data-project="research"' in queue and "vision" not in queue
        assert "What holds launches back" not in queue
        budgets = ui.get("/ui/budgets").text
        assert "research-day" in budgets and "vision-day" not in budgets
        assert "pool-month" not in budgets
        spend = ui.get("/ui/spend").text
        assert "research" in spend and "vision" not in spend
        csv = ui.get("/ui/spend.csv?by=project&days=30")
        assert csv.status_code == 200 and csv.headers["content-type"].startswith("text/csv")
        assert "research" in csv.text and "vision" not in csv.text
        by_provider = ui.get("/ui/spend.csv?by=provider&days=30").text
        api = seeded.client.get("/v1/costs", headers=bearer(seeded.tokens.viewer),
                                params={"group_by": "day,provider", "from": "30d"},
                                ).json()
        assert f'{float(api["total"]["cost_usd"]):.2f}' in by_provider
        assert ui.get("/ui/decisions").status_code == 403
        assert ui.get("/ui/decisions/d-anything").status_code == 403


def test_static_assets_and_unknown_paths(seeded: Seeded, tmp_path: Path) -> None:
    with httpx.Client(base_url=seeded.base, timeout=30) as anon:
        assert anon.get("/ui/static/ui.css").headers["content-type"].startswith("text/css")
        assert anon.get("/ui/static/refresh.js").status_code == 200
        assert anon.get("/ui/static/../../etc/passwd").status_code == 404
        assert anon.get("/ui/static/secret.txt").status_code == 404
