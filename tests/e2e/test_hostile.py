"""Hostile input in a real browser: every case shows a message, nothing typed or uploaded becomes markup, no script
runs, and the next normal input still works.

Text goes into the GPT and encoder pages (the offline SmolLM2 and MiniLM), model ids into the sidebar's "Other" box,
bad files into the ViT and Swin uploaders. The typed markup sets ``window.__pwned`` and opens an ``alert`` if it runs,
and leaves an element with the id ``pwned`` if it is parsed as HTML; a ``dialog`` listener, registered before anything
is typed, catches any ``alert``, and a ``request`` listener any URL a typed Markdown image would make the browser fetch.
"""
from __future__ import annotations

import io
import struct
import time
import zlib
from pathlib import Path

import pytest
from PIL import Image

from tests.e2e.conftest import (LEAK_URL, MARKUP, assert_healthy, assert_nothing_injected, charts_visible,
                                open_page, screenshot, wait_until_idle)

ROOT = Path(__file__).resolve().parents[2]


def submit_text(page, label: str, value: str) -> None:
    box = page.get_by_role("textbox", name=label, exact=True)
    box.fill(value)
    box.press("Control+Enter")
    wait_until_idle(page)


def alert_text(page) -> str:
    return " ".join(page.locator('[data-testid="stAlert"]').all_inner_texts())


TEXT_CASES = [  # (name, text, what the page must say; None = the charts come back)
    ("script-and-html", MARKUP + " &lt;b&gt; **bold** $x^2$ :red[red]", None),
    ("bidi-and-zero-width", "user\u202egnp.exe\u202c zero\u200bwidth\u200d \u2066iso\u2069 مرحبا שלום", None),
    ("emoji", "the cat 🙂🐈‍⬛👩🏽‍🚀 sat on the mat 🇫🇷", None),
    ("control", "nul\x00 bell\x07 escape\x1b[31m red\x1b[0m tab\tend", None),
    ("whitespace", " \n\t \u00a0 ", "Type a"),
    ("100k-characters", ("the cat sat on the mat. " * 4200)[:100_000], "only the first"),
]


@pytest.mark.parametrize("path, label, normal", [("", "Prompt", "The capital of France is"),
                                                 ("encoder", "Sentence", "The cat sat on the mat.")],
                         ids=["gpt", "encoder"])
def test_hostile_text_gives_a_message_and_the_next_input_works(watched, app_url, path, label, normal):
    page = watched
    open_page(page, app_url, path, timeout_s=300)
    assert_healthy(page)
    for name, typed, says in TEXT_CASES:
        submit_text(page, label, typed)
        assert_healthy(page)
        assert_nothing_injected(page)
        if says is None:
            assert charts_visible(page) >= 2, name
        else:
            assert says in page.inner_text('[data-testid="stMain"]'), name
        if name in ("script-and-html", "100k-characters"):
            screenshot(page, f"hostile-{path or 'gpt'}-{name}")
        submit_text(page, label, normal)  # the next normal input works
        assert_healthy(page)
        assert charts_visible(page) >= 2, f"after {name}"
        assert "only the first" not in alert_text(page)


def test_typed_markup_is_shown_as_text(watched, app_url):
    """The GPT page's generated text starts with the prompt, exactly as typed: markup as characters, not elements."""
    page = watched
    open_page(page, app_url, "", timeout_s=300)
    typed = MARKUP + " **bold** the cat"
    submit_text(page, "Prompt", typed)
    page.get_by_role("tab", name="Generate and step through").click()
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_until_idle(page)
    assert_healthy(page)
    shown = page.locator('[data-testid="stText"]').all_inner_texts()
    assert any(text.startswith(typed) for text in shown), shown
    assert_nothing_injected(page)


def choose_model(page, option: str) -> None:
    page.get_by_role("combobox", name="Model", exact=True).click()
    page.get_by_role("option", name=option, exact=True).click()
    wait_until_idle(page)


@pytest.mark.parametrize("typed, says", [
    (f"![x]({LEAK_URL}) **bold** {MARKUP}", "Could not load"),
    ("../../../../etc", "outside the folders"),
    ("no-such-owner-4821/no-such-model", "Could not load"),
])
def test_typed_model_ids_are_messages_not_markup(watched, app_url, typed, says):
    page = watched
    open_page(page, app_url, "encoder")
    choose_model(page, "Other: a hub id or a local folder…")
    box = page.get_by_label("Hub id or local folder")
    box.fill(typed)
    box.press("Enter")
    wait_until_idle(page)
    assert_healthy(page)
    assert_nothing_injected(page)
    shown = alert_text(page)
    assert says in shown
    if typed.startswith("!["):
        assert "![x](" in shown and "**bold**" in shown and MARKUP in shown  # shown literally, as typed
        assert page.locator('[data-testid="stAlert"] :is(img, strong, a)').count() == 0  # no image, bold or link
        assert page.locator('[data-testid="stCaptionContainer"] :is(img, a)').count() == 0  # the model card line
        screenshot(page, "hostile-model-id")
    choose_model(page, "all-MiniLM-L6-v2 (offline, packaged)")  # back to a listed model: the page works again
    assert_healthy(page)
    assert charts_visible(page) >= 2


