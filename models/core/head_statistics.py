"""Per-head attention statistics: the one table of their names, labels, units and formulas, and
the float64 numpy reference every path is tested against.

For a head's map A ``(q, k)`` (row i: query i's weights over the keys, summing to 1), each
statistic is a mean over queries (Clark et al. 2019 for the first-token and diagonal shares, Xiao
et al. 2023 for the sink, Olsson et al. 2022 for the previous-token and induction scores). The
paths that compute them:

- the heads table, numpy: ``models/analysis/heads.py`` (``layer_statistics``: this reference,
  kept in float32);
- the heads table from q and k: ``models/core/tiles.py`` ``head_statistics`` (PyTorch) and its
  Triton kernels (``models/core/tiles_triton.py``);
- corpus mode: ``models/corpus/statistics.py`` ``HeadStatistics`` (PyTorch) and its fused Triton
  kernel (``models/corpus/statistics_triton.py``); its ``eager_statistics`` is this reference on
  an eager model's maps.

Which statistics a path computes is the table's ``heads_table`` / ``corpus`` flags; every label
shown anywhere is the table's. ``tests/test_head_statistics.py`` checks every path against
``reference``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Statistic:
    name: str  # the key in every dict, file column and link
    label: str  # what a page, a table or a caption shows
    unit: str
    formula: str  # one line, over a head's map A (q, k)
    heads_table: bool = True  # in the heads table (analysis/heads.py, tiles.head_statistics)
    corpus: bool = True  # in corpus mode (models/corpus/statistics.py)


TABLE = (
    Statistic("entropy_bits", "Entropy (bits)", "bits",
              "mean_q −Σ_k A_qk log₂ A_qk (0 log 0 = 0)"),
    Statistic("mean_distance", "Mean distance (tokens)", "tokens", "mean_q Σ_k A_qk |q − k|"),
    Statistic("first_token", "First-token (sink) share", "share", "mean_q A_q0"),
    Statistic("previous_token", "Previous-token score", "share", "mean over q ≥ 1 of A_q,q−1"),
    Statistic("diagonal", "Self (diagonal) score", "share", "mean over q < k of A_qq"),
    Statistic("induction", "Induction score", "share",
              "mean over q with a target of Σ A_qt over t, 1 ≤ t < q, token t−1 = token q; "
              "NaN if none", heads_table=False),
    Statistic("max_weight", "Mean max weight", "share", "mean_q max_k A_qk", heads_table=False),
)
BY_NAME = {statistic.name: statistic for statistic in TABLE}
HEADS_TABLE = tuple(s.name for s in TABLE if s.heads_table)
CORPUS = tuple(s.name for s in TABLE if s.corpus)
# the corpus's "top examples": a head's largest weight in a document off the first key and the
# diagonal, and where it sits
PEAK_FIELDS = ("peak_value", "peak_query", "peak_key")


def labels(names: tuple[str, ...] = HEADS_TABLE) -> dict[str, str]:
    """``{name: label}`` of ``names``, in the table's order."""
    return {name: BY_NAME[name].label for name in names}


def label(name: str) -> str:
    return BY_NAME[name].label


ROWS_PER_BLOCK = 256  # queries a step: temporaries stay (heads, block, k), not (heads, q, k)


