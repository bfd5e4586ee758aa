"""Positional-encoding formulas, pure numpy: what each scheme adds to (or does to) the attention scores.

- sinusoidal absolute encodings, Vaswani et al. 2017 ("Attention is all you need", §3.5):
  ``PE(pos, 2k) = sin(pos / base^{2k/d})``, ``PE(pos, 2k+1) = cos(pos / base^{2k/d})``;
- the 2-D sin-cos table of image patches in the channel layout of MAE (He et al. 2022, ``get_2d_sincos_pos_embed``
  in facebookresearch/mae ``util/pos_embed.py``): first half the patch's column, second half its row, each half
  ``[sin(pos·ω) | cos(pos·ω)]``;
- similarity of position vectors, the ViT paper's patch-similarity maps (Dosovitskiy et al. 2021, Fig. 7) and
  bicubic resampling of a patch grid to another resolution (as timm's ``resample_abs_pos_embed`` and DINOv2 do);
- rotary position embedding (RoPE), Su et al. 2021 (RoFormer, eq. 34): ``θ_i = base^{-2i/d}``, each pair of channels
  rotated by ``m·θ_i``, so that ``(R_m q)ᵀ(R_n k)`` depends only on ``n − m``; the long-range decay bound of §3.4.3;
- ALiBi, Press et al. 2022 ("Train short, test long"): per-head slopes ``2^{-8h/H}`` and the linear bias
  ``−m_h·(i − j)``;
- T5 relative-position buckets, Raffel et al. 2020 (§2.1; Mesh TensorFlow's ``_relative_position_bucket``).

Everything returns float32/float64/int64 numpy arrays. Only ``interpolate_grid`` uses torch (its resize kernels, so
the result equals what timm and transformers compute), imported when called.
"""
from __future__ import annotations

import math

import numpy as np

# The formulas as this package implements them, in LaTeX, for the page to show next to the numbers they produce.
LATEX = {
    "equivariance": r"F(\sigma(X)) = \sigma(F(X)) \quad\text{for self-attention } F \text{ and any permutation }"
                    r" \sigma",
    "sinusoidal": r"PE_{(pos,\,2k)} = \sin\!\left(\frac{pos}{b^{2k/d}}\right),\qquad PE_{(pos,\,2k+1)} = "
                  r"\cos\!\left(\frac{pos}{b^{2k/d}}\right)",
    "rope": r"\theta_i = b^{-2i/d},\quad R_m \begin{pmatrix}x_{2i}\\ x_{2i+1}\end{pmatrix} = \begin{pmatrix}"
            r"\cos m\theta_i & -\sin m\theta_i\\ \sin m\theta_i & \cos m\theta_i\end{pmatrix}\begin{pmatrix}"
            r"x_{2i}\\ x_{2i+1}\end{pmatrix},\quad (R_m q)^\top (R_n k) = q^\top R_{n-m}\, k",
    "alibi": r"\mathrm{softmax}\big(q_i K^\top + m_h \cdot [-(i-1), \dots, -2, -1, 0]\big),\qquad "
             r"m_h = 2^{-8h/H}",
    "t5": r"b(\delta) = \begin{cases} |\delta| & |\delta| < e \\ e + \left\lfloor \frac{\ln(|\delta|/e)}"
          r"{\ln(D/e)}\,(n - e)\right\rfloor & \text{otherwise, at most } n-1 \end{cases}\quad e = n/2,\ "
          r"\delta = j - i",
}

# --- sinusoidal (Vaswani et al. 2017) ----------------------------------------------------------------------------


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be positive (got {value}).")


def sinusoidal_frequencies(dim: int, base: float = 10000.0) -> np.ndarray:
    """Angular frequency ``ω_k = base^{-2k/d}`` (radians per position) of each sin/cos pair, ``(dim // 2,)``."""
    if dim < 2 or dim % 2:
        raise ValueError(f"the encoding dimension must be an even number ≥ 2 (got {dim}): sin and cos come in pairs.")
    _check_positive("The base", base)
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def sinusoidal_wavelengths(dim: int, base: float = 10000.0) -> np.ndarray:
    """Wavelength ``2π / ω_k`` in positions of every channel, ``(dim,)`` (channels 2k and 2k+1 share one)."""
    return np.repeat(2 * np.pi / sinusoidal_frequencies(dim, base), 2)


