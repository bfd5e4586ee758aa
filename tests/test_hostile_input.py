"""Hostile and odd input, each case its own test, at the level where it is handled.

Text (models/core/text.py, and a full run on tiny random models loaded through the real loader), model ids and paths
(models/core/specs.py + models/core/loading.py), images (models/core/images.py), and the GPT / encoder pages as AppTest runs with
the loader patched to the tiny models: every case gives a message a user can act on — a ``ValueError`` in models/,
``st.error`` / ``st.info`` / ``st.warning`` on the page — and never an exception; the next normal input still works.
"""
from __future__ import annotations

import io
import json
import re
import struct
import time
import tracemalloc
import unicodedata
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from app import catalog
from models import families
from models.core import loading, text
from models.core.inputs import ImageInput, TextInput
from models.core.specs import ModelSpec
from models.families.causal_lm import model as causal_lm
from models.families.encoder import model as encoder
from tests import tiny_text_models

ROOT = Path(__file__).resolve().parent.parent
INVISIBLE = ("Cc", "Cf", "Co", "Cs")  # control, format (zero-width, bidi), private use, surrogates


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No hub: the nonexistent-id cases must fail the way they fail on an offline lab server."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def model_root(tmp_path_factory) -> Path:
    """The one allowed model folder of these tests, holding a tiny causal LM and a tiny encoder."""
    root = tmp_path_factory.mktemp("allowed_models")
    tiny_text_models.save_tiny_causal_lm(root / "tiny-lm")
    tiny_text_models.save_tiny_encoder(root / "tiny-bert")
    return root


@pytest.fixture(autouse=True)
def allowed(monkeypatch, model_root):
    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(model_root))


@pytest.fixture(scope="module")
def lm(model_root):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(model_root))
        return tiny_text_models.load_local("causal_lm", model_root / "tiny-lm")


@pytest.fixture(scope="module")
def bert(model_root):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(model_root))
        return tiny_text_models.load_local("encoder", model_root / "tiny-bert")


def assert_plain_labels(tokens: list[str]) -> None:
    """Token labels never carry a raw invisible or reordering character (it would hide or flip the chart labels)."""
    for token in tokens:
        bad = [f"U+{ord(c):04X}" for c in token if unicodedata.category(c) in INVISIBLE or c in "\u2028\u2029"]
        assert not bad, f"token {token!r} carries {bad}"


def assert_valid_attention(result) -> None:
    maps = result.maps("self")
    for layer in range(maps.num_layers):
        weights = maps.layer(layer)
        assert np.isfinite(weights).all()
        assert np.allclose(weights.sum(-1), 1, atol=1e-4)


# --- text ------------------------------------------------------------------------------------------------------

def test_empty_text_asks_for_text(lm):
    with pytest.raises(ValueError, match="Type or pick some text"):
        causal_lm.run(lm, TextInput(""))


def test_whitespace_only_text_asks_for_text(lm):
    with pytest.raises(ValueError, match="Type or pick some text"):
        causal_lm.run(lm, TextInput(" \t\n\r\u00a0\u3000\u2003 "))  # ASCII, no-break, ideographic and em spaces


def test_hundred_thousand_characters_are_truncated_with_a_notice(lm):
    prompt = ("the cat sat on the mat. " * 5000)[:100_000]
    started = time.perf_counter()
    result = causal_lm.run(lm, TextInput(prompt, 48))
    assert time.perf_counter() - started < 10
    assert len(result.tokens) == 48
    assert any("only the first 48" in notice for notice in result.notices)
    assert_valid_attention(result)


def test_more_than_the_character_limit_is_cut_before_tokenising():
    class CountingTokenizer:
        seen = 0
        sep_token_id = None

        def __call__(self, value, add_special_tokens=True):
            CountingTokenizer.seen = len(value)
            return {"input_ids": list(range(5))}

        def decode(self, ids):
            return "x"

    tokenized = text.tokenize(CountingTokenizer(), "a" * (text.MAX_CHARACTERS + 50_000), 512)
    assert CountingTokenizer.seen == text.MAX_CHARACTERS
    assert any(f"first {text.MAX_CHARACTERS:,} characters" in notice for notice in tokenized.notices)


def test_emoji_run_and_label_as_text(lm, bert):
    prompt = "the cat 🙂🐈‍⬛👩🏽‍🚀 sat 🇫🇷"
    for result in (causal_lm.run(lm, TextInput(prompt)), encoder.run(bert, TextInput(prompt))):
        assert result.tokens and all(isinstance(token, str) for token in result.tokens)
        assert_plain_labels(result.tokens)
        assert_valid_attention(result)


