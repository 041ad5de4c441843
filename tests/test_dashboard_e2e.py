"""End to end in a real browser: start the app with streamlit, open it in headless Chromium
(Debian's, driven by Playwright), run the default scenario, and check that the headline cards
and the TTFT chart appear. A screenshot is saved in the test's output directory."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.streamlit_app import running_app

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: As the machine notes advise: no GPU, no background traffic to the (closed) internet.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("CI"),
    reason="Debian's chromium is not installed (make test installs it in CI)",
)


@pytest.fixture
def app_url(tmp_path: Path) -> Iterator[str]:
    with running_app(tmp_path, "--browser.gatherUsageStats", "false") as (url, _):
        yield url


def test_default_scenario_in_a_real_browser(app_url: str, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(app_url, wait_until="domcontentloaded")
            page.get_by_text("Valid:", exact=False).wait_for(timeout=60_000)
            page.get_by_role("link", name="Results").click()
            page.get_by_text("TTFT p90").first.wait_for(timeout=120_000)
            page.get_by_text("SLO attainment").first.wait_for(timeout=10_000)
            page.locator(".js-plotly-plot").first.wait_for(timeout=60_000)
            assert page.get_by_text("TTFT", exact=True).count() >= 1
            page.screenshot(path=str(tmp_path / "results.png"), full_page=True)
        finally:
            browser.close()
    assert (tmp_path / "results.png").stat().st_size > 10_000