def reference(weights: np.ndarray, query_offset: int = 0, token_ids=None,
              causal: bool | None = None, names: tuple[str, ...] | None = None,
              dtype=np.float64, sink: bool = False) -> dict[str, np.ndarray]:
    """Every statistic of ``names`` for each head of ``weights (heads, q, k)``: ``{name: (heads,)}``
    in ``dtype``, computed in float64. ``names`` defaults to the heads table's, ``max_weight``, and
    with ``token_ids`` ``induction``; with ``token_ids`` the peak fields come too.

    Masked keys must be exactly 0 (they add nothing: 0 log 0 = 0). A query that sees no key is an
    all-zero row and still counts in every mean, as in the tile path; the corpus passes a document's
    real queries only, so its padding never counts. ``query_offset``: the position of query 0 among
    the keys (query i's own key is ``i + query_offset``). ``token_ids (q,)``: the document's tokens,
    for the induction targets and the peak. The peak is the largest weight off the first key and the
    diagonal (and, ``causal``, off the future keys; None: causal when no weight lies above the
    diagonal), the first in row-major order on a tie; NaN (query and key −1) when no cell qualifies.
    ``sink``: rows sum to one less a sink's share (gpt-oss), which is one more outcome of the row's
    entropy, as the tile path counts it.
    """
    heads, q, k = weights.shape
    if names is None:
        names = (*HEADS_TABLE, *(("induction",) if token_ids is not None else ()), "max_weight")
    rows = np.arange(q)
    own = rows + query_offset
    entropy, distance, largest = np.zeros(heads), np.zeros(heads), np.zeros(heads)
    for start in range(0, q, ROWS_PER_BLOCK):
        block = weights[:, start:start + ROWS_PER_BLOCK].astype(np.float64)  # (heads, b, k)
        gap = np.abs(own[start:start + block.shape[1], None] - np.arange(k)[None, :])  # (b, k)
        entropy -= (block * np.log2(np.where(block > 0, block, 1))).sum(axis=(1, 2))
        if sink:
            share = np.clip(1 - block.sum(-1), 0, None)  # (heads, b)
            entropy -= (share * np.log2(np.where(share > 0, share, 1))).sum(-1)
        distance += (block * gap).sum(axis=(1, 2))
        if "max_weight" in names and k:
            largest += block.max(-1).sum(-1)
    out = {"entropy_bits": entropy / q, "mean_distance": distance / q, "max_weight": largest / q,
           "first_token": weights[:, :, 0].astype(np.float64).mean(-1)}
    on_diagonal = (own >= 0) & (own < k)
    diagonal = weights[:, rows[on_diagonal], own[on_diagonal]].astype(np.float64)
    out["diagonal"] = diagonal.mean(-1) if on_diagonal.any() else np.zeros(heads)
    has_previous = (rows >= 1) & (own - 1 >= 0) & (own - 1 < k)
    previous = weights[:, rows[has_previous], own[has_previous] - 1].astype(np.float64)
    out["previous_token"] = previous.mean(-1) if has_previous.any() else np.zeros(heads)
    if token_ids is not None:
        out.update(_induction_and_peak(weights, np.asarray(token_ids), causal))
    found = {name: np.asarray(out[name]).astype(dtype) for name in names}
    if token_ids is not None:
        found.update({name: out[name] for name in PEAK_FIELDS})  # the query and key stay ints
    return found


def _induction_and_peak(weights: np.ndarray, tokens: np.ndarray, causal: bool | None
                        ) -> dict[str, np.ndarray]:
    """The corpus's induction score and peak of one document's map ``(heads, n, n)``."""
    heads, n, _ = weights.shape
    targets = np.zeros((n, n), dtype=bool)  # [q, t]: t ≥ 1, t < q and token t−1 == token q
    targets[:, 1:] = tokens[None, :-1] == tokens[:, None]
    targets &= np.tri(n, n, -1, dtype=bool)
    has_target = targets.any(-1)
    if has_target.any():
        induction = (weights.astype(np.float64) * targets).sum(-1)[:, has_target].mean(-1)
    else:
        induction = np.full(heads, np.nan)
    candidates = np.ones((n, n), dtype=bool)
    candidates[:, 0] = False
    candidates[np.arange(n), np.arange(n)] = False
    future = np.triu(np.ones((n, n), dtype=bool), 1)
    if causal is None:
        causal = not weights[:, future].any()
    if causal:
        candidates &= ~future
    flat = np.where(candidates[None], weights, -1.0).reshape(heads, -1)
    index, value = flat.argmax(-1), flat.max(-1)
    found = value >= 0
    return {"induction": induction, "peak_value": np.where(found, value, np.nan),
            "peak_query": np.where(found, index // max(n, 1), -1),
            "peak_key": np.where(found, index % max(n, 1), -1)}
