"""Figures of the Swin page (Liu et al. 2021): the stage hierarchy, the cyclic shift, the shifted-window masks, the
relative position bias, the captured window attention and what windows save.

Every builder reads a ``models.families.swin.model.SwinResult``: the structure read from the model's own buffers
(``result.structure``), the captured per-window maps (``result.windows``) and the crop the model saw
(``result.image``). Options number stages from 0 (the page calls them stage 1, 2, …) and blocks over the whole
model (``BlockGeometry.index``); ``block=None`` is the stage's shifted (SW-MSA) block, else its first. The drawing
itself is ``viz/swin_charts.py``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.families.swin import geometry
from models.families.swin.model import SwinResult
from models.core import selection
from viz import export, heatmap, image_overlay, swin_charts
from viz.figure import Figure, NoOptions, view



def head_label(head: int | None) -> str:
    """How a head is named in titles (the maps' index, None for the mean): one label table for every page."""
    return selection.head_label(selection.head_choice(head))


def _stem(result: SwinResult, *parts) -> str:
    return export.file_stem(result.model.short_name, result.input_name, *parts)


def _metadata(result: SwinResult, **settings) -> dict[str, str]:
    return {"model": result.model.key, "input": result.input_name, **{k: str(v) for k, v in settings.items()}}


def _scale(result: SwinResult, scale: int | None) -> int:
    """The crop's integer enlargement: the one asked for, or about 448 px wide."""
    if scale is None:
        return swin_charts.display_scale(result.image.image)
    if not 1 <= scale <= 16:
        raise ValueError(f"scale {scale} is outside 1..16 (the crop's enlargement, a whole number)")
    return scale


def _query(block: geometry.BlockGeometry, row: int | None, col: int | None) -> tuple[int, int]:
    """The patch (row, col) of the block's token grid; None: the one left of and above the centre."""
    rows, cols = block.resolution
    row = max(0, rows // 2 - 1) if row is None else row
    col = max(0, cols // 2 - 1) if col is None else col
    if not (0 <= row < rows and 0 <= col < cols):
        raise ValueError(f"patch ({row}, {col}) is outside stage {block.stage + 1}'s {rows} × {cols} token grid")
    return row, col


def _shifted(result: SwinResult, stage: int) -> geometry.BlockGeometry:
    shifted = result.structure.shifted_block(stage)
    if shifted is None:
        raise ValueError(result.structure.no_shift_reason(stage))
    return shifted


# --- the model's structure --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class HierarchyOptions:
    scale: int | None = None  # each stage's picture enlarged this many times; None: half the page's enlargement


@view("hierarchy", "Every stage: tokens and windows, one table row each", HierarchyOptions)
def hierarchy(result: SwinResult, options: HierarchyOptions) -> Figure:
    """Every stage's tokens and windows on the crop, side by side, with one table row per stage."""
    structure, crop = result.structure, result.image.image
    scale = _scale(result, options.scale) if options.scale is not None else max(1, swin_charts.display_scale(crop) // 2)
    pictures = [swin_charts.stage_grid(crop, s, structure.first_block(s.index).window, scale) for s in structure.stages]
    rows = structure.stage_rows()
    return Figure(
        _stem(result, "stages"),
        image=image_overlay.tile(pictures, len(pictures), gap=8),
        caption="Patch merging: 2 × 2 neighbouring tokens concatenated (4C), LayerNorm, a linear layer to 2C — half "
                "the resolution, twice the width, so windows of the same M tokens cover 4× the pixels a stage later.",
        table=pd.DataFrame(rows), payload=lambda: {"model": result.model.key, "stages": rows},
        metadata=_metadata(result))


@dataclass(frozen=True)
class StageOptions:
    stage: int = 0  # 0 = stage 1
    scale: int | None = None  # the crop's enlargement; None: about 448 px wide


@view("stage_windows", "One stage's tokens and windows on the image", StageOptions)
def stage_windows(result: SwinResult, options: StageOptions) -> Figure:
    """The crop with one stage's tokens (thin white lines) and its M × M windows (thick yellow lines)."""
    structure = result.structure
    stage = structure.stage(options.stage)
    window = structure.first_block(stage.index).window
    picture = swin_charts.stage_grid(result.image.image, stage, window, _scale(result, options.scale))
    (rows, cols), px = stage.resolution, stage.token_px
    return Figure(
        _stem(result, f"stage {stage.index + 1}", "windows"), image=picture,
        caption=f"stage {stage.index + 1}: {rows} × {cols} tokens of {px} px, {window[0]} × {window[1]}-token "
                "windows",
        payload={"model": result.model.key, "stage": stage.index + 1, "tokens": [rows, cols], "token_px": px,
                 "window": list(window), "windows": structure.first_block(stage.index).num_windows},
        metadata=_metadata(result, stage=stage.index + 1))


@dataclass(frozen=True)
class MergingOptions:
    stage: int = 1  # the stage the merging leads into (stage 0 starts from the patch embedding)


@view("patch_merging", "Patch merging into a stage", MergingOptions)
def patch_merging(result: SwinResult, options: MergingOptions) -> Figure:
    """2 × 2 neighbours (C each) concatenated to 4C and projected to 2C: the sizes of the model's reduction layer."""
    stage = result.structure.stage(options.stage)
    picture = swin_charts.merge_picture(stage)  # a ValueError for stage 0, which has no merging
    return Figure(
        export.file_stem(result.model.short_name, f"patch merging into stage {stage.index + 1}"), image=picture,
        caption=f"into stage {stage.index + 1} (the model's reduction layer)",
        payload={"model": result.model.key, "stage": stage.index + 1, "concatenated_4C": stage.merge[0],
                 "projected_2C": stage.merge[1]},
        metadata={"model": result.model.key, "stage": str(stage.index + 1)})


# --- the cyclic shift and its masks -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShiftOptions:
    stage: int = 0
    step: str = swin_charts.SHIFT_STEPS[0]  # one of viz.swin_charts.SHIFT_STEPS
    scale: int | None = None


def _shift_caption(step: str, before: geometry.BlockGeometry, shifted: geometry.BlockGeometry) -> str:
    s = shifted.shift[0]
    return {
        "original layout": f"{before.label} attends inside these regular windows.",
        "shifted windows": f"{shifted.label} displaces the windows by ⌊M/2⌋ = {s} tokens (red). Border windows "
                           "are partial: more windows, of unequal sizes, would be wasteful to batch.",
        "rolled feature map": f"Instead the map is rolled by −{s} tokens (torch.roll): the top {s} rows and left "
                              f"{s} columns wrap round to the bottom and right. Colours travel with the pixels.",
        "region ids": "Regular windows on the rolled map now mix pieces that were not neighbours. Each token gets "
                      "a region id (0–8), as in the model's own mask construction.",
        "regrouped windows": "The rolled map's windows: those framed red hold several regions, and the mask stops "
                             f"attention between them. Afterwards the map is rolled back by +{s}.",
    }[step]


@view("cyclic_shift", "The cyclic shift, step by step", ShiftOptions)
def cyclic_shift(result: SwinResult, options: ShiftOptions) -> Figure:
    """One step of how a shifted block displaces its windows by rolling the map (the paper's Fig. 4), drawn on the
    crop; the NPZ holds the rolled map's region ids."""
    if options.step not in swin_charts.SHIFT_STEPS:
        raise ValueError(f"unknown step {options.step!r}; choose one of {', '.join(swin_charts.SHIFT_STEPS)}")
    shifted = _shifted(result, options.stage)
    picture = swin_charts.shift_step(result.image.image, shifted, options.step, _scale(result, options.scale))
    return Figure(
        _stem(result, shifted.label, "cyclic shift", options.step), image=picture,
        caption=_shift_caption(options.step, result.structure.stage_blocks(options.stage)[0], shifted),
        payload=lambda: {"model": result.model.key, "block": shifted.label, "step": options.step,
                         "shift": list(shifted.shift), "window": list(shifted.window), "regions": shifted.regions()},
        arrays={"regions": shifted.regions()},
        metadata=_metadata(result, block=shifted.label, step=options.step))


@dataclass(frozen=True)
class MaskOptions:
    stage: int = 0


@view("shifted_window_masks", "Attention masks of a shifted block", MaskOptions)
def shifted_window_masks(result: SwinResult, options: MaskOptions) -> Figure:
    """For one window of each kind (interior, right edge, bottom edge, corner): its region ids and the additive mask
    the model's ``attn_mask`` buffer holds for it. ``charts`` are the (region ids, mask) pairs in order; the export
    stacks the pairs."""
    shifted = _shifted(result, options.stage)
    regions = shifted.regions()
    window_regions = geometry.window_partition(regions, shifted.window)  # (nW, Mh, Mw)
    same = np.array_equal(geometry.shifted_window_mask(regions, shifted.window), shifted.attn_mask)
    kinds = geometry.window_types(shifted.window_grid)
    pairs = [(swin_charts.region_chart(window_regions[index], f"{name} (window {index}): region ids"),
              swin_charts.mask_chart(shifted.attn_mask[index], window_regions[index], shifted.window,
                              f"{name}: mask added to the scores"))
             for name, index in kinds.items()]
    return Figure(
        export.file_stem(result.model.short_name, shifted.label, "attention masks"),
        charts=tuple(chart for pair in pairs for chart in pair), layout=((1, 2),),  # a row per kind of window
        caption=f"{shifted.label}: the model's `attn_mask` buffer {tuple(shifted.attn_mask.shape)} is added to the "
                "scores before softmax; −100 makes a weight ≈ 4·10⁻⁴⁴. Rebuilt from the region ids it is "
                f"{'identical' if same else 'DIFFERENT'}.",
        payload=lambda: {"model": result.model.key, "block": shifted.label, "windows_shown": kinds,
                         "mask_equals_region_rebuild": same, "attn_mask": shifted.attn_mask,
                         "window_regions": window_regions},
        arrays={"attn_mask": shifted.attn_mask, "window_regions": window_regions},
        metadata={"model": result.model.key, "block": shifted.label})


# --- relative position bias -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BiasOptions:
    stage: int = 0
    block: int | None = None  # numbered over the model; None: the stage's shifted block, else its first
    head: int = 0  # the head whose B is expanded


def _bias_layout(heads: int) -> tuple[tuple[float, ...], ...]:
    """Up to four heads' small tables in one row with B and the index (twice as wide) beside them; more heads in rows
    of six, B and the index under them."""
    if heads <= 4:
        return ((1,) * heads + (2, 2),)
    return tuple((1,) * min(6, heads - start) for start in range(0, heads, 6)) + ((1, 1),)


@view("relative_position_bias", "Relative position bias", BiasOptions)
def relative_position_bias(result: SwinResult, options: BiasOptions) -> Figure:
    """Every head's learned table over (Δx, Δy), then B = table[relative_position_index] for one head next to the
    index buffer. ``charts``: every head's table, then B and the index (laid out by ``_bias_layout``)."""
    block = result.structure.block_in(options.stage, options.block)
    if not 0 <= options.head < block.heads:
        raise ValueError(f"head {options.head} does not exist: {block.label} has heads 0..{block.heads - 1}")
    m, head = block.window[0], options.head
    bias = block.bias()[head]  # (N, N)
    tables = swin_charts.bias_tables_charts(geometry.bias_table_images(block.bias_table, block.window), block.window)
    pair = (swin_charts.bias_matrix_chart(bias, block.window, f"B for head {head}"),
            swin_charts.bias_matrix_chart(block.relative_position_index.astype(float), block.window,
                                   "relative_position_index s (buffer)"))
    return Figure(
        export.file_stem(result.model.short_name, block.label, "relative position bias", f"head {head}"),
        charts=(*tables, *pair), layout=_bias_layout(len(tables)),
        caption=(f"B is gathered from a learned table of (2M−1)² = {(2 * m - 1) ** 2} rows × {block.heads} heads at "
                 f"s(Δx, Δy) = (Δx + M − 1)(2M − 1) + (Δy + M − 1) with M = {m}; Δx, Δy ∈ [−{m - 1}, {m - 1}] are "
                 "the row and column offsets query − key. Shown: the model's `relative_position_bias_table` per "
                 "head, and `table[relative_position_index]` for one head." if result.structure.version == 1 else
                 f"Swin v2: the table is not learned directly but made by a small MLP from the log-spaced offsets "
                 f"(Δx, Δy) ∈ [−{m - 1}, {m - 1}]² and squashed to 16·sigmoid(·), one row per offset and head, "
                 "gathered with the same index s(Δx, Δy) = (Δx + M − 1)(2M − 1) + (Δy + M − 1); it is added to "
                 "cosine scores scaled by a learned temperature, not to QKᵀ/√d. Shown: that table per head, and "
                 "`table[relative_position_index]` for one head."),
        # every head's table (drawn above), B of the head named in the file, the index buffer
        payload=lambda: {"model": result.model.key, "block": block.label, "head": head, "window": list(block.window),
                         "relative_position_bias_table": block.bias_table, "bias": bias,
                         "relative_position_index": block.relative_position_index},
        arrays={"relative_position_bias_table": block.bias_table, "bias": bias,
                "relative_position_index": block.relative_position_index},
        metadata={"model": result.model.key, "block": block.label, "head": str(head)})


# --- captured window attention ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WindowOptions:
    stage: int = 0
    block: int | None = None  # numbered over the model; None: the stage's shifted block, else its first
    head: int | None = None  # None: the average of heads
    row: int | None = None  # the patch whose window is shown; None: left of and above the centre
    col: int | None = None
    scheme: str = "viridis"


def _window_attention(result: SwinResult, options):
    block = result.structure.block_in(options.stage, options.block)
    query = _query(block, options.row, options.col)
    weights = result.windows.window_head(block.index, options.head)  # (nW, N, N), validates the head
    window, slot = geometry.window_of(query, block)
    return block, query, weights, block.allowed(), window, slot


@view("window_attention", "Window attention: the patch's window", WindowOptions)
def window_attention(result: SwinResult, options: WindowOptions) -> Figure:
    """The captured ``(N, N)`` attention of the window holding the chosen patch, on the rolled map (after bias and
    mask; blocked cells grey). The files hold that window's map only."""
    block, query, weights, allowed, window, slot = _window_attention(result, options)
    name = head_label(options.head)
    mh, mw = block.window
    slots = [f"({i // mw},{i % mw})" for i in range(mh * mw)]
    chart = swin_charts.window_attention_chart(weights[window], allowed[window], block.window,
                                        f"window {window}, query slot {slot}", options.scheme)
    deviation = float(np.abs(weights.sum(-1) - 1).max())
    leak = float(weights[~allowed].max(initial=0.0))
    return Figure(
        _stem(result, block.label, name, f"window {window}"), chart=chart,
        caption=f"Rows sum to 1 (max deviation {deviation:.1e}); largest weight on a blocked pair: {leak:.1e}. "
                "Captured at WindowAttention.softmax, i.e. after bias and mask.",
        table=lambda: export.matrix_frame(weights[window], slots, slots),
        payload=lambda: {"model": result.model.key, "input": result.input_name, "stage": block.stage + 1,
                         "block": block.label, "head": name, "window": window, "query_slot": slot,
                         "patch": list(query), "slots": slots, "weights": weights[window],
                         "allowed": allowed[window]},
        arrays=lambda: {"weights": weights[window], "allowed": allowed[window]},
        metadata=_metadata(result, block=block.label, head=name, window=window, patch=query))


@view("block_windows", "Window attention: every window of a block", WindowOptions)
def block_windows(result: SwinResult, options: WindowOptions) -> Figure:
    """Every window's captured ``(N, N)`` map of one head, tiled as the windows lie on the rolled map, the chosen
    patch's window framed. The NPZ holds all of them: ``windows (nW, N, N)`` and ``allowed``."""
    block, _, weights, allowed, window, _ = _window_attention(result, options)  # window: the patch's, framed
    name = head_label(options.head)
    image = swin_charts.all_windows_image(weights, allowed, block.window_grid, window, scheme=options.scheme)
    return Figure(
        _stem(result, block.label, name, f"all {block.num_windows} windows"), image=image,
        caption=f"All {block.num_windows} windows of {block.label} on the rolled map, {name}; grey = blocked by the "
                "mask; red frame = the patch's window",
        payload=lambda: {"model": result.model.key, "input": result.input_name, "block": block.label, "head": name,
                         "window_grid": list(block.window_grid), "selected_window": window, "windows": weights,
                         "allowed": allowed},
        arrays=lambda: {"windows": weights, "allowed": allowed},
        metadata=_metadata(result, block=block.label, head=name))


@dataclass(frozen=True)
class PatchOptions:
    stage: int = 0
    block: int | None = None
    head: int | None = None
    row: int | None = None
    col: int | None = None
    scale: int | None = None


@view("patch_attention", "Where a patch attends, roll undone", PatchOptions)
def patch_attention(result: SwinResult, options: PatchOptions) -> Figure:
    """The chosen patch's row of its window's map, put back on the original token grid (the roll undone) over the
    crop, with the block's windows drawn: in a shifted block it reaches across the previous block's borders."""
    block = result.structure.block_in(options.stage, options.block)
    query = _query(block, options.row, options.col)
    values = result.windows.patch_map(block.index, options.head, query)  # (H, W), sums to 1
    picture = swin_charts.patch_attention_picture(result.image.image, values, block, query, _scale(result, options.scale))
    name = head_label(options.head)
    return Figure(
        _stem(result, block.label, name, f"patch {query[0]} {query[1]}"), image=picture,
        caption=f"{block.label}: where token ({query[0]}, {query[1]}) attends ({name}), roll undone",
        payload=lambda: {"model": result.model.key, "input": result.input_name, "block": block.label, "head": name,
                         "patch": list(query), "attention": values},
        arrays={"attention": values},
        metadata=_metadata(result, block=block.label, head=name, patch=query))


# --- cost and predictions ---------------------------------------------------------------------------------------------

@view("window_cost", "Attention cost: full against windowed", NoOptions)
def window_cost(result: SwinResult, options: NoOptions) -> Figure:
    """Attention entries per head and block, full (hw)² against windowed M²·hw, per stage of this model (log scale),
    with the paper's multiply-add counts (eq. 1–2) in the table."""
    lecture = geometry.stage_cost(0, (56, 56), 96, (7, 7), 3)
    return Figure(
        export.file_stem(result.model.short_name, "attention cost per stage"),
        chart=swin_charts.cost_chart(result.structure.costs()), table=pd.DataFrame(result.structure.cost_rows()),
        payload=lambda: {"model": result.model.key, "stages": result.structure.cost_rows()},
        caption=f"Full attention over 56 × 56 tokens: (56²)² = 56⁴ = **{lecture.full_entries:,}** ≈ 9.8 M entries "
                f"per head; in 7 × 7 windows M²·H·W = 49 · 3,136 = **{lecture.window_entries:,}** "
                f"({lecture.saving:.0f}× fewer). Paper, eq. 1–2: Ω(MSA) = 4hwC² + 2(hw)²C, Ω(W-MSA) = 4hwC² + "
                "2M²hwC. This model, per stage:",
        metadata={"model": result.model.key})


@view("swin_predictions", "Top predictions", NoOptions)
def swin_predictions(result: SwinResult, options: NoOptions) -> Figure:
    """The model's top classes, best first, and where their names come from."""
    if not result.predictions:
        raise ValueError(f"No class names for this head ({result.label_source}); the attention views work all the "
                         "same.")
    tokens = [p.token for p in result.predictions]
    probabilities = [p.probability for p in result.predictions]
    return Figure(
        _stem(result, "top predictions"),
        chart=heatmap.probability_bars(tokens, probabilities, f"Top predictions ({result.label_source})"),
        table=lambda: pd.DataFrame({"class": tokens, "class_id": [p.token_id for p in result.predictions],
                                    "probability": probabilities}),
        payload=lambda: {"model": result.model.key, "label_source": result.label_source, "classes": tokens,
                         "probabilities": probabilities},
        metadata=_metadata(result))
