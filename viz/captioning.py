"""Drawing a word's attention over the image when image tokens are regions of any shape: the mini's 8 × 8 cells, a
LLaVA's centre crop, SmolVLM's tiles plus a thumbnail over the same pixels, Qwen2-VL's merged blocks.

A token's value is spread evenly over its region (``region_density``: value / area, summed where regions overlap, so
a tile token and the thumbnail token covering the same pixel both count, each by its own area), coloured and blended
onto the picture; ``smooth`` blurs it by about half a token (the soft maps of Xu et al. 2015, Fig. 2–3). Visual
attention sinks are outlined, and may be left out of the colour scale (their pixels then saturate). The strip of
small overlays with each word under its map is the paper's figure. Pure: arrays in, ``PIL.Image`` out.
"""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from viz import image_overlay

SINK_OUTLINE = (0, 229, 255)  # cyan: reads on every colormap here
LABEL_FRACTION = 0.16  # a word's label is this fraction of its tile's height: readable from the back of a hall


def font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def region_density(values: np.ndarray, boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    """float32 ``(height, width)``: each token's ``values[i]`` spread over its box ``boxes[i]`` (x0, y0, x1, y1 in
    pixels of this canvas, x1/y1 exclusive, rounded to whole pixels), divided by the box's area, summed."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) != len(boxes):
        raise ValueError(f"{len(values)} values for {len(boxes)} regions")
    density = np.zeros((height, width), dtype=np.float64)
    rounded = np.rint(np.asarray(boxes, dtype=np.float64)).astype(int)
    rounded[:, [0, 2]] = rounded[:, [0, 2]].clip(0, width)
    rounded[:, [1, 3]] = rounded[:, [1, 3]].clip(0, height)
    for value, (x0, y0, x1, y1) in zip(values, rounded):
        x1, y1 = max(x1, min(x0 + 1, width)), max(y1, min(y0 + 1, height))  # a sub-pixel region keeps one pixel
        area = (x1 - x0) * (y1 - y0)
        if area > 0:
            density[y0:y1, x0:x1] += value / area
    return density.astype(np.float32)


def smoothed(density: np.ndarray, radius: float) -> np.ndarray:
    """A Gaussian blur of ``radius`` pixels (0: unchanged)."""
    if radius <= 0:
        return density
    from scipy.ndimage import gaussian_filter

    return gaussian_filter(np.asarray(density, dtype=np.float32), sigma=radius, mode="nearest")


def word_overlay(picture: np.ndarray, values: np.ndarray, boxes: np.ndarray, opacity: float = 0.6,
                 colormap: str = "inferno", smooth: bool = True, clip: float = 100.0,
                 sinks: np.ndarray | None = None, exclude_sinks: bool = False, pixels: int = 0) -> Image.Image:
    """One word's map on ``picture`` (uint8 (H, W, 3)): ``values`` per token, ``boxes`` in pixels of ``picture``.
    ``sinks``: token indices to outline; ``exclude_sinks``: the colour scale tops out at the highest value outside
    them. ``pixels``: the result's longer side (nearest enlargement of small pictures), 0 = as is."""
    if not 0.0 <= opacity <= 1.0:
        raise ValueError(f"opacity must be between 0 and 1; got {opacity}")
    if not 0.0 < clip <= 100.0:
        raise ValueError(f"clip is a percentile: between 0 and 100, not {clip}")
    height, width = picture.shape[:2]
    values = np.asarray(values, dtype=np.float32)
    sinks = np.asarray([] if sinks is None else sinks, dtype=np.int64)
    radius = 0.0
    if smooth and len(boxes):
        sides = np.minimum(boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1])
        radius = 0.5 * float(np.median(sides[sides > 0])) if (sides > 0).any() else 0.0
    density = smoothed(region_density(values, boxes, height, width), radius)
    top = None
    if exclude_sinks and len(sinks):
        kept = values.copy()
        kept[sinks] = 0.0
        top = float(smoothed(region_density(kept, boxes, height, width), radius).max())
    if clip < 100.0:
        limit = float(np.percentile(density, clip))
        top = limit if top is None else min(top, limit)
    if top is not None and top > 0:
        density = np.minimum(density, top)
    heat = image_overlay.colorize(image_overlay.normalise(density), colormap)
    blended = (1.0 - opacity) * picture.astype(np.float32) + opacity * heat.astype(np.float32)
    result = Image.fromarray(np.clip(blended.round(), 0, 255).astype(np.uint8))
    scale = max(1, round(pixels / max(height, width))) if pixels else 1
    if scale > 1:
        result = result.resize((width * scale, height * scale), Image.Resampling.NEAREST)
    if len(sinks):
        draw = ImageDraw.Draw(result)
        for x0, y0, x1, y1 in np.asarray(boxes)[sinks] * scale:
            draw.rectangle([x0, y0, max(x0, x1 - 1), max(y0, y1 - 1)], outline=SINK_OUTLINE, width=max(1, scale))
    return result


def labelled(picture: Image.Image, label: str, highlight: bool = False) -> Image.Image:
    """``picture`` with ``label`` written under it in large type (the paper's strip), framed when ``highlight``."""
    size = max(12, round(picture.height * LABEL_FRACTION))
    band = round(size * 1.5)
    sheet = Image.new("RGB", (picture.width, picture.height + band), (255, 255, 255))
    sheet.paste(picture, (0, 0))
    draw = ImageDraw.Draw(sheet)
    typeface = font(size)
    text = label
    while draw.textlength(text, font=typeface) > picture.width - 4 and len(text) > 2:
        text = text[:-2] + "…"
    x = (picture.width - draw.textlength(text, font=typeface)) / 2
    draw.text((x, picture.height + (band - size) / 2 - 1), text, fill=(0, 0, 0), font=typeface)
    if highlight:
        draw.rectangle([0, 0, sheet.width - 1, sheet.height - 1], outline=(220, 30, 30), width=max(2, size // 6))
    return sheet


def strip(tiles: list[Image.Image], columns: int, gap: int = 6) -> Image.Image:
    """The tiles in rows of ``columns`` (the paper's strip, wrapped)."""
    return image_overlay.tile(tiles, max(1, min(columns, len(tiles))), gap)


def outline_regions(picture: np.ndarray, boxes: np.ndarray, frame_of: np.ndarray, pixels: int = 0) -> Image.Image:
    """The picture with every frame's token grid drawn on, one colour per frame (how the processor cut it up)."""
    palette = [(255, 255, 255), (255, 200, 0), (0, 229, 255), (255, 80, 200), (120, 255, 120)]
    height, width = picture.shape[:2]
    scale = max(1, round(pixels / max(height, width))) if pixels else 1
    result = Image.fromarray(picture).resize((width * scale, height * scale), Image.Resampling.NEAREST)
    draw = ImageDraw.Draw(result)
    for (x0, y0, x1, y1), frame in zip(np.asarray(boxes) * scale, frame_of):
        draw.rectangle([x0, y0, max(x0, x1 - 1), max(y0, y1 - 1)], outline=palette[int(frame) % len(palette)])
    return result
