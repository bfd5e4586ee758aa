"""Issue 21's additions in a real browser: the MLP-Mixer page (fixed token mixing beside a ViT's attention), the DETR
page (each query's cross-attention with its box and class, on a generated scene and on a photo, state in the URL),
and the ViT page's prefix-token caption."""
from tests.e2e.conftest import assert_healthy, charts_visible, open_page, screenshot, wait_until_idle


def test_mixer_page_sets_fixed_mixing_beside_vit_attention(page, app_url):
    open_page(page, app_url, "mixer", timeout_s=300)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "mini Mixer shapes" in body and "accuracy" in body and "Jacobian" in body
    assert "The whole map" in body and "attention of patch" in body
    assert charts_visible(page) >= 3  # Mixer row, ViT row, the whole map
    screenshot(page, "mixer")
    page.get_by_text("at this image", exact=True).click()
    wait_until_idle(page)
    assert_healthy(page)
    assert "mixer_map=input" in page.url


def test_detr_page_draws_queries_with_boxes(page, app_url):
    open_page(page, app_url, "detr?detr_seed=11", timeout_s=300)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "mini DETR shapes" in body and "AP@0.5" in body and "True objects" in body
    assert "cross-attention over the image with its box and class" in body
    assert charts_visible(page) >= 1
    screenshot(page, "detr-scene")
    for tab in ("One query, head by head", "All detections"):
        page.get_by_role("tab", name=tab).click()
        wait_until_idle(page)
        assert_healthy(page)
    assert "queries found an object" in page.inner_text("body")
    page.get_by_text("Photo or your image", exact=True).click()
    wait_until_idle(page)
    assert_healthy(page)
    assert "detr_input=Photo" in page.url
    screenshot(page, "detr-photo")


def test_vit_page_names_its_prefix_tokens(page, app_url):
    open_page(page, app_url, "vit", timeout_s=300)
    assert_healthy(page)
    assert "Prefix tokens (no pixels, not in the grid): [CLS]" in page.inner_text("body")
