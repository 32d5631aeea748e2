"""The dashboard in a real headless Chromium (the Debian ``chromium`` package, driven by
Playwright through ``executable_path``), over one seeded API server and one browser for the
module: each page loads with no console error and no failed request, shows the API's numbers,
sign-in refuses a bad token, a viewer of one project never sees another's rows, pages work with
JavaScript off and at phone width, and a screenshot of each page is written (to
``$BURST_UI_SCREENSHOTS`` when set: ``docs/dashboard/`` holds the committed ones).

Marked ``long`` (CI's second step): starting a browser costs seconds the default suite has not.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.api_support import bearer
from tests.integration.ui_support import Seeded, seeded_server

pytestmark = pytest.mark.long
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PAGES = ("fleet", "queue", "budgets", "spend", "decisions")


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    with seeded_server(tmp_path_factory.mktemp("ui-browser")) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator:
    from playwright.sync_api import sync_playwright  # the test extra installs it

    if not Path(CHROMIUM).exists():
        pytest.fail("chromium is missing: install the Debian package chromium (.ci/run does)")
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = os.environ.get("BURST_UI_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("shots")
    path.mkdir(parents=True, exist_ok=True)
    return path


class Watched:
    """A page whose console errors and failed requests are collected."""

    def __init__(self, context, base: str) -> None:
        self.page = context.new_page()
        self.base = base
        self.problems: list[str] = []
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(
            f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(
            f"failed: {r.url} {r.failure}"))
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(
            f"HTTP {r.status}: {r.url}"))

    def sign_in(self, secret: str) -> None:
        self.page.goto(f"{self.base}/ui/login")
        self.page.get_by_label("API token").fill(secret)
        self.page.get_by_role("button", name="Sign in").click()
        self.page.wait_for_url(f"{self.base}/ui/fleet")

    def open(self, name: str) -> None:
        self.page.goto(f"{self.base}/ui/{name}")
        self.page.wait_for_load_state("load")


def test_every_page_loads_clean_shows_the_api_numbers_and_is_captured(
        browser, seeded: Seeded, shots: Path) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    watched = Watched(context, seeded.base)
    watched.sign_in(seeded.tokens.admin)
    cookie = next(c for c in context.cookies() if c["name"] == "burst_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    admin = bearer(seeded.tokens.admin)
    for name in PAGES:
        watched.open(name)
        assert seeded.tokens.admin not in watched.page.url
        watched.page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
    # The numbers, read from the rendered page as a person sees them.
    watched.open("fleet")
    for node in seeded.client.get("/v1/nodes", headers=admin).json()["nodes"]:
        row = watched.page.locator(f'tr[data-node="{node["id"]}"]')
        assert row.locator("td.price").inner_text() == f'{node["price_usd_hour"]:.2f}'
    watched.open("budgets")
    for b in seeded.client.get("/v1/budgets", headers=admin).json()["budgets"]:
        section = watched.page.locator(f'section[data-budget="{b["policy"]}/{b["budget"]}"]')
        assert section.locator("td.spent-usd").inner_text() == f'${float(b["spent_usd"]):,.2f}'
        assert section.locator("svg.burnup polyline.actual").count() == 1
    decision = seeded.client.get("/v1/decisions", headers=admin).json()[0]
    watched.open("decisions")
    watched.page.get_by_role("link", name=decision["id"]).click()
    watched.page.wait_for_load_state("load")
    assert watched.page.locator("dd.rule").inner_text() == decision["rule"]
    watched.page.screenshot(path=str(shots / "decision.png"), full_page=True)
    # Keyboard: the first Tab reaches the skip link, Enter moves to the content.
    watched.page.keyboard.press("Tab")
    assert watched.page.evaluate("document.activeElement.textContent") == "Skip to content"
    assert watched.problems == []
    context.close()


def test_sign_in_refuses_a_bad_token(browser, seeded: Seeded) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{seeded.base}/ui/fleet")
    assert page.url.endswith("/ui/login")
    page.get_by_label("API token").fill("bat_not-a-real-token")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_load_state("load")
    assert page.get_by_role("alert").inner_text() == "That token is not valid."
    assert not [c for c in context.cookies() if c["name"] == "burst_ui"]
    context.close()


def test_a_viewer_never_sees_another_projects_rows(browser, seeded: Seeded, shots: Path) -> None:
    context = browser.new_context(viewport={"width": 390, "height": 844},
                                  accept_downloads=True)  # a phone
    watched = Watched(context, seeded.base)
    watched.sign_in(seeded.tokens.viewer)  # research only
    for name in ("fleet", "queue", "budgets", "spend"):
        watched.open(name)
        text = watched.page.locator("main").inner_text()
        assert "vision" not in text, name
    watched.open("queue")
    watched.page.screenshot(path=str(shots / "queue-phone-viewer.png"), full_page=True)
    watched.open("spend")
    with watched.page.expect_download() as download:
        watched.page.get_by_role("link", name="Download CSV").click()
    csv = Path(download.value.path()).read_text()
    assert "research" in csv and "vision" not in csv
    assert watched.problems == []
    # Decisions are the admin's: the page says so (and answers 403).
    watched.problems.clear()
    watched.open("decisions")
    assert "only an admin token" in watched.page.get_by_role("alert").inner_text()
    context.close()


def test_pages_work_with_javascript_off(browser, seeded: Seeded) -> None:
    context = browser.new_context(java_script_enabled=False)
    watched = Watched(context, seeded.base)
    watched.sign_in(seeded.tokens.admin)
    watched.open("budgets")
    assert watched.page.locator("section.budget").count() == 3
    assert not watched.page.locator("#auto-refresh").is_visible()  # refresh needs the script
    assert watched.problems == []
    context.close()
