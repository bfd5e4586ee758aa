"""Pictures of Swin's windows, cyclic shift, masks and relative position bias (Liu et al. 2021, Fig. 2 and Fig. 4).

Pure: arrays and ``models.families.swin.geometry`` objects in, ``PIL.Image`` or ``alt.Chart`` out; nothing here loads or runs a
model or calls Streamlit. Everything is drawn from the arrays it is given (the model's ``attn_mask``, index and table
buffers, the captured windows); the only geometry computed here is where a token's pixels are: token (r, c) of a stage
with ``token_px`` pixels per token covers ``[r·p, (r+1)·p) × [c·p, (c+1)·p)`` of the crop.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
from PIL import Image, ImageDraw, ImageFont

from models.families.swin import geometry
from viz import heatmap, image_overlay

# nine region colours (tab10 without grey), region 0 (the untouched interior) light so the photo stays visible
REGION_RGB = np.array([(230, 230, 230), (31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40),
                       (148, 103, 189), (140, 86, 75), (227, 119, 194), (188, 189, 34)], dtype=np.uint8)
SHIFT_STEPS = ("original layout", "shifted windows", "rolled feature map", "region ids", "regrouped windows")
WINDOW_LINE = (255, 215, 0)  # regular windows: the yellow of the stage grid
SHIFTED_LINE = (255, 40, 40)  # displaced windows


def _line_width(scale: int) -> int:
    return max(2, scale // 2)


def _scaled(crop: np.ndarray, scale: int) -> Image.Image:
    picture = Image.fromarray(np.asarray(crop, dtype=np.uint8))
    return picture.resize((picture.width * scale, picture.height * scale), Image.Resampling.NEAREST)


def display_scale(crop: np.ndarray, target_px: int = 448) -> int:
    """Integer enlargement so a crop is about ``target_px`` wide (64 px crops become readable, 224 px ones 2×)."""
    return max(1, round(target_px / crop.shape[1]))


def _grid_lines(draw: ImageDraw.ImageDraw, size: tuple[int, int], step: float, offset: float, colour, width: int,
                dashed: bool = False) -> None:
    """Vertical and horizontal lines every ``step`` pixels starting at ``offset`` (pixels), over an image ``size``."""
    width_px, height_px = size
    for axis_length, vertical in ((width_px, True), (height_px, False)):
        position = offset % step
        while position < axis_length:
            if position > 0:
                ends = [(position, 0), (position, height_px)] if vertical else [(0, position), (width_px, position)]
                if dashed:
                    length = height_px if vertical else width_px
                    for start in range(0, length, 12):
                        a = (position, start) if vertical else (start, position)
                        b = (position, min(start + 6, length)) if vertical else (min(start + 6, length), position)
                        draw.line([a, b], fill=colour, width=width)
                else:
                    draw.line(ends, fill=colour, width=width)
            position += step


def _tint(picture: np.ndarray, labels: np.ndarray, token_px: int, strength: float = 0.45) -> np.ndarray:
    """Blend a region colour per token (``labels (H, W)`` ints) onto a crop ``(H·p, W·p, 3)``."""
    colours = REGION_RGB[labels % len(REGION_RGB)].repeat(token_px, 0).repeat(token_px, 1)
    colours = colours[:picture.shape[0], :picture.shape[1]]
    return ((1 - strength) * picture + strength * colours).round().astype(np.uint8)


def stage_grid(crop: np.ndarray, stage: geometry.StageGeometry, window: tuple[int, int], scale: int) -> Image.Image:
    """The crop with one stage's tokens (thin lines, ``token_px`` apart) and its M × M windows (thick lines)."""
    picture = _scaled(crop, scale)
    draw = ImageDraw.Draw(picture)
    step = stage.token_px * scale
    if step >= 4:
        _grid_lines(draw, picture.size, step, 0, (255, 255, 255), 1)
    _grid_lines(draw, picture.size, step * window[0], 0, (255, 215, 0), _line_width(scale))
    return picture


def _font(size: int) -> ImageFont.ImageFont:
    """DejaVu Sans where installed (it has ×, →, ², …), else Pillow's own scalable default font."""
    try:
        return ImageFont.truetype("DejaVuSans.ttf", size)
    except OSError:
        return ImageFont.load_default(size=size)


