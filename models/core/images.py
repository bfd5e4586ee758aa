"""Images a user gives the vision pages: decoding and validating uploads, the shipped sample photos, and
preprocessing exactly as a timm model's data config says.

Decoding (Pillow) accepts PNG, JPEG, WebP, BMP, GIF (first frame) and TIFF; respects the EXIF orientation tag; turns
RGBA / LA / palette (composited on white), greyscale, CMYK and 16-bit images into 8-bit RGB. Limits are deliberate:

- ``MAX_IMAGE_PIXELS`` (64 megapixels, a 48 MP phone photo fits) is checked from the header *before* decoding, so a
  decompression bomb (a few KB of PNG claiming 30 000 × 30 000 pixels) is refused without allocating anything; Pillow's
  own ``Image.MAX_IMAGE_PIXELS`` is set to the same number as a second line of defence.
- ``MIN_SIDE`` (16 px): below that a ViT sees one interpolated blur; 1 × 1 images are refused.
- ``MAX_SIDE`` (2048 px): bigger photos are downscaled on decode (JPEG decodes at a reduced scale directly), which
  keeps memory and time bounded; every model here crops 224–518 px anyway.

Preprocessing follows timm's eval transform built from the model's ``pretrained_cfg`` (``resolve_data_config`` +
``create_transform``): resize the short side to ``input_size / crop_pct`` with the configured interpolation, centre
crop to ``input_size``, scale to [0, 1], subtract ``mean`` and divide by ``std``. ``preprocess`` returns both the
normalised tensor and the uint8 crop the model saw, so overlays land on exactly the pixels behind each patch.
"""
from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile, ImageOps, UnidentifiedImageError

from models.core import limits

MAX_IMAGE_PIXELS = limits.MAX_IMAGE_PIXELS  # width × height refused above this, checked before decoding
MAX_SIDE = limits.MAX_IMAGE_SIDE  # longer side after decoding; larger photos are downscaled (with a notice)
MIN_SIDE = 16  # shorter side below this is refused
MAX_FILE_BYTES = limits.MAX_UPLOAD_BYTES  # = server.maxUploadSize in .streamlit/config.toml
ALLOWED_FORMATS = ("PNG", "JPEG", "WEBP", "BMP", "GIF", "TIFF", "MPO")  # MPO: JPEG from some cameras

Image.MAX_IMAGE_PIXELS = MAX_IMAGE_PIXELS  # Pillow warns above this and refuses above twice this
ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is an error, not a half-grey picture

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "sample_data" / "images"
SAMPLES = {  # label shown on the button -> file in sample_data/images (licences in sample_data/images/LICENSES)
    "cat": "cat.png",
    "astronaut": "astronaut.png",
    "coffee": "coffee.png",
    "rocket": "rocket.jpg",
}


@dataclass(frozen=True)
class UserImage:
    """A decoded, validated image: 8-bit RGB, at most ``MAX_SIDE`` pixels on its longer side."""

    image: Image.Image  # mode "RGB"
    source_format: str  # "PNG", "JPEG", ... as Pillow identified it
    original_size: tuple[int, int]  # (width, height) stored in the file, before orientation and downscaling
    notes: tuple[str, ...] = ()  # what was changed, in words a user understands ("downscaled from ...")

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size