def test_right_to_left_text_runs(lm, bert):
    prompt = "مرحبا بالعالم and שלום עולם"
    for result in (causal_lm.run(lm, TextInput(prompt)), encoder.run(bert, TextInput(prompt))):
        assert_plain_labels(result.tokens)
        assert_valid_attention(result)


def test_bidi_override_characters_are_shown_not_obeyed(lm, bert):
    prompt = "user\u202egnp.exe\u202c \u2066isolate\u2069 \u200fmark"
    assert text.display_token("\u202egnp.exe") == "⟨U+202E⟩gnp.exe"
    for result in (causal_lm.run(lm, TextInput(prompt)), encoder.run(bert, TextInput(prompt))):
        assert_plain_labels(result.tokens)


def test_zero_width_characters_become_visible(lm):
    assert text.visible_text("a\u200bb\u200dc\ufeffd\u2060e") == "a⟨U+200B⟩b⟨U+200D⟩c⟨U+FEFF⟩d⟨U+2060⟩e"
    result = causal_lm.run(lm, TextInput("zero\u200bwidth\u200d joiner\ufeff"))
    assert_plain_labels(result.tokens)
    assert_valid_attention(result)


def test_control_characters_become_visible(lm, bert):
    prompt = "nul\x00 bell\x07 escape\x1b[31mred\x1b[0m back\x08 line\u2028sep\r\n\tend\x7f"
    assert text.visible_text("\x00\x1b\n") == "⟨U+0000⟩⟨U+001B⟩↵"
    for result in (causal_lm.run(lm, TextInput(prompt)), encoder.run(bert, TextInput(prompt))):
        assert_plain_labels(result.tokens)
        assert_valid_attention(result)


def test_html_and_script_tags_stay_literal_text(lm):
    prompt = "<script>alert('x')</script><img src=x onerror=alert(1)>&lt;b&gt;"
    result = causal_lm.run(lm, TextInput(prompt))
    shown = "".join(result.tokens).replace("␣", "")
    assert shown == prompt.replace(" ", "")  # every character kept as literal text, nothing escaped or dropped
    assert_valid_attention(result)


def test_lone_surrogates_are_replaced_not_a_crash(lm):
    # A browser string can carry an unpaired UTF-16 surrogate; the Rust tokenizer refuses it with a TypeError.
    result = causal_lm.run(lm, TextInput("broken \ud800 pair \udfff end"))
    assert_plain_labels(result.tokens)
    assert any("replaced" in notice for notice in result.notices)


def test_token_limit_below_two_is_refused(lm):
    with pytest.raises(ValueError, match="at least 2"):
        text.tokenize(lm.tokenizer, "hello", 1)


@pytest.mark.parametrize("data, says", [
    (b"", "empty"),
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary"),
    ("café crème".encode("latin-1"), "not UTF-8"),
])
def test_bad_text_uploads_say_what_to_do(data, says):
    with pytest.raises(ValueError, match=says):
        text.decode_upload(data)


def test_utf8_upload_with_bom_is_read_without_it():
    assert text.decode_upload("\ufeffhello ✓".encode("utf-8")) == "hello ✓"


@pytest.mark.parametrize("settings, says", [
    (causal_lm.GenerationSettings(max_new_tokens=0), "Max new tokens"),
    (causal_lm.GenerationSettings(max_new_tokens=100_000), "Max new tokens"),
    (causal_lm.GenerationSettings(strategy="sampling", temperature=0.0), "Temperature"),
    (causal_lm.GenerationSettings(top_p=0.0), "top-p"),
    (causal_lm.GenerationSettings(strategy="<script>"), "unknown strategy"),
])
def test_bad_generation_settings_are_refused(lm, settings, says):
    with pytest.raises(ValueError, match=says):
        causal_lm.run(lm, TextInput("the cat"), settings)


def test_generation_never_exceeds_the_context(lm):
    result = causal_lm.run(lm, TextInput("the cat sat " * 200), causal_lm.GenerationSettings(max_new_tokens=30))
    assert len(result.tokens) <= lm.max_positions
    assert any("only the first" in notice for notice in result.notices)


# --- model ids and paths ------------------------------------------------------------------------------------------

def load_typed(family: str, typed: str):
    return families.load(families.custom(family, typed))


def test_empty_model_id_asks_for_one():
    with pytest.raises(ValueError, match="Type a model id"):
        families.custom("causal_lm", "   ")


