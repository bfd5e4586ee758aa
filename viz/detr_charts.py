"""Drawing primitives of the DETR page: boxes with their class and score on a picture (DETR's Fig. 6 style)."""
from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# one colour per class, cycled (matplotlib's tab10): the same class has the same colour in every figure
PALETTE = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75),
           (227, 119, 194), (127, 127, 127), (188, 189, 34), (23, 190, 207))


def class_colour(label: int) -> tuple[int, int, int]:
    return PALETTE[int(label) % len(PALETTE)]


def _font(size: int):
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one bitmap size
        return ImageFont.load_default()


def draw_boxes(picture: Image.Image, boxes: np.ndarray, captions: list[str], labels: list[int],
               scale: float = 1.0) -> Image.Image:
    """A copy of ``picture`` with each box (x0, y0, x1, y1 in pixels of the unscaled crop, times ``scale``) outlined
    in its class's colour over a thin dark edge (legible on any background) and captioned above (inside the picture
    when the box touches its top; moved left when it would run past the right edge)."""
    picture = picture.convert("RGB").copy()
    draw = ImageDraw.Draw(picture)
    font = _font(max(11, round(picture.height / 26)))
    line = max(2, round(picture.height / 100))
    for box, caption, label in zip(np.asarray(boxes, dtype=np.float64).reshape(-1, 4), captions, labels):
        x0, y0, x1, y1 = (float(v) * scale for v in box)
        x0, x1 = sorted((max(0.0, min(x0, picture.width - 1)), max(0.0, min(x1, picture.width - 1))))
        y0, y1 = sorted((max(0.0, min(y0, picture.height - 1)), max(0.0, min(y1, picture.height - 1))))
        colour = class_colour(label)
        draw.rectangle([x0 - 1, y0 - 1, x1 + 1, y1 + 1], outline=(20, 20, 20), width=line + 2)
        draw.rectangle([x0, y0, x1, y1], outline=colour, width=line)
        left, top, right, bottom = draw.textbbox((0, 0), caption, font=font)
        width, height = right - left + 6, bottom - top + 4
        x_text = max(0.0, min(x0, picture.width - width))
        y_text = y0 - height if y0 - height >= 0 else y0 + line
        draw.rectangle([x_text, y_text, x_text + width, y_text + height], fill=colour)
        draw.text((x_text + 3, y_text + 2 - top), caption, fill=(255, 255, 255), font=font)
    return picture
