"""The GPT and encoder pages in a real browser on the offline models: charts render, input works, no exception."""
from tests.e2e.conftest import (MARKUP, assert_healthy, assert_nothing_injected, charts_visible,
                                open_page, screenshot, wait_until_idle)


def test_gpt_page_shows_smollm2_attention(page, app_url):
    open_page(page, app_url, "", timeout_s=300)  # first run may dequantise SmolLM2 (~30 s)
    assert_healthy(page)
    assert charts_visible(page) >= 2
    assert "SmolLM2" in page.inner_text("body")
    screenshot(page, "gpt")


def test_gpt_page_takes_new_text_and_hostile_input(watched, app_url):
    page = watched
    open_page(page, app_url, "", timeout_s=300)
    box = page.locator("textarea[aria-label=\"Prompt\"]")
    box.fill(MARKUP + " ‮evil‬ zero\u200bwidth 🙂")
    box.press("Control+Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert_nothing_injected(page)
    assert charts_visible(page) >= 2
    box.fill("   ")
    box.press("Control+Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert "Type a prompt" in page.inner_text("body")
    screenshot(page, "gpt-empty-input")


def test_encoder_page_shows_minilm_attention(page, app_url):
    open_page(page, app_url, "encoder")
    assert_healthy(page)
    assert charts_visible(page) >= 2
    assert "[CLS]" in page.inner_text("body")
    screenshot(page, "encoder")


def test_gpt_page_logit_lens_tab(page, app_url):
    open_page(page, app_url, "", timeout_s=300)
    page.get_by_role("tab", name="What each layer predicts").click()
    wait_until_idle(page)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "Layer 0 is the embeddings" in body and "it is the top token from" in body
    assert charts_visible(page) >= 2  # the layer × position grid and the rank curve
    assert "gpt_tab=What+each+layer+predicts" in page.url or "gpt_tab=What%20each" in page.url
    screenshot(page, "gpt-logit-lens")


def test_gpt_page_head_ablation_tab(page, app_url):
    open_page(page, app_url, "?gpt_tab=Which+heads+matter", timeout_s=300)
    assert_healthy(page)
    assert "with every head on" not in page.inner_text("body")  # a tab opened in passing computes nothing
    page.get_by_role("button", name="Switch off each of the 270 heads").click()  # 270 forward passes, on request
    wait_until_idle(page, timeout_s=300)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "with every head on" in body and "key/value group" in body  # SmolLM2: 9 query heads, 3 K/V groups
    assert charts_visible(page) >= 1
    screenshot(page, "gpt-head-ablation")


def test_gpt_page_activation_patching_tab(page, app_url):
    open_page(page, app_url, "?gpt_tab=Patching", timeout_s=300)
    page.get_by_role("button", name="Try: Eiffel Tower → Colosseum").click()
    wait_until_idle(page, timeout_s=300)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "Logit difference logit('Paris') − logit('Rome')" in body, body[-1500:]
    assert charts_visible(page) >= 2  # the residual stream map and the heads map
    screenshot(page, "gpt-activation-patching")
