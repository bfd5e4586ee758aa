"""The captioning page in a real browser on the trained minis: a generated scene's caption with the strip of word maps,
the step-through, the faithfulness test with its table, the three architectures compared, state in the link, a photo,
a bad upload shown as an error with the page still working, and presentation mode."""
from tests.e2e.conftest import (
    assert_healthy,
    charts_visible,
    open_page,
    screenshot,
    wait_until_idle,
)


def _tab(page, name: str, timeout_s: float = 300) -> None:
    page.get_by_role("tab", name=name).click()
    wait_until_idle(page, timeout_s)
    assert_healthy(page)


def test_captioning_page_captions_a_scene_and_tests_its_maps(page, app_url):
    open_page(page, app_url, "captioning?cap_seed=11", timeout_s=300)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "Image captioning with attention" in body and "held-out scenes" in body
    assert "each word under the attention that produced it" in body and "additive attention" in body
    assert "reference" in body
    assert charts_visible(page) >= 1
    screenshot(page, "captioning-strip")

    _tab(page, "Step through")
    assert "most probable next tokens" in page.inner_text("body") and charts_visible(page) >= 3
    _tab(page, "Is it faithful?", timeout_s=600)
    assert "shuffled orders" in page.inner_text("body")
    table = page.locator('[data-testid="stDataFrame"]').first.text_content() or ""  # a canvas: its text is hidden
    assert "deletion AUC" in table and "Random order" in table
    screenshot(page, "captioning-faithfulness")
    _tab(page, "Architectures compared")
    assert "Closest to the truth, measured" in page.inner_text("body")
    screenshot(page, "captioning-architectures")
    assert "cap_seed=11" in page.url and "cap_view=" in page.url


def test_captioning_page_takes_a_photo_and_refuses_a_bad_upload(page, app_url):
    model = "mini+encoder–decoder+Transformer+%28offline%2C+trained+here%29"
    open_page(page, app_url, f"captioning?model_captioning={model}", timeout_s=300)
    assert_healthy(page)
    page.get_by_text("Photo, upload or camera", exact=True).click()
    wait_until_idle(page)
    assert_healthy(page)
    assert charts_visible(page) >= 1
    page.get_by_text("Upload", exact=True).click()
    wait_until_idle(page)
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        {"name": "notes.png", "mimeType": "image/png", "buffer": b"this is not a picture"})
    wait_until_idle(page, 240)
    assert_healthy(page)
    assert "not an image" in page.inner_text("body")
    page.get_by_text("Generated scene", exact=True).click()
    wait_until_idle(page)
    assert_healthy(page)
    assert charts_visible(page) >= 1


def test_captioning_page_in_presentation_mode(browser, app_url):
    context = browser.new_context(viewport={"width": 1920, "height": 1080})
    page = context.new_page()
    page.set_default_timeout(120_000)
    try:
        open_page(page, app_url, "captioning?presentation=True", timeout_s=300)
        assert_healthy(page)
        assert charts_visible(page) >= 1
        screenshot(page, "captioning-presentation")
    finally:
        context.close()
