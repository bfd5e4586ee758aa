"""Drawing primitives of the MLP-Mixer page: a signed tokens × tokens map as an image (diverging, 0 in white)."""
from __future__ import annotations

import numpy as np
from PIL import Image

DIVERGING = "RdBu_r"  # red: positive, blue: negative, white: 0


def signed_matrix_image(values: np.ndarray, max_pixels: int = 512) -> tuple[Image.Image, float]:
    """``values`` (rows, cols), any sign, as an RGB image scaled symmetrically about 0 (±the largest |value|), each
    cell enlarged to whole pixels up to about ``max_pixels``; returns the image and that largest |value|."""
    from matplotlib import colormaps

    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2 or values.size == 0:
        raise ValueError(f"a map is a non-empty 2-D array; got shape {values.shape}")
    limit = float(np.abs(values).max()) or 1.0
    rgb = (colormaps[DIVERGING](0.5 + 0.5 * values / limit)[..., :3] * 255).round().astype(np.uint8)
    scale = max(1, max_pixels // max(values.shape))
    image = Image.fromarray(rgb).resize((rgb.shape[1] * scale, rgb.shape[0] * scale), Image.Resampling.NEAREST)
    return image, limit
