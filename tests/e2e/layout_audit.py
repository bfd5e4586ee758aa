"""The layout audit (issue 28): every page of the catalog and every tab, nested tabs included, in real Chromium, at a
laptop's 1280 × 800 and in presentation mode at a projector's 1920 × 1080.

``audit_page`` opens one page at one size, walks its tabs by clicking them (no reload: one server, one browser, the
session's caches stay warm), presses the buttons of ``FOLLOW_UPS`` (a generation, an example) where a tab's figures
wait for one, and measures what is drawn in each view with ``GEOMETRY_JS``. It returns one ``View``
per tab state; ``View.findings`` lists what a lecturer would see go wrong:

* a figure (a Vega chart's drawing, an image, a table) sticking out of its column or the window;
* two figures overlapping;
* an exception on the page, or a chart that never draws;
* in presentation mode: the sidebar open; no figure starting above the fold (in the page's default view, the first
  figure must start in the top ``FOLD_SHARE`` of the window, so that a good part of it shows); a chart or image not
  filling most of its column (``FILL_WIDTH`` of its width, or ``FILL_HEIGHT`` of the window's height: a square
  heatmap in a wide column); text in a chart under ``MIN_TEXT_PX`` (each SVG ``<text>``'s font size times the CSS
  scale of its drawing; a chart drawn on a canvas is a finding of its own, as its text cannot be read); the page's
  own text (widget labels, options, buttons, tabs, typed text, code) under ``MIN_TEXT_PX`` too.

Used by tests/e2e/test_layout_audit.py, and runnable alone against a running app for a report:
``python -m tests.e2e.layout_audit http://localhost:8501 [page ...]``.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field

SIZES = {"laptop": (1280, 800, False), "presentation": (1920, 1080, True)}
MIN_TEXT_PX = 18  # readable from the back of a lecture hall at 1920 px wide
FILL_WIDTH = 0.6  # a figure is at least this share of its column's width ...
FILL_HEIGHT = 0.5  # ... or of the window's height (a square heatmap in a wide column)
FOLD_SHARE = 0.7  # the page's first figure starts in this top share of the window (30% of it shows at least)
SLACK_PX = 2  # sub-pixel rounding
# Views that show their figures only after a button (a generation, an example to try): (page, tab) -> the buttons
# to press, by the start of their label; each press is audited as a view of its own
FOLLOW_UPS = {("gpt", "Generate and step through"): ("Generate",),
              ("gpt", "Which heads matter"): ("Switch off each",),
              ("gpt", "Knockout"): ("Try: cut", "Sweep"),
              ("gpt", "Patching"): ("Try: Eiffel",)}

# Everything measured in one pass of the page. Figures: Vega charts (their svg/canvas drawing, which is what sticks
# out when a chart is wider than its element), images, tables. A figure's column is its stColumn, else the main block;
# its content box is the column less its padding. Hidden tab panels have no layout and are skipped.
GEOMETRY_JS = r"""(MIN_TEXT_PX) => {
  const main = document.querySelector('[data-testid="stMain"]');
  // a closed expander keeps its content laid out, but nobody sees it
  const shown = e => {
    const r = e.getBoundingClientRect();
    return r.width > 2 && r.height > 2 && e.offsetParent !== null && !e.closest('details:not([open])');
  };
  const figures = [];
  for (const element of main.querySelectorAll('[data-testid="stVegaLiteChart"], [data-testid="stImage"], ' +
                                               '[data-testid="stDataFrame"], [data-testid="stTable"]')) {
    if (!shown(element)) continue;
    const kind = element.getAttribute('data-testid').replace(/^st/, '');
    let drawn = element;
    if (kind === 'VegaLiteChart')
      drawn = element.querySelector('svg.marks, canvas.marks') || element.querySelector('svg, canvas');
    if (kind === 'Image') drawn = element.querySelector('img') || element;
    if (!drawn || !shown(drawn)) continue;
    const r = drawn.getBoundingClientRect();
    const column = element.closest('[data-testid="stColumn"]')
      || element.closest('[data-testid="stMainBlockContainer"]');
    const c = column.getBoundingClientRect(), style = getComputedStyle(column);
    const left = c.left + parseFloat(style.paddingLeft), right = c.right - parseFloat(style.paddingRight);
    // a chart's name: its title, else its axis titles, else the text just above it
    let name = '';
    if (drawn.tagName === 'svg') {
      const title = drawn.querySelector('.role-title-text');
      const axes = Array.from(drawn.querySelectorAll('.role-axis-title text')).map(t => t.textContent);
      name = title ? title.textContent : axes.join(' / ');
    }
    if (kind === 'Image') name = (element.innerText || drawn.getAttribute('alt') || '').trim();
    const figure = {kind, name: name.slice(0, 60), x: r.left, y: r.top, w: r.width, h: r.height,
                    columnLeft: left, columnRight: right, columnWidth: right - left, texts: []};
    if (drawn.tagName === 'svg') {
      const scale = r.width / (drawn.width.baseVal.value || r.width);
      const sizes = [];
      for (const t of drawn.querySelectorAll('text')) {
        const content = t.textContent.trim();
        if (!content || t.closest('[opacity="0"], [fill-opacity="0"]')) continue;
        const px = parseFloat(t.getAttribute('font-size') || getComputedStyle(t).fontSize) * scale;
        sizes.push([Math.round(px * 10) / 10, content.slice(0, 24)]);
      }
      sizes.sort((a, b) => a[0] - b[0]);
      figure.texts = sizes.slice(0, 3);
      figure.minText = sizes.length ? sizes[0][0] : null;
    }
    if (kind === 'VegaLiteChart' && drawn.tagName === 'CANVAS') figure.canvas = true;
    figures.push(figure);
  }
  // the page's own text (labels, options, buttons, tabs, typed text, code) under the figures' minimum, by the
  // element that holds it; formulas' sub- and superscripts (KaTeX) are smaller by design and not counted
  const smallText = {};
  const walker = document.createTreeWalker(main, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode, holder = node.parentElement;
    const content = node.textContent.replace(/[\u200b\s]/g, '');
    if (!content || holder.closest('svg, .katex, [data-testid="stDataFrame"]') || !shown(holder)) continue;
    const px = parseFloat(getComputedStyle(holder).fontSize);
    if (px >= MIN_TEXT_PX - 0.05) continue;
    const place = holder.closest('[data-testid]');
    const key = (place ? place.getAttribute('data-testid') : holder.tagName) + ' at ' + Math.round(px * 10) / 10 + ' px';
    if (!(key in smallText)) smallText[key] = content.slice(0, 24);
  }
  const undrawn = Array.from(main.querySelectorAll('[data-testid="stVegaLiteChart"]')).filter(c =>
    shown(c) && !c.querySelector('svg.marks, canvas.marks')).length;
  const sidebar = document.querySelector('[data-testid="stSidebar"]');
  const sr = sidebar ? sidebar.getBoundingClientRect() : null;
  return {
    viewport: [innerWidth, innerHeight],
    figures,
    exceptions: Array.from(document.querySelectorAll('[data-testid="stException"]'))
      .map(e => e.innerText.slice(0, 300)),
    undrawn,
    smallText,
    sidebarWidth: sr && sr.right > 0 && getComputedStyle(sidebar).visibility !== 'hidden' ? Math.round(sr.right) : 0,
  };
}"""

# The tab groups on screen, outer before inner (document order), with their labels and which tab is selected.
TAB_GROUPS_JS = r"""() => {
  const main = document.querySelector('[data-testid="stMain"]');
  return Array.from(main.querySelectorAll('[data-testid="stTabs"]')).filter(g => g.offsetParent !== null).map(g =>
    Array.from(g.querySelectorAll('[role="tab"]')).filter(t => t.closest('[data-testid="stTabs"]') === g)
      .map(t => [(t.innerText || '').trim(), t.getAttribute('aria-selected') === 'true']));
}"""

# The centre of tab ``tab`` of visible group ``group``, scrolled into view, to click it as a person would.
TAB_POSITION_JS = r"""([group, tab]) => {
  const main = document.querySelector('[data-testid="stMain"]');
  const g = Array.from(main.querySelectorAll('[data-testid="stTabs"]')).filter(g => g.offsetParent !== null)[group];
  const t = Array.from(g.querySelectorAll('[role="tab"]')).filter(t => t.closest('[data-testid="stTabs"]') === g)[tab];
  t.scrollIntoView({block: 'center'});
  const r = t.getBoundingClientRect();
  return [r.x + r.width / 2, r.y + r.height / 2];
}"""

BUSY_JS = r"""() => {
  const app = document.querySelector('[data-testid="stApp"]');
  if (!app) return 'no app';
  const state = app.getAttribute('data-test-script-state');
  if (state !== 'notRunning' && state !== 'compilationError') return 'script ' + state;
  if (document.querySelector('[data-testid="stSpinner"], [data-testid="stProgress"], [data-testid="stSkeleton"]'))
    return 'spinner';
  if (document.querySelector('[data-stale="true"]')) return 'stale';
  const main = document.querySelector('[data-testid="stMain"]');
  if (!main || !main.querySelector('[data-testid="stElementContainer"]')) return 'empty';
  for (const chart of main.querySelectorAll('[data-testid="stVegaLiteChart"]'))
    if (chart.offsetParent !== null && !chart.querySelector('svg.marks, canvas.marks')) return 'chart drawing';
  return '';
}"""


@dataclass
class View:
    """One state of a page (which tab of each group is open) and what the audit found there."""

    page: str
    size: str
    tabs: tuple[str, ...]
    default: bool  # the page as it opens (every group on its selected tab)
    geometry: dict
    findings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.page} @ {self.size}" + (f" [{' › '.join(self.tabs)}]" if self.tabs else "")


def _label(figure: dict) -> str:
    name = f" '{figure['name']}'" if figure.get("name") else ""
    return f"{figure['kind']}{name} ({round(figure['w'])} × {round(figure['h'])} px)"


def findings(geometry: dict, presentation: bool, default: bool) -> list[str]:
    """What is wrong in one measured view (see the module docstring)."""
    found = []
    width, height = geometry["viewport"]
    figures = geometry["figures"]
    for figure in figures:
        right, left = figure["x"] + figure["w"], figure["x"]
        if right > figure["columnRight"] + SLACK_PX or left < figure["columnLeft"] - SLACK_PX:
            over = max(right - figure["columnRight"], figure["columnLeft"] - left)
            found.append(f"{_label(figure)} sticks out of its {round(figure['columnWidth'])}-px column by "
                         f"{round(over)} px")
        if right > width + SLACK_PX:
            found.append(f"{_label(figure)} runs {round(right - width)} px off the window")
    for i, a in enumerate(figures):
        for b in figures[i + 1:]:
            dx = min(a["x"] + a["w"], b["x"] + b["w"]) - max(a["x"], b["x"])
            dy = min(a["y"] + a["h"], b["y"] + b["h"]) - max(a["y"], b["y"])
            if dx > SLACK_PX and dy > SLACK_PX:
                found.append(f"{_label(a)} and {_label(b)} overlap by {round(dx)} × {round(dy)} px")
    found += [f"exception on the page: {text}" for text in geometry["exceptions"]]
    if geometry.get("undrawn"):
        found.append(f"{geometry['undrawn']} chart(s) never drew (blank)")
    if not presentation:
        return found
    if geometry["sidebarWidth"] > 0:
        found.append(f"the sidebar is open ({geometry['sidebarWidth']} px)")
    for figure in figures:
        if figure["kind"] in ("VegaLiteChart", "Image") and figure["w"] < FILL_WIDTH * figure["columnWidth"] \
                and figure["h"] < FILL_HEIGHT * height:
            found.append(f"{_label(figure)} fills {figure['w'] / figure['columnWidth']:.0%} of its "
                         f"{round(figure['columnWidth'])}-px column and {figure['h'] / height:.0%} of the window's "
                         "height")
    if figures and default:
        top = min(f["y"] for f in figures)
        if top > FOLD_SHARE * height:
            found.append(f"no figure starts above the fold: the first starts at {round(top)} px of {height}")
    elif default:
        found.append("no figure on the page as it opens")
    for figure in figures:
        if figure.get("minText") is not None and figure["minText"] < MIN_TEXT_PX - 0.05:
            samples = ", ".join(f"'{text}' {px} px" for px, text in figure["texts"] if px < MIN_TEXT_PX - 0.05)
            found.append(f"{_label(figure)} has text under {MIN_TEXT_PX} px: {samples}")
        if figure.get("canvas"):
            found.append(f"{_label(figure)} is drawn on a canvas: its text cannot be measured")
    found += [f"the page's text is under {MIN_TEXT_PX} px: {where} ('{text}')"
              for where, text in geometry.get("smallText", {}).items()]
    return found


def wait_idle(page, timeout_s: float = 300, settle_s: float = 0.6, drawing_s: float = 30) -> None:
    """Until the script has finished, nothing is stale or spinning and every visible chart has drawn, for
    ``settle_s`` in a row. A chart that has not drawn ``drawing_s`` after the script finished is left to the
    audit (``undrawn`` in the geometry), which reports it."""
    deadline, since, busy, drawing = time.monotonic() + timeout_s, None, "", None
    while time.monotonic() < deadline:
        busy = page.evaluate(BUSY_JS)
        if busy == "chart drawing":
            drawing = drawing or time.monotonic()
            if time.monotonic() - drawing > drawing_s:
                return
        else:
            drawing = None
        if busy:
            since = None
        elif since is None:
            since = time.monotonic()
        elif time.monotonic() - since >= settle_s:
            return
        page.wait_for_timeout(150)
    raise AssertionError(f"the page was still busy after {timeout_s:.0f} s ({busy})")


def measure(page) -> dict:
    """The geometry, once two measurements 300 ms apart agree (Vega lays out after it draws; images load late)."""
    last = page.evaluate(GEOMETRY_JS, MIN_TEXT_PX)
    for _ in range(20):
        page.wait_for_timeout(300)
        now = page.evaluate(GEOMETRY_JS, MIN_TEXT_PX)
        if json.dumps(now["figures"]) == json.dumps(last["figures"]):
            return now
        last = now
    return last


def audit_page(page, base_url: str, name: str, path: str, size: str, log=print) -> list[View]:
    """Every tab state of one page at one size (``SIZES``), each measured and judged."""
    width, height, presentation = SIZES[size]
    page.set_viewport_size({"width": width, "height": height})
    page.goto(f"{base_url}/{path}" + ("?presentation=True" if presentation else ""))
    page.wait_for_selector('[data-testid="stApp"]', timeout=120_000)
    page.wait_for_timeout(500)
    wait_idle(page)
    views: list[View] = []

    def record(tabs: tuple[str, ...], default: bool) -> None:
        page.mouse.move(width - 5, height - 5)  # no hover toolbar or tooltip over a figure
        geometry = measure(page)
        view = View(name, size, tabs, default, geometry, findings(geometry, presentation, default))
        views.append(view)
        log(f"{view.name}: {len(view.findings)} finding(s)" + "".join(f"\n    {f}" for f in view.findings))

    def follow_up(tabs: tuple[str, ...]) -> None:
        for label in FOLLOW_UPS.get((name, tabs[-1] if tabs else ""), ()):
            button = page.locator('[data-testid="stMain"] button:visible').filter(has_text=label).first
            if not button.count():
                views.append(View(name, size, tabs + (f"after “{label}”",), False, {},
                                  [f"no button labelled “{label}…” to press (FOLLOW_UPS is out of date)"]))
                continue
            button.scroll_into_view_if_needed()
            button.click()
            page.wait_for_timeout(300)
            wait_idle(page)
            record(tabs + (f"after “{label}”",), False)

    def visit(depth: int, tabs: tuple[str, ...], default: bool) -> None:
        groups = page.evaluate(TAB_GROUPS_JS)
        if depth >= len(groups):
            record(tabs, default)
            follow_up(tabs)
            return
        labels = [label for label, _ in groups[depth]]
        selected = next((i for i, (_, chosen) in enumerate(groups[depth]) if chosen), 0)
        order = [selected] + [i for i in range(len(labels)) if i != selected]
        for i in order:
            if i != selected:
                x, y = page.evaluate(TAB_POSITION_JS, [depth, i])
                page.mouse.click(x, y)
                page.wait_for_timeout(300)
                wait_idle(page)
            visit(depth + 1, tabs + (labels[i],), default and i == selected)
            default = False

    visit(0, (), True)
    return views


def main(argv: list[str]) -> int:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, ".")
    from app import catalog

    base, wanted = argv[0].rstrip("/"), argv[1:]
    total = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium",
                                    args=["--headless", "--no-sandbox", "--disable-gpu"])
        page = browser.new_page()
        page.set_default_timeout(120_000)
        for index, entry in enumerate(catalog.PAGES):
            if wanted and entry.name not in wanted:
                continue
            for size in SIZES:
                views = audit_page(page, base, entry.name, "" if index == 0 else entry.name, size)
                count = sum(len(v.findings) for v in views)
                total += count
                print(f"== {entry.name} @ {size}: {count} finding(s) in {len(views)} view(s)", flush=True)
        browser.close()
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
