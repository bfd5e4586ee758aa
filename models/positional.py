"""Positional encodings: the formulas, and the encodings inside loaded models.

Self-attention is permutation-equivariant — shuffle its input tokens and its outputs shuffle the same way — so a
transformer only knows word order through what its position scheme adds. Implemented here:

- sinusoidal absolute encodings, Vaswani et al. 2017 ("Attention is all you need", §3.5):
  ``PE(pos, 2k) = sin(pos / base^{2k/d})``, ``PE(pos, 2k+1) = cos(pos / base^{2k/d})``; and the 2-D variant for image
  patches (half the channels encode the row, half the column, as in MAE / ViT sin-cos baselines);
- learned absolute tables read out of a loaded model (GPT-2 ``wpe``, BERT ``position_embeddings``, a ViT
  ``pos_embed``), their similarity structure (Dosovitskiy et al. 2021, Fig. 7) and bicubic interpolation of a patch
  grid to another resolution (as ViT fine-tuning and DINOv2 do);
- rotary position embedding (RoPE), Su et al. 2021 (RoFormer, eq. 34): ``θ_i = base^{-2i/d}``, each pair of channels
  rotated by ``m·θ_i``, so that ``(R_m q)ᵀ(R_n k)`` depends only on ``n − m``; the long-range decay bound of §3.4.3;
  ``rope_theta`` and partial rotary settings read from a model config;
- ALiBi, Press et al. 2022 ("Train short, test long"): per-head slopes ``2^{-8h/H}`` and the linear bias
  ``−m_h·(i − j)``;
- T5 relative-position buckets, Raffel et al. 2020 (§2.1; Mesh TensorFlow's ``_relative_position_bucket``);
- a permutation-equivariance demo: one tiny self-attention layer on a sentence and on a shuffled copy.

Everything returns float32/int64 numpy arrays; nothing here imports Streamlit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# The formulas as implemented below, in LaTeX, for the page to show next to the numbers they produce.
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
    return _sinusoidal_at(np.arange(length, dtype=np.float64), dim, base)


def _sinusoidal_at(positions: np.ndarray, dim: int, base: float) -> np.ndarray:
    angles = positions[:, None] * sinusoidal_frequencies(dim, base)[None, :]  # (P, dim/2)
    table = np.empty((len(positions), dim), dtype=np.float64)
    table[:, 0::2] = np.sin(angles)
    table[:, 1::2] = np.cos(angles)
    return table.astype(np.float32)


def sinusoidal_encoding_2d(rows: int, cols: int, dim: int, base: float = 10000.0) -> np.ndarray:
    """2-D sin-cos encoding of a ``rows × cols`` patch grid, float32 ``(rows * cols, dim)`` in row-major patch order.

    The first ``dim/2`` channels are the 1-D encoding of the patch's row, the last ``dim/2`` that of its column.
    """
    if dim % 4:
        raise ValueError(f"a 2-D encoding needs a dimension divisible by 4 (got {dim}): half for rows, half for "
                         "columns, each in sin/cos pairs.")
    if rows < 1 or cols < 1:
        raise ValueError(f"the patch grid must be at least 1 × 1 (got {rows} × {cols}).")
    row_pe = sinusoidal_encoding(rows, dim // 2, base)  # (rows, dim/2)
    col_pe = sinusoidal_encoding(cols, dim // 2, base)  # (cols, dim/2)
    grid_rows = np.repeat(row_pe, cols, axis=0)  # (rows*cols, dim/2): patch r*cols + c gets row r
    grid_cols = np.tile(col_pe, (rows, 1))  # (rows*cols, dim/2): ... and column c
    return np.concatenate([grid_rows, grid_cols], axis=1)


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


# --- learned absolute tables read from a model -------------------------------------------------------------------


@dataclass
class LearnedPositions:
    """A learned absolute position table as the model holds it.

    ``table``: float32 ``(positions, dim)`` without prefix tokens; ``grid``: ``(rows, cols)`` of image patches in
    row-major order, or None for a 1-D text table; ``prefix``: float32 ``(prefix_tokens, dim)`` (e.g. the CLS
    position of a ViT), possibly empty.
    """

    parameter: str  # where it lives in the model, e.g. "transformer.wpe.weight"
    table: np.ndarray
    grid: tuple[int, int] | None = None
    prefix: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.float32))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.table.shape)


def _as_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.float32).numpy().copy()


def _grid_from_count(count: int) -> tuple[int, int]:
    side = math.isqrt(count)
    if side * side != count:
        raise ValueError(f"{count} patch positions do not form a square grid; give the grid explicitly.")
    return side, side


def learned_positions(model: Any) -> LearnedPositions:
    """Read the learned absolute position table of a loaded model.

    Knows GPT-2 (``wpe``), BERT-style encoders (``embeddings.position_embeddings``), transformers ViT/DINOv2
    (``embeddings.position_embeddings`` parameter ``(1, 1 + patches, dim)``) and timm ViTs (``pos_embed``). A model
    that encodes positions otherwise (RoPE, relative biases) raises ValueError saying so.
    """
    # timm ViT: pos_embed (1, prefix + patches, D), or without the prefix when no_embed_class is set
    pos_embed = getattr(model, "pos_embed", None)
    if isinstance(pos_embed, torch.Tensor) and hasattr(model, "patch_embed"):
        table = _as_numpy(pos_embed)[0]
        prefix_count = 0 if getattr(model, "no_embed_class", False) else int(getattr(model, "num_prefix_tokens", 1))
        grid = tuple(int(g) for g in model.patch_embed.grid_size)
        if grid[0] * grid[1] != len(table) - prefix_count:  # dynamic_img_size models keep their training grid
            grid = _grid_from_count(len(table) - prefix_count)
        return LearnedPositions("pos_embed", table[prefix_count:], grid, table[:prefix_count])

    for path in ("transformer.wpe", "wpe"):  # GPT-2 with or without the LM head wrapper
        module = _get_submodule(model, path)
        if isinstance(module, torch.nn.Embedding):
            return LearnedPositions(f"{path}.weight", _as_numpy(module.weight))

    for owner in ("", "bert.", "roberta.", "vit.", "dinov2.", "model."):
        embeddings = _get_submodule(model, owner + "embeddings")
        if embeddings is None:
            continue
        position = getattr(embeddings, "position_embeddings", None)
        if isinstance(position, torch.nn.Embedding):  # BERT: (max_positions, D)
            return LearnedPositions(f"{owner}embeddings.position_embeddings.weight", _as_numpy(position.weight))
        if isinstance(position, torch.Tensor):  # ViT / DINOv2: (1, 1 + patches, D), CLS first
            table = _as_numpy(position)[0]
            prefix_count = 1
            return LearnedPositions(f"{owner}embeddings.position_embeddings", table[prefix_count:],
                                    _grid_from_count(len(table) - prefix_count), table[:prefix_count])

    config = getattr(model, "config", None)
    scheme = position_scheme(config) if config is not None else "unknown"
    raise ValueError(f"this model has no learned absolute position table (it uses {scheme}). Pick GPT-2, a BERT "
                     "encoder or a ViT for this view.")


def _get_submodule(model: Any, path: str):
    try:
        return model.get_submodule(path) if path else model
    except (AttributeError, TypeError):
        return None


def position_scheme(config: Any) -> str:
    """A short human description of how a transformers config encodes positions."""
    try:
        settings = rope_settings(config)
        return f"rotary position embeddings (RoPE, θ base {settings.theta:g})"
    except ValueError:
        pass
    if getattr(config, "relative_attention_num_buckets", None):
        return "T5 relative-position buckets"
    if getattr(config, "alibi", False) or getattr(config, "model_type", "") in ("bloom", "mpt"):
        return "ALiBi linear biases"
    if getattr(config, "n_positions", None) or getattr(config, "position_embedding_type", None) == "absolute":
        return "learned absolute positions"
    return "an unknown scheme"


UNTRAINED_VIT = "vit_tiny_patch16_224"


def untrained_vit_positions() -> LearnedPositions:
    """``pos_embed`` of timm's ``vit_tiny_patch16_224`` as created, untrained (truncated normal, std 0.02): what a
    ViT's grid looks like before training — no spatial structure at all. 14 × 14 patches, 192 channels."""
    import timm

    return learned_positions(timm.create_model(UNTRAINED_VIT, pretrained=False, depth=1))


