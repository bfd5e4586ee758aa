"""Swin Transformer geometry, pure numpy: windows, the cyclic shift, region masks, relative position bias, cost.

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

These helpers rebuild independently what a timm model holds in its buffers (``models/families/swin/model.py`` reads those), so tests
can check our understanding against the model's tensors, views can explain them, and the mechanics page can draw
Swin's mask on any token grid. Nothing here imports torch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MASK_VALUE = -100.0  # what timm (and the official code) adds between regions; exp(-100) ≈ 4e-44, i.e. 0 in float32


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
    # 1: softmax(QKᵀ/√d + B + mask), B from a learned table (Liu et al. 2021); 2: Swin v2's softmax(τ · cos(q, k) +
    # 16·sigmoid(B) + mask), B from a small MLP of log-spaced offsets tabulated over the window (Liu et al. 2022)
    version: int = 1

    def stage(self, stage: int) -> StageGeometry:
        """Stage ``stage`` (0-based; pages call it stage ``stage + 1``), or a ``ValueError`` naming those there are."""
        if not 0 <= stage < len(self.stages):
            raise ValueError(f"stage {stage} does not exist: this model has stages 0..{len(self.stages) - 1} "
                             f"(shown as stage 1..{len(self.stages)})")
        return self.stages[stage]

    def first_block(self, stage: int) -> BlockGeometry:
        return next(b for b in self.blocks if b.stage == stage)

    def stage_blocks(self, stage: int) -> list[BlockGeometry]:
        self.stage(stage)
        return [b for b in self.blocks if b.stage == stage]

    def shifted_block(self, stage: int) -> BlockGeometry | None:
        """The stage's first SW-MSA block; None when no block of the stage shifts its windows."""
        return next((b for b in self.stage_blocks(stage) if b.kind == "SW-MSA"), None)

    def no_shift_reason(self, stage: int) -> str:
        """Why a stage has no shifted block, in words for a page."""
        height, width = self.stage(stage).resolution
        return (f"Stage {stage + 1} has no shifted block: its {height} × {width} tokens fit in one window, so timm "
                "sets the shift to 0 (nothing to displace). Pick an earlier stage.")

    def block_in(self, stage: int, block: int | None = None) -> BlockGeometry:
        """Block ``block`` (numbered over the whole model) of ``stage``; None: the stage's shifted block, else its
        first. A block of another stage is a ``ValueError``."""
        blocks = self.stage_blocks(stage)
        if block is None:
            return self.shifted_block(stage) or blocks[0]
        if block not in [b.index for b in blocks]:
            raise ValueError(f"block {block} is not in stage {stage + 1}: its blocks are "
                             f"{', '.join(str(b.index) for b in blocks)}")
        return self.blocks[block]

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
