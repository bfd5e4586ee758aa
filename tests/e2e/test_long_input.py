"""The GPT page at 2,048 tokens in a real browser: the overview image, the cell-by-cell zoom with its range sliders,
the all-heads grid and the per-head statistics table all render, charts fit their columns, and another head re-draws
without a model run."""
import re

from tests.e2e.conftest import assert_healthy, open_page, screenshot, wait_until_idle

SENTENCES = ["The animal didn't cross the street because it was too tired.",
             "Mr and Mrs Dursley of number four, Privet Drive, were proud to say that they were perfectly normal.",
             "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)"]


def long_text(sentences: int = 260) -> str:
    """About 4,000 SmolLM2 tokens: longer than the 2,048-token limit set below, so truncation shows too."""
    return " ".join(SENTENCES[i % len(SENTENCES)] for i in range(sentences))


def test_gpt_page_stays_usable_at_2048_tokens(page, app_url):
    open_page(page, app_url, "?max_tokens=2048", timeout_s=300)
    box = page.locator("textarea[aria-label=\"Prompt\"]")
    box.fill(long_text())
    box.press("Control+Enter")
    wait_until_idle(page, timeout_s=300)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "2048 tokens · 30 layers × 9 heads" in body
    assert "only the first 2,048 are shown" in body
    assert "all 2048 × 2048" in body  # the overview caption: the whole map, as one image
    main = page.locator('[data-testid="stMain"]')
    assert main.locator('[data-testid="stSlider"]:has-text("Zoom: query tokens")').count() == 1
    assert main.locator('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg').count() >= 2
    screenshot(page, "gpt-long-2048")

    for chart in main.locator('[data-testid="stVegaLiteChart"]').all():  # none is cut off by (or scaled to) its column
        box_chart, box_column = chart.bounding_box(), chart.locator("xpath=ancestor::*[@data-testid='stColumn'][1]")
        if box_column.count():
            column = box_column.bounding_box()
            assert box_chart["x"] + box_chart["width"] <= column["x"] + column["width"] + 1

    page.get_by_role("combobox", name="Head", exact=True).click()  # another head of the same run: no model re-run
    page.get_by_role("option", name="head 3", exact=True).click()
    wait_until_idle(page)
    assert_healthy(page)
    # the layer is the one the page chose for this text (models/analysis/showcase.py); the head is the one picked
    assert re.search(r"layer \d+, head 3: all 2048 × 2048", page.inner_text("body"))

    page.get_by_role("tab", name="All heads (model view)").click()
    wait_until_idle(page, timeout_s=300)  # the summary of 270 heads is computed once per input
    assert_healthy(page)
    assert main.locator('[data-testid="stDataFrame"]').count() >= 1  # the sortable per-head statistics
    assert main.locator('[data-testid="stImage"] img, [data-testid="stVegaLiteChart"] canvas, '
                        '[data-testid="stVegaLiteChart"] svg').count() >= 2
    screenshot(page, "gpt-long-2048-all-heads")
