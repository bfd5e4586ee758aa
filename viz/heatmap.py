"""Attention heatmaps: Altair for small maps (tooltips per cell), PIL images for large ones.

Masked cells (a future token under a causal mask, a padded key) are drawn in a neutral grey that no value of the
colour scale produces, so "not allowed" never looks like "near zero". Token strings are data, never markup or code:
labels are made unique (a repeated token gets " (2)", " (3)") and passed as sort lists, not as expressions.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
from matplotlib import colormaps
from PIL import Image, ImageDraw

MASKED_RGB = (200, 200, 200)
MASKED_HEX = "#c8c8c8"
# Streamlit defaults charts to autosize "fit", which squeezes the plot so that labels, legend and title fit inside
# width × height; "pad" keeps the plot at the size asked for and adds room for the decorations.
PAD = alt.AutoSizeParams(type="pad", contains="padding")
MAX_CHART_TOKENS = 64  # beyond this a side, a chart has too many rows for the browser: draw an image
BY_KEY_POSITION = alt.EncodingSortField("key position", op="min")
BY_QUERY_POSITION = alt.EncodingSortField("query position", op="min")
COLOR_SCHEMES = ("viridis", "magma", "cividis", "blues", "greys")


def token_labels(tokens: list[str]) -> list[str]:
    """Unique, readable axis labels: the 2nd occurrence of "the" becomes "the (2)"."""
    seen: dict[str, int] = {}
    labels = []
    for token in tokens:
        token = token if token.strip() else "␣"
        seen[token] = seen.get(token, 0) + 1
        labels.append(token if seen[token] == 1 else f"{token} ({seen[token]})")
    return labels


def _check(weights: np.ndarray, query_tokens: list[str], key_tokens: list[str]) -> None:
    if weights.ndim != 2:
        raise ValueError(f"expected one head's (queries, keys) map, got shape {weights.shape}")
    if weights.shape != (len(query_tokens), len(key_tokens)):
        raise ValueError(f"map {weights.shape} does not match {len(query_tokens)} query and {len(key_tokens)} key tokens")


LINK_MIN_CELL = 9  # px: below this a token beside the map is too small to read or hover (the axes thin instead)
HOVER = "hover"  # the prefix of the linked-hover selections: pages never rerun on them (app/display.py)
HIGHLIGHT = "crimson"


def attention_chart(weights: np.ndarray, query_tokens: list[str], key_tokens: list[str],
                    allowed: np.ndarray | None = None, title: str = "", scheme: str = "viridis",
                    query_offset: int = 0, key_offset: int = 0, size: int = 640, compact: bool = False,
                    linked: bool = True) -> alt.Chart:
    """A heatmap of one ``(queries, keys)`` map: keys on x, queries on y, weight and both tokens in the tooltip.

    ``query_offset``/``key_offset``: positions of the first row/column in the full input (for zoomed ranges).
    ``compact``: legend below and shorter token labels, for half a laptop screen (the chart must fit its column:
    Vega maps the pointer in its own pixels, so a chart scaled down by CSS shows the wrong cell's tooltip).

    ``linked`` (where a cell is at least ``LINK_MIN_CELL`` px): linked token hover. The tokens beside the map are
    marks, not axis labels (``token_strips``), so hovering a query token lights its row and dims the others, hovering
    a key token lights its column, and hovering a cell lights its two tokens; all in the one view, so the chart still
    fits its column (``viz.screen``). A figure of several maps passes False: Altair lifts the selections of charts
    put side by side into every layer of each, which Vega refuses (duplicate signals) when the figure is exported.
    """
    _check(weights, query_tokens, key_tokens)
    q_labels, k_labels = token_labels(query_tokens), token_labels(key_tokens)
    q_index, k_index = np.meshgrid(np.arange(weights.shape[0]), np.arange(weights.shape[1]), indexing="ij")
    visible = np.ones_like(weights, dtype=bool) if allowed is None else allowed.astype(bool)
    frame = pd.DataFrame({
        "query": np.asarray(q_labels, dtype=object)[q_index.ravel()],
        "key": np.asarray(k_labels, dtype=object)[k_index.ravel()],
        "query position": q_index.ravel() + query_offset,
        "key position": k_index.ravel() + key_offset,
        "weight": weights.ravel().astype(float),
        "state": np.where(visible.ravel(), "visible", "masked"),
    })
    color = alt.Color("weight:Q", scale=alt.Scale(scheme=scheme, domain=[0, float(max(weights.max(), 1e-9))]),
                      legend=alt.Legend(title="weight", orient="bottom" if compact else "right"))
    label_limit = 60 if compact else 90
    side = max(200, min(size, 24 * max(weights.shape)))
    linked = linked and side / max(weights.shape) >= LINK_MIN_CELL
    # every label shown: at >= 10 px a cell rotated labels do not collide, and a missing token misleads
    # sorted by position, never by a list of the tokens: Vega-Lite turns a sort list into an expression, and a
    # token such as "if" then breaks the chart ("Unrecognized signal name")
    # linked: the axes keep their titles, the tokens are the strips' marks (token_strips)
    hidden = dict(labels=False, ticks=False)
    x_axis = alt.Axis(titlePadding=_strip_px(k_labels, label_limit), **hidden) if linked else \
        alt.Axis(labelAngle=-90, labelLimit=label_limit, labelOverlap=side / len(k_labels) < 10)
    y_axis = alt.Axis(titlePadding=_strip_px(q_labels, label_limit), **hidden) if linked else \
        alt.Axis(labelLimit=label_limit, labelOverlap=side / len(q_labels) < 10)
    cells = alt.Chart(frame).mark_rect().encode(
        x=alt.X("key:N", sort=BY_KEY_POSITION, title="key (attended to)", axis=x_axis),
        y=alt.Y("query:N", sort=BY_QUERY_POSITION, title="query (attending)", axis=y_axis),
        color=alt.condition(alt.datum.state == "masked", alt.value(MASKED_HEX), color),
        tooltip=["query", "query position", "key", "key position", alt.Tooltip("weight:Q", format=".4f"), "state"],
    )
    chart = token_strips(cells, q_labels, k_labels, (query_offset, key_offset), label_limit, title) if linked \
        else cells
    return chart.properties(width=side, height=side, title=title, autosize=PAD)


def token_strips(cells: alt.Chart, q_labels: list[str], k_labels: list[str], offsets: tuple[int, int],
                 label_limit: int, title: str) -> alt.LayerChart:
    """The heatmap's ``cells`` with its query tokens down the left and its key tokens along the bottom as text marks
    in place of the axis labels, linked by hover selections named ``hover_*`` (unique per title, so two maps drawn
    side by side in one exported figure keep theirs apart)."""
    import zlib

    tag = f"{zlib.crc32(title.encode()):08x}"
    names = {part: f"{HOVER}_{part}_{tag}" for part in ("cells", "queries", "keys")}

    def hover(part: str, field: str, **extra):
        # a pointer over any mark would set every point selection (a strip token has no key position: its
        # selection would then match nothing); each listens to its own layer's marks only
        return alt.selection_point(name=f"{names[part]}_{field.split()[0]}", fields=[field],
                                   on=f"@{names[part]}_marks:pointerover", clear="pointerout", **extra)

    strip_query, strip_key = hover("queries", "query position"), hover("keys", "key position")
    cell_query = hover("cells", "query position", empty=False)
    cell_key = hover("cells", "key position", empty=False)
    cells = cells.encode(opacity=alt.condition(strip_query & strip_key, alt.value(1.0), alt.value(0.25))).add_params(
        cell_query, cell_key).properties(name=names["cells"])
    queries = pd.DataFrame({"query": q_labels, "query position": np.arange(len(q_labels)) + offsets[0]})
    keys = pd.DataFrame({"key": k_labels, "key position": np.arange(len(k_labels)) + offsets[1]})
    query_strip = alt.Chart(queries).mark_text(align="right", baseline="middle", dx=-5, limit=label_limit).encode(
        y=alt.Y("query:N", sort=BY_QUERY_POSITION), x=alt.value(0), text="query:N",
        color=_lit(cell_query, strip_query), tooltip=["query", "query position"],
    ).add_params(strip_query).properties(name=names["queries"])
    key_strip = alt.Chart(keys).mark_text(align="right", baseline="middle", angle=270, dx=-5,
                                          limit=label_limit).encode(
        x=alt.X("key:N", sort=BY_KEY_POSITION), y=alt.value("height"), text="key:N",
        color=_lit(cell_key, strip_key), tooltip=["key", "key position"],
    ).add_params(strip_key).properties(name=names["keys"])
    return alt.layer(cells, query_strip, key_strip)


def _lit(*selections) -> dict:
    """A token's colour: the highlight while any of ``selections`` holds it (an empty selection holds nothing)."""
    held = [{"param": selection.name, "empty": False} for selection in selections]
    return {"condition": {"test": {"or": held}, "value": HIGHLIGHT}, "value": "black"}


def _strip_px(labels: list[str], limit: int) -> float:
    """Room a strip of token marks takes beside the map (11 px text, about 6.5 px a character, at most ``limit``)."""
    return min(limit, 6.5 * max((len(label) for label in labels), default=1)) + 10


def _colormap(name: str) -> np.ndarray:
    """256 × 3 uint8 lookup table of a matplotlib colormap ("blues" -> "Blues")."""
    cmap = colormaps[{"blues": "Blues", "greys": "Greys"}.get(name, name)]
    return (cmap(np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)


def attention_rgb(weights: np.ndarray, allowed: np.ndarray | None = None, scheme: str = "viridis",
                  vmax: float | None = None) -> np.ndarray:
    """``(q, k)`` weights -> ``(q, k, 3)`` uint8 colours, one pixel per cell, masked cells grey."""
    top = float(weights.max()) if vmax is None else vmax
    scaled = np.clip(weights / max(top, 1e-12), 0, 1)
    rgb = _colormap(scheme)[(scaled * 255).round().astype(np.int64)]
    if allowed is not None:
        rgb[~allowed.astype(bool)] = MASKED_RGB
    return rgb


def block_max(weights: np.ndarray, allowed: np.ndarray | None, factor: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Shrink ``(q, k)`` by an integer ``factor``: each ``factor × factor`` block becomes its largest visible weight
    (a lone strong cell stays visible, where a mean would wash it out); a block with no visible cell stays masked.
    Edge blocks are partial. Returns ``(ceil(q / f), ceil(k / f))`` weights and visibility."""
    if factor <= 1:
        return weights, allowed
    q, k = weights.shape
    pad_q, pad_k = -q % factor, -k % factor
    visible = np.ones_like(weights, dtype=bool) if allowed is None else allowed.astype(bool)
    padded = np.pad(np.where(visible, weights, -1.0), ((0, pad_q), (0, pad_k)), constant_values=-1.0)
    blocks = padded.reshape((q + pad_q) // factor, factor, (k + pad_k) // factor, factor).max(axis=(1, 3))
    shown = blocks >= 0
    return np.maximum(blocks, 0).astype(np.float32), (shown if allowed is not None else None)


def attention_image(weights: np.ndarray, allowed: np.ndarray | None = None, scheme: str = "viridis",
                    max_px: int = 900, vmax: float | None = None) -> Image.Image:
    """A large map as an image at most ``max_px`` a side: up to ``max_px`` tokens each cell is an integer block of
    pixels (nearest neighbour, so pixels are exactly the cells' colours); beyond, each pixel is the largest weight of
    an ``f × f`` block of cells, ``f = ceil(tokens / max_px)`` (``block_max``)."""
    factor = -(-max(weights.shape) // max_px)
    weights, allowed = block_max(weights, allowed, factor)
    rgb = attention_rgb(weights, allowed, scheme, vmax)  # vmax: the weight drawn in the top colour (default: max)
    scale = max(1, max_px // max(weights.shape))
    return Image.fromarray(rgb).resize((rgb.shape[1] * scale, rgb.shape[0] * scale), Image.NEAREST)


def png_bytes(image: Image.Image) -> bytes:
    """PNG (lossless: every pixel is the colour of its cell) with fast compression; Streamlit would send an RGB
    image as JPEG, which smears a heatmap, and its default PNG level costs ~0.1 s per megapixel on a slider move."""
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


OVERVIEW_PX = 900  # a long input's whole map is drawn at most this many pixels a side


def overview_image(weights: np.ndarray, allowed: np.ndarray, scheme: str = "viridis") -> tuple[Image.Image, float]:
    """A large ``(q, k)`` map as an image (``attention_image``) and the weight drawn in the top colour.

    One strong cell (the first token attending to itself is 1.0) would leave every other pixel dark, so colours
    saturate at the median over queries of each query's largest visible weight, a level most rows reach."""
    row_max = np.where(allowed, weights, 0).max(axis=1)
    seeing = allowed.any(axis=1)
    vmax = float(np.median(row_max[seeing])) if seeing.any() else 1.0
    return attention_image(weights, allowed, scheme, max_px=OVERVIEW_PX, vmax=max(vmax, 1e-9)), vmax


def zoom_overview_chart(png: bytes, n_q: int, n_k: int, queries: tuple[int, int], keys: tuple[int, int],
                        width: int = 420, origin: tuple[int, int] = (0, 0), brush: str = "zoom",
                        pick: str | None = None) -> alt.Chart:
    """A map (or a window of it) as one image inside a Vega-Lite chart, with a brush (interval selection named
    ``brush``) whose ``query``/``key`` extent, in token positions, picks the region to show next, and a red frame
    around the region shown now (``queries``/``keys``: inclusive first and last positions). The image covers
    ``n_q × n_k`` positions from ``origin`` (first query, first key); axes are token positions. ``pick``: a point
    selection of that name on double-click (a single click ends a brush) whose ``query`` opens that row."""
    import base64

    (q0, k0) = origin
    height = max(120, round(width * n_q / max(n_k, 1)))
    url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    x = alt.X("key:Q", scale=alt.Scale(domain=[k0, k0 + n_k], nice=False, zero=False), title="key position")
    y = alt.Y("query:Q", scale=alt.Scale(domain=[q0, q0 + n_q], nice=False, reverse=True, zero=False),
              title="query position")
    # the image spans the axes' whole domain (x to x2, y to y2), so it stays on its positions at any drawn size
    picture = alt.Chart(pd.DataFrame({"key": [k0], "key2": [k0 + n_k], "query": [q0], "query2": [q0 + n_q],
                                      "url": [url]})).mark_image(aspect=False).encode(x=x, x2="key2:Q", y=y,
                                                                                      y2="query2:Q", url="url:N")
    selection = alt.selection_interval(name=brush, encodings=["x", "y"], fields=["key", "query"], clear=False)
    # a transparent grid of points gives the brush something to select over the whole area (and a double-click
    # the nearest row: 64 rows of points)
    rows = min(n_q, 64 if pick else 16)
    grid_q, grid_k = np.meshgrid(q0 + (np.arange(rows) + 0.5) * n_q / rows, np.linspace(k0, k0 + n_k, 16),
                                 indexing="ij")
    catcher = alt.Chart(pd.DataFrame({"key": grid_k.ravel(), "query": np.floor(grid_q.ravel())})).mark_point(
        opacity=0).encode(x=x, y=y).add_params(selection)
    if pick:
        catcher = catcher.add_params(alt.selection_point(name=pick, fields=["query"], on="dblclick", nearest=True,
                                                         clear=False))
    frame = alt.Chart(pd.DataFrame({"key": [keys[0]], "key2": [keys[1] + 1], "query": [queries[0]],
                                    "query2": [queries[1] + 1]})).mark_rect(
        fill=None, stroke="crimson", strokeWidth=2).encode(x=x, x2="key2:Q", y=y, y2="query2:Q")
    return (picture + catcher + frame).properties(width=width, height=height, autosize=PAD)


def tiles_image(tiles, statistic: str = "maximum", scheme: str = "viridis", max_px: int = 900,
                vmax: float | None = None) -> tuple[Image.Image, float]:
    """A window reduced to tiles (``models.core.results.Tiles``) as an image at most ``max_px`` a side: one pixel a
    tile, scaled up by a whole number (nearest neighbour: pixels are exactly the tiles' colours); tiles with no
    visible cell are grey. Colours saturate at ``vmax``, by default the median over queries of each query's largest
    weight in the window (one strong cell, the first token attending to itself, would leave the rest dark). Returns
    the image and the weight drawn in the top colour."""
    values = tiles.statistic(statistic)
    if vmax is None:
        seen = tiles.row_max[tiles.row_max > 0]
        vmax = float(np.median(seen)) if len(seen) else 1.0
        if statistic == "mean":  # a tile's mean is at most its maximum: saturate at the means' own level
            shown = values[tiles.visible]
            vmax = float(np.quantile(shown, 0.99)) if len(shown) else 1.0
    vmax = max(vmax, 1e-9)
    rgb = attention_rgb(values, tiles.visible, scheme, vmax)
    scale = max(1, max_px // max(values.shape))
    return Image.fromarray(rgb).resize((rgb.shape[1] * scale, rgb.shape[0] * scale), Image.NEAREST), vmax


def head_grid_image(thumbnails: np.ndarray, scheme: str = "viridis", cell: int = 56, gap: int = 4,
                    selected: tuple[int, int] | None = None, group_size: int = 1) -> Image.Image:
    """All heads of all layers, ``thumbnails (layers, heads, s, s)``, as one image; each head scaled to its own max.

    Row = layer (labelled L0, L1, ...), column = head (H0, H1, ...). The selected head gets a red frame. With
    ``group_size > 1`` (grouped-query attention) the heads sharing a key/value head stand together, a wider gap
    between groups, and are labelled ``H<head>/kv<group>``. A colour bar under the grid is its key: from 0 to each
    head's own largest weight.
    """
    layers, heads = thumbnails.shape[:2]
    margin, group_gap, key_height = 30, (3 * gap if group_size > 1 else 0), 44

    def left(h: int) -> int:
        return margin + h * (cell + gap) + (h // group_size) * group_gap

    width = max(left(heads - 1) + cell + gap, 300)
    grid_bottom = margin + layers * (cell + gap)
    canvas = Image.new("RGB", (width, grid_bottom + key_height), "white")
    draw = ImageDraw.Draw(canvas)
    bar = np.repeat(_colormap(scheme)[np.newaxis, np.linspace(0, 255, width - 2 * margin).astype(int)], 12, axis=0)
    canvas.paste(Image.fromarray(bar), (margin, grid_bottom + 6))
    draw.text((margin, grid_bottom + 21), "0", fill="black")
    label = "each head's largest weight"
    draw.text((width - margin - draw.textlength(label), grid_bottom + 21), label, fill="black")
    for h in range(heads):
        label = f"H{h}/kv{h // group_size}" if group_size > 1 else f"H{h}"
        draw.text((left(h) + cell // 2 - 3 * len(label), 8), label, fill="black")
    for layer in range(layers):
        draw.text((2, margin + layer * (cell + gap) + cell // 2 - 6), f"L{layer}", fill="black")
        for h in range(heads):
            tile = Image.fromarray(attention_rgb(thumbnails[layer, h], scheme=scheme)).resize((cell, cell),
                                                                                              Image.NEAREST)
            x, y = left(h), margin + layer * (cell + gap)
            canvas.paste(tile, (x, y))
            if selected == (layer, h):
                draw.rectangle([x - 2, y - 2, x + cell + 1, y + cell + 1], outline=(220, 20, 60), width=3)
    return canvas


def head_statistic_chart(values: np.ndarray, label: str, selected: tuple[int, int] | None = None,
                         scheme: str = "viridis", group_size: int = 1) -> alt.Chart:
    """A clickable layer × head heatmap of one statistic ``(layers, heads)``; the point selection is named "pick".
    ``group_size > 1``: black rules between the key/value groups of grouped-query attention."""
    layers, heads = values.shape
    layer_index, head_index = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    frame = pd.DataFrame({"layer": layer_index.ravel(), "head": head_index.ravel(),
                          "kv group": head_index.ravel() // group_size, "value": values.ravel().astype(float)})
    pick = alt.selection_point(name="pick", fields=["layer", "head"], on="click", clear=False)
    tooltip = ["layer", "head"] + (["kv group"] if group_size > 1 else [])
    chart = alt.Chart(frame).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("head:O", title="head" + (f" ({group_size} per key/value group)" if group_size > 1 else "")),
        y=alt.Y("layer:O", title="layer"),
        color=alt.Color("value:Q", scale=alt.Scale(scheme=scheme), title=label),
        tooltip=tooltip + [alt.Tooltip("value:Q", title=label, format=".3f")],
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.85)),
    ).add_params(pick)
    width = min(700, 34 * heads + 40)
    if group_size > 1 and heads > group_size:  # a rule at the start of a group's first band, whatever the width
        edges = pd.DataFrame({"head": list(range(group_size, heads, group_size))})
        chart = chart + alt.Chart(edges).mark_rule(color="black", strokeWidth=1.5).encode(
            x=alt.X("head:O", bandPosition=0))
    if selected is not None:
        marker = alt.Chart(pd.DataFrame({"layer": [selected[0]], "head": [selected[1]]})).mark_rect(
            fill=None, stroke="crimson", strokeWidth=3).encode(x="head:O", y="layer:O")
        chart = chart + marker
    return chart.properties(width=width, height=min(700, 20 * layers + 20), autosize=PAD)


def token_bars(weights: np.ndarray, key_tokens: list[str], title: str = "", allowed: np.ndarray | None = None
               ) -> alt.Chart:
    """One query's attention over the keys ``(k,)`` as bars in token order; masked keys are left out."""
    labels = token_labels(key_tokens)
    keep = np.ones(len(labels), dtype=bool) if allowed is None else allowed.astype(bool)
    frame = pd.DataFrame({"key": np.asarray(labels, dtype=object)[keep], "position": np.arange(len(labels))[keep],
                          "weight": weights[keep].astype(float)})
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("key:N", sort=alt.EncodingSortField("position", op="min"), title=None,
                axis=alt.Axis(labelAngle=-60, labelLimit=90)),
        y=alt.Y("weight:Q", title="attention weight"),
        color=alt.Color("weight:Q", scale=alt.Scale(scheme="blues"), legend=None),
        tooltip=["key", "position", alt.Tooltip("weight:Q", format=".4f")],
    ).properties(title=title, height=260, width=max(320, min(1100, 22 * len(frame))), autosize=PAD)


def probability_bars(tokens: list[str], probabilities: list[float], title: str = "",
                     highlight: str | None = None) -> alt.Chart:
    """Top candidates as horizontal bars, most likely first; ``highlight`` marks the chosen token."""
    labels = token_labels(tokens)
    frame = pd.DataFrame({"token": labels, "probability": probabilities, "rank": np.arange(len(labels)),
                          "chosen": [token == highlight for token in tokens]})
    return alt.Chart(frame).mark_bar().encode(
        y=alt.Y("token:N", sort=alt.EncodingSortField("rank", op="min"), title=None, axis=alt.Axis(labelLimit=140)),
        x=alt.X("probability:Q", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%")),
        color=alt.condition(alt.datum.chosen, alt.value("crimson"), alt.value("steelblue")),
        tooltip=["token", alt.Tooltip("probability:Q", format=".2%")],
    ).properties(title=title, height=24 * len(labels) + 20, width=420, autosize=PAD)