def decode_image(data: bytes, name: str = "the file") -> UserImage:
    """Decode uploaded bytes into an RGB ``UserImage``; every bad input raises ``ValueError`` saying what to do."""
    if not data:
        raise ValueError(f"{name} is empty (0 bytes). Pick an image file such as a PNG or JPEG.")
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{name} is {len(data) / 2**20:.0f} MB; the limit is {MAX_FILE_BYTES // 2**20} MB. "
                         "Save it at a smaller size or as a JPEG.")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ValueError(f"{name} is not an image Pillow can read. Use PNG, JPEG, WebP, BMP or GIF.") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _too_many_pixels(name, None) from None
    except (OSError, SyntaxError, ValueError) as error:
        raise ValueError(f"{name} could not be read as an image ({error}). It may be damaged; "
                         "try saving it again as PNG or JPEG.") from error

    fmt = (image.format or "").upper()
    if fmt not in ALLOWED_FORMATS:
        raise ValueError(f"{name} is a {fmt or 'unknown'} image; use PNG, JPEG, WebP, BMP or GIF.")
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise _too_many_pixels(name, (width, height))
    if min(width, height) < MIN_SIDE:
        raise ValueError(f"{name} is only {width} × {height} pixels; give an image at least {MIN_SIDE} pixels "
                         "on each side (a photo works best).")

    notes: list[str] = []
    frames = getattr(image, "n_frames", 1)
    if frames > 1:
        image.seek(0)
        notes.append(f"animated {fmt} with {frames} frames: the first frame is used")
    if fmt in ("JPEG", "MPO") and max(width, height) > MAX_SIDE:
        image.draft("RGB", (MAX_SIDE, MAX_SIDE))  # decode at 1/2, 1/4 or 1/8 scale directly: fast, little memory
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image.load()
            orientation = image.getexif().get(0x0112, 1)  # EXIF Orientation: 1 = as stored
            image = ImageOps.exif_transpose(image)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _too_many_pixels(name, (width, height)) from None
    except (OSError, SyntaxError, ValueError, EOFError) as error:
        raise ValueError(f"{name} is truncated or damaged ({error}). Upload the complete file, or save it "
                         "again as PNG or JPEG.") from error
    if orientation not in (None, 1):
        notes.append(f"turned upright as its EXIF orientation tag ({orientation}) says")

    rgb, note = to_rgb(image)
    if note:
        notes.append(note)
    if max(rgb.size) > MAX_SIDE:
        rgb.thumbnail((MAX_SIDE, MAX_SIDE), Image.Resampling.LANCZOS)
    if rgb.size not in ((width, height), (height, width)):
        notes.append(f"downscaled from {width} × {height} to {rgb.size[0]} × {rgb.size[1]} pixels")
    return UserImage(rgb, fmt, (width, height), tuple(notes))


def _too_many_pixels(name: str, size: tuple[int, int] | None) -> ValueError:
    what = f"{size[0]} × {size[1]} pixels" if size else "too many pixels"
    return ValueError(f"{name} has {what}, more than the {MAX_IMAGE_PIXELS // 1_000_000} megapixel limit "
                      "(this protects the app from decompression bombs). Resize it below that and upload again.")


def to_rgb(image: Image.Image) -> tuple[Image.Image, str]:
    """8-bit RGB from any Pillow mode, and a note saying what was converted ("" when it already was RGB).

    Transparent pixels are composited on white (what a viewer shows); 16- and 32-bit integer images are scaled from
    their full range (a 16-bit value v becomes round(v / 257)); float images are scaled from [0, 1] when they lie
    there, else clipped to [0, 255]; CMYK and YCbCr use Pillow's conversion.
    """
    mode = image.mode
    if mode == "RGB":
        return image, ""
    if mode == "P":  # palette: with a transparent index it becomes RGBA, handled below
        image = image.convert("RGBA" if "transparency" in image.info else "RGB")
        if image.mode == "RGB":
            return image, "palette image converted to RGB"
        mode = "RGBA"
    if mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB"), \
            "transparent pixels were placed on a white background"
    if mode.startswith("I;16") or mode in ("I", "F"):
        values = np.asarray(image).astype(np.float64)
        if mode == "F":
            values = values * 255.0 if values.size and np.nanmax(values) <= 1.0 else values
        elif mode.startswith("I;16") or values.max(initial=0) > 255:
            values = values / 257.0  # 0..65535 -> 0..255
        grey = np.clip(np.nan_to_num(np.rint(values)), 0, 255).astype(np.uint8)
        return Image.fromarray(grey, "L").convert("RGB"), f"{_bit_depth(mode)} greyscale converted to 8-bit RGB"
    if mode in ("1", "L"):
        return image.convert("RGB"), "greyscale image converted to RGB"
    if mode == "CMYK":
        return image.convert("RGB"), "CMYK image converted to RGB"
    try:
        return image.convert("RGB"), f"{mode} image converted to RGB"
    except ValueError:
        raise ValueError(f"images in Pillow mode {mode!r} are not supported; save it as an RGB PNG or JPEG.") from None


