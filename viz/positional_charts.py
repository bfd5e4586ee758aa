"""Charts and images for the positional-encodings page (arrays from models/lessons/positional/ in, Altair / PIL out).

Matrices up to ``MAX_CHART_CELLS`` cells are Altair rects with a tooltip per cell; bigger ones (a 512 × 384 position
table, a 512 × 512 similarity matrix) are rendered to a PNG that an Altair image mark stretches over the same
quantitative axes, so every matrix keeps readable axes and a colour legend whatever its size. Cell ``i`` spans
``[i, i + 1)`` on its axis; rows grow downwards, as in a matrix.
"""
from __future__ import annotations

import base64
import io

import altair as alt
import numpy as np
import pandas as pd
from matplotlib import colormaps
from PIL import Image, ImageDraw

from viz.heatmap import MASKED_HEX, MASKED_RGB, token_labels

MAX_CHART_CELLS = 6_000  # beyond this many cells a rect chart gets slow in the browser: draw an image
# Vega scheme -> (matplotlib colormap with the same colours, reverse the Vega scale?). Vega's "redblue" runs red to
# blue; reversed it matches RdBu_r: blue for −1, red for +1, as in the ViT paper's figures.
_SCHEMES = {"redblue": ("RdBu_r", True), "viridis": ("viridis", False), "turbo": ("turbo", False)}


def _lut(scheme: str) -> np.ndarray:
    """256 × 3 uint8 colours matching the Vega scheme of the same name (so images and legends agree)."""
    cmap = colormaps[_SCHEMES[scheme][0]]
    return (cmap(np.linspace(0, 1, 256))[:, :3] * 255).round().astype(np.uint8)


def colorize(matrix: np.ndarray, scheme: str, domain: tuple[float, float]) -> np.ndarray:
    """``(rows, cols)`` values -> ``(rows, cols, 3)`` uint8; non-finite values (masked cells) are grey."""
    low, high = domain
    finite = np.isfinite(matrix)
    scaled = np.clip((np.where(finite, matrix, low) - low) / max(high - low, 1e-12), 0, 1)
    rgb = _lut(scheme)[(scaled * 255).round().astype(np.int64)]
    rgb[~finite] = MASKED_RGB
    return rgb