def hub_model_cached(model_id: str, cache_dir: str | None = None) -> bool:
    """Whether a hub model's config and weights are already in the local Hugging Face cache (no network used)."""
    from huggingface_hub import try_to_load_from_cache

    def cached(filename: str) -> bool:
        return isinstance(try_to_load_from_cache(model_id, filename, cache_dir=cache_dir), str)

    return cached("config.json") and (cached("model.safetensors") or cached("pytorch_model.bin"))


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


@dataclass(frozen=True)
class RopeSettings:
    """How a model configures RoPE; ``rotary_dim`` = channels per head that rotate (partial rotary when < head_dim)."""

    theta: float
    head_dim: int
    rotary_dim: int
    rope_type: str = "default"
    pairing: str = "half"  # transformers' rotate_half layout unless the architecture interleaves
    scaling: dict = field(default_factory=dict)  # extra rope_parameters (YaRN, linear, llama3 factors)
    max_positions: int | None = None

    @property
    def partial_rotary_factor(self) -> float:
        return self.rotary_dim / self.head_dim


_INTERLEAVED_ARCHITECTURES = {"gptj", "codegen"}


def rope_settings(config: Any) -> RopeSettings:
    """Read ``rope_theta``, head and rotary dimensions from a transformers config (v5 ``rope_parameters`` or older
    ``rope_theta`` / ``rotary_pct`` / ``partial_rotary_factor`` / ``rotary_dim`` attributes)."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config()
    params = getattr(config, "rope_parameters", None) or {}
    if params and "rope_theta" not in params and all(isinstance(v, dict) for v in params.values()):
        # per-layer-type parameters (e.g. Gemma 3): full attention layers carry the long-range base
        params = params.get("full_attention") or next(iter(params.values()))
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    model_type = getattr(config, "model_type", "")
    rotary_dim_attr = getattr(config, "rotary_dim", None)
    if theta is None and rotary_dim_attr is None:
        raise ValueError(f"the {model_type or 'given'} config has no rotary position settings: this model does not "
                         "use RoPE.")
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None)
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None)
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if hidden and heads else None)
    if not head_dim:
        raise ValueError("the config gives neither head_dim nor hidden_size and num_attention_heads")
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    factor = getattr(config, "rotary_pct", None) if factor is None else factor
    if rotary_dim_attr is not None:
        rotary_dim = int(rotary_dim_attr)
    else:
        rotary_dim = int(head_dim * (1.0 if factor is None else float(factor)))
    extra = {k: v for k, v in params.items() if k not in ("rope_theta", "rope_type", "partial_rotary_factor")}
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    return RopeSettings(
        theta=float(theta if theta is not None else 10000.0), head_dim=int(head_dim), rotary_dim=rotary_dim,
        rope_type=str(params.get("rope_type", "default")),
        pairing="interleaved" if model_type in _INTERLEAVED_ARCHITECTURES else "half",
        scaling=extra, max_positions=max_positions,
    )


@dataclass(frozen=True)
class RopeInModel:
    """RoPE as a loaded model uses it: its settings, and whether its ``inv_freq`` buffer is ``b^{-2i/d}``."""

    settings: RopeSettings
    buffer_name: str | None  # None when the model keeps no inv_freq buffer
    max_relative_error: float | None  # max |buffer / formula − 1|
    slowest_wavelength: float  # positions per turn of the slowest pair, 2π / θ_{d/2−1}
    fastest_wavelength: float  # 2π / θ_0 = 2π

    def facts(self) -> dict[str, str]:
        """Label -> value, for a row of metrics."""
        s = self.settings
        return {"rope_theta": f"{s.theta:g}", "Head dimension": str(s.head_dim),
                "Rotary dimensions": f"{s.rotary_dim} ({s.partial_rotary_factor:.0%})",
                "Context (positions)": str(s.max_positions or "?"), "RoPE type": s.rope_type}


def rope_in_model(model: Any) -> RopeInModel:
    """Read RoPE settings from ``model.config`` and check the model's own frequencies against the formula."""
    settings = rope_settings(model.config)
    formula = rope_frequencies(settings.rotary_dim, settings.theta)
    found = model_inv_freq(model)
    error = None
    if found is not None and found[1].shape == formula.shape:
        error = float(np.abs(found[1] / formula - 1).max())
    return RopeInModel(settings, None if found is None else found[0], error, float(2 * np.pi / formula[-1]),
                       float(2 * np.pi / formula[0]))