def merge_picture(stage: geometry.StageGeometry, cell: int = 36) -> Image.Image:
    """Patch merging as a diagram: 2 × 2 neighbours (C each) concatenated to 4C, projected to 2C (sizes from the
    model's ``reduction`` layer, ``stage.merge``)."""
    if stage.merge is None:
        raise ValueError("stage 1 has no patch merging: it starts from the patch embedding")
    four_c, two_c = stage.merge
    font = _font(max(10, cell // 3))
    top = cell // 2 + 8
    picture = Image.new("RGB", (9 * cell, top + 2 * cell + 6), "white")
    draw = ImageDraw.Draw(picture)
    colours = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40)]
    for i, colour in enumerate(colours):  # the 2 × 2 neighbourhood
        r, c = divmod(i, 2)
        draw.rectangle([c * cell + 2, top + r * cell, (c + 1) * cell, top + (r + 1) * cell - 2], fill=colour)
    draw.text((2, 2), f"2 × 2 tokens, C = {four_c // 4}", fill="black", font=font)
    x0 = 3 * cell
    for i, colour in enumerate(colours):  # concatenated along the channels
        draw.rectangle([x0 + i * cell // 2, top + cell // 2, x0 + (i + 1) * cell // 2 - 2, top + 3 * cell // 2],
                       fill=colour)
    draw.text((x0, top + cell // 2 - 4), f"concat: 4C = {four_c}", fill="black", font=font, anchor="lb")
    x1 = 6 * cell + cell // 2
    draw.rectangle([x1, top + cell // 2, x1 + cell, top + 3 * cell // 2], fill=(90, 90, 90))
    draw.text((x1 - cell // 2, top + 3 * cell // 2 + 4), f"linear → 2C = {two_c}", fill="black", font=font)
    for a, b in ((2 * cell + 8, x0 - 8), (x0 + 2 * cell + 6, x1 - 8)):
        draw.line([(a, top + cell), (b, top + cell)], fill="black", width=2)
        draw.polygon([(b, top + cell - 5), (b + 7, top + cell), (b, top + cell + 5)], fill="black")
    return picture


def shift_step(crop: np.ndarray, block: geometry.BlockGeometry, step: str, scale: int) -> Image.Image:
    """One picture of the cyclic-shift story for a shifted block (``SHIFT_STEPS``), drawn on the crop.

    - original layout: the regular windows W-MSA used in the block before;
    - shifted windows: windows displaced by s = ⌊M/2⌋ tokens, tinted by displaced window (partial ones at the border);
    - rolled feature map: the crop rolled by −s tokens; the tint travels with the pixels, the regular grid stays;
    - region ids: the rolled map coloured by the model's region id (0–8) per token;
    - regrouped windows: the rolled map cut into its windows, drawn apart, each labelled with its regions.
    """
    if step not in SHIFT_STEPS:
        raise ValueError(f"unknown step {step!r}; use one of {SHIFT_STEPS}")
    if not any(block.shift):
        raise ValueError(f"{block.label} does not shift its windows; pick an SW-MSA block")
    p, (mh, mw), (sh, sw) = block.token_px, block.window, block.shift
    height, width = block.resolution
    crop = np.asarray(crop, dtype=np.uint8)[:height * p, :width * p]
    displaced = ((np.arange(height) + mh - sh) // mh)[:, None] * (width // mw + 1) + \
        ((np.arange(width) + mw - sw) // mw)[None, :]  # (H, W) displaced-window number, original layout
    if step == "original layout":
        picture = _scaled(crop, scale)
        _grid_lines(ImageDraw.Draw(picture), picture.size, mh * p * scale, 0, WINDOW_LINE, _line_width(scale))
        return picture
    if step == "shifted windows":
        picture = _scaled(_tint(crop, displaced, p), scale)
        draw = ImageDraw.Draw(picture)
        _grid_lines(draw, picture.size, mh * p * scale, 0, WINDOW_LINE, 1, dashed=True)
        _grid_lines(draw, picture.size, mh * p * scale, sh * p * scale, SHIFTED_LINE, _line_width(scale))
        return picture
    rolled_pixels = geometry.cyclic_shift(crop, (sh * p, sw * p))
    if step == "rolled feature map":
        picture = _scaled(_tint(rolled_pixels, geometry.cyclic_shift(displaced, block.shift), p), scale)
        _grid_lines(ImageDraw.Draw(picture), picture.size, mh * p * scale, 0, WINDOW_LINE, _line_width(scale))
        return picture
    regions = block.regions()[:height, :width]
    if step == "region ids":
        picture = _scaled(_tint(rolled_pixels, regions, p, 0.6), scale)
        draw = ImageDraw.Draw(picture)
        _grid_lines(draw, picture.size, mh * p * scale, 0, WINDOW_LINE, _line_width(scale))
        for label in np.unique(regions):
            rows, cols = np.nonzero(regions == label)
            y, x = (rows.min() + rows.max() + 1) / 2 * p * scale, (cols.min() + cols.max() + 1) / 2 * p * scale
            draw.rectangle([x - 10, y - 10, x + 10, y + 10], fill="white")
            draw.text((x, y), str(int(label)), fill="black", font=_font(14), anchor="mm")
        return picture
    # regrouped windows: an exploded view of the rolled map, one tile per window, gaps between windows
    tinted = _scaled(_tint(rolled_pixels, regions, p, 0.6), scale)
    tile_px, gap = mh * p * scale, max(6, scale * 3)
    rows, cols = block.window_grid
    sheet = Image.new("RGB", (cols * tile_px + (cols - 1) * gap, rows * tile_px + (rows - 1) * gap), "white")
    draw = ImageDraw.Draw(sheet)
    window_regions = geometry.window_partition(block.regions(), block.window)
    for index in range(rows * cols):
        r, c = divmod(index, cols)
        piece = tinted.crop((c * tile_px, r * tile_px, (c + 1) * tile_px, (r + 1) * tile_px))
        x, y = c * (tile_px + gap), r * (tile_px + gap)
        sheet.paste(piece, (x, y))
        labels = np.unique(window_regions[index])
        if len(labels) > 1:
            draw.rectangle([x, y, x + tile_px - 1, y + tile_px - 1], outline=SHIFTED_LINE, width=2)
            text = "/".join(str(int(v)) for v in labels)
            font = _font(12)
            box = draw.textbbox((x + 4, y + 3), text, font=font)
            draw.rectangle([box[0] - 2, box[1] - 2, box[2] + 2, box[3] + 2], fill="white")
            draw.text((x + 4, y + 3), text, fill="black", font=font)
    return sheet


# --- masks and bias ----------------------------------------------------------------------------------------------

def _window_frame(values: np.ndarray, window: tuple[int, int], regions: np.ndarray | None = None
                  ) -> tuple[pd.DataFrame, list[str]]:
    """Long form of an ``(N, N)`` window matrix with in-window (row, col) names of query and key."""
    n = values.shape[0]
    mw = window[1]
    names = [f"({i // mw},{i % mw})" for i in range(n)]
    q, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    frame = pd.DataFrame({"query": np.asarray(names, dtype=object)[q.ravel()],
                          "key": np.asarray(names, dtype=object)[k.ravel()],
                          "value": values.ravel().astype(float)})
    if regions is not None:
        flat = regions.reshape(-1)
        frame["query region"] = flat[q.ravel()]
        frame["key region"] = flat[k.ravel()]
    return frame, names


def mask_chart(mask: np.ndarray, regions: np.ndarray, window: tuple[int, int], title: str, side: int = 260
               ) -> alt.Chart:
    """One window's additive mask ``(N, N)`` (0 or −100, as the model adds it) with both tokens' region ids."""
    frame, names = _window_frame(mask, window, regions)
    frame["mask"] = np.where(frame["value"] < 0, "−100 (blocked)", "0 (allowed)")
    return alt.Chart(frame).mark_rect().encode(
        x=alt.X("key:N", sort=names, title="key", axis=alt.Axis(labels=len(names) <= 16, ticks=False)),
        y=alt.Y("query:N", sort=names, title="query", axis=alt.Axis(labels=len(names) <= 16, ticks=False)),
        color=alt.Color("mask:N", scale=alt.Scale(domain=["0 (allowed)", "−100 (blocked)"],
                                                  range=["#f2f2f2", "#31135e"]), legend=alt.Legend(title=None,
                                                                                                    orient="bottom")),
        tooltip=["query", "query region", "key", "key region", alt.Tooltip("value:Q", title="added to the score")],
    ).properties(width=side, height=side, title=title, autosize=heatmap.PAD)


def region_chart(regions: np.ndarray, title: str, side: int = 200) -> alt.Chart:
    """The region ids ``(M, M)`` of one window as coloured cells with the id written in."""
    rows, cols = np.meshgrid(np.arange(regions.shape[0]), np.arange(regions.shape[1]), indexing="ij")
    frame = pd.DataFrame({"row": rows.ravel(), "col": cols.ravel(), "region": regions.ravel().astype(int)})
    palette = ["#%02x%02x%02x" % tuple(c) for c in REGION_RGB]
    base = alt.Chart(frame).encode(x=alt.X("col:O", title=None), y=alt.Y("row:O", title=None))
    cells = base.mark_rect(stroke="white").encode(
        color=alt.Color("region:N", scale=alt.Scale(domain=list(range(9)), range=palette), legend=None),
        tooltip=["row", "col", "region"])
    text = base.mark_text(fontSize=10).encode(text="region:N")
    return (cells + text).properties(width=side, height=side, title=title, autosize=heatmap.PAD)


def bias_tables_charts(tables: np.ndarray, window: tuple[int, int]) -> tuple[alt.Chart, ...]:
    """Each head's learned table ``(heads, 2Mh−1, 2Mw−1)`` as a small heatmap over (Δx, Δy), one chart per head (the
    page lays them out in a row, each fitted to its column); own colour per head."""
    heads = tables.shape[0]
    dx, dy = np.meshgrid(np.arange(tables.shape[1]) - (window[0] - 1), np.arange(tables.shape[2]) - (window[1] - 1),
                         indexing="ij")
    frames = []
    for head in range(heads):
        values = tables[head]
        spread = float(values.max() - values.min()) or 1.0
        frames.append(pd.DataFrame({"head": f"head {head}", "Δx (rows)": dx.ravel(), "Δy (cols)": dy.ravel(),
                                    "bias": values.ravel().astype(float),
                                    "relative": ((values - values.min()) / spread).ravel().astype(float),
                                    "s": ((dx + window[0] - 1) * (2 * window[1] - 1) + dy + window[1] - 1).ravel()}))
    side = 18 * tables.shape[1] if tables.shape[1] <= 13 else 140
    labels = tables.shape[1] <= 13  # every offset labelled while they fit
    return tuple(alt.Chart(frame).mark_rect().encode(
        x=alt.X("Δy (cols):O", axis=alt.Axis(labels=labels)), y=alt.Y("Δx (rows):O", axis=alt.Axis(labels=labels)),
        color=alt.Color("relative:Q", scale=alt.Scale(scheme="redblue", reverse=True), legend=None),
        tooltip=["head", "Δx (rows)", "Δy (cols)", "s", alt.Tooltip("bias:Q", format=".3f")],
    ).properties(width=side, height=side, title=f"head {head}", autosize=heatmap.PAD)
        for head, frame in enumerate(frames))


def bias_matrix_chart(bias: np.ndarray, window: tuple[int, int], title: str, side: int = 320) -> alt.Chart:
    """B for one head, ``(N, N)`` = table[index]: the same value along every line of equal (Δx, Δy)."""
    frame, names = _window_frame(bias, window)
    return alt.Chart(frame).mark_rect().encode(
        x=alt.X("key:N", sort=names, axis=alt.Axis(labels=len(names) <= 16, ticks=False)),
        y=alt.Y("query:N", sort=names, axis=alt.Axis(labels=len(names) <= 16, ticks=False)),
        color=alt.Color("value:Q", scale=alt.Scale(scheme="redblue", reverse=True, domainMid=0), title="B"),
        tooltip=["query", "key", alt.Tooltip("value:Q", title="bias", format=".3f")],
    ).properties(width=side, height=side, title=title, autosize=heatmap.PAD)


def window_attention_chart(weights: np.ndarray, allowed: np.ndarray, window: tuple[int, int], title: str,
                           scheme: str = "viridis") -> alt.Chart:
    """One window of one head ``(N, N)``: probabilities, cells the mask blocked in grey (not dark: not 'near 0')."""
    n = weights.shape[0]
    names = [f"({i // window[1]},{i % window[1]})" for i in range(n)]
    return heatmap.attention_chart(weights, names, names, allowed=allowed, title=title, scheme=scheme, size=360)


def all_windows_image(weights: np.ndarray, allowed: np.ndarray, grid: tuple[int, int], selected: int | None = None,
                      cell_px: int = 3, gap: int = 4, scheme: str = "viridis") -> Image.Image:
    """Every window's ``(N, N)`` map of one head (``weights (nW, N, N)``), tiled as the windows lie on the rolled map;
    blocked cells grey, each tile scaled to its own maximum, the selected window framed in red."""
    rows, cols = grid
    n = weights.shape[1]
    tile_px = n * cell_px
    sheet = Image.new("RGB", (cols * (tile_px + gap) - gap, rows * (tile_px + gap) - gap), "white")
    draw = ImageDraw.Draw(sheet)
    for index in range(rows * cols):
        rgb = heatmap.attention_rgb(weights[index], allowed[index], scheme)
        tile = Image.fromarray(rgb).resize((tile_px, tile_px), Image.Resampling.NEAREST)
        r, c = divmod(index, cols)
        sheet.paste(tile, (c * (tile_px + gap), r * (tile_px + gap)))
        if index == selected:
            x, y = c * (tile_px + gap), r * (tile_px + gap)
            draw.rectangle([x - 2, y - 2, x + tile_px + 1, y + tile_px + 1], outline=(220, 20, 60), width=2)
    return sheet


def patch_attention_picture(crop: np.ndarray, values: np.ndarray, block: geometry.BlockGeometry,
                            query: tuple[int, int], scale: int, opacity: float = 0.65) -> Image.Image:
    """A token's attention ``(H, W)`` (original layout) over the crop, exact tokens (nearest), with this block's
    windows (displaced ones in red for SW-MSA, dashed regular ones for reference) and the query token outlined."""
    p = block.token_px
    height, width = block.resolution
    crop = np.asarray(crop, dtype=np.uint8)[:height * p, :width * p]
    picture = image_overlay.attention_overlay(crop, values, opacity=opacity, colormap="inferno", mode="nearest",
                                              scale=scale)
    draw = ImageDraw.Draw(picture)
    step = block.window[0] * p * scale
    if any(block.shift):
        _grid_lines(draw, picture.size, step, 0, WINDOW_LINE, 1, dashed=True)
        _grid_lines(draw, picture.size, step, block.shift[0] * p * scale, SHIFTED_LINE, _line_width(scale))
    else:
        _grid_lines(draw, picture.size, step, 0, WINDOW_LINE, _line_width(scale))
    r, c = query
    box = [c * p * scale, r * p * scale, (c + 1) * p * scale - 1, (r + 1) * p * scale - 1]
    draw.rectangle(box, outline=(0, 255, 255), width=max(2, scale // 2))
    return picture


def cost_chart(costs: list[geometry.StageCost]) -> alt.Chart:
    """Attention entries per head and block, full vs windowed, per stage, on a log scale."""
    rows = []
    for cost in costs:
        stage = f"stage {cost.stage + 1} ({cost.resolution[0]}×{cost.resolution[1]})"
        rows.append({"stage": stage, "attention": "full (hw)²", "entries": cost.full_entries})
        rows.append({"stage": stage, "attention": f"windowed M²·hw (M={cost.window[0]})",
                     "entries": cost.window_entries})
    frame = pd.DataFrame(rows)
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("stage:N", sort=list(dict.fromkeys(frame["stage"])), title=None, axis=alt.Axis(labelAngle=0)),
        xOffset="attention:N",
        y=alt.Y("entries:Q", scale=alt.Scale(type="log", domainMin=1), title="attention entries per head (log)"),
        y2=alt.datum(1),  # log scales have no 0: bars start at 1 entry
        color=alt.Color("attention:N", legend=alt.Legend(orient="bottom", title=None)),
        tooltip=["stage", "attention", alt.Tooltip("entries:Q", format=",")],
    ).properties(height=280, width=520, autosize=heatmap.PAD)
