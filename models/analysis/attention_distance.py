"""Mean attention distance per head, in pixels (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words", Fig. 7
right and Appendix D.7): for each head, the distance in image space between a query patch and the key patches it
attends to, weighted by the attention weights and averaged over query patches::

    d(layer, head) = mean_q  Σ_k  A'[q, k] · ‖centre(q) − centre(k)‖₂ · patch_size

Only patch tokens take part (prefix tokens such as [CLS] and registers have no position). ``A'`` is the patch-to-patch
block renormalised to sum to 1 per query, so a head that parks most of its weight on [CLS] is still measured by where
its patch attention goes (the paper's figure does not say how it treats the prefix; without renormalising, such heads
would read as near-zero distance). Early layers of an ImageNet ViT mix local and global heads; later layers are
global: the paper's "receptive field grows with depth" finding, in pixels of the model's input crop.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def patch_distances(grid: tuple[int, int], patch_size: tuple[int, int]) -> np.ndarray:
    """Euclidean distance in pixels between patch centres, ``(P, P)`` with P = rows · cols (row-major order)."""
    rows, cols = grid
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    centres = np.stack([r.ravel() * patch_size[0], c.ravel() * patch_size[1]], axis=-1).astype(np.float64)
    return np.linalg.norm(centres[:, None, :] - centres[None, :, :], axis=-1)


def mean_attention_distance(layers: Sequence[np.ndarray], grid: tuple[int, int], patch_size: tuple[int, int],
                            num_prefix_tokens: int) -> np.ndarray:
    """``(layers, heads)`` mean attention distance in pixels from per-layer attention ``(heads, N, N)``."""
    distances = patch_distances(grid, patch_size)  # (P, P)
    patches = grid[0] * grid[1]
    out = []
    for attention in layers:
        if attention.shape[-1] != num_prefix_tokens + patches:
            raise ValueError(f"attention over {attention.shape[-1]} tokens does not match {num_prefix_tokens} "
                             f"prefix tokens + {patches} patches")
        block = np.asarray(attention[:, num_prefix_tokens:, num_prefix_tokens:], dtype=np.float64)  # (H, P, P)
        total = block.sum(-1, keepdims=True)
        block = np.divide(block, total, out=np.zeros_like(block), where=total > 0)
        out.append((block * distances).sum(-1).mean(-1))  # (H,)
    return np.stack(out).astype(np.float32)
