"""The Swin page in a real browser on the offline mini Swin: views render, an upload runs, a broken one is a message."""
import io

import numpy as np
from PIL import Image

from tests.e2e.conftest import assert_healthy, charts_visible, open_page, screenshot, wait_until_idle


def _png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def _upload(page, name: str, data: bytes, wait_for: str) -> None:
    """Upload bytes through the picker and wait until ``wait_for`` (a CSS selector) shows the page reacted."""
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        files=[{"name": name, "mimeType": "image/png", "buffer": data}])
    page.wait_for_selector(wait_for, timeout=180_000)
    wait_until_idle(page)


def test_swin_page_shows_windows_masks_and_attention(page, app_url):
    open_page(page, app_url, "swin")
    assert_healthy(page)
    body = page.inner_text("body")
    assert "mini Swin shapes" in body and "accuracy" in body
    assert charts_visible(page) >= 3
    screenshot(page, "swin")
    for tab, expected in (("Cyclic shift", "attends inside these regular windows"), ("Masks", "identical"),
                          ("Window attention", "Rows sum to 1")):
        page.get_by_role("tab", name=tab).click()
        wait_until_idle(page)
        assert_healthy(page)
        assert expected in page.inner_text("body")  # "identical": the mask buffer equals the region-id rebuild
    screenshot(page, "swin-window-attention")


def test_swin_page_runs_an_upload_and_refuses_a_broken_one(page, app_url):
    from models.minis.swin_shapes import data

    open_page(page, app_url, "swin")
    page.get_by_text("Upload", exact=True).click()
    wait_until_idle(page)
    shape = data.make_image(np.random.default_rng(7), data.CLASSES.index("cross"))
    big = np.kron(shape, np.ones((3, 3, 1), dtype=np.uint8))  # 192 px: the model's data config resizes it to 64
    _upload(page, "cross.png", _png(big), 'text="PNG, 192 × 192 pixels"')
    assert_healthy(page)
    assert charts_visible(page) >= 3
    screenshot(page, "swin-upload")
    _upload(page, "broken.png", _png(shape)[:200], '[data-testid="stAlertContentError"]')  # a truncated PNG
    assert_healthy(page)
    assert "damaged" in page.locator('[data-testid="stAlertContentError"]').first.inner_text()
