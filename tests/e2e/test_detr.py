"""The DETR page in a real browser, where Streamlit's frontend sends back each widget's label: an uploaded image
and a new scene after a query was shown head by head (issue 28: both ended in a TypeError traceback, because the
query chooser's labels held the previous image's classes and scores)."""
import io

import numpy as np
from PIL import Image

from tests.e2e.conftest import assert_healthy, charts_visible, open_page, screenshot, wait_until_idle


def _png(width: int = 120, height: int = 90) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def test_an_uploaded_png_draws_its_detections(page, app_url, tmp_path):
    open_page(page, app_url, "detr", timeout_s=300)
    assert_healthy(page)
    page.get_by_role("tab", name="One query, head by head").click()  # the query chooser drawn for this scene
    wait_until_idle(page)
    page.get_by_text("Photo or your image", exact=True).click()
    wait_until_idle(page)
    page.get_by_text("Upload", exact=True).click()
    wait_until_idle(page)
    upload = tmp_path / "mine.png"
    upload.write_bytes(_png())
    page.locator('input[type="file"]').set_input_files(str(upload))
    wait_until_idle(page)
    assert_healthy(page)
    body = page.inner_text("body")
    assert "PNG, 120 × 90 pixels" in body  # the picker read the file …
    assert "head by head" in body and "heads 0–" in body  # … and the query's heads were drawn on it
    page.get_by_role("tab", name="All detections").click()
    wait_until_idle(page)
    assert_healthy(page)
    assert "queries found an object" in page.inner_text("body")
    assert charts_visible(page) >= 1
    screenshot(page, "detr-upload")


def test_a_new_scene_after_looking_at_one_query(page, app_url):
    open_page(page, app_url, "detr", timeout_s=300)
    page.get_by_role("tab", name="One query, head by head").click()
    wait_until_idle(page)
    for seed in ("8", "9"):
        field = page.get_by_test_id("stNumberInputField")
        field.fill(seed)
        field.press("Enter")
        wait_until_idle(page)
        assert_healthy(page)
        assert f"detr_seed={seed}" in page.url
    assert "heads 0–" in page.inner_text("body")