def test_nonexistent_hub_id_offline_says_so():
    with pytest.raises(ValueError, match="Could not load 'no-such-owner-4821/no-such-model'.*HF_HUB_OFFLINE"):
        load_typed("causal_lm", "no-such-owner-4821/no-such-model")


@pytest.mark.parametrize("typed", ["gpt2; rm -rf ~", "<script>alert(1)</script>", "owner/name/extra/parts",
                                   "a" * 500])
def test_malformed_hub_ids_are_a_message(typed):
    with pytest.raises(ValueError):
        load_typed("causal_lm", typed)


def _remote_code_folder(root: Path, model_type: str) -> Path:
    folder = root / f"remote-{model_type}"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "model_type": model_type, "architectures": ["EvilForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                     "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}}))
    (folder / "configuration_evil.py").write_text("raise SystemExit('remote code ran')\n")
    (folder / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    return folder


def test_model_needing_remote_code_is_refused(model_root):
    folder = _remote_code_folder(model_root, "evil")
    with pytest.raises(ValueError, match="needs its own Python code"):
        load_typed("causal_lm", str(folder))


def test_known_architecture_with_auto_map_is_still_refused(model_root):
    folder = _remote_code_folder(model_root, "llama")  # transformers could build it, but the repo ships code
    with pytest.raises(ValueError, match="needs its own Python code"):
        load_typed("causal_lm", str(folder))


def test_dot_dot_path_outside_the_allowed_folders_is_refused(model_root):
    typed = str(model_root / ".." / ".." / ".." / "etc")
    with pytest.raises(ValueError, match="outside the folders models may be loaded from"):
        load_typed("causal_lm", typed)


def test_home_relative_escape_is_refused():
    with pytest.raises(ValueError, match="outside the folders"):
        load_typed("causal_lm", "~/../../../../etc/ssl")


def test_symlink_out_of_an_allowed_folder_is_refused(model_root, tmp_path):
    outside = tiny_text_models.save_tiny_causal_lm(tmp_path / "outside-model")
    link = model_root / "innocent-looking-link"
    if not link.exists():
        link.symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="outside the folders"):
        load_typed("causal_lm", str(link))


def test_relative_path_without_dot_cannot_escape(model_root, tmp_path, monkeypatch):
    """'outside/model' looks like a hub id, but transformers loads an existing folder of that name first."""
    tiny_text_models.save_tiny_causal_lm(tmp_path / "outside" / "model")
    monkeypatch.chdir(tmp_path)
    for typed in ("outside/model", f"{model_root.name}/../outside/model"):
        with pytest.raises(ValueError, match="outside the folders"):
            load_typed("causal_lm", typed)


def test_timm_local_dir_scheme_is_a_checked_folder(tmp_path):
    """timm.create_model('local-dir:/any/folder') loads a folder: a typed one must pass the allowed-folder check."""
    from models.families.vit import model as vit

    spec = vit.custom_spec(f"local-dir:{tmp_path}")
    assert spec.source == "local" and spec.id == str(tmp_path)
    with pytest.raises(ValueError, match="outside the folders"):
        vit.load(spec)


def test_null_byte_in_a_path_is_a_message():
    with pytest.raises(ValueError, match="cannot contain"):
        loading.resolve_local_folder("/tmp/model\x00.json")


def test_folder_without_config_is_refused(model_root):
    (model_root / "empty-folder").mkdir(exist_ok=True)
    with pytest.raises(ValueError, match="no config.json"):
        load_typed("causal_lm", str(model_root / "empty-folder"))


def test_file_instead_of_folder_is_refused(model_root):
    with pytest.raises(ValueError, match="not a folder"):
        load_typed("causal_lm", str(model_root / "tiny-lm" / "config.json"))


def _copy_of_tiny_lm(model_root: Path, name: str) -> Path:
    import shutil

    target = model_root / name
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(model_root / "tiny-lm", target)
    return target


def test_corrupt_safetensors_is_refused(model_root):
    folder = _copy_of_tiny_lm(model_root, "corrupt-weights")
    (folder / "model.safetensors").write_bytes(b"\x00" * 8 + b"this is not a safetensors file" * 100)
    with pytest.raises(ValueError, match="corrupt-weights"):
        load_typed("causal_lm", str(folder))


def test_truncated_safetensors_is_refused(model_root):
    folder = _copy_of_tiny_lm(model_root, "truncated-weights")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated-weights"):
        load_typed("causal_lm", str(folder))


