"""The layout audit (issue 28) over every page of the catalog at both sizes: no figure out of its column or the
window, no overlap, no exception; in presentation mode the sidebar tucked away, a figure above the fold, the main
figure filling its column and text readable from the back of the hall. See tests/e2e/layout_audit.py.

One server and one browser for all of it; tabs are changed by clicking, so each page's run is computed once and
its tabs reuse the session's caches. Every view's measurements go to ``artifacts/layout-audit.jsonl``."""
import json
from dataclasses import asdict

import pytest

from app import catalog
from tests.e2e.conftest import ROOT
from tests.e2e.layout_audit import SIZES, audit_page

RECORD = ROOT / "artifacts" / "layout-audit.jsonl"


@pytest.fixture(scope="module")
def audit_tab(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(120_000)
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text("")
    yield page
    context.close()


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("entry", catalog.PAGES, ids=[p.name for p in catalog.PAGES])
def test_every_figure_fits(audit_tab, app_url, entry, size):
    path = "" if entry is catalog.PAGES[0] else entry.name
    views = audit_page(audit_tab, app_url, entry.name, path, size, log=lambda line: None)
    with RECORD.open("a") as record:
        for view in views:
            record.write(json.dumps(asdict(view), ensure_ascii=False) + "\n")
    problems = [f"{view.name}: {finding}" for view in views for finding in view.findings]
    assert views, f"{entry.name}: nothing was measured"
    assert not problems, f"{len(problems)} layout problem(s):\n" + "\n".join(problems)
