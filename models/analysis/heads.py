"""Per-head summaries that let a user find interesting heads among hundreds without opening each.

For a head's map A ``(q, k)`` (rows are probability distributions):
- entropy: mean over queries of −Σ_k A log₂ A (bits); low = focused, log₂(k) = uniform;
- mean distance: mean over queries of Σ_k A_qk |q − k| (tokens), the text analogue of the ViT paper's Fig. 7;
- first-token share: mean over queries of A_q0 (the "attention sink" of Xiao et al. 2023);
- previous-token score: mean over q ≥ 1 of A_q,q−1 (Olsson et al.'s previous-token heads);
- diagonal score: mean over queries of A_qq (self-attention to the token itself).
Thumbnails are block means of each map to at most ``size × size`` cells, so the all-heads grid costs
``layers × heads × size²`` floats whatever the input length.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.results import AttentionMaps

STATISTICS = {
    "entropy_bits": "Entropy (bits)",
    "mean_distance": "Mean distance (tokens)",
    "first_token": "Share on first token",
    "previous_token": "Previous-token score",
    "diagonal": "Self (diagonal) score",
}


def _bin_edges(length: int, bins: int) -> np.ndarray:
    return np.linspace(0, length, bins + 1).round().astype(int)[:-1]


def pooled(weights: np.ndarray, size: int = 64) -> np.ndarray:
    """Block means of ``(heads, q, k)`` to ``(heads, min(q, size), min(k, size))``."""
    heads, q, k = weights.shape
    rows, cols = _bin_edges(q, min(q, size)), _bin_edges(k, min(k, size))
    summed = np.add.reduceat(np.add.reduceat(weights, rows, axis=1), cols, axis=2)
    row_counts = np.diff(np.append(rows, q))[None, :, None]
    col_counts = np.diff(np.append(cols, k))[None, None, :]
    return (summed / (row_counts * col_counts)).astype(np.float32)


def layer_statistics(weights: np.ndarray, query_offset: int = 0) -> dict[str, np.ndarray]:
    """The statistics above for every head of one layer ``(heads, q, k)`` -> ``{name: (heads,)}``.

    ``query_offset``: position of query 0 among the keys (0 for self-attention over the same tokens).
    """
    heads, q, k = weights.shape
    query_pos = np.arange(q)[:, None] + query_offset
    distance = np.abs(query_pos - np.arange(k)[None, :]).astype(np.float32)  # (q, k)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(weights > 0, weights * np.log2(weights), 0.0)
    entropy = -plogp.sum(axis=-1).mean(axis=-1)
    rows = np.arange(q)
    diagonal_cols = rows + query_offset
    on_diag = diagonal_cols < k
    diagonal = weights[:, rows[on_diag], diagonal_cols[on_diag]].mean(axis=-1) if on_diag.any() else np.zeros(heads)
    previous = diagonal_cols - 1
    has_previous = (previous >= 0) & (previous < k)
    previous_score = (weights[:, rows[has_previous], previous[has_previous]].mean(axis=-1)
                      if has_previous.any() else np.zeros(heads))
    return {
        "entropy_bits": entropy.astype(np.float32),
        "mean_distance": (weights * distance).sum(axis=-1).mean(axis=-1).astype(np.float32),
        "first_token": weights[:, :, 0].mean(axis=-1).astype(np.float32),
        "previous_token": np.asarray(previous_score, dtype=np.float32),
        "diagonal": np.asarray(diagonal, dtype=np.float32),
    }


@dataclass(frozen=True)
class HeadSummary:
    thumbnails: np.ndarray  # (layers, heads, s_q, s_k) block means
    statistics: dict[str, np.ndarray]  # name -> (layers, heads)


def summarize(maps: AttentionMaps, size: int = 64) -> HeadSummary:
    """Thumbnails and statistics of every head, computing one layer at a time (peak: one layer's maps)."""
    thumbnails, stats = [], {name: [] for name in STATISTICS}
    for layer in range(maps.num_layers):
        weights = maps.layer(layer)
        thumbnails.append(pooled(weights, size))
        for name, values in layer_statistics(weights).items():
            stats[name].append(values)
    return HeadSummary(np.stack(thumbnails), {name: np.stack(v) for name, v in stats.items()})
