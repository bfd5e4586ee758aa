"""Swin Transformer internals, read from a real timm model: windows, the cyclic shift, masks, relative position bias.

Liu et al. 2021, "Swin Transformer: Hierarchical Vision Transformer using Shifted Windows" (arXiv:2103.14030):

- Hierarchy (Sec. 3.1): 4 × 4 px patches, then per stage a patch merging that concatenates 2 × 2 neighbours
  (4C features) and projects them to 2C, so 224 px gives 56², 28², 14², 7² tokens.
- W-MSA (Sec. 3.2): self-attention inside non-overlapping M × M windows. Per head, full attention over h·w tokens
  has (hw)² entries, windowed M²·hw; the paper's cost (eq. 1–2): Ω(MSA) = 4hwC² + 2(hw)²C,
  Ω(W-MSA) = 4hwC² + 2M²hwC.
- SW-MSA: every second block displaces the windows by ⌊M/2⌋. Implemented as a cyclic shift, ``roll(x, −⌊M/2⌋)``,
  regular windows on the rolled map, and an attention mask of −100 between tokens that were not neighbours before
  the roll (different "regions"), then ``roll(+⌊M/2⌋)`` back.
- Relative position bias (eq. 4): softmax(QKᵀ/√d + B) with B gathered from a learned table of (2M−1)² × heads
  entries at s(Δx, Δy) = (Δx + M − 1)(2M − 1) + (Δy + M − 1), Δx, Δy ∈ [−M+1, M−1] the row and column offset of
  query minus key.

Everything the page draws comes from the model itself: ``read_structure`` reads each block's ``window_size``,
``shift_size``, ``attn_mask`` buffer, ``relative_position_index`` buffer and ``relative_position_bias_table``; the
attention is captured at each ``WindowAttention.softmax`` (fused attention switched off per module, see
``models/capture_timm.py``). The geometry helpers below rebuild the same objects independently, so tests can check
our understanding against the model's tensors, and so views can explain them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from models.registry import ModelSpec
from models.results import AttentionMaps, ImageInfo, ModelInfo, RunResult, TokenProbability

MASK_VALUE = -100.0  # what timm (and the official code) adds between regions; exp(-100) ≈ 4e-44, i.e. 0 in float32
CAPTURE_DESCRIPTION = ("timm eager window attention (fused_attn off per module); softmax(QKᵀ/√d + B + mask) hooked "
                       "at each WindowAttention.softmax")
FULL_EXPANSION_LIMIT = 64_000_000  # heads · N² entries above which layer(i) refuses to build the dense matrix


# --- windows and the cyclic shift (pure numpy) -------------------------------------------------------------------

def window_partition(x: np.ndarray, window: tuple[int, int]) -> np.ndarray:
    """Cut a feature map into non-overlapping windows, row-major over the window grid (timm's order).

    x ``(H, W, ...)`` with H, W multiples of the window -> ``(H/Mh · W/Mw, Mh, Mw, ...)``; window k covers rows
    ``(k // (W/Mw)) · Mh …`` and columns ``(k % (W/Mw)) · Mw …``.
    """
    mh, mw = window
    height, width = x.shape[:2]
    if height % mh or width % mw:
        raise ValueError(f"a {height} × {width} map does not split into {mh} × {mw} windows; pad it first")
    rest = x.shape[2:]
    x = x.reshape(height // mh, mh, width // mw, mw, *rest)  # (nWh, Mh, nWw, Mw, ...)
    x = np.swapaxes(x, 1, 2)  # (nWh, nWw, Mh, Mw, ...)
    return x.reshape(-1, mh, mw, *rest)


def window_reverse(windows: np.ndarray, window: tuple[int, int], height: int, width: int) -> np.ndarray:
    """Inverse of ``window_partition``: ``(nW, Mh, Mw, ...)`` -> ``(H, W, ...)``."""
    mh, mw = window
    rest = windows.shape[3:]
    x = windows.reshape(height // mh, width // mw, mh, mw, *rest)  # (nWh, nWw, Mh, Mw, ...)
    x = np.swapaxes(x, 1, 2)  # (nWh, Mh, nWw, Mw, ...)
    return x.reshape(height, width, *rest)


def cyclic_shift(x: np.ndarray, shift: tuple[int, int]) -> np.ndarray:
    """The roll SW-MSA does before partitioning: ``roll(x, (−sh, −sw))`` over the first two axes of ``(H, W, ...)``."""
    return np.roll(x, (-shift[0], -shift[1]), axis=(0, 1))


def undo_cyclic_shift(x: np.ndarray, shift: tuple[int, int]) -> np.ndarray:
    """The roll back after attention: ``roll(x, (+sh, +sw))``."""
    return np.roll(x, (shift[0], shift[1]), axis=(0, 1))


def padded_size(resolution: tuple[int, int], window: tuple[int, int]) -> tuple[int, int]:
    """``(Hp, Wp)``: the resolution rounded up to whole windows (timm pads the bottom/right with zeros)."""
    return tuple(-(-r // m) * m for r, m in zip(resolution, window))


def region_ids(size: tuple[int, int], window: tuple[int, int], shift: tuple[int, int]) -> np.ndarray:
    """Region label of every position of the *rolled* map, int ``(Hp, Wp)`` with values 0..8 (the paper's Fig. 4).

    Along each axis the rolled map has three bands: ``[0, H−M)`` (never moved across the border), ``[H−M, H−s)``
    (the last window's part that stayed) and ``[H−s, H)`` (what the roll brought round from the top/left).
    label = 3 · row band + column band. Tokens of one window attend to each other only within one label.
    """
    labels = []
    for length, m, s in zip(size, window, shift):
        band = np.zeros(length, dtype=np.int64)
        if s:
            band[length - m:length - s] = 1
            band[length - s:] = 2
        labels.append(band)
    return labels[0][:, None] * 3 + labels[1][None, :]


def shifted_window_mask(regions: np.ndarray, window: tuple[int, int]) -> np.ndarray:
    """Additive attention mask per window from a region-id map: float32 ``(nW, N, N)``, N = Mh·Mw.

    ``mask[w, i, j] = −100`` where query i and key j of window w carry different region ids, else 0 — exactly the
    values timm's ``SwinTransformerBlock.attn_mask`` buffer holds.
    """
    ids = window_partition(regions, window).reshape(-1, window[0] * window[1])  # (nW, N)
    different = ids[:, :, None] != ids[:, None, :]  # (nW, N, N): query i, key j
    return np.where(different, np.float32(MASK_VALUE), np.float32(0.0)).astype(np.float32)


def window_types(grid: tuple[int, int]) -> dict[str, int]:
    """Index of one window of each kind in a ``(nWh, nWw)`` window grid of a shifted block.

    interior: only region 0; right edge: the last window column (two regions side by side); bottom edge: the last
    window row; corner: the bottom-right window (four regions). Kinds that do not exist in a small grid are left out.
    """
    rows, cols = grid
    found = {"interior": 0 if rows > 1 and cols > 1 else None,
             "right edge": cols - 1 if rows > 1 else None,
             "bottom edge": (rows - 1) * cols if cols > 1 else None,
             "corner": rows * cols - 1}
    return {name: index for name, index in found.items() if index is not None}


# --- relative position bias --------------------------------------------------------------------------------------

def relative_position_index(window: tuple[int, int]) -> np.ndarray:
    """s(Δx, Δy) = (Δx + Mh − 1)(2Mw − 1) + (Δy + Mw − 1) for every (query i, key j) of a window: int ``(N, N)``.

    Tokens are numbered row-major inside the window; Δx = row_i − row_j, Δy = col_i − col_j. The result indexes the
    ``(2Mh − 1)(2Mw − 1)``-row bias table.
    """
    mh, mw = window
    rows, cols = np.divmod(np.arange(mh * mw), mw)
    dx = rows[:, None] - rows[None, :]
    dy = cols[:, None] - cols[None, :]
    return (dx + mh - 1) * (2 * mw - 1) + (dy + mw - 1)


def relative_position_bias(table: np.ndarray, index: np.ndarray) -> np.ndarray:
    """B per head, ``table[index]``: table ``(T, heads)``, index ``(N, N)`` -> float32 ``(heads, N, N)``."""
    return np.ascontiguousarray(np.moveaxis(table[index], -1, 0), dtype=np.float32)


def bias_table_images(table: np.ndarray, window: tuple[int, int]) -> np.ndarray:
    """The table ``(T, heads)`` as a ``(2Mh−1) × (2Mw−1)`` image per head: ``[head, Δx + Mh − 1, Δy + Mw − 1]``."""
    mh, mw = window
    return np.ascontiguousarray(table.T.reshape(table.shape[1], 2 * mh - 1, 2 * mw - 1), dtype=np.float32)


# --- cost --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StageCost:
    """Attention cost of one stage: entries per head and the paper's multiply-add count (eq. 1–2) per block."""

    stage: int
    resolution: tuple[int, int]  # (h, w) tokens
    channels: int  # C
    window: tuple[int, int]
    heads: int
    full_entries: int  # (hw)² per head
    window_entries: int  # M² · hw per head
    full_flops: int  # 4hwC² + 2(hw)²C
    window_flops: int  # 4hwC² + 2M²hwC

    @property
    def saving(self) -> float:
        return self.full_entries / self.window_entries


def stage_cost(stage: int, resolution: tuple[int, int], channels: int, window: tuple[int, int],
               heads: int) -> StageCost:
    hw = resolution[0] * resolution[1]
    m2 = window[0] * window[1]
    return StageCost(stage, tuple(resolution), channels, tuple(window), heads, hw * hw, m2 * hw,
                     4 * hw * channels ** 2 + 2 * hw * hw * channels, 4 * hw * channels ** 2 + 2 * m2 * hw * channels)


# --- the structure of a loaded model -----------------------------------------------------------------------------

@dataclass(frozen=True)
class BlockGeometry:
    """One Swin block as the model holds it (all arrays read from the model, float32 / int64 numpy)."""

    index: int  # block number over the whole model
    stage: int
    block: int  # within the stage
    resolution: tuple[int, int]  # (H, W) tokens this block sees
    window: tuple[int, int]  # (Mh, Mw) after timm's clamp to the resolution
    shift: tuple[int, int]  # (sh, sw); (0, 0) for W-MSA
    heads: int
    dim: int
    token_px: int  # pixels of the input image per token side at this stage
    attn_mask: np.ndarray | None  # (nW, N, N) 0 / −100, the model's buffer; None in W-MSA blocks
    relative_position_index: np.ndarray  # (N, N) int64, the model's buffer
    bias_table: np.ndarray  # ((2Mh−1)(2Mw−1), heads) float32, the learned parameter

    @property
    def kind(self) -> str:
        return "SW-MSA" if any(self.shift) else "W-MSA"

    @property
    def padded(self) -> tuple[int, int]:
        return padded_size(self.resolution, self.window)

    @property
    def window_grid(self) -> tuple[int, int]:
        hp, wp = self.padded
        return hp // self.window[0], wp // self.window[1]

    @property
    def num_windows(self) -> int:
        rows, cols = self.window_grid
        return rows * cols

    @property
    def label(self) -> str:
        return f"stage {self.stage + 1} · block {self.block + 1} ({self.kind})"

    def regions(self) -> np.ndarray:
        """Region ids of the rolled (padded) map, ``(Hp, Wp)``."""
        return region_ids(self.padded, self.window, self.shift)

    def bias(self) -> np.ndarray:
        """B ``(heads, N, N)`` expanded from the model's table through the model's index buffer."""
        return relative_position_bias(self.bias_table, self.relative_position_index)

    def allowed(self) -> np.ndarray:
        """Boolean ``(nW, N, N)``: where the mask lets query i see key j (all True in W-MSA blocks)."""
        n = self.window[0] * self.window[1]
        if self.attn_mask is None:
            return np.ones((self.num_windows, n, n), dtype=bool)
        return self.attn_mask > MASK_VALUE / 2


@dataclass(frozen=True)
class StageGeometry:
    index: int
    resolution: tuple[int, int]  # tokens after this stage's patch merging
    dim: int  # C of this stage
    depth: int
    heads: int
    token_px: int
    merge: tuple[int, int] | None  # (4C_in, 2C_in) of the patch merging's linear layer; None for stage 1


@dataclass(frozen=True)
class SwinStructure:
    image_size: tuple[int, int]  # (H, W) pixels the model takes
    patch_size: tuple[int, int]
    stages: list[StageGeometry]
    blocks: list[BlockGeometry]

    def first_block(self, stage: int) -> BlockGeometry:
        return next(b for b in self.blocks if b.stage == stage)

    def stage_rows(self) -> list[dict]:
        """One row per stage for a table: tokens, pixels per token, width, heads, blocks, windows, patch merging."""
        return [{"stage": s.index + 1, "tokens": f"{s.resolution[0]} × {s.resolution[1]}", "token px": s.token_px,
                 "C": s.dim, "heads": s.heads, "blocks": s.depth, "windows": self.first_block(s.index).num_windows,
                 "patch merging": "—" if s.merge is None else f"{s.merge[0]} → {s.merge[1]}"} for s in self.stages]

    def cost_rows(self) -> list[dict]:
        """``costs()`` as table rows."""
        return [{"stage": c.stage + 1, "h × w": f"{c.resolution[0]} × {c.resolution[1]}", "C": c.channels,
                 "M": c.window[0], "full (hw)²": c.full_entries, "windowed M²hw": c.window_entries,
                 "Ω(MSA)": c.full_flops, "Ω(W-MSA)": c.window_flops, "saving": f"{c.saving:.0f}×"}
                for c in self.costs()]

    def costs(self) -> list[StageCost]:
        """Per stage, the attention cost of one block with the stage's (largest) window."""
        out = []
        for stage in self.stages:
            window = max((b.window for b in self.blocks if b.stage == stage.index), key=lambda w: w[0] * w[1])
            out.append(stage_cost(stage.index, stage.resolution, stage.dim, window, stage.heads))
        return out


def _np(tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy() if tensor.is_floating_point() else tensor.detach().cpu().numpy()


def read_structure(model) -> SwinStructure:
    """Read stages, blocks, windows, shifts, masks and bias tables out of a timm ``SwinTransformer``."""
    import torch
    from timm.models.swin_transformer import SwinTransformer

    if not isinstance(model, SwinTransformer):
        raise ValueError(f"{type(model).__name__} is not a Swin Transformer (v1) from timm; this page reads "
                         "SwinTransformer's windows, masks and bias tables. Pick a timm 'swin_*' model.")
    patch = tuple(model.patch_embed.patch_size)
    image_size = tuple(model.patch_embed.img_size)
    stages, blocks = [], []
    for s, layer in enumerate(model.layers):
        merge = None
        if hasattr(layer.downsample, "reduction"):
            out_features, in_features = layer.downsample.reduction.weight.shape
            merge = (int(in_features), int(out_features))
        token_px = patch[0] * 2 ** s
        first = layer.blocks[0]
        stages.append(StageGeometry(s, tuple(layer.output_resolution), int(first.dim), len(layer.blocks),
                                    int(first.attn.num_heads), token_px, merge))
        for b, block in enumerate(layer.blocks):
            mask = block.attn_mask
            if mask is None and any(block.shift_size):  # dynamic-size models build the mask per forward
                hp, wp = padded_size(tuple(block.input_resolution), tuple(block.window_size))
                with torch.no_grad():
                    mask = block.get_attn_mask(torch.zeros(1, hp, wp, 1))
            blocks.append(BlockGeometry(
                len(blocks), s, b, tuple(block.input_resolution), tuple(block.window_size),
                tuple(block.shift_size), int(block.attn.num_heads), int(block.dim), token_px,
                None if mask is None else _np(mask).astype(np.float32),
                _np(block.attn.relative_position_index).astype(np.int64),
                _np(block.attn.relative_position_bias_table).astype(np.float32)))
    return SwinStructure(image_size, patch, stages, blocks)


# --- captured attention ------------------------------------------------------------------------------------------

def patch_attention_map(window_attention: np.ndarray, query: tuple[int, int], resolution: tuple[int, int],
                        window: tuple[int, int], shift: tuple[int, int]) -> np.ndarray:
    """Where the token at ``query`` = (row, col) of the *original* map attends, reassembled onto that map.

    ``window_attention`` ``(nW, N, N)`` is one head of one block as the model computed it on the rolled, padded map.
    The query's rolled position is ``(row − sh, col − sw) mod (H, W)``; its row of its window's matrix is placed on
    the window's positions and rolled back by ``(+sh, +sw)``. Returns float32 ``(H, W)`` summing to 1 (padding
    positions, which hold no image, are dropped; their share is reported by the caller if needed).
    """
    height, width = resolution
    row, col = query
    if not (0 <= row < height and 0 <= col < width):
        raise ValueError(f"patch ({row}, {col}) is outside this stage's {height} × {width} token grid")
    hp, wp = padded_size(resolution, window)
    mh, mw = window
    rolled_row, rolled_col = (row - shift[0]) % height, (col - shift[1]) % width
    window_index = (rolled_row // mh) * (wp // mw) + rolled_col // mw
    within = (rolled_row % mh) * mw + rolled_col % mw
    canvas = np.zeros((hp // mh * (wp // mw), mh, mw), dtype=np.float32)
    canvas[window_index] = window_attention[window_index, within].reshape(mh, mw)
    rolled = window_reverse(canvas, window, hp, wp)[:height, :width]  # (H, W) on the rolled map
    return undo_cyclic_shift(rolled, shift)


def window_of(query: tuple[int, int], geometry: BlockGeometry) -> tuple[int, int]:
    """``(window index, position inside the window)`` of an original-map token in this block's rolled layout."""
    (height, width), (mh, mw) = geometry.resolution, geometry.window
    rolled_row, rolled_col = (query[0] - geometry.shift[0]) % height, (query[1] - geometry.shift[1]) % width
    return (rolled_row // mh) * geometry.window_grid[1] + rolled_col // mw, (rolled_row % mh) * mw + rolled_col % mw


@dataclass(eq=False)
class SwinAttention(AttentionMaps):
    """Captured window attention of every block: ``windows[b]`` float32 ``(nW, heads, N, N)``, rows sum to 1.

    The contract's ``layer(b)`` is the same attention as a dense ``(heads, H·W, H·W)`` matrix over the block's tokens
    in original row-major order (the roll undone, zeros outside each token's window); it is built on demand and
    refused above ``FULL_EXPANSION_LIMIT`` entries (56² tokens × 3 heads is 118 MB), where the per-window view is the
    one to use. Token labels differ per stage: ``tokens(b)``; ``query_tokens``/``key_tokens`` are block 0's.
    """

    kind: str
    query_tokens: list[str]
    key_tokens: list[str]
    windows: list[np.ndarray]
    geometry: list[BlockGeometry]

    @property
    def num_layers(self) -> int:
        return len(self.windows)

    @property
    def num_heads(self) -> int:  # the most any block has; per block see heads_in
        return max((w.shape[1] for w in self.windows), default=0)

    def heads_in(self, layer: int) -> int:
        return int(self.windows[layer].shape[1])

    def tokens(self, layer: int) -> list[str]:
        height, width = self.geometry[layer].resolution
        return [f"r{r}c{c}" for r in range(height) for c in range(width)]

    def head(self, layer: int, head: int | None) -> np.ndarray:
        if head is not None and not 0 <= head < self.heads_in(layer):
            raise ValueError(f"head {head} does not exist: block {layer} has heads 0..{self.heads_in(layer) - 1}")
        return super().head(layer, None) if head is None else self.layer(layer)[head]

    def window_head(self, layer: int, head: int | None) -> np.ndarray:
        """One head's per-window maps ``(nW, N, N)`` (mean over heads when None)."""
        weights = self.windows[layer]
        if head is None:
            return weights.mean(axis=1)
        if not 0 <= head < weights.shape[1]:
            raise ValueError(f"head {head} does not exist: block {layer} has heads 0..{weights.shape[1] - 1}")
        return weights[:, head]

    def patch_map(self, layer: int, head: int | None, query: tuple[int, int]) -> np.ndarray:
        """``patch_attention_map`` for block ``layer``: float32 ``(H, W)`` over the original token grid."""
        g = self.geometry[layer]
        return patch_attention_map(self.window_head(layer, head), query, g.resolution, g.window, g.shift)

    def _dense_entries(self, layer: int) -> int:
        height, width = self.geometry[layer].resolution
        return self.heads_in(layer) * (height * width) ** 2

    def _compute(self, layer: int) -> np.ndarray:
        if self._dense_entries(layer) > FULL_EXPANSION_LIMIT:
            raise ValueError(f"block {layer} as one dense matrix would hold {self._dense_entries(layer):,} entries; "
                             "use the per-window view (SwinAttention.windows / patch_map) for this stage")
        g = self.geometry[layer]
        height, width = g.resolution
        out = np.zeros((self.heads_in(layer), height * width, height * width), dtype=np.float32)
        for q in range(height * width):
            for h in range(self.heads_in(layer)):
                out[h, q] = self.patch_map(layer, h, divmod(q, width)).reshape(-1)
        return out

    def allowed(self, layer: int) -> np.ndarray:
        """Boolean ``(H·W, H·W)`` in original token order: same window of the rolled map and same region."""
        g = self.geometry[layer]
        height, width = g.resolution
        hp, wp = g.padded
        rolled = cyclic_shift(np.arange(height * width).reshape(height, width), g.shift)  # original id at rolled pos
        ids = np.full((hp, wp), -1, dtype=np.int64)
        ids[:height, :width] = rolled
        windows = window_partition(ids, g.window).reshape(g.num_windows, -1)  # (nW, N) original ids
        allowed = np.zeros((height * width, height * width), dtype=bool)
        for w, keep in enumerate(g.allowed()):
            tokens = windows[w]
            real = tokens >= 0
            allowed[np.ix_(tokens[real], tokens[real])] = keep[np.ix_(real, real)]
        return allowed


@dataclass(frozen=True)
class SwinRun:
    """Family extras: the structure the run used and the captured windows (``RunResult.extras["swin"]``)."""

    structure: SwinStructure
    attention: SwinAttention
    predictions: list[TokenProbability] = field(default_factory=list)
    label_source: str = ""  # where class names came from ("ImageNet-1k", "the checkpoint's label_names", ...)


def capture_windows(model, pixel_values) -> tuple[Any, list[np.ndarray]]:
    """Run ``model`` on ``pixel_values`` ``(1, 3, H, W)`` with a hook on every ``WindowAttention.softmax``.

    Returns the logits and, per block, float32 ``(nW, heads, N, N)``: the probabilities after bias and mask, as the
    block multiplies them with V. Fused attention must already be off (``capture_timm.disable_fused_attention``).
    """
    import torch

    from models import capture_timm

    if pixel_values.shape[0] != 1:
        raise ValueError(f"capture one image at a time, got a batch of {pixel_values.shape[0]}")
    points = capture_timm.attention_points(model, "softmax")
    keep = lambda output: output.detach().float().cpu().numpy()  # noqa: E731 (B·nW, heads, N, N) with B = 1
    with torch.inference_mode(), capture_timm.recording(model, points, keep=keep) as rec:
        logits = model(pixel_values)
    return logits, rec.per_point()


# --- loading -----------------------------------------------------------------------------------------------------

def supported_names() -> list[str]:
    """timm architecture names this page can load (Swin v1: ``SwinTransformer`` with a bias table)."""
    import timm

    return timm.list_models(module="swin_transformer")


def _timm_name(spec: ModelSpec) -> str:
    from models import loading

    if spec.source == "mini":
        return f"local-dir:{loading.SAMPLE_DATA / spec.id}"
    if spec.source == "local":
        return f"local-dir:{loading.resolve_local_folder(spec.id)}"
    name = spec.id.strip()
    if name.startswith(("hf-hub:", "timm/")) or "/" in name:
        return name if name.startswith("hf-hub:") else f"hf-hub:{name}"
    base = name.split(".")[0]  # a pretrained tag such as ".ms_in22k_ft_in1k" is allowed
    if base not in supported_names():
        close = [n for n in supported_names() if base.split("_")[0] in n][:5] or supported_names()[:5]
        raise ValueError(f"'{name}' is not a timm Swin (v1) model. Try one of: {', '.join(close)}; or type a "
                         "local folder saved with timm (config.json + model.safetensors).")
    return name


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32", progress=None):
    """A timm Swin ready for ``run``: eager attention per module, eval mode, on ``device`` in ``dtype``."""
    import timm
    from timm.models.swin_transformer import SwinTransformer

    from models import capture_timm, loading

    progress = progress or (lambda step, fraction: None)
    name = _timm_name(spec)
    progress("Loading weights" + (" (downloading if not cached)" if spec.source == "hub" else ""), 0.2)
    try:
        model = timm.create_model(name, pretrained=True)
    except ValueError:
        raise
    except (OSError, RuntimeError, KeyError) as error:
        if spec.source == "hub":
            raise loading._friendly_hub_error(spec.id, error) from None
        raise ValueError(f"'{spec.id}' could not be loaded as a timm model: {str(error).splitlines()[0][:300]}. "
                         "Save it with timm.models.save_for_hf(model, folder, safe_serialization=True).") from None
    except Exception as error:  # huggingface_hub raises its own types when offline or the repo is missing
        raise loading._friendly_hub_error(spec.id, error) from None
    if not isinstance(model, SwinTransformer):
        raise ValueError(f"'{spec.id}' is a {type(model).__name__}, not a Swin Transformer (v1); this page reads "
                         "SwinTransformer's windows, masks and bias tables.")
    capture_timm.disable_fused_attention(model)
    progress(f"Moving to {device}", 0.8)
    model = model.to(device=device, dtype=loading.torch_dtype(dtype)).eval()
    model.requires_grad_(False)
    progress("Ready", 1.0)
    return loading.LoadedModel(spec, model, None, device, dtype)


# --- one run -----------------------------------------------------------------------------------------------------

def class_names(model) -> tuple[list[str] | None, str]:
    """Class names for the model's head and where they came from; ``(None, reason)`` when unknown."""
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    names = cfg.get("label_names")
    if names and len(names) == model.num_classes:
        return [str(n) for n in names], "the checkpoint's label_names"
    if model.num_classes == 1000:
        from timm.data import ImageNetInfo

        info = ImageNetInfo()
        return [info.index_to_description(i).split(",")[0] for i in range(1000)], "ImageNet-1k"
    return None, f"{model.num_classes} classes without names"


def run(loaded, image, top_k: int = 5) -> RunResult:
    """Preprocess ``image`` (a ``models.images.UserImage`` or PIL image) as the model's data config says, run the
    model with window-attention capture, and return the result contract plus ``extras["swin"]`` (``SwinRun``)."""
    import torch

    from models import images
    from models.loading import is_out_of_memory

    model = loaded.model
    prepared = images.preprocess(image, images.data_config(model))
    pixels = prepared.tensor.to(device=loaded.device, dtype=next(model.parameters()).dtype)
    structure = read_structure(model)
    if tuple(prepared.crop.shape[:2]) != structure.image_size:
        raise ValueError(f"the model's data config produced a {prepared.crop.shape[1]} × {prepared.crop.shape[0]} crop "
                         f"but the model takes {structure.image_size[1]} × {structure.image_size[0]}")
    try:
        logits, windows = capture_windows(model, pixels)
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        if loaded.device.startswith("cuda"):
            torch.cuda.empty_cache()
        raise ValueError(f"Out of memory on {loaded.device} running {loaded.spec.key}. Pick a smaller model, "
                         "half precision on a GPU, or the CPU in the sidebar.") from None
    for geometry, captured in zip(structure.blocks, windows):
        expected = (geometry.num_windows, geometry.heads, geometry.window[0] * geometry.window[1])
        if captured.shape[:3] != expected:
            raise RuntimeError(f"{geometry.label}: captured {captured.shape}, expected windows/heads/N {expected}")

    first = structure.blocks[0].resolution
    labels = [f"r{r}c{c}" for r in range(first[0]) for c in range(first[1])]
    attention = SwinAttention("self", labels, labels, windows, structure.blocks)
    names, label_source = class_names(model)
    predictions = []
    if names is not None:
        probs = torch.softmax(logits[0].float(), -1).cpu()
        top = torch.topk(probs, min(top_k, probs.numel()))
        predictions = [TokenProbability(names[i], int(i), float(p)) for p, i in zip(top.values, top.indices)]
    spec = loaded.spec
    info = ModelInfo(spec.key, "swin", spec.source, loaded.device, loaded.dtype, CAPTURE_DESCRIPTION,
                     spec.licence, spec.trained_on)
    patch = structure.patch_size
    image_info = ImageInfo(prepared.crop, first, patch, 0, ())
    notices = list(getattr(image, "notes", ())) + [f"input {prepared.describe()}"]
    return RunResult(info, labels, {"self": attention}, image=image_info, notices=notices,
                     extras={"swin": SwinRun(structure, attention, predictions, label_source)})


def model_card(spec: ModelSpec) -> tuple[str, dict | None]:
    """The card (markdown) and measured metrics of a mini model; ``("", None)`` for others."""
    from models import loading

    if spec.source != "mini":
        return "", None
    folder = Path(loading.SAMPLE_DATA) / spec.id
    card = (folder / "card.md").read_text() if (folder / "card.md").is_file() else ""
    metrics_file = folder / "metrics.json"
    import json

    return card, json.loads(metrics_file.read_text()) if metrics_file.is_file() else None
