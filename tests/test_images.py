"""Decoding uploads (formats, modes, EXIF, bad files, limits) and preprocessing as timm's data config says."""
import io
import struct
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from models.core import images


def encode(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


@pytest.fixture(scope="module")
def photo() -> Image.Image:
    return images.load_sample("coffee").image.resize((64, 48))


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF"])
def test_every_format_decodes_to_rgb(photo, fmt):
    decoded = images.decode_image(encode(photo, fmt))
    assert decoded.image.mode == "RGB" and decoded.size == (64, 48) and decoded.source_format == fmt
    if fmt in ("PNG", "BMP", "TIFF"):  # lossless: same pixels
        assert np.array_equal(np.asarray(decoded.image), np.asarray(photo))


def test_transparent_pixels_go_on_white():
    rgba = np.zeros((20, 20, 4), np.uint8)
    rgba[:, :10] = (255, 0, 0, 255)  # left half opaque red, right half fully transparent
    decoded = images.decode_image(encode(Image.fromarray(rgba, "RGBA"), "PNG"))
    pixels = np.asarray(decoded.image)
    assert (pixels[:, :10] == (255, 0, 0)).all() and (pixels[:, 10:] == 255).all()
    assert any("white" in note for note in decoded.notes)


@pytest.mark.parametrize("mode", ["L", "1", "P", "LA", "CMYK"])
def test_modes_are_converted(photo, mode):
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    decoded = images.decode_image(encode(photo.convert(mode), fmt))
    assert decoded.image.mode == "RGB" and decoded.notes


def test_sixteen_bit_is_scaled_not_clipped():
    ramp = (np.arange(32 * 32).reshape(32, 32) * 64).astype(np.uint16)  # 0 .. 65472
    decoded = images.decode_image(encode(Image.fromarray(ramp), "PNG"))
    pixels = np.asarray(decoded.image)[..., 0]
    assert pixels.max() == round(65472 / 257) and pixels.min() == 0
    assert np.array_equal(pixels, np.rint(ramp / 257).astype(np.uint8))


def test_gif_uses_first_frame():
    frames = [Image.new("RGB", (20, 20), color) for color in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    decoded = images.decode_image(buffer.getvalue())
    assert tuple(np.asarray(decoded.image)[5, 5]) == (255, 0, 0)
    assert any("first frame" in note for note in decoded.notes)


def test_exif_orientation_is_respected():
    wide = np.zeros((20, 40, 3), np.uint8)
    wide[:, :20] = 255  # left half white
    exif = Image.Exif()
    exif[0x0112] = 6  # stored rotated: viewers turn it 90° clockwise
    decoded = images.decode_image(encode(Image.fromarray(wide), "JPEG", exif=exif, quality=95))
    assert decoded.size == (20, 40)  # upright: portrait
    pixels = np.asarray(decoded.image).mean(axis=(1, 2))
    assert pixels[:15].mean() > 200 and pixels[-15:].mean() < 50  # the left half is now on top
    assert any("EXIF" in note for note in decoded.notes)


def _png_claiming(width: int, height: int) -> bytes:
    """A few hundred bytes of PNG whose header claims ``width × height`` (a decompression bomb's header)."""
    data = encode(Image.new("L", (16, 16)), "PNG")
    ihdr = struct.pack(">II", width, height) + data[24:29]
    chunk = b"IHDR" + ihdr
    return data[:8] + struct.pack(">I", 13) + chunk + struct.pack(">I", zlib.crc32(chunk)) + data[33:]


@pytest.mark.parametrize("data, says", [
    (b"", "empty"),
    (b"%PDF-1.4 certainly not an image", "not an image"),
    (_png_claiming(30_000, 30_000), "megapixel"),
    (encode(Image.new("RGB", (1, 1)), "PNG"), "1 × 1"),
])
def test_bad_files_say_what_to_do(data, says):
    with pytest.raises(ValueError, match=says):
        images.decode_image(data)


def test_truncated_jpeg_is_refused(photo):
    data = encode(photo.resize((256, 192)), "JPEG", quality=90)
    with pytest.raises(ValueError, match="truncated|damaged|could not be read"):
        images.decode_image(data[: len(data) // 2])


def test_large_photo_is_downscaled():
    big = Image.fromarray(np.random.default_rng(0).integers(0, 255, (1500, 5000, 3), np.uint8))
    decoded = images.decode_image(encode(big, "JPEG"))
    assert max(decoded.size) == images.MAX_SIDE and abs(decoded.size[0] / decoded.size[1] - 5000 / 1500) < 0.01
    assert any("downscaled" in note for note in decoded.notes)


def test_pillow_limit_is_set_deliberately():
    assert Image.MAX_IMAGE_PIXELS == images.MAX_IMAGE_PIXELS


def test_samples_and_licences_ship():
    assert (images.SAMPLE_DIR / "LICENSES").is_file()
    for name in images.sample_names():
        assert images.load_sample(name).image.mode == "RGB"
    with pytest.raises(ValueError, match="samples are"):
        images.load_sample("dog")


def test_preprocess_equals_timm_transform_and_returns_the_crop():
    import timm.data

    config = {"input_size": (3, 56, 56), "interpolation": "bicubic", "mean": (0.485, 0.456, 0.406),
              "std": (0.229, 0.224, 0.225), "crop_pct": 0.875, "crop_mode": "center"}
    picture = images.load_sample("rocket")
    prepared = images.preprocess(picture, config)
    whole = timm.data.create_transform(**config, is_training=False)(picture.image)
    assert prepared.tensor.shape == (1, 3, 56, 56) and prepared.crop.shape == (56, 56, 3)
    assert torch.allclose(prepared.tensor[0], whole, atol=1e-6)
    mean, std = torch.tensor(config["mean"])[:, None, None], torch.tensor(config["std"])[:, None, None]
    from_crop = (torch.from_numpy(prepared.crop).permute(2, 0, 1).float() / 255 - mean) / std
    assert torch.allclose(prepared.tensor[0], from_crop, atol=1e-5)