def _bit_depth(mode: str) -> str:
    return {"F": "32-bit float", "I": "32-bit integer"}.get(mode, "16-bit")


def sample_names() -> list[str]:
    """Labels of the shipped sample photos, in the order the page shows them."""
    return list(SAMPLES)


def load_sample(name: str) -> UserImage:
    """One shipped sample photo, decoded through the same path as an upload."""
    if name not in SAMPLES:
        raise ValueError(f"no sample image called {name!r}; the samples are {', '.join(SAMPLES)}")
    path = SAMPLE_DIR / SAMPLES[name]
    return decode_image(path.read_bytes(), f"the sample {name!r}")


def from_array(pixels: np.ndarray) -> UserImage:
    """A ``UserImage`` from an RGB uint8 array ``(H, W, 3)`` (tests, generated data); same validation as uploads."""
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return decode_image(buffer.getvalue(), "the array")


# --- preprocessing as the model's data config says ------------------------------------------------------------

@dataclass(frozen=True)
class Preprocessed:
    """What goes into the model, and what it saw."""

    tensor: "object"  # torch.Tensor (1, 3, H, W) float32, normalised with the config's mean/std
    crop: np.ndarray  # uint8 (H, W, 3): the resized, centre-cropped pixels before normalisation
    data_config: dict  # input_size, interpolation, mean, std, crop_pct, crop_mode as timm resolved them

    def describe(self) -> str:
        """One line for the page: how the image was turned into the model's input."""
        cfg = self.data_config
        _, height, width = cfg["input_size"]
        return (f"resized ({cfg['interpolation']}) and {cfg.get('crop_mode', 'center')}-cropped to {width} × {height} "
                f"(crop_pct {cfg.get('crop_pct', 1.0):g}), normalised with mean {tuple(round(m, 3) for m in cfg['mean'])}"
                f" and std {tuple(round(s, 3) for s in cfg['std'])}")


def data_config(model) -> dict:
    """timm's resolved eval data config of a created model (``input_size``, ``interpolation``, ``mean``, ...)."""
    import timm.data

    return dict(timm.data.resolve_data_config({}, model=model))


def preprocess(image: Image.Image | UserImage, config: dict) -> Preprocessed:
    """Apply timm's eval transform for ``config``; return the normalised tensor and the uint8 crop it came from.

    The transform is timm's own ``create_transform(**config, is_training=False)``, split at ``ToTensor``: the PIL
    steps (resize, crop) give the crop, the tensor steps (to [0, 1], normalise) give the input. Equal to applying the
    whole transform at once (tested).
    """
    import timm.data
    import torch

    pil = image.image if isinstance(image, UserImage) else image
    if pil.mode != "RGB":
        pil, _ = to_rgb(pil)
    transform = timm.data.create_transform(**config, is_training=False)
    steps = list(getattr(transform, "transforms", [transform]))
    split = next((i for i, step in enumerate(steps) if "ToTensor" in type(step).__name__), None)
    if split is None:
        raise ValueError("this model's data config has no ToTensor step; it cannot be shown as an image crop")
    crop = pil
    for step in steps[:split]:
        crop = step(crop)
    tensor = crop
    for step in steps[split:]:
        tensor = step(tensor)
    tensor = torch.as_tensor(tensor, dtype=torch.float32).unsqueeze(0).contiguous()  # (1, 3, H, W)
    return Preprocessed(tensor, np.asarray(crop.convert("RGB"), dtype=np.uint8).copy(), dict(config))