def test_weights_that_do_not_match_the_config_are_refused(model_root):
    folder = _copy_of_tiny_lm(model_root, "mismatched-weights")
    config = json.loads((folder / "config.json").read_text())
    config["hidden_size"] = 48
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="mismatched-weights"):
        load_typed("causal_lm", str(folder))


def test_config_that_is_not_json_is_refused(model_root):
    folder = _copy_of_tiny_lm(model_root, "broken-config")
    (folder / "config.json").write_text("{'model_type': 'llama',")
    with pytest.raises(ValueError, match="broken-config"):
        load_typed("causal_lm", str(folder))


def test_an_allowed_folder_typed_relative_still_loads(model_root, monkeypatch):
    monkeypatch.chdir(model_root.parent)
    loaded = load_typed("causal_lm", f"{model_root.name}/tiny-lm")
    assert causal_lm.run(loaded, TextInput("the cat")).tokens


# --- images (models/core/images.py) --------------------------------------------------------------------------------

def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def gradient(width: int, height: int) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    return Image.fromarray(np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1),
                                     (x + y) % 256], -1).astype(np.uint8))


def decode(data: bytes):
    from models.core import images

    return images.decode_image(data, "The uploaded file")


@pytest.mark.parametrize("data", [b"<svg xmlns='http://www.w3.org/2000/svg' onload='alert(1)'/>",
                                  b"<html><script>alert(1)</script></html>", b"PK\x03\x04 a zip file",
                                  bytes(range(256)) * 40])
def test_bytes_that_are_not_an_image_are_refused(data):
    with pytest.raises(ValueError, match="not an image"):
        decode(data)


def test_empty_image_file_is_refused():
    with pytest.raises(ValueError, match="empty"):
        decode(b"")


@pytest.mark.parametrize("keep", [2, 200, 0.5])
def test_truncated_jpeg_is_refused(keep):
    data = encode(gradient(320, 240), "JPEG", quality=90)
    cut = data[: int(len(data) * keep) if isinstance(keep, float) else keep]
    with pytest.raises(ValueError, match="truncated|damaged|could not be read|not an image"):
        decode(cut)


def _png_bomb(width: int, height: int) -> bytes:
    """A real PNG of ``width × height`` black pixels: a few hundred kB of compressed zeros."""
    def chunk(kind: bytes, payload: bytes) -> bytes:
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))

    compressor, row = zlib.compressobj(1), b"\x00" * (1 + width)  # filter byte + one grey byte per pixel
    body = b"".join(compressor.compress(row) for _ in range(height)) + compressor.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", body) + chunk(b"IEND", b""))


def test_decompression_bomb_is_refused_before_decoding():
    bomb = _png_bomb(12_000, 12_000)  # 144 megapixels (576 MB as RGBA) in well under 1 MB
    assert len(bomb) < 1_000_000
    tracemalloc.start()
    started = time.perf_counter()
    with pytest.raises(ValueError, match="megapixel"):
        decode(bomb)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert time.perf_counter() - started < 2 and peak < 50 * 2**20


def test_jpeg_header_claiming_65535_squared_is_refused():
    data = bytearray(encode(gradient(64, 64), "JPEG"))
    sof = data.index(b"\xff\xc0")
    data[sof + 5: sof + 9] = struct.pack(">HH", 65_535, 65_535)  # SOF0: height, width
    with pytest.raises(ValueError, match="megapixel"):
        decode(bytes(data))


def test_one_by_one_image_is_refused():
    with pytest.raises(ValueError, match="1 × 1"):
        decode(encode(Image.new("RGB", (1, 1), (255, 0, 0)), "PNG"))


def test_huge_photo_is_downscaled_in_bounded_time():
    from models.core import images

    ramp = Image.linear_gradient("L").resize((8000, 6000), Image.Resampling.BILINEAR)
    photo = Image.merge("RGB", (ramp, ramp.transpose(Image.Transpose.FLIP_LEFT_RIGHT), ramp.transpose(
        Image.Transpose.FLIP_TOP_BOTTOM)))
    data = encode(photo, "JPEG", quality=85)  # 48 megapixels, a phone photo
    started = time.perf_counter()
    decoded = decode(data)
    assert time.perf_counter() - started < 5
    assert max(decoded.size) <= images.MAX_SIDE and decoded.image.mode == "RGB"
    assert any("downscaled" in note for note in decoded.notes)


