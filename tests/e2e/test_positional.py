"""The positional-encodings page in a real browser on the offline models: every tab draws, sliders rerun their tab,
a user mistake is a message and the rest of the page keeps working."""
from tests.e2e.conftest import assert_healthy, charts_visible, open_page, screenshot, wait_until_idle


def _visible_text(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text()


def test_positional_page_every_tab_draws(page, app_url):
    open_page(page, app_url, "positional", timeout_s=300)  # may load MiniLM, SmolLM2 and the DINOv2 grid first
    assert_healthy(page)
    expected = {"Why positions?": "Shuffled:", "Sinusoidal": "Wavelength per channel",
                "Learned tables": "Fig. 7", "RoPE": "rope_theta", "ALiBi · T5 · Swin": "T5 relative-position buckets"}
    for tab, text in expected.items():
        page.get_by_role("tab", name=tab).click()
        page.wait_for_timeout(1500)
        assert_healthy(page)
        panel = page.locator('[role="tabpanel"]:visible')
        assert text in panel.inner_text(), f"{tab}: {text!r} not shown"
        drawn = panel.locator('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg, '
                              '[data-testid="stImage"] img')
        assert drawn.count() >= 2, f"{tab}: only {drawn.count()} charts/images drawn"
        screenshot(page, f"positional-{tab.split()[0].lower().rstrip('?')}")
    assert charts_visible(page) >= 10


def test_positional_page_slider_and_user_mistake(page, app_url):
    open_page(page, app_url, "positional", timeout_s=300)
    page.get_by_role("tab", name="ALiBi · T5 · Swin").click()
    assert "Slopes for H = 8:" in _visible_text(page)
    page.locator('input[type="range"][aria-label="Heads H"]').focus()
    page.keyboard.press("ArrowRight")  # heads 8 -> 9: only this tab's fragment reruns
    wait_until_idle(page)
    assert "Slopes for H = 9:" in _visible_text(page)
    assert_healthy(page)

    page.get_by_role("tab", name="Why positions?").click()
    box = page.get_by_label("Sentence")
    box.fill("hello")
    box.press("Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert "fewer than two tokens" in _visible_text(page)
    box.fill("<img src=x onerror=alert(1)> **not bold** shuffled")
    box.press("Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert page.locator('[data-testid="stMain"] img[src="x"]').count() == 0  # typed text is never HTML
    shown = _visible_text(page)
    assert "alert" in shown and "*" in shown  # WordPiece tokens shown as plain text: "<", "im", "##g", …, "*", "*"
    page.get_by_role("tab", name="RoPE").click()
    assert "rope_theta" in _visible_text(page)  # the rest of the page still works
    screenshot(page, "positional-user-input")


def test_positional_page_beyond_the_training_length(page, app_url):
    open_page(page, app_url, "positional", timeout_s=300)
    page.get_by_role("tab", name="Beyond the training length").click()
    wait_until_idle(page)
    assert_healthy(page)
    panel = page.locator('[role="tabpanel"]:visible')
    text = panel.inner_text()
    for expected in ("wavelength of each pair", "score against distance", "ALiBi (formula)",
                     "Measured: SmolLM2's perplexity against length", "bench.case_rope_ppl"):
        assert expected in text, expected
    drawn = panel.locator('[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg')
    assert drawn.count() >= 4
    screenshot(page, "positional-beyond")
