"""The GPT page's decoding penalties in a real browser: generate, then the before/after views of each penalty."""
from tests.e2e.conftest import assert_healthy, charts_visible, open_page, screenshot, wait_until_idle


def test_gpt_generate_tab_shows_each_penalty_before_and_after(page, app_url):
    open_page(page, app_url, "?gpt_tab=Generate+and+step+through")
    page.get_by_role("button", name="Generate").click()
    wait_until_idle(page, 300)
    assert_healthy(page)
    body = page.inner_text("body")
    for text in ("Presence penalty (0 = off)", "What each penalty does", "presence −1 if generated",
                 "repetition ÷1.3 if in context", "Beam search's length penalty"):
        assert text in body, text
    assert charts_visible(page) >= 6  # the step's two, three penalty panels, two length-penalty panels
    screenshot(page, "gpt-decoding-penalties")