def test_animated_gif_with_many_frames_uses_the_first():
    frames = [Image.new("RGB", (64, 64), (i % 256, 255 - i % 256, (7 * i) % 256)) for i in range(300)]
    data = encode(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=10, loop=0)
    started = time.perf_counter()
    decoded = decode(data)
    assert time.perf_counter() - started < 2
    assert decoded.image.mode == "RGB" and any("300 frames" in note for note in decoded.notes)


def test_cmyk_jpeg_becomes_rgb():
    decoded = decode(encode(gradient(64, 48).convert("CMYK"), "JPEG"))
    assert decoded.image.mode == "RGB" and decoded.size == (64, 48) and any("CMYK" in n for n in decoded.notes)


def test_sixteen_bit_greyscale_becomes_eight_bit_rgb():
    ramp = np.linspace(0, 65535, 64 * 64).reshape(64, 64).astype(np.uint16)
    decoded = decode(encode(Image.fromarray(ramp), "PNG"))
    pixels = np.asarray(decoded.image)
    assert pixels.dtype == np.uint8 and pixels.max() == 255 and pixels.min() == 0


def test_rgba_is_composited_on_white():
    rgba = Image.new("RGBA", (32, 32), (0, 0, 255, 0))  # fully transparent blue
    decoded = decode(encode(rgba, "PNG"))
    assert (np.asarray(decoded.image) == 255).all()


def test_palette_image_with_transparency_becomes_rgb():
    palette = gradient(40, 40).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    decoded = decode(encode(palette, "PNG", transparency=0))
    assert decoded.image.mode == "RGB" and decoded.size == (40, 40)


@pytest.mark.parametrize("orientation, upright", [(1, (60, 30)), (3, (60, 30)), (6, (30, 60)), (8, (30, 60))])
def test_exif_rotated_photo_is_turned_upright(orientation, upright):
    exif = Image.Exif()
    exif[0x0112] = orientation
    decoded = decode(encode(gradient(60, 30), "JPEG", exif=exif))
    assert decoded.size == upright


def test_unsupported_format_is_refused():
    with pytest.raises(ValueError, match="use PNG, JPEG"):
        decode(encode(gradient(32, 32), "ICO"))


# --- the pages (AppTest, loader patched to the tiny models) -----------------------------------------------------

PAGE_TEXT_CASES = {
    "empty": ("", "info", "Type a prompt"),
    "whitespace": ("  \n\t  ", "info", "Type a prompt"),
    "100k characters": ("the cat sat on the mat. " * 4200, "warning", "only the first"),
    "emoji": ("the cat 🙂🐈‍⬛ sat 🇫🇷", None, None),
    "right-to-left and bidi override": ("مرحبا user\u202egnp.exe\u202c", None, None),
    "zero-width and control": ("zero\u200bwidth\x00nul\x1b[31m", None, None),
    "html and script": ("<script>alert('x')</script><img src=x onerror=alert(1)>", None, None),
}


@pytest.fixture
def tiny_loader(monkeypatch, lm, bert):
    """resources.load returns the tiny model of the page's family (no packaged weights are read)."""
    from app import resources

    def fake_load(spec, device, dtype):
        return {"causal_lm": lm, "encoder": bert}[spec.family]

    monkeypatch.setattr(resources, "load", fake_load)
    return fake_load


def app_test(page: str):
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(ROOT / "app" / "views" / f"{page}.py"), default_timeout=60)


def assert_message(at, kind: str | None, says: str | None) -> None:
    assert not at.exception, at.exception[0].value
    if kind is None:
        assert not at.error, at.error[0].value
        return
    shown = " ".join(str(element.value) for element in getattr(at, kind))
    assert says in shown, f"expected {kind} saying {says!r}, got {shown!r}"


@pytest.mark.parametrize("case", list(PAGE_TEXT_CASES))
def test_gpt_page_gives_a_message_for_each_hostile_text(tiny_loader, case):
    typed, kind, says = PAGE_TEXT_CASES[case]
    at = app_test("gpt").run()
    assert not at.exception
    at.text_area(key="gpt_text").input(typed).run()
    assert_message(at, kind, says)
    at.text_area(key="gpt_text").input("the cat sat on the mat").run()  # the next normal input works
    assert_recovered(at, "Type a prompt")


def assert_recovered(at, prompt_message: str) -> None:
    assert not at.exception and not at.error
    assert prompt_message not in " ".join(str(element.value) for element in at.info)
    assert any(" tokens · " in str(caption.value) for caption in at.caption)


