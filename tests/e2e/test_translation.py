"""The translation page in a real browser on the offline minis: alignment chart, comparison, hostile input."""
from tests.e2e.conftest import (MARKUP, assert_healthy, assert_nothing_injected, charts_visible,
                                open_page, screenshot, wait_until_idle)


def test_translation_page_shows_the_alignment_of_the_mini_transformer(page, app_url):
    open_page(page, app_url, "translation")
    assert_healthy(page)
    body = page.inner_text("body")
    assert "mini Transformer" in body and "Translation" in body
    assert charts_visible(page) >= 1
    screenshot(page, "translation")
    page.get_by_role("tab", name="Step through decoding").click()
    wait_until_idle(page)
    assert_healthy(page)
    assert "Step 1 of" in page.inner_text("body") and charts_visible(page) >= 2  # source bars and candidates
    page.get_by_role("tab", name="Transformer vs GRU").click()
    wait_until_idle(page)
    assert_healthy(page)
    assert charts_visible(page) >= 2  # the Transformer's cross-attention and the GRU's additive attention
    screenshot(page, "translation-compare")


def test_translation_page_hostile_and_unknown_input_is_a_message(watched, app_url):
    page = watched
    open_page(page, app_url, "translation")
    box = page.get_by_label("English sentence")
    box.fill(MARKUP + " The council approved the report.")
    box.press("Control+Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert_nothing_injected(page)
    assert "does not know" in page.inner_text("body")
    assert page.locator('[data-testid="stDataFrame"]').count() == 1  # the unknown words with suggestions
    screenshot(page, "translation-unknown-words")
    box.fill("The council approved the report.")
    box.press("Control+Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert "does not know" not in page.inner_text("body")
    assert charts_visible(page) >= 1
