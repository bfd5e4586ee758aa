"""Attention over an image, drawn as in the ViT paper's attention figure (Dosovitskiy et al. 2021, Fig. 6): a value
per patch ``(rows, cols)`` is normalised, upsampled to the crop the model saw (bilinear, or nearest to show the exact
patches), coloured with a colormap and alpha-blended onto the crop.

Geometry: patch (r, c) covers pixels ``[r·ph, (r+1)·ph) × [c·pw, (c+1)·pw)`` of the crop, so a one-hot map on (r, c)
lights exactly that block with ``upsample="nearest"`` and is centred on it with ``"bilinear"`` (tested). Pure: arrays
in, ``PIL.Image`` out; no Streamlit.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

COLORMAPS = ("inferno", "viridis", "cividis", "magma", "plasma", "jet", "gray")
UPSAMPLING = ("bilinear", "nearest")


def normalise(values: np.ndarray, clip_percentile: float = 100.0, scale_from: np.ndarray | None = None) -> np.ndarray:
    """Min–max to [0, 1] (a constant map becomes all zeros), float32. ``clip_percentile`` < 100 saturates the
    brightest values at that percentile, so one outlier patch does not turn the rest of the map black.
    ``scale_from`` (bool, the shape of ``values``) names the values that set the scale; the others are clipped into
    it (they saturate at either end). None, or no value named: all of them."""
    values = np.asarray(values, dtype=np.float32)
    reference = values
    if scale_from is not None:
        scale_from = np.asarray(scale_from, dtype=bool)
        if scale_from.shape != values.shape:
            raise ValueError(f"scale_from has shape {scale_from.shape}, the values {values.shape}")
        if scale_from.any():
            reference = values[scale_from]
    high = float(np.percentile(reference, clip_percentile)) if clip_percentile < 100.0 else float(reference.max())
    low = float(reference.min())
    values = np.clip(values, low, high)
    return np.zeros_like(values) if high - low <= 1e-12 else (values - low) / (high - low)


def upsample(values: np.ndarray, size: tuple[int, int], mode: str = "bilinear") -> np.ndarray:
    """``(rows, cols)`` -> ``(H, W)`` float32; ``size`` is (H, W). Bilinear uses pixel-centre alignment."""
    if mode not in UPSAMPLING:
        raise ValueError(f"unknown upsampling {mode!r}; use one of {UPSAMPLING}")
    height, width = size
    grid = Image.fromarray(np.asarray(values, dtype=np.float32), mode="F")
    resample = Image.Resampling.BILINEAR if mode == "bilinear" else Image.Resampling.NEAREST
    return np.asarray(grid.resize((width, height), resample), dtype=np.float32)


def colorize(values: np.ndarray, colormap: str = "inferno") -> np.ndarray:
    """Values in [0, 1] ``(H, W)`` -> uint8 RGB ``(H, W, 3)`` through a matplotlib colormap (no pyplot)."""
    import matplotlib

    if colormap not in COLORMAPS:
        raise ValueError(f"unknown colormap {colormap!r}; use one of {COLORMAPS}")
    rgba = matplotlib.colormaps[colormap](np.clip(values, 0.0, 1.0))
    return (rgba[..., :3] * 255).round().astype(np.uint8)


def attention_overlay(image: np.ndarray, patch_values: np.ndarray, opacity: float = 0.6,
                      colormap: str = "inferno", mode: str = "bilinear", scale: int = 1,
                      clip_percentile: float = 100.0, scale_from: np.ndarray | None = None) -> Image.Image:
    """Blend a per-patch map onto the crop the model saw.

    image: uint8 ``(H, W, 3)``; patch_values: ``(rows, cols)`` (any scale, normalised here); opacity in [0, 1]
    (0 = only the photo); ``scale`` enlarges the result (nearest) so small crops (64 px) stay readable;
    ``clip_percentile`` (see ``normalise``) keeps an outlier patch from washing out the rest; ``scale_from`` (bool
    ``(rows, cols)``, see ``normalise``) sets the colour scale from some patches only (the others saturate).
    """
    if not 0.0 <= opacity <= 1.0:
        raise ValueError(f"opacity must be between 0 and 1; got {opacity}")
    image = np.asarray(image, dtype=np.uint8)
    heat = colorize(normalise(upsample(normalise(patch_values, clip_percentile, scale_from), image.shape[:2], mode)),
                    colormap)
    blended = (1.0 - opacity) * image.astype(np.float32) + opacity * heat.astype(np.float32)
    result = Image.fromarray(np.clip(blended.round(), 0, 255).astype(np.uint8))
    return result.resize((result.width * scale, result.height * scale), Image.Resampling.NEAREST) if scale > 1 \
        else result


def patch_grid(image: np.ndarray, grid: tuple[int, int], highlight: tuple[int, int] | None = None,
               scale: int = 1, colour: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """The crop with its patch grid drawn on (thin lines), and one patch outlined in red when ``highlight`` is given."""
    picture = Image.fromarray(np.asarray(image, dtype=np.uint8))
    if scale > 1:
        picture = picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(picture)
    rows, cols = grid
    step_y, step_x = picture.height / rows, picture.width / cols
    for r in range(1, rows):
        draw.line([(0, round(r * step_y)), (picture.width, round(r * step_y))], fill=colour, width=1)
    for c in range(1, cols):
        draw.line([(round(c * step_x), 0), (round(c * step_x), picture.height)], fill=colour, width=1)
    if highlight is not None:
        r, c = highlight
        box = [round(c * step_x), round(r * step_y), round((c + 1) * step_x) - 1, round((r + 1) * step_y) - 1]
        draw.rectangle(box, outline=(255, 0, 0), width=max(2, scale))
    return picture


def outline_patches(picture: Image.Image, grid: tuple[int, int], patches: np.ndarray,
                    colour: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """A copy of ``picture`` (the crop, at any scale) with each patch where ``patches`` (bool ``(rows, cols)``) is
    True outlined in ``colour`` over a thin dark edge, so the mark reads on any colour of the map under it."""
    picture = picture.convert("RGB").copy()
    draw = ImageDraw.Draw(picture)
    rows, cols = grid
    step_y, step_x = picture.height / rows, picture.width / cols
    width = max(2, round(min(step_x, step_y) / 10))
    for r, c in zip(*np.nonzero(np.asarray(patches, dtype=bool))):
        box = [round(c * step_x), round(r * step_y), round((c + 1) * step_x) - 1, round((r + 1) * step_y) - 1]
        draw.rectangle(box, outline=(20, 20, 20), width=width + 2)
        draw.rectangle([box[0] + 1, box[1] + 1, box[2] - 1, box[3] - 1], outline=colour, width=width)
    return picture


def tile(pictures: list[Image.Image], columns: int, gap: int = 4, background=(255, 255, 255)) -> Image.Image:
    """Pictures of one size in a grid, row-major (the all-heads grid)."""
    if not pictures:
        raise ValueError("nothing to tile")
    width, height = pictures[0].size
    rows = -(-len(pictures) // columns)
    sheet = Image.new("RGB", (columns * width + (columns - 1) * gap, rows * height + (rows - 1) * gap), background)
    for index, picture in enumerate(pictures):
        r, c = divmod(index, columns)
        sheet.paste(picture, (c * (width + gap), r * (height + gap)))
    return sheet


def similarity_grid(similarity: np.ndarray, tile_pixels: int = 42, gap: int = 3,
                    colormap: str = "viridis") -> Image.Image:
    """The ViT paper's Fig. 7 (centre): for each patch position (r, c) a small tile showing the cosine similarity of
    its position embedding with every position. ``similarity``: ``(rows, cols, rows, cols)`` in [-1, 1]; one colour
    scale for all tiles (-1 → bottom of the colormap, 1 → top). Each tile is about ``tile_pixels`` wide."""
    rows, cols = similarity.shape[:2]
    per_patch = max(1, tile_pixels // max(rows, cols))
    tiles = [Image.fromarray(colorize((similarity[r, c] + 1.0) / 2.0, colormap)).resize(
        (cols * per_patch, rows * per_patch), Image.Resampling.NEAREST) for r in range(rows) for c in range(cols)]
    return tile(tiles, cols, gap)
