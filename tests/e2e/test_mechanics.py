"""The "how attention works" page in a real browser: the step slider, the Swin mask, the cost calculator's numbers."""
from tests.e2e.conftest import assert_healthy, charts_visible, open_page, screenshot, wait_until_idle


def test_mechanics_page_steps_masks_and_cost(page, app_url):
    open_page(page, app_url, "mechanics")
    assert_healthy(page)
    assert charts_visible(page) >= 3  # one step's matrix, the entropy curve, the head maps
    body = page.inner_text("body")
    assert "four matrix multiplications" in body and "[N×D]·[D×3HD_H] → [N×3HD_H]" in body
    screenshot(page, "mechanics-steps")

    page.get_by_role("tab", name="② Masks").click()
    page.get_by_text("Swin shifted window", exact=True).first.click()
    wait_until_idle(page)
    assert_healthy(page)
    assert "region ids" in page.inner_text("body")
    screenshot(page, "mechanics-masks-swin")

    page.get_by_role("tab", name="③ Cost").click()
    wait_until_idle(page)
    assert_healthy(page)
    body = page.inner_text("body")
    for number in ("38,809", "38,416", "65,536", "150.06 KiB", "119,221,248", "1,073,741,824", "153,664", "20 GB",
                   "18.63 GiB", "SmolLM2"):
        assert number in body, number
    screenshot(page, "mechanics-cost")


def test_mechanics_page_shows_a_too_long_sentence_as_an_error(page, app_url):
    open_page(page, app_url, "mechanics")
    box = page.get_by_role("textbox", name="Sentence")
    box.fill("<b>word</b> " * 40)
    box.press("Control+Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert "Shorten it" in page.inner_text("body")
    assert page.locator("b:has-text('word')").count() == 0  # typed text is never rendered as HTML


def test_mechanics_page_linear_attention_tab(page, app_url):
    open_page(page, app_url, "mechanics")
    page.get_by_role("tab", name="④ Linear attention").click()
    wait_until_idle(page)
    assert_healthy(page)
    assert charts_visible(page) >= 9  # three matrices, the distances, the RNN's four, the two cost curves
    body = page.inner_text("body")
    for text in ("flow attention (Flowformer)", "Causal linear attention is an RNN", "agree on every token",
                 "bench.case_linear_attention"):
        assert text in body, text
    screenshot(page, "mechanics-linear-attention")


def test_mechanics_page_pre_ln_vs_post_ln_tab(page, app_url):
    open_page(page, app_url, "mechanics")
    page.get_by_role("tab", name="⑤ Pre-LN vs Post-LN").click()
    wait_until_idle(page, 400)  # builds and differentiates a dozen small stacks on first open
    assert_healthy(page)
    assert charts_visible(page) >= 2
    body = page.inner_text("body")
    for text in ("identity highway", "every layer of a 12-layer stack", "needs learning-rate warm-up"):
        assert text in body, text
    screenshot(page, "mechanics-pre-post-ln")