def sinusoidal_encoding(length: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """``PE`` of positions ``0 … length−1``: float32 ``(length, dim)``, sin in even channels, cos in odd ones."""
    if length < 1:
        raise ValueError(f"the sequence length must be at least 1 (got {length}).")
    angles = np.arange(length, dtype=np.float64)[:, None] * sinusoidal_frequencies(dim, base)[None, :]  # (L, d/2)
    table = np.empty((length, dim), dtype=np.float64)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table.astype(np.float32)


def sinusoidal_encoding_2d(rows: int, cols: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """2-D sin-cos encoding of a ``rows × cols`` patch grid: float32 ``(rows * cols, dim)``, patches in row-major
    order (patch (r, c) is row ``r · cols + c``).

    Channels as MAE's ``get_2d_sincos_pos_embed`` lays them out (its ``meshgrid(grid_w, grid_h)`` puts the column
    first), four blocks of ``dim/4``::

        [ sin(c·ω) | cos(c·ω) | sin(r·ω) | cos(r·ω) ],   ω_k = base^{-k/(dim/4)},  k = 0 … dim/4 − 1

    so the first half encodes the column c, the second half the row r. The frequencies are those of the 1-D
    encoding of width ``dim/2``, but each half holds its sines then its cosines instead of interleaving them.
    """
    if dim % 4:
        raise ValueError(f"a 2-D encoding needs a dimension divisible by 4 (got {dim}): half for columns, half for "
                         "rows, each in sin/cos pairs.")
    if rows < 1 or cols < 1:
        raise ValueError(f"the patch grid must be at least 1 × 1 (got {rows} × {cols}).")
    omega = sinusoidal_frequencies(dim // 2, base)  # (dim/4,): base^{-2k/(dim/2)} = base^{-k/(dim/4)}
    row, col = np.divmod(np.arange(rows * cols), cols)  # (rows*cols,) each: patch r*cols + c

    def half(positions: np.ndarray) -> np.ndarray:  # (P,) -> (P, dim/2): [sin | cos]
        angles = positions[:, None] * omega[None, :]
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)

    return np.concatenate([half(col), half(row)], axis=1).astype(np.float32)


def position_similarity(table: np.ndarray, measure: str = "cosine") -> np.ndarray:
    """Similarity of every position's vector with every other: ``(P, D) -> (P, P)`` float32.

    ``cosine`` normalises each row first; ``dot`` is the raw inner product (for sinusoidal PE it equals
    ``Σ_k cos((p − q) ω_k)``, a function of the offset only).
    """
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2:
        raise ValueError(f"expected a (positions, dim) table, got shape {table.shape}")
    if measure == "cosine":
        norms = np.linalg.norm(table, axis=1, keepdims=True)
        table = table / np.where(norms > 0, norms, 1.0)
    elif measure != "dot":
        raise ValueError(f"unknown similarity {measure!r}; use 'cosine' or 'dot'")
    return (table @ table.T).astype(np.float32)


# --- patch grids (Dosovitskiy et al. 2021) -----------------------------------------------------------------------


def patch_similarity(table: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Cosine similarity of each patch's position vector with every other, ``(rows, cols, rows, cols)`` float32:
    ``out[r, c]`` is the map the ViT paper's Fig. 7 draws for patch (r, c)."""
    rows, cols = grid
    if table.shape[0] != rows * cols:
        raise ValueError(f"{table.shape[0]} positions do not fill a {rows} × {cols} grid")
    return position_similarity(table, "cosine").reshape(rows, cols, rows, cols)


def interpolate_grid(table: np.ndarray, grid: tuple[int, int], new_grid: tuple[int, int],
                     mode: str = "bicubic", antialias: bool = True) -> np.ndarray:
    """Resample a patch-grid position table to another grid, as a ViT does for a new image resolution.

    ``table`` ``(rows * cols, D)`` -> float32 ``(new_rows * new_cols, D)``; each channel is treated as a
    ``rows × cols`` image and resized with ``align_corners=False``. ``antialias=True`` is timm's
    ``resample_abs_pos_embed`` (PIL-style cubic kernel); transformers' DINOv2 ``interpolate_pos_encoding`` uses False.
    """
    rows, cols = grid
    new_rows, new_cols = new_grid
    if new_rows < 1 or new_cols < 1:
        raise ValueError(f"the new grid must be at least 1 × 1 (got {new_rows} × {new_cols}).")
    if mode not in ("bicubic", "bilinear", "nearest"):
        raise ValueError(f"unknown interpolation {mode!r}; use bicubic, bilinear or nearest")
    if table.shape[0] != rows * cols:
        raise ValueError(f"{table.shape[0]} positions do not fill a {rows} × {cols} grid")
    import torch

    dim = table.shape[1]
    image = torch.from_numpy(np.asarray(table, np.float32)).reshape(1, rows, cols, dim).permute(0, 3, 1, 2)
    resized = torch.nn.functional.interpolate(
        image, size=(new_rows, new_cols), mode=mode,
        **({} if mode == "nearest" else {"align_corners": False, "antialias": antialias}),
    )  # (1, D, new_rows, new_cols)
    return resized.permute(0, 2, 3, 1).reshape(new_rows * new_cols, dim).numpy()


def neighbour_similarity(table: np.ndarray, grid: tuple[int, int]) -> float:
    """Mean cosine similarity of horizontally and vertically adjacent patches: how smooth the grid is (1 = flat)."""
    sim = patch_similarity(table, grid)
    rows, cols = grid
    pairs = [sim[r, c, r, c + 1] for r in range(rows) for c in range(cols - 1)]
    pairs += [sim[r, c, r + 1, c] for r in range(rows - 1) for c in range(cols)]
    return float(np.mean(pairs)) if pairs else 1.0


# --- RoPE (Su et al. 2021) ---------------------------------------------------------------------------------------


def rope_frequencies(rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    """``θ_i = base^{-2i/d}`` for ``i = 0 … d/2 − 1``, radians per position, ``(rotary_dim // 2,)`` float64."""
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"RoPE rotates pairs of channels, so the rotary dimension must be even (got {rotary_dim}).")
    _check_positive("The RoPE base", base)
    return base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)


def rope_angles(positions: np.ndarray, rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    """Rotation angle ``m·θ_i`` in radians (unwrapped) of every pair at every position, ``(P, rotary_dim // 2)``."""
    return np.asarray(positions, dtype=np.float64)[:, None] * rope_frequencies(rotary_dim, base)[None, :]


def rope_rotate(x: np.ndarray, positions: np.ndarray, base: float = 10000.0, rotary_dim: int | None = None,
                pairing: str = "interleaved") -> np.ndarray:
    """Apply ``R_m`` to vectors ``x`` ``(..., P, d)`` at ``positions`` ``(P,)``; returns float64 of the same shape.

    ``pairing="interleaved"`` rotates channels (2i, 2i+1) as in the RoFormer paper and GPT-J; ``"half"`` rotates
    (i, i + d/2) as GPT-NeoX and transformers' Llama (``rotate_half``). Only the first ``rotary_dim`` channels turn
    (partial rotary); the rest pass through unchanged.
    """
    x = np.asarray(x, dtype=np.float64)
    dim = x.shape[-1]
    rotary_dim = dim if rotary_dim is None else rotary_dim
    if rotary_dim > dim:
        raise ValueError(f"the rotary dimension {rotary_dim} exceeds the head dimension {dim}")
    angles = rope_angles(positions, rotary_dim, base)  # (P, r/2)
    if angles.shape[0] != x.shape[-2]:
        raise ValueError(f"{angles.shape[0]} positions for {x.shape[-2]} vectors")
    cos, sin = np.cos(angles), np.sin(angles)
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    if pairing == "interleaved":
        first, second = rotated[..., 0::2], rotated[..., 1::2]
    elif pairing == "half":
        first, second = rotated[..., : rotary_dim // 2], rotated[..., rotary_dim // 2:]
    else:
        raise ValueError(f"unknown RoPE pairing {pairing!r}; use 'interleaved' or 'half'")
    new_first = first * cos - second * sin
    new_second = first * sin + second * cos
    out = np.empty_like(rotated)
    if pairing == "interleaved":
        out[..., 0::2], out[..., 1::2] = new_first, new_second
    else:
        out[..., : rotary_dim // 2], out[..., rotary_dim // 2:] = new_first, new_second
    return np.concatenate([out, passed], axis=-1)


def rope_scores(query: np.ndarray, key: np.ndarray, query_position: int, key_positions: np.ndarray,
                base: float = 10000.0, rotary_dim: int | None = None) -> np.ndarray:
    """``(R_m q)ᵀ (R_n k)`` for one query at ``m`` and keys at every ``n`` in ``key_positions``: ``(len(n),)``."""
    key_positions = np.asarray(key_positions)
    rotated_query = rope_rotate(query[None, :], np.array([query_position]), base, rotary_dim)[0]  # (d,)
    keys = np.broadcast_to(key, (len(key_positions), len(key)))
    rotated_keys = rope_rotate(keys, key_positions, base, rotary_dim)  # (len(n), d)
    return rotated_keys @ rotated_query


def rope_offset_demo(head_dim: int, base: float, span: int, query_positions: tuple[int, ...] = (0, 1000, 100_000),
                     seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray], float]:
    """The relative property made visible: a fixed random q and a matching key ``k = q + noise`` (so the score peaks
    at offset 0), scored at offsets ``−span … span`` from several absolute query positions m.

    Returns offsets ``(2·span + 1,)``, ``{"m = …": scores}``, and the largest difference between the curves
    (rounding only, ~1e-11, because the score depends on n − m alone).
    """
    rng = np.random.default_rng(seed)
    query = rng.normal(size=head_dim)
    key = query + 0.5 * rng.normal(size=head_dim)
    offsets = np.arange(-span, span + 1)
    scores = {f"m = {m}": rope_scores(query, key, m, m + offsets, base) for m in query_positions}
    first = next(iter(scores.values()))
    return offsets, scores, max(float(np.abs(curve - first).max()) for curve in scores.values())


def rope_decay_bound(offsets: np.ndarray, rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    """Su et al. §3.4.3: ``(1 / (d/2)) Σ_{j=1}^{d/2} |S_j|`` with ``S_j = Σ_{i<j} e^{i·(n−m)·θ_i}``, ``(len,)``.

    The score of any q, k at offset ``n − m`` is bounded by this quantity times ``max_i |h_{i+1} − h_i|``; it decays
    (with oscillation) as the offset grows.
    """
    phases = np.exp(1j * rope_angles(np.asarray(offsets), rotary_dim, base))  # (len, d/2)
    partial_sums = np.cumsum(phases, axis=1)  # S_1 … S_{d/2}
    return np.abs(partial_sums).mean(axis=1)


# --- ALiBi (Press et al. 2022) -----------------------------------------------------------------------------------


def alibi_slopes(num_heads: int) -> np.ndarray:
    """Head slopes ``m_h``, ``(num_heads,)`` float64: ``2^{-8h/H}`` for ``h = 1 … H`` when H is a power of two.

    Otherwise (the paper's footnote / reference code): the slopes of the nearest smaller power of two ``n``, then
    every other slope of ``2n`` heads for the remaining ``H − n``.
    """
    if num_heads < 1:
        raise ValueError(f"ALiBi needs at least one head (got {num_heads}).")

    def power_of_two(count: int) -> np.ndarray:
        return 2.0 ** (-8.0 * np.arange(1, count + 1) / count)

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    if closest == num_heads:
        return power_of_two(num_heads)
    return np.concatenate([power_of_two(closest), power_of_two(2 * closest)[0::2][: num_heads - closest]])


def alibi_bias(num_heads: int, length: int, causal: bool = True) -> np.ndarray:
    """The bias ALiBi adds to the scores, float32 ``(heads, queries, keys)``: ``−m_h·(i − j)`` for key ``j ≤ i``.

    Causal: entries above the diagonal (future keys) are ``-inf``. Bidirectional variant: ``−m_h·|i − j|``.
    """
    if length < 1:
        raise ValueError(f"the sequence length must be at least 1 (got {length}).")
    distance = np.arange(length)[:, None] - np.arange(length)[None, :]  # (q, k): i − j
    bias = -alibi_slopes(num_heads)[:, None, None] * np.abs(distance)[None]
    if causal:
        bias = np.where(distance[None] < 0, -np.inf, bias)
    return bias.astype(np.float32)


# --- T5 relative-position buckets (Raffel et al. 2020) ------------------------------------------------------------


def t5_relative_position_bucket(relative_position: np.ndarray, bidirectional: bool = True, num_buckets: int = 32,
                                max_distance: int = 128) -> np.ndarray:
    """Bucket id of each ``relative_position = key − query``, int64 of the same shape, in ``[0, num_buckets)``.

    Half the buckets (per direction when bidirectional) hold exact offsets ``0 … max_exact − 1``; the others
    cover ``[max_exact, max_distance)`` logarithmically; farther offsets share the last bucket. Causal (decoder)
    attention maps every future offset (``> 0``) to bucket 0.
    """
    if num_buckets < (4 if bidirectional else 2):
        raise ValueError(f"too few buckets ({num_buckets}); T5 uses 32")
    relative_position = np.asarray(relative_position, dtype=np.int64)
    if bidirectional:
        num_buckets //= 2
        direction_offset = np.where(relative_position > 0, num_buckets, 0)
        distance = np.abs(relative_position)
    else:
        direction_offset = np.zeros_like(relative_position)
        distance = np.maximum(-relative_position, 0)  # looking back only
    max_exact = num_buckets // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance ({max_distance}) must exceed the exact range ({max_exact})")
    # float32 like the reference, so that offsets on a bucket boundary land where T5 put them during training
    ratio = np.log(np.maximum(distance, 1).astype(np.float32) / np.float32(max_exact))
    ratio = ratio / np.float32(math.log(max_distance / max_exact)) * np.float32(num_buckets - max_exact)
    log_bucket = np.minimum(max_exact + np.trunc(ratio).astype(np.int64), num_buckets - 1)
    return direction_offset + np.where(distance < max_exact, distance, log_bucket)


def t5_bucket_matrix(length: int, bidirectional: bool = True, num_buckets: int = 32,
                     max_distance: int = 128) -> np.ndarray:
    """Bucket id for every (query i, key j) pair, int64 ``(length, length)``, with offset ``j − i``."""
    if length < 1:
        raise ValueError(f"the sequence length must be at least 1 (got {length}).")
    relative = np.arange(length)[None, :] - np.arange(length)[:, None]  # (q, k): j − i
    return t5_relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
