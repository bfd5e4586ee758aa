"""The mixture-of-experts page in a real browser on the offline mini MoE: every tab draws, a download holds the
model's routing, odd text is shown as text."""
import json

from tests.e2e.conftest import assert_healthy, charts_visible, open_page, screenshot, wait_until_idle

TABS = ["One token's gate", "Load and balance", "Co-activation and layers", "Specialisation", "Two prompts"]


def test_moe_page_routes_text_on_the_mini(page, app_url):
    open_page(page, app_url, "moe")
    assert_healthy(page)
    body = page.inner_text("body")
    assert "mini-moe" in body and "dispatch: top-2 of softmax, renormalised" in body
    assert charts_visible(page) >= 3  # coloured tokens, legend, all-layers strip
    screenshot(page, "moe")
    json_button = page.locator('[data-testid="stDownloadButton"] button:visible').filter(has_text="JSON").first
    with page.expect_download(timeout=120_000) as info:
        json_button.click()
    assert info.value.suggested_filename == \
        "mini-moe-8-experts-top-2_anna-found-the-old-map-in-the-kitchen-l_routing_block-0.json"  # the opening text
    routed = json.loads(open(info.value.path(), encoding="utf-8").read())
    assert routed["layer"] == "block 0" and len(routed["top_experts"]) == len(routed["tokens"]) > 10
    for tab in TABS:
        page.get_by_role("tab", name=tab).click()
        wait_until_idle(page)
        assert_healthy(page)
        assert charts_visible(page) >= 1, tab
    assert "Expert load of A minus B" in page.inner_text("body")
    screenshot(page, "moe-two-prompts")


def test_moe_page_hostile_and_empty_text(page, app_url):
    open_page(page, app_url, "moe")
    box = page.get_by_role("textbox", name="Text", exact=True)
    box.fill("<img src=x onerror=alert(1)> ‮evil‬ 42 def f(x):")
    box.press("Control+Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert page.locator("img[src='x']").count() == 0  # the tag is token text in a chart, not markup
    assert charts_visible(page) >= 3
    box.fill("   ")
    box.press("Control+Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert "Type some text" in page.inner_text("body")