def _png_data_uri(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def matrix_chart(matrix: np.ndarray, x_title: str, y_title: str, value_title: str, scheme: str = "redblue",
                 domain: tuple[float, float] | None = None, width: int = 420, height: int = 420,
                 title: str = "", legend: str | None = "right") -> alt.Chart:
    """A heatmap of ``(rows, cols)`` with quantitative axes (column index on x, row index on y, row 0 on top).

    ``domain`` fixes the colour range (default: symmetric around 0 for ``redblue``, min..max otherwise).
    Non-finite cells (``-inf`` for masked) are grey. ``legend``: where the colour bar goes, None for none (small
    multiples sharing one scale show it once).
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or 0 in matrix.shape:
        raise ValueError(f"expected a non-empty 2-D matrix, got shape {matrix.shape}")
    rows, cols = matrix.shape
    finite = matrix[np.isfinite(matrix)]
    if domain is None:
        top = float(np.abs(finite).max()) if finite.size else 1.0
        domain = (-top, top) if scheme == "redblue" else (float(finite.min()), float(finite.max()))
    if domain[1] <= domain[0]:
        domain = (domain[0], domain[0] + 1e-9)
    x_scale = alt.Scale(domain=[0, cols], nice=False, zero=False)
    y_scale = alt.Scale(domain=[0, rows], nice=False, zero=False, reverse=True)
    color = alt.Color("value:Q", title=value_title,
                      scale=alt.Scale(scheme=scheme, reverse=_SCHEMES[scheme][1], domain=list(domain), clamp=True),
                      legend=alt.Legend(orient=legend) if legend else None)
    if rows * cols <= MAX_CHART_CELLS:
        row_index, col_index = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        frame = pd.DataFrame({"col": col_index.ravel(), "row": row_index.ravel(), "value": matrix.ravel()})
        frame["col_end"], frame["row_end"] = frame["col"] + 1, frame["row"] + 1
        frame["state"] = np.where(np.isfinite(frame["value"]), "value", "masked")
        frame["value"] = frame["value"].where(np.isfinite(frame["value"]), None)
        base = alt.Chart(frame).encode(
            x=alt.X("col:Q", scale=x_scale, title=x_title), x2="col_end:Q",
            y=alt.Y("row:Q", scale=y_scale, title=y_title), y2="row_end:Q",
            tooltip=[alt.Tooltip("row:Q", title=y_title), alt.Tooltip("col:Q", title=x_title),
                     alt.Tooltip("value:Q", title=value_title, format=".4f")],
        )
        cells = base.transform_filter(alt.datum.state == "value").mark_rect().encode(color=color)
        masked = base.transform_filter(alt.datum.state == "masked").mark_rect(color=MASKED_HEX)
        chart = masked + cells
    else:
        rgb = colorize(matrix, scheme, domain)
        scale = max(1, min(4, 900 // max(rows, cols)))  # whole pixels per cell, so the browser never blurs cells
        image = Image.fromarray(rgb).resize((cols * scale, rows * scale), Image.NEAREST)
        picture = alt.Chart(pd.DataFrame({"x": [0], "x2": [cols], "y": [0], "y2": [rows],
                                          "url": [_png_data_uri(image)]})).mark_image(aspect=False).encode(
            x=alt.X("x:Q", scale=x_scale, title=x_title), x2="x2:Q",
            y=alt.Y("y:Q", scale=y_scale, title=y_title), y2="y2:Q", url="url:N")
        # an invisible layer that only draws the colour legend of the baked-in colours
        legend = alt.Chart(pd.DataFrame({"value": list(domain), "x": [0, 0], "y": [0, 0]})).mark_point(
            opacity=0).encode(x=alt.X("x:Q", scale=x_scale), y=alt.Y("y:Q", scale=y_scale), color=color)
        chart = picture + legend
    return chart.properties(width=width, height=height, title=title)


# --- sinusoidal --------------------------------------------------------------------------------------------------

def sinusoidal_charts(table: np.ndarray, dot: np.ndarray, wavelengths: np.ndarray) -> list[alt.Chart]:
    """The four sinusoidal views, in reading order: PE heatmap, wavelengths, PE(p)·PE(q) matrix, its profiles."""
    length = len(table)
    return [matrix_chart(table, "channel", "position", "PE", title="PE(position, channel)"),
            wavelength_chart(wavelengths, length),
            matrix_chart(dot, "position q", "position p", "PE(p)·PE(q)", title="PE(p)·PE(q)"),
            similarity_profile_chart(dot, sorted({0, length // 4, length // 2}), "PE(p)·PE(q)")]


def wavelength_chart(wavelengths: np.ndarray, length: int) -> alt.Chart:
    """Wavelength (positions, log scale) of each channel ``(dim,)``, with a rule at the sequence length: channels
    above it never complete a period inside the sequence."""
    frame = pd.DataFrame({"channel": np.arange(len(wavelengths)), "wavelength": wavelengths})
    line = alt.Chart(frame).mark_line(point=len(wavelengths) <= 64).encode(
        x=alt.X("channel:Q", title="channel (2k and 2k+1 share a frequency)"),
        y=alt.Y("wavelength:Q", scale=alt.Scale(type="log"), title="wavelength (positions)"),
        tooltip=["channel", alt.Tooltip("wavelength:Q", format=",.1f")])
    rule = alt.Chart(pd.DataFrame({"length": [length]})).mark_rule(color="crimson", strokeDash=[4, 3]).encode(
        y="length:Q", tooltip=[alt.Tooltip("length:Q", title="sequence length")])
    return (line + rule).properties(height=260, title="Wavelength per channel (red: sequence length)")


def similarity_profile_chart(similarity: np.ndarray, anchors: list[int], value_title: str,
                             title: str = "Similarity of PE(p) with every other position") -> alt.Chart:
    """Rows ``similarity[p]`` of a ``(P, P)`` matrix for a few anchor positions p, against the other position."""
    frames = [pd.DataFrame({"position": np.arange(similarity.shape[1]), "similarity": similarity[p],
                            "anchor": f"p = {p}"}) for p in anchors]
    return alt.Chart(pd.concat(frames)).mark_line().encode(
        x=alt.X("position:Q", title="other position q"),
        y=alt.Y("similarity:Q", title=value_title),
        color=alt.Color("anchor:N", sort=[f"p = {p}" for p in anchors], title=None),
        tooltip=["anchor", "position", alt.Tooltip("similarity:Q", format=".3f")],
    ).properties(height=260, title=title)


# --- learned grids -----------------------------------------------------------------------------------------------

def mosaic_range(similarity: np.ndarray) -> tuple[float, float]:
    """Colour range of a mosaic: from the lowest similarity (or −1 … 1 when it reaches below 0) up to 1."""
    low = float(similarity.min())
    return (-1.0, 1.0) if low < 0 else (low, 1.0)


def patch_similarity_mosaic(similarity: np.ndarray, step: int = 1, tile: int | None = None,
                            gap: int = 5, max_px: int = 900) -> Image.Image:
    """The ViT paper's Fig. 7: for every ``step``-th patch (r, c), a tile showing the cosine similarity of its position
    vector with all patches. ``similarity`` ``(rows, cols, rows, cols)``; colours over ``mosaic_range`` (blue low,
    red high); each tile has a dark dot on its own patch."""
    rows, cols = similarity.shape[:2]
    if step < 1:
        raise ValueError("the step between shown patches must be at least 1")
    shown_rows, shown_cols = range(0, rows, step), range(0, cols, step)
    if tile is None:
        tile = max(cols, (max_px // max(len(shown_rows), len(shown_cols)) - gap) // cols * cols)
    domain = mosaic_range(similarity)
    canvas = Image.new("RGB", (len(shown_cols) * (tile + gap) + gap, len(shown_rows) * (tile + gap) + gap), "white")
    draw = ImageDraw.Draw(canvas)
    cell_w, cell_h = tile / cols, tile / rows
    for i, r in enumerate(shown_rows):
        for j, c in enumerate(shown_cols):
            rgb = colorize(similarity[r, c], "redblue", domain)
            x, y = gap + j * (tile + gap), gap + i * (tile + gap)
            canvas.paste(Image.fromarray(rgb).resize((tile, tile), Image.NEAREST), (x, y))
            cx, cy = x + (c + 0.5) * cell_w, y + (r + 0.5) * cell_h
            radius = max(2.0, min(cell_w, cell_h) / 2.5)
            draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=(0, 0, 0), outline="white")
    return canvas


# --- RoPE --------------------------------------------------------------------------------------------------------

def rope_score_chart(offsets: np.ndarray, scores: dict[str, np.ndarray]) -> alt.Chart:
    """Score ``(R_m q)ᵀ(R_n k)`` against ``n − m`` for several query positions m (one line each): the lines coincide
    because the score depends only on the offset."""
    frames = [pd.DataFrame({"offset": offsets, "score": values, "query position": label})
              for label, values in scores.items()]
    frame = pd.concat(frames)
    dash = alt.StrokeDash("query position:N", sort=list(scores), title=None)
    return alt.Chart(frame).mark_line(strokeWidth=2, opacity=0.8).encode(
        x=alt.X("offset:Q", title="offset n − m (positions)"), y=alt.Y("score:Q", title="(R_m q)ᵀ (R_n k)"),
        color=alt.Color("query position:N", sort=list(scores), title=None), strokeDash=dash,
        tooltip=["query position", "offset", alt.Tooltip("score:Q", format=".4f")],
    ).properties(height=260, title="Same q, k at different absolute positions")


def decay_bound_chart(offsets: np.ndarray, bound: np.ndarray) -> alt.Chart:
    frame = pd.DataFrame({"offset": offsets, "bound": bound})
    return alt.Chart(frame).mark_line(color="darkorange").encode(
        x=alt.X("offset:Q", title="relative distance |n − m|", scale=alt.Scale(nice=False)),
        y=alt.Y("bound:Q", title="(1/(d/2)) Σ |S_j|"),
        tooltip=["offset", alt.Tooltip("bound:Q", format=".3f")],
    ).properties(height=260, title="Long-range decay bound (Su et al. §3.4.3)")


# --- ALiBi and T5 ------------------------------------------------------------------------------------------------

def slopes_chart(slopes: np.ndarray) -> alt.Chart:
    frame = pd.DataFrame({"head": np.arange(len(slopes)), "slope": slopes, "floor": slopes.min() / 2,
                          "as power of 2": [f"2^{np.log2(s):.2f}" for s in slopes]})
    return alt.Chart(frame).mark_bar().encode(  # bars start at `floor`: a log axis has no zero
        x=alt.X("head:O", title="head h (0-based)"), y2="floor:Q",
        y=alt.Y("slope:Q", scale=alt.Scale(type="log"), title="slope m_h"),
        tooltip=["head", alt.Tooltip("slope:Q", format=".6f"), "as power of 2"],
    ).properties(height=220, title="ALiBi slope per head")


def bias_small_multiples(bias: np.ndarray, heads: list[int], size: int = 160) -> tuple[alt.Chart, ...]:
    """One small heatmap per chosen head of an ALiBi bias ``(H, L, L)``, all on one colour scale (masked = grey),
    its colour bar under the first."""
    domain = (float(np.min(bias[heads][np.isfinite(bias[heads])])), 0.0)
    return tuple(matrix_chart(bias[h], "key j", "query i", "bias", scheme="viridis", domain=domain, width=size,
                              height=size, title=f"head {h}", legend="bottom" if i == 0 else None)
                 for i, h in enumerate(heads))


def bucket_chart(buckets: np.ndarray, title: str, size: int = 360) -> alt.Chart:
    return matrix_chart(buckets.astype(float), "key j", "query i", "bucket", scheme="turbo",
                        domain=(0.0, float(max(buckets.max(), 1))), width=size, height=size, title=title)


# --- permutation equivariance ------------------------------------------------------------------------------------

def output_gap_chart(tokens: list[str], gaps: dict[str, np.ndarray]) -> alt.Chart:
    """Per token, ``‖F(σX)[σ⁻¹] − F(X)‖ / ‖F(X)‖`` for each setting (bars side by side, log scale)."""
    labels = token_labels(tokens)
    floor = 1e-17  # a log axis has no zero: bars start here, and an exact 0 is drawn at the floor
    frames = [pd.DataFrame({"token": labels, "position": np.arange(len(labels)), "setting": setting,
                            "gap": np.maximum(values.astype(float), floor), "floor": floor})
              for setting, values in gaps.items()]
    return alt.Chart(pd.concat(frames)).mark_bar().encode(
        # sorted by position, never by a list of the tokens: Vega-Lite turns a sort list into an expression, and a
        # token such as "if" then breaks the chart ("Unrecognized signal name")
        x=alt.X("token:N", sort=alt.EncodingSortField("position", op="min"), title=None,
                axis=alt.Axis(labelAngle=-60, labelLimit=90)),
        xOffset=alt.XOffset("setting:N", sort=list(gaps)),
        y=alt.Y("gap:Q", scale=alt.Scale(type="log", domain=[floor, 10]), title="relative output change"),
        y2="floor:Q",
        color=alt.Color("setting:N", sort=list(gaps), title=None),
        tooltip=["token", "position", "setting", alt.Tooltip("gap:Q", format=".2e")],
    ).properties(height=260, title="Does the output just shuffle along? (tiny bars: yes, up to rounding)")


def rope_wavelength_chart(formula: np.ndarray, model: np.ndarray | None, model_name: str) -> alt.Chart:
    """Wavelength ``2π / θ_i`` (positions per turn, log scale) of each rotated pair: the formula ``b^{-2i/d}`` as a
    line and, when the model keeps one, its own ``inv_freq`` buffer as dots (on the line when it is the formula)."""
    formula_name, model_label = "formula b^(−2i/d)", f"{model_name}'s inv_freq"
    series = {formula_name: formula} | ({model_label: model} if model is not None else {})
    frame = pd.concat([pd.DataFrame({"pair": np.arange(len(values)), "wavelength": 2 * np.pi / values,
                                     "source": name}) for name, values in series.items()])
    base = alt.Chart(frame).encode(
        x=alt.X("pair:Q", title="pair i"),
        y=alt.Y("wavelength:Q", scale=alt.Scale(type="log"), title="wavelength 2π/θᵢ (positions)"),
        color=alt.Color("source:N", sort=list(series), title=None),
        tooltip=["source", "pair", alt.Tooltip("wavelength:Q", format=",.1f")])
    line = base.transform_filter(alt.datum.source == formula_name).mark_line()
    dots = base.transform_filter(alt.datum.source == model_label).mark_point(filled=True, size=40)
    return (line + dots).properties(height=260, title=f"RoPE in {model_name}: wavelength per pair")


def rope_wavelengths_by_layer_type_chart(curves: list[tuple[str, np.ndarray, np.ndarray | None]],
                                         model_name: str) -> alt.Chart:
    """Wavelength ``2π / θ_i`` of each rotated pair for each kind of layer (``(label, formula, model's inv_freq or
    None)``, e.g. Gemma 3's local and global layers): the formula as a line, the model's own buffer as dots on it."""
    frame = pd.concat([pd.DataFrame({"pair": np.arange(len(values)), "wavelength": 2 * np.pi / values,
                                     "layers": label, "source": source})
                       for label, formula, model in curves
                       for source, values in (("formula b^(−2i/d)", formula), ("the model's inv_freq", model))
                       if values is not None])
    base = alt.Chart(frame).encode(
        x=alt.X("pair:Q", title="pair i"),
        y=alt.Y("wavelength:Q", scale=alt.Scale(type="log"), title="wavelength 2π/θᵢ (positions)"),
        color=alt.Color("layers:N", sort=[label for label, _, _ in curves], title=None,
                        scale=alt.Scale(scheme="tableau10")),
        tooltip=["layers", "source", "pair", alt.Tooltip("wavelength:Q", format=",.1f")])
    line = base.transform_filter(alt.datum.source == "formula b^(−2i/d)").mark_line()
    dots = base.transform_filter(alt.datum.source == "the model's inv_freq").mark_point(filled=True, size=40)
    return (line + dots).properties(height=260, title=f"RoPE in {model_name}: wavelength per pair, per kind of layer")


def side_by_side(*images: Image.Image, gap: int = 28) -> Image.Image:
    """Images in one row on white, tops aligned, ``gap`` pixels apart (a figure the page shows as one picture)."""
    canvas = Image.new("RGB", (sum(i.width for i in images) + gap * (len(images) - 1), max(i.height for i in images)),
                       "white")
    x = 0
    for image in images:
        canvas.paste(image, (x, 0))
        x += image.width + gap
    return canvas