@pytest.mark.parametrize("case", ["empty", "100k characters", "zero-width and control", "html and script"])
def test_encoder_page_gives_a_message_for_each_hostile_text(tiny_loader, case):
    typed, kind, says = PAGE_TEXT_CASES[case]
    says = says.replace("Type a prompt", "Type a sentence") if says else says
    at = app_test("encoder").run()
    at.text_area(key="encoder_text").input(typed).run()
    assert_message(at, kind, says)
    at.text_area(key="encoder_text").input("the dog sat on the log").run()
    assert_recovered(at, "Type a sentence")


def test_typed_model_id_errors_are_plain_text_on_the_page(tiny_loader, monkeypatch):
    """A typed id is echoed in the error: markdown in it (an image that calls a server) must stay literal."""
    from app import resources

    monkeypatch.setattr(resources, "load", lambda spec, device, dtype: families.load(spec, device, dtype))
    at = app_test("gpt").run()
    at.selectbox(key="model_causal_lm").set_value(at.selectbox(key="model_causal_lm").options[-1]).run()
    at.text_input(key="custom_model_causal_lm").input("![x](http://127.0.0.1:9/leak.png) **bold**").run()
    assert not at.exception
    assert len(at.error) == 1
    body = at.error[0].value
    assert "![x](" not in body and "**bold**" not in body  # escaped: rendered as the literal characters typed
    assert "\\!\\[x\\]" in body
    assert "http://" not in body.replace("\\", "")  # no bare URL left for GFM to turn into a link


@pytest.mark.parametrize("typed", ["![x](http://evil.test/p.png)", "[click](javascript:alert(1))", "**bold** _it_",
                                   "$x^2$", ":red[red] :material/home:", "<b>tag</b> &amp;", "# heading",
                                   "see https://evil.test or www.evil.test or me@evil.test", "a\\b `code`"])
def test_plain_keeps_markdown_as_typed(typed):
    """What the escaped text means in Markdown is the typed text itself: no markup survives, nothing is lost."""
    from app.widgets import plain

    escaped = plain(typed)
    unescaped = re.sub(r"\\(.)", r"\1", escaped).replace("\u2060", "")
    assert unescaped == typed
    assert not re.search(r"(?<!\\)[\[\]*_$<>`&#]", escaped)  # every markup character is escaped
    assert not re.search(r"https?://|www\.|\w@", escaped.replace("\\", ""))  # nothing GFM would autolink


# --- faults: out of memory ------------------------------------------------------------------------------------------

CPU_ALLOCATOR_FAILURE = ("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                         "you tried to allocate 35184372088832 bytes. Error code 12 (Cannot allocate memory)")


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                   RuntimeError(CPU_ALLOCATOR_FAILURE), MemoryError(),
                                   RuntimeError("MPS backend out of memory (MPS allocated: 8 GB)")],
                         ids=["cuda", "cpu-allocator", "python", "mps"])
def test_out_of_memory_becomes_advice(lm, monkeypatch, error):
    def exhausted(*args, **kwargs):
        raise error

    monkeypatch.setattr(lm.model, "forward", exhausted)
    with pytest.raises(ValueError, match="Out of memory on cpu with .* tokens. Use fewer tokens.*switch the device"):
        causal_lm.run(lm, TextInput("the cat sat on the mat"))
    monkeypatch.undo()
    assert causal_lm.run(lm, TextInput("the cat sat on the mat")).tokens  # the model is untouched by the failure


