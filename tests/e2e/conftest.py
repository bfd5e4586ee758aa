"""Browser end-to-end fixtures: the app started as the README does, driven by Debian's Chromium through Playwright.

Skipped (with the reason) where Chromium or Playwright is missing on a developer's machine; under ``CI=true`` (where
tests/run.sh installs both) that is a failure, so CI can never go green without them.
Screenshots go to ``$SCREENSHOT_DIR`` (default ``artifacts/screenshots``) and are listed at the end of the run.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.layout_audit import wait_idle

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(os.environ.get("SCREENSHOT_DIR", ROOT / "artifacts" / "screenshots"))
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
_taken: list[Path] = []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def app_url():
    """Start `streamlit run app/streamlit_app.py` on a free loopback port; stop it after the session."""
    port = _free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", STREAMLIT_BROWSER_GATHER_USAGE_STATS="false")
    (ROOT / "artifacts").mkdir(parents=True, exist_ok=True)
    log = open(ROOT / "artifacts" / "e2e-streamlit.log", "w")
    process = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "streamlit_app.py"), "--server.headless", "true",
         "--server.port", str(port), "--server.address", "127.0.0.1", "--browser.gatherUsageStats", "false"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 90
    while time.time() < deadline:
        try:
            if urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).status == 200:
                break
        except OSError:
            time.sleep(0.5)
    else:
        process.kill()
        pytest.fail("the app did not start within 90 s (see artifacts/e2e-streamlit.log)")
    yield url
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


def require_browser() -> None:
    """Chromium and Playwright, or the browser tests cannot run: a failure under CI (``CI=true``), where tests/run.sh
    installs both, and a skip with the reason on a developer's machine without them."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install -r requirements-dev.txt)")
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        missing.append(f"Chromium at {CHROMIUM} (apt-get install -y chromium)")
    if missing:
        message = "the browser tests need " + " and ".join(missing)
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message + " (CI=true: a missing browser is a failure, not a skip)")
        pytest.skip(message)


@pytest.fixture(scope="session")
def browser():
    require_browser()
    import playwright.sync_api as playwright
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    # Streamlit scrolls inside its own container, so a full-page screenshot is the viewport: make it tall
    context = browser.new_context(viewport={"width": 1400, "height": 2600})
    page = context.new_page()
    page.set_default_timeout(120_000)
    yield page
    context.close()


def wait_until_idle(page, timeout_s: float = 180) -> None:
    """Wait until Streamlit has finished running the script and every visible chart has drawn, for half a second
    in a row (``layout_audit.wait_idle``: the script state, spinners and progress bars (model loading), stale
    elements of the previous run, Vega charts without their marks yet). The first 0.3 s let a click's rerun start.
    """
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_s * 1000)
    page.wait_for_timeout(300)
    wait_idle(page, timeout_s, settle_s=0.5, drawing_s=10)


def open_page(page, app_url: str, path: str, timeout_s: float = 240) -> None:
    page.goto(f"{app_url}/{path}")
    wait_until_idle(page, timeout_s)


def assert_healthy(page) -> None:
    """No exception box, no traceback on the page."""
    exceptions = page.locator('[data-testid="stException"]')
    assert exceptions.count() == 0, exceptions.first.inner_text()[:2000]
    assert "Traceback" not in page.locator('[data-testid="stMain"]').inner_text()


def charts_visible(page, settle_s: float = 1, timeout_s: float = 30) -> int:
    """How many charts (Vega) and images are visible, once that number has not changed for ``settle_s`` (Vega draws
    after the script finishes, later on a busy machine); at most ``timeout_s`` of waiting."""
    def count() -> int:
        return (page.locator('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg').count()
                + page.locator('[data-testid="stImage"] img').count())

    seen, since, deadline = count(), time.time(), time.time() + timeout_s
    while time.time() - since < settle_s and time.time() < deadline:
        time.sleep(0.25)
        now = count()
        if now != seen:
            seen, since = now, time.time()
    return seen


MARKUP = ("<script>window.__pwned=1;alert('typed')</script>"
          "<img id=\"pwned\" src=x onerror=\"window.__pwned=1;alert('img')\">")
LEAK_URL = "http://127.0.0.1:9/leak.png"


@pytest.fixture
def watched(page):
    """The page, with every JavaScript dialog and every request to LEAK_URL recorded."""
    page.dialogs, page.leaks = [], []

    def on_dialog(dialog):
        page.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    page.on("request", lambda request: page.leaks.append(request.url) if "leak.png" in request.url else None)
    return page


def assert_nothing_injected(page) -> None:
    """No typed MARKUP became an element or ran, in the page or in any frame on it (a component's iframe); needs the
    ``watched`` page."""
    for frame in page.frames:
        injected = frame.evaluate("""() => ({
            element: document.getElementById('pwned') !== null || document.querySelector("img[src='x']") !== null,
            script: [...document.scripts].some(script => script.textContent.includes('__pwned')),
            ran: window.__pwned !== undefined,
        })""")
        assert injected == {"element": False, "script": False, "ran": False}, (frame.url, injected)
    assert not page.dialogs, f"a dialog opened: {page.dialogs}"
    assert not page.leaks, f"the browser fetched {page.leaks}"


def screenshot(page, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    _taken.append(path)
    return path


def pytest_terminal_summary(terminalreporter):
    if _taken:
        terminalreporter.write_sep("-", "browser screenshots")
        for path in _taken:
            terminalreporter.write_line(str(path))