# --- uploads on the image pages ------------------------------------------------------------------------------------

def _encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _png_bomb(width: int, height: int) -> bytes:
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    compressor, row = zlib.compressobj(1), b"\x00" * (1 + width)
    body = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", body) + chunk(b"IEND", b""))


def _jpeg(size=(320, 240)) -> bytes:
    return _encode(Image.linear_gradient("L").resize(size).convert("RGB"), "JPEG", quality=90)


BAD_UPLOADS = [  # (file name, bytes, mime type, what the page must say)
    ("<img src=x onerror=alert('name')>.png", b"<svg onload=alert(1)>not a picture</svg>", "image/png",
     "not an image"),
    ("truncated.jpg", _jpeg()[:600], "image/jpeg", "damaged"),
    ("bomb.png", _png_bomb(12_000, 12_000), "image/png", "megapixel"),
    ("dot.png", _encode(Image.new("RGB", (1, 1)), "PNG"), "image/png", "1 × 1"),
]


def upload(page, name: str, data: bytes, mime: str) -> None:
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(
        {"name": name, "mimeType": mime, "buffer": data})
    # the rerun starts only once the file has reached the server: wait for its name, then for the script
    page.wait_for_function("name => [...document.querySelectorAll('[data-testid=stFileChipName]')]"
                           ".some(chip => chip.title === name)", arg=name, timeout=60_000)
    wait_until_idle(page, 240)


def remove_upload(page) -> None:
    """Take the uploaded file off with its chip's delete button. Dropping a new file onto a single-file uploader
    that holds one makes the browser send a removal and an upload back to back, and once in CI (a loaded machine) the
    page ran with neither: the chip showed the new name while the script saw no file."""
    page.locator('[data-testid="stFileChipDeleteBtn"] button, button[data-testid="stFileChipDeleteBtn"]').first.click()
    page.wait_for_function("() => !document.querySelector('[data-testid=stFileChipName]')", timeout=60_000)
    wait_until_idle(page, 240)


def wait_for_alert(page, says: str, timeout_s: float = 60) -> str:
    """The alerts' text once it contains ``says`` (the previous file's message may still be up for a moment)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and says not in alert_text(page):
        time.sleep(0.5)
    return alert_text(page)


@pytest.mark.parametrize("path", ["vit", "swin"])
def test_bad_uploads_give_a_message_and_a_good_one_works(watched, app_url, path):
    page = watched
    open_page(page, app_url, path, timeout_s=300)
    assert_healthy(page)
    page.get_by_text("Upload", exact=True).click()
    wait_until_idle(page)
    for index, (name, data, mime, says) in enumerate(BAD_UPLOADS):
        if index:  # the bad file is taken off first, as a person would, and the page says it waits for an image
            remove_upload(page)
            assert "Upload an image" in wait_for_alert(page, "Upload an image")
        upload(page, name, data, mime)
        assert_healthy(page)
        assert_nothing_injected(page)
        shown = wait_for_alert(page, says)
        assert says in shown, f"{name}: {shown!r}"
        assert_healthy(page)
        if name == "bomb.png":
            screenshot(page, f"hostile-{path}-bomb")
    remove_upload(page)
    upload(page, "photo.jpg", _jpeg((400, 300)), "image/jpeg")
    assert_healthy(page)
    assert not page.locator('[data-testid="stAlertContentError"]').count()
    assert charts_visible(page) >= 2
    screenshot(page, f"hostile-{path}-recovered")


def test_upload_over_the_size_limit_is_refused_by_the_browser(watched, app_url):
    """server.maxUploadSize (.streamlit/config.toml) is enforced before a byte reaches the app."""
    page = watched
    open_page(page, app_url, "vit", timeout_s=300)
    page.get_by_text("Upload", exact=True).click()
    wait_until_idle(page)
    upload(page, "huge.jpg", b"\xff\xd8\xff" + b"\x00" * (26 * 2**20), "image/jpeg")
    assert_healthy(page)
    uploader = page.locator('[data-testid="stFileUploader"]').inner_text()
    assert "25.0MB" in uploader or "25MB" in uploader or "25 MB" in uploader, uploader
    screenshot(page, "hostile-upload-too-big")
