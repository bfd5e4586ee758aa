"""Reference screenshots of every page and every tab: ``python bench/screenshots.py [--root DIR] --out DIR``.

Starts ``DIR/.venv/bin/streamlit run app/streamlit_app.py`` (offline, no warm-up) on ``--port``, opens each page in
headless Chromium (Playwright), waits until the app is idle (script not running, connected, no spinner, no progress
bar, no running-man status widget, for ``--settle`` seconds in a row), and saves a full-page PNG; then clicks each
other tab and saves one PNG per tab, nested tabs included (the GPT page's "Attention on the prompt" has its own "One
head / All heads / Token focus"). Files are named ``<page>__<tab index>-<tab label slug>.png``, a nested tab's
``<page>__<outer>-<slug>__<inner>-<slug>.png``. ``--presentation`` opens every page in presentation mode
(``?presentation=True``; use it with ``--width 1920 --height 1080``, a projector). ``index.json`` in the output
folder lists, per screenshot, the page, the tab, the file, whether the page went idle, and the text of any Streamlit
exception (``stException``) or alert box (``stAlert``) shown.

Meant for before/after comparisons of a refactor: run it once on a checkout of the old code and once on the new one,
with the same ``--width``. A page that fails or never goes idle is still screenshotted and the run goes on.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import unicodedata
import urllib.request
from pathlib import Path

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script too (python bench/screenshots.py)
from app import catalog  # noqa: E402

# (name used in file names, URL path), every page of the catalog. The first page is the default one, at the root URL.
PAGES = [(page.name, "/" if index == 0 else f"/{page.name}") for index, page in enumerate(catalog.PAGES)]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
VIEWPORT_HEIGHT = 1000
MAX_PAGE_HEIGHT = 16000  # px; a taller page is cut here (Chromium struggles with huge captures)

# What "busy" means, read in the page. Streamlit sets data-test-script-state / data-test-connection-state on stApp
# for its own end-to-end tests; the widgets are checked too, in case those attributes ever go away.
BUSY_JS = """() => {
  const reasons = [];
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app) return ['no stApp'];
  const state = app.getAttribute('data-test-script-state');
  if (state !== null && state !== 'notRunning' && state !== 'compilationError') reasons.push('script ' + state);
  const conn = app.getAttribute('data-test-connection-state');
  if (conn !== null && conn !== 'CONNECTED' && conn !== 'STATIC_CONNECTED') reasons.push('connection ' + conn);
  for (const w of document.querySelectorAll('[data-testid="stStatusWidget"]')) {
    const text = (w.innerText || '') + ' ' + Array.from(w.querySelectorAll('[aria-label]'))
      .map(e => e.getAttribute('aria-label')).join(' ');
    if (/running/i.test(text) || w.querySelector('[data-testid="stStatusWidgetRunningIcon"]'))
      reasons.push('status widget running');
  }
  if (document.querySelector('[data-testid="stSpinner"]')) reasons.push('spinner');
  if (document.querySelector('[data-testid="stProgress"]')) reasons.push('progress bar');
  if (document.querySelector('[data-testid="stSkeleton"]')) reasons.push('skeleton');
  const main = document.querySelector('[data-testid="stMain"]') || app;
  if (!main.querySelector('[data-testid="stElementContainer"]')) reasons.push('main area empty');
  return reasons;
}"""

# The tabs of visible st.tabs group number ``depth`` in the main area, outer groups before the groups nested in
# them (document order): [label, selected].
TABS_JS = """(depth = 0) => {
  const main = document.querySelector('[data-testid="stMain"]') || document;
  const group = Array.from(main.querySelectorAll('[data-testid="stTabs"]')).filter(g => g.offsetParent !== null)[depth];
  if (!group) return [];
  return Array.from(group.querySelectorAll('[role="tab"]'))
    .filter(t => t.closest('[data-testid="stTabs"]') === group)
    .map(t => [(t.innerText || '').trim(), t.getAttribute('aria-selected') === 'true']);
}"""

CLICK_TAB_JS = """([depth, index]) => {
  const main = document.querySelector('[data-testid="stMain"]') || document;
  const group = Array.from(main.querySelectorAll('[data-testid="stTabs"]')).filter(g => g.offsetParent !== null)[depth];
  const tabs = Array.from(group.querySelectorAll('[role="tab"]'))
    .filter(t => t.closest('[data-testid="stTabs"]') === group);
  tabs[index].scrollIntoView({block: 'center'});
  const r = tabs[index].getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2];
}"""

SELECTED_JS = """([depth, index]) => {
  const main = document.querySelector('[data-testid="stMain"]') || document;
  const group = Array.from(main.querySelectorAll('[data-testid="stTabs"]')).filter(g => g.offsetParent !== null)[depth];
  const tabs = Array.from(group.querySelectorAll('[role="tab"]'))
    .filter(t => t.closest('[data-testid="stTabs"]') === group);
  return tabs[index] && tabs[index].getAttribute('aria-selected') === 'true';
}"""

PROBLEMS_JS = """() => {
  const text = sel => Array.from(document.querySelectorAll(sel)).map(e => (e.innerText || '').trim()).filter(Boolean);
  return {exceptions: text('[data-testid="stException"]'), alerts: text('[data-testid="stAlert"]')};
}"""

# The height of the page's content: Streamlit scrolls inside its own containers, not the document.
HEIGHT_JS = """() => {
  let h = document.documentElement.scrollHeight;
  for (const sel of ['[data-testid="stAppViewContainer"]', '[data-testid="stMain"]',
                     '[data-testid="stAppScrollToBottomContainer"]', '[data-testid="stSidebarContent"]'])
    for (const e of document.querySelectorAll(sel)) h = Math.max(h, e.scrollHeight);
  return h;
}"""


def slug(label: str) -> str:
    """'① Step by step' -> '1-step-by-step'; an empty label -> 'tab'."""
    ascii_label = unicodedata.normalize("NFKD", label).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", ascii_label.lower()).strip("-") or "tab"


def wait_idle(page: Page, timeout_s: float, settle_s: float) -> tuple[bool, list[str]]:
    """Wait until the app has been idle for settle_s seconds in a row; (idle, the last busy reasons seen)."""
    deadline = time.monotonic() + timeout_s
    idle_since = None
    reasons: list[str] = ["not checked"]
    while time.monotonic() < deadline:
        try:
            reasons = page.evaluate(BUSY_JS)
        except PlaywrightError as error:  # navigation in progress, page crashed...
            reasons = [f"evaluate failed: {error.message.splitlines()[0]}"]
        now = time.monotonic()
        if reasons:
            idle_since = None
            if any(r.startswith("connection DISCONNECTED_FOREVER") for r in reasons):
                return False, reasons
        elif idle_since is None:
            idle_since = now
        elif now - idle_since >= settle_s:
            return True, []
        page.wait_for_timeout(250)
    return False, reasons


def screenshot(page: Page, path: Path, width: int, viewport_height: int = VIEWPORT_HEIGHT) -> None:
    """Full-page PNG: the viewport is made as tall as the content for the capture, then put back."""
    try:
        height = min(max(int(page.evaluate(HEIGHT_JS)), viewport_height), MAX_PAGE_HEIGHT)
    except PlaywrightError:
        height = viewport_height
    page.set_viewport_size({"width": width, "height": height})
    # Park the mouse over the empty header: where the last click was may now be over an element whose hover toolbar
    # (fullscreen button, sidebar collapse arrow) would show in the capture.
    page.mouse.move(width * 0.6, 2)
    try:
        page.wait_for_timeout(800)  # let charts reflow to the new size
        page.screenshot(path=str(path), full_page=True, animations="disabled")
    finally:
        page.set_viewport_size({"width": width, "height": viewport_height})


def problems(page: Page) -> dict:
    try:
        return page.evaluate(PROBLEMS_JS)
    except PlaywrightError as error:
        return {"exceptions": [], "alerts": [], "error": error.message.splitlines()[0]}


def start_server(root: Path, port: int, log_path: Path) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", ATTN_EXPLORER_WARMUP="0")
    command = [str(root / ".venv" / "bin" / "streamlit"), "run", "app/streamlit_app.py",
               "--server.headless", "true", "--server.port", str(port)]
    log = open(log_path, "wb")
    # A process group of its own, so the whole server (and anything it spawned) can be ended at the end.
    return subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_server(server: subprocess.Popen) -> None:
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait()


def wait_for_server(server: subprocess.Popen, base: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {server.returncode} before serving")
        try:
            with urllib.request.urlopen(base + "/_stcore/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"streamlit did not answer {base}/_stcore/health within {timeout_s:.0f} s")


def capture_page(page: Page, name: str, url: str, out: Path, args: argparse.Namespace) -> list[dict]:
    """Screenshots of one page: as loaded, then every other tab, nested tab groups walked inside each tab."""
    entries = []

    def shoot(path: tuple[tuple[int, str], ...], idle: bool, busy: list[str], started: float) -> None:
        file = name + "".join(f"__{index}-{slug(label)}" for index, label in path or ((0, "page"),)) + ".png"
        error = None
        try:
            screenshot(page, out / file, args.width, args.height)
        except PlaywrightError as e:
            error = e.message.splitlines()[0]
        seen = problems(page)
        entry = {"page": name, "url": url, "tab_index": path[-1][0] if path else 0,
                 "tab_label": " › ".join(label for _, label in path) or "page", "file": file, "idle": idle,
                 "busy": busy, "seconds": round(time.monotonic() - started, 1),
                 "exceptions": seen["exceptions"], "alerts": seen["alerts"]}
        if error or seen.get("error"):
            entry["error"] = error or seen["error"]
        entries.append(entry)
        flags = "" if idle else f"  NOT IDLE ({', '.join(busy)})"
        flags += f"  EXCEPTIONS: {len(seen['exceptions'])}" if seen["exceptions"] else ""
        flags += f"  ALERTS: {len(seen['alerts'])}" if seen["alerts"] else ""
        flags += f"  ERROR: {entry['error']}" if "error" in entry else ""
        print(f"{file}  ({entry['seconds']} s){flags}", flush=True)

    def walk(depth: int, path: tuple, idle: bool, busy: list[str], started: float) -> None:
        try:
            tabs = page.evaluate(TABS_JS, depth)
        except PlaywrightError:
            tabs = []
        if not tabs:
            shoot(path, idle, busy, started)
            return
        selected = next((i for i, (_, is_selected) in enumerate(tabs) if is_selected), 0)
        for index in [selected] + [i for i in range(len(tabs)) if i != selected]:
            if index != selected:
                started = time.monotonic()
                try:
                    x, y = page.evaluate(CLICK_TAB_JS, [depth, index])
                    page.mouse.click(x, y)
                    page.wait_for_function(SELECTED_JS, arg=[depth, index], timeout=15000)
                except PlaywrightError as error:
                    print(f"{name}: tab {index} ({tabs[index][0]!r}) click failed: {error.message.splitlines()[0]}",
                          flush=True)
                idle, busy = wait_idle(page, args.tab_timeout, args.settle)
            walk(depth + 1, path + ((index, tabs[index][0]),), idle, busy, started)

    started = time.monotonic()
    try:
        page.goto(url, wait_until="domcontentloaded", timeout=args.load_timeout * 1000)
    except PlaywrightError as error:
        print(f"{name}: navigation failed: {error.message.splitlines()[0]}", flush=True)
    idle, busy = wait_idle(page, args.load_timeout, args.settle)
    walk(0, (), idle, busy, started)
    return entries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="checkout whose app to serve (default: the repository this script is in)")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs and index.json")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--url", help="an app already running there (no server is started)")
    parser.add_argument("--width", type=int, default=1400, help="browser viewport width in px")
    parser.add_argument("--height", type=int, default=VIEWPORT_HEIGHT,
                        help="browser viewport height in px (what is above the fold)")
    parser.add_argument("--presentation", action="store_true",
                        help="open every page in presentation mode (?presentation=True)")
    parser.add_argument("--pages", nargs="*", default=[name for name, _ in PAGES], help="subset of pages to visit")
    parser.add_argument("--load-timeout", type=float, default=180, help="seconds for a page to go idle")
    parser.add_argument("--tab-timeout", type=float, default=180, help="seconds for a tab to go idle")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of continuous idleness required")
    args = parser.parse_args(argv)

    root = args.root.resolve()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    base = (args.url or f"http://localhost:{args.port}").rstrip("/")
    chosen = [(name, path) for name, path in PAGES if name in args.pages]
    entries: list[dict] = []
    run_started = time.monotonic()

    server = None if args.url else start_server(root, args.port, out / "streamlit.log")
    try:
        if server is not None:
            wait_for_server(server, base, args.load_timeout)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                context = browser.new_context(viewport={"width": args.width, "height": args.height})
                page = context.new_page()
                for name, path in chosen:
                    try:
                        url = base + path + ("?presentation=True" if args.presentation else "")
                        entries.extend(capture_page(page, name, url, out, args))
                    except Exception as error:  # noqa: BLE001 - one broken page must not stop the others
                        print(f"{name}: failed: {type(error).__name__}: {error}", flush=True)
                        entries.append({"page": name, "url": base + path, "error": f"{type(error).__name__}: {error}"})
                        page = context.new_page()
            finally:
                browser.close()
    finally:
        if server is not None:
            stop_server(server)
        index = {"root": str(root), "width": args.width, "height": args.height, "presentation": args.presentation,
                 "seconds": round(time.monotonic() - run_started, 1),
                 "screenshots": entries}
        (out / "index.json").write_text(json.dumps(index, indent=2, ensure_ascii=False) + "\n")
    print(f"{len(entries)} screenshots in {out} ({index['seconds']} s)", flush=True)
    return 0 if all(entry.get("idle") and not entry.get("error") for entry in entries) else 1


if __name__ == "__main__":
    sys.exit(main())