def test_other_runtime_errors_are_not_disguised_as_memory(lm, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch in a bug of ours")

    monkeypatch.setattr(lm.model, "forward", broken)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        causal_lm.run(lm, TextInput("the cat"))


@pytest.mark.parametrize("where", ["forward", "generate"])
def test_gpt_page_out_of_memory_shows_advice_and_recovers(tiny_loader, lm, monkeypatch, where):
    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    at = app_test("gpt").run()
    prompt = f"a prompt only this {where} test uses"
    with monkeypatch.context() as patch:
        patch.setattr(lm.model, where, exhausted)
        at.text_area(key="gpt_text").input(prompt).run()
        if where == "generate":
            assert not at.error  # the attention tab ran; now press Generate
            at.button[0].click().run()
        assert not at.exception
        shown = " ".join(str(element.value) for element in at.error)
        assert "Out of memory" in shown and "fewer tokens" in shown and "CPU" in shown
    at.text_area(key="gpt_text").input(prompt + ", again").run()  # the next run works
    if where == "generate":
        at.button[0].click().run()
    assert not at.exception and not at.error
    assert any(" tokens · " in str(caption.value) for caption in at.caption)


# --- limits (.streamlit/config.toml and models/core/limits.py) -----------------------------------------------------------

def test_upload_limit_is_one_number_in_streamlit_and_in_the_app():
    import tomllib

    from models.core import images, limits

    config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    assert config["server"]["maxUploadSize"] * 2**20 == limits.MAX_UPLOAD_BYTES == images.MAX_FILE_BYTES
    assert images.MAX_IMAGE_PIXELS == limits.MAX_IMAGE_PIXELS == Image.MAX_IMAGE_PIXELS


def test_streamlit_knows_every_option_in_the_config():
    """Unknown options in .streamlit/config.toml are only a log warning: check each against Streamlit's own list."""
    import tomllib

    from streamlit import config

    parsed = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())
    options = [f"{section}.{name}" for section, values in parsed.items() for name in values]
    assert "server.maxUploadSize" in options and "server.maxMessageSize" in options
    unknown = [option for option in options if option not in config._config_options_template]
    assert not unknown, f"Streamlit does not know {unknown}"


def _limits_in_a_fresh_process(**environment) -> tuple[int, str]:
    import subprocess
    import sys

    env = {key: value for key, value in __import__("os").environ.items() if not key.startswith("ATTN_EXPLORER_MAX")}
    completed = subprocess.run([sys.executable, "-c", "from models.core import limits; print(limits.summary())"],
                               cwd=ROOT, env={**env, **environment}, capture_output=True, text=True, timeout=60)
    return completed.returncode, completed.stdout + completed.stderr


def test_limits_are_set_from_the_environment():
    code, output = _limits_in_a_fresh_process(ATTN_EXPLORER_MAX_TOKENS="64", ATTN_EXPLORER_MAX_NEW_TOKENS="8",
                                              ATTN_EXPLORER_MAX_IMAGE_PIXELS="4_000_000",
                                              STREAMLIT_SERVER_MAX_UPLOAD_SIZE="5")
    assert code == 0, output
    summary = eval(output.strip().splitlines()[-1])  # a dict of ints printed by the subprocess
    assert summary["MAX_TOKENS"] == 64 and summary["DEFAULT_TOKENS"] == 64 and summary["MAX_NEW_TOKENS"] == 8
    assert summary["MAX_IMAGE_PIXELS"] == 4_000_000 and summary["MAX_UPLOAD_BYTES"] == 5 * 2**20


@pytest.mark.parametrize("value", ["lots", "3"])
def test_a_bad_limit_stops_the_app_with_the_variable_named(value):
    code, output = _limits_in_a_fresh_process(ATTN_EXPLORER_MAX_TOKENS=value)
    assert code != 0 and "ATTN_EXPLORER_MAX_TOKENS" in output.splitlines()[-1]


def test_token_limit_above_the_server_limit_is_refused(lm):
    from models.core import limits

    with pytest.raises(ValueError, match="token limit on this server"):
        text.tokenize(lm.tokenizer, "hello", limits.MAX_TOKENS + 1)


def test_generation_length_limit_comes_from_the_settings(lm):
    from models.core import limits

    with pytest.raises(ValueError, match=f"between 1 and {limits.MAX_NEW_TOKENS}"):
        causal_lm.run(lm, TextInput("the cat"), causal_lm.GenerationSettings(max_new_tokens=limits.MAX_NEW_TOKENS + 1))


@pytest.fixture
def tiny_vision(tmp_path, monkeypatch):
    """A tiny timm ViT and Swin saved as a user saves them, loaded through the pages' loaders."""
    import timm

    from models.families.swin import model as swin
    from models.families.vit import model as vit
    from tests.test_swin import tiny_swin
    from tests.test_vit import save_tiny_vit

    monkeypatch.setenv("ATTN_EXPLORER_MODEL_DIRS", str(tmp_path))
    save_tiny_vit(tmp_path / "vit")
    model = tiny_swin(seed=3)
    model.pretrained_cfg = {**model.pretrained_cfg, "input_size": (3, 32, 32), "crop_pct": 1.0,
                            "interpolation": "bilinear", "hf_hub_id": None, "url": None}
    timm.models.save_for_hf(model, str(tmp_path / "swin"), model_config={"label_names": list("abcde")},
                            model_args=dict(img_size=32, patch_size=2, window_size=4, embed_dim=16, depths=[2, 2],
                                            num_heads=[2, 4], num_classes=5), safe_serialization=True)
    return {"vit": (vit, vit.load(vit.custom_spec(str(tmp_path / "vit")))),
            "swin": (swin, swin.load(ModelSpec("swin", str(tmp_path / "swin"), "local", str(tmp_path / "swin"),
                                               "", "", library="timm")))}