def model_inv_freq(model: Any) -> tuple[str, np.ndarray] | None:
    """The ``inv_freq`` buffer (``θ_i``, ``(rotary_dim // 2,)``) a transformers RoPE model actually uses, or None."""
    for name, buffer in model.named_buffers():
        if name.endswith("inv_freq"):
            return name, _as_numpy(buffer).astype(np.float64)
    return None


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


# --- permutation equivariance -------------------------------------------------------------------------------------


@dataclass
class EquivarianceDemo:
    """One self-attention layer F run on X and on σ(X).

    ``permutation[i]`` is the original index of the token at shuffled position i; ``attention`` ``(L, L)`` is F's
    attention on X; ``shuffled_attention_restored`` is the attention on σ(X) with rows and columns put back in the
    original order (equal to ``attention`` exactly when F is equivariant); ``output_gap`` ``(L,)`` is
    ``‖F(σ(X))[σ⁻¹] − F(X)‖ / ‖F(X)‖`` per token.
    """

    tokens: list[str]
    permutation: np.ndarray
    attention: np.ndarray
    shuffled_attention_restored: np.ndarray
    output_gap: np.ndarray

    @property
    def max_gap(self) -> float:
        return float(self.output_gap.max())


def tiny_self_attention(x: torch.Tensor, seed: int = 0, head_dim: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """One single-head self-attention layer with fixed random weights: ``x`` ``(L, d)`` -> output ``(L, head_dim)``,
    attention ``(L, L)``.

    As in a (pre-LN) transformer block, each token is layer-normalised first (a per-token operation, so it keeps the
    symmetry); that puts the scores at a scale where softmax is not uniform. Weights ``N(0, 1/d)`` come from a
    generator seeded with ``seed``.
    """
    length, dim = x.shape
    generator = torch.Generator().manual_seed(seed)
    w_query, w_key, w_value = (torch.randn(dim, head_dim, generator=generator, dtype=torch.float64) / dim ** 0.5
                               for _ in range(3))
    x = torch.nn.functional.layer_norm(x.to(torch.float64), (dim,))
    query, key, value = x @ w_query, x @ w_key, x @ w_value  # (L, head_dim) each
    attention = torch.softmax(query @ key.T / head_dim ** 0.5, dim=-1)  # (L, L)
    return attention @ value, attention


MAX_DEMO_TOKENS = 32


def token_embeddings(model: Any, tokenizer: Any, text: str, max_tokens: int = MAX_DEMO_TOKENS
                     ) -> tuple[list[str], np.ndarray, list[str]]:
    """The input-embedding rows of ``text``'s tokens (no special tokens): labels, float32 ``(L, d)``, notices."""
    from models.text import display_tokens

    if not text.strip():
        raise ValueError("Type a sentence first.")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    notices = []
    if len(ids) > max_tokens:
        notices.append(f"The sentence has {len(ids)} tokens; the demo uses the first {max_tokens}.")
        ids = ids[:max_tokens]
    if len(ids) < 2:
        raise ValueError("The sentence gives fewer than two tokens: type a few words, so there is something to "
                         "shuffle.")
    weight = model.get_input_embeddings().weight  # (vocab, d)
    return display_tokens(tokenizer, ids), _as_numpy(weight[torch.tensor(ids, device=weight.device)]), notices


def equivariance_comparison(embeddings: np.ndarray, tokens: list[str], learned_table: np.ndarray | None,
                            learned_name: str = "learned", seed: int = 0) -> dict[str, EquivarianceDemo]:
    """The demo three ways: no positions; sinusoidal (``X·√d + PE``, Vaswani et al.); a model's learned table
    (``X + P``, as BERT adds them) when given. Keys are labels for the page."""
    dim = embeddings.shape[1]
    runs = {"no positions": permutation_equivariance(embeddings, tokens, None, seed),
            "sinusoidal (X·√d + PE)": permutation_equivariance(embeddings, tokens,
                                                               sinusoidal_encoding(len(tokens), dim), seed,
                                                               math.sqrt(dim))}
    if learned_table is not None:
        runs[f"{learned_name} (X + P)"] = permutation_equivariance(embeddings, tokens, learned_table, seed)
    return runs


def permutation_equivariance(embeddings: np.ndarray, tokens: list[str], position_table: np.ndarray | None = None,
                             seed: int = 0, embedding_scale: float = 1.0) -> EquivarianceDemo:
    """Run ``tiny_self_attention`` on ``embeddings`` ``(L, d)`` and on a seeded shuffle of them.

    With ``position_table`` ``(≥ L, d)``, row p is added to whichever token sits at position p — before and after
    shuffling — so tokens that move get a different encoding, and the outputs no longer just shuffle along.
    ``embedding_scale`` multiplies the token embeddings first (Vaswani et al. use ``√d`` before adding sinusoids).
    """
    embeddings = np.asarray(embeddings, dtype=np.float64) * embedding_scale
    length = embeddings.shape[0]
    if length < 2:
        raise ValueError("type at least two tokens: a single token cannot be shuffled.")
    if len(tokens) != length:
        raise ValueError(f"{len(tokens)} tokens for {length} embeddings")
    if position_table is not None and (position_table.shape[0] < length or
                                       position_table.shape[1] != embeddings.shape[1]):
        raise ValueError(f"the position table {position_table.shape} does not cover {length} tokens of width "
                         f"{embeddings.shape[1]}")
    rng = np.random.default_rng(seed)
    permutation = rng.permutation(length)
    while np.array_equal(permutation, np.arange(length)):  # a shuffle that moves nothing proves nothing
        permutation = rng.permutation(length)
    shuffled = embeddings[permutation]
    if position_table is not None:
        positions = np.asarray(position_table[:length], dtype=np.float64)
        embeddings, shuffled = embeddings + positions, shuffled + positions
    output, attention = tiny_self_attention(torch.from_numpy(embeddings), seed)
    shuffled_output, shuffled_attention = tiny_self_attention(torch.from_numpy(shuffled), seed)
    inverse = np.argsort(permutation)
    restored_output = shuffled_output.numpy()[inverse]  # row i: the output of original token i
    restored_attention = shuffled_attention.numpy()[np.ix_(inverse, inverse)]
    reference = output.numpy()
    gap = np.linalg.norm(restored_output - reference, axis=1) / np.maximum(np.linalg.norm(reference, axis=1), 1e-12)
    return EquivarianceDemo(list(tokens), permutation, attention.numpy().astype(np.float32),
                            restored_attention.astype(np.float32), gap.astype(np.float32))