@pytest.mark.parametrize("family", ["vit", "swin"])
@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory"), RuntimeError(CPU_ALLOCATOR_FAILURE)],
                         ids=["cuda", "cpu-allocator"])
def test_image_pages_out_of_memory_becomes_advice(tiny_vision, monkeypatch, family, error):
    module, loaded = tiny_vision[family]
    photo = gradient(48, 40)

    def exhausted(*args, **kwargs):
        raise error

    monkeypatch.setattr(loaded.model, "forward", exhausted)
    with pytest.raises(ValueError, match="Out of memory on cpu.*the CPU"):
        module.run(loaded, ImageInput(photo))
    monkeypatch.undo()
    assert module.run(loaded, ImageInput(photo)).maps("self").num_layers >= 2  # the next run works


MARKDOWN_ID = "![x](http://127.0.0.1:9/leak.png) **bold** [link](http://127.0.0.1:9/)"
PICKER_PAGES = {"gpt": "causal_lm", "encoder": "encoder", "translation": "translation", "vit": "vit", "swin": "swin",
                "moe": "moe", "speech": "speech"}


@pytest.mark.parametrize("page", sorted(PICKER_PAGES))
def test_every_page_shows_a_typed_model_id_as_text(page):
    """On every page with the model picker, a typed id (echoed in errors, notes and the model card) stays literal."""
    from app.widgets import OTHER

    family = PICKER_PAGES[page]
    at = app_test(page)
    at.session_state[f"model_{family}"] = OTHER  # straight to the typed id: no default model is loaded
    at.session_state[f"custom_model_{family}"] = MARKDOWN_ID
    at.run()
    assert not at.exception, at.exception[0].value
    assert at.error, "a typed id that cannot load must say so"
    for kind in ("error", "warning", "info", "caption", "markdown", "success"):
        for element in getattr(at, kind):
            body = str(element.value)
            assert "![x](" not in body and "**bold**" not in body and "](http" not in body, f"{kind}: {body}"


@pytest.mark.parametrize("page", ["translation", "moe"])
def test_other_text_pages_survive_every_hostile_text(page):
    """The translation and MoE pages on their own offline mini models: no exception for any case, and the next
    normal sentence gives no error."""
    at = app_test(page).run(timeout=180)
    assert not at.exception, at.exception[0].value
    normal = at.text_area(key=f"{page}_text").value  # the page's first sample: words its mini model knows
    for case, (typed, _, _) in PAGE_TEXT_CASES.items():
        at.text_area(key=f"{page}_text").input(typed).run(timeout=180)
        assert not at.exception, f"{case}: {at.exception[0].value}"
        assert at.error or at.info or at.warning or case not in ("empty", "whitespace"), f"{case}: no message"
        at.text_area(key=f"{page}_text").input(normal).run(timeout=180)
        assert not at.exception and not at.error, f"after {case}: {[e.value for e in at.error]}"


# --- hostile links (url_state.restore puts URL values into widget state) -------------------------------------------

URL_GARBAGE = ["<script>alert(1)</script>", "99999999", "-5", "nan", "1e309", "", "\u202e[x](http://127.0.0.1:9/)"]


@pytest.mark.parametrize("page", [page.name for page in catalog.PAGES])
def test_a_hand_edited_link_cannot_break_a_page(request, monkeypatch, page):
    """Every value a page reads from its URL, set to garbage: the page still runs without an exception."""
    from app import url_state

    if page in ("gpt", "encoder"):
        request.getfixturevalue("tiny_loader")  # the other pages run their small offline models

    recorded: list[str] = []
    real_restore = url_state.restore

    def recording_restore(keys, coerce=None, names=None):
        recorded.extend((names or {}).get(key, key) for key in keys)
        return real_restore(keys, coerce, names)

    monkeypatch.setattr(url_state, "restore", recording_restore)
    app_test(page).run(timeout=300)
    assert recorded, f"the {page} page reads nothing from its URL: its links cannot reproduce what it shows"
    for garbage in URL_GARBAGE:
        at = app_test(page)
        for name in recorded:
            at.query_params[name] = garbage
        at.run(timeout=300)
        assert not at.exception, f"{garbage!r}: {at.exception[0].value}"
