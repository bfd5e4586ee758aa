"""Charts for the "how attention works" page: annotated matrices, the √d_k entropy curve, mask patterns, Swin's
region ids, and the cost curves. Pure: arrays in, ``alt.Chart`` out; no Streamlit.

Matrices here are small (≤ 32 tokens a side) and every cell carries its number, because a lecture reads them aloud.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from viz.heatmap import BY_KEY_POSITION, BY_QUERY_POSITION

MASKED_COLOUR = "#d9d9d9"
_LOW_IS_DARK = {"viridis", "magma", "cividis", "inferno", "plasma"}
BY_ROW_POSITION = alt.EncodingSortField("row position", op="min")
BY_COL_POSITION = alt.EncodingSortField("col position", op="min")


def unique_labels(tokens: list[str]) -> list[str]:
    """``['the', 'cat', 'the']`` -> ``['0 the', '1 cat', '2 the']``: an axis must not merge repeated words."""
    return [f"{i} {t}" for i, t in enumerate(tokens)]


def _cell_size(cols: int, width: int) -> int:
    return int(max(12, min(56, width / max(cols, 1))))


def matrix_chart(values: np.ndarray, row_labels: list[str], col_labels: list[str], title: str = "",
                 masked: np.ndarray | None = None, masked_text: str = "−∞", probabilities: bool = False,
                 decimals: int = 2, width: int = 900, annotate: bool | None = None,
                 colour_max: float | None = None, scheme: str | None = None) -> alt.Chart:
    """A 2-D array ``(rows, cols)`` as an annotated heatmap.

    ``masked`` bool ``(rows, cols)``: cells shown grey with ``masked_text`` (the −∞ a mask adds). Signed values get a
    diverging scale centred on 0; ``probabilities`` a 0..1 sequential scale. Numbers are printed in the cells when
    they fit (``annotate`` None: when a cell is at least 34 px wide within ``width``). ``width``: pixels for the
    cells; ``colour_max``: top of the probability scale (default 1) so faint patterns show; ``scheme``: a Vega
    scheme for probabilities (default white → navy, so 0 reads as empty).
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"matrix_chart needs a 2-D array, got shape {values.shape}")
    rows, cols = values.shape
    if len(row_labels) != rows or len(col_labels) != cols:
        raise ValueError(f"{len(row_labels)}×{len(col_labels)} labels for a {rows}×{cols} matrix")
    masked = np.zeros_like(values, dtype=bool) if masked is None else np.asarray(masked, dtype=bool)
    cell = _cell_size(cols, width)
    annotate = cell >= 34 if annotate is None else annotate
    r, c = np.indices((rows, cols))
    shown = np.where(masked, np.nan, values)
    rounded = np.round(np.nan_to_num(values, posinf=0.0, neginf=0.0), decimals) + 0.0  # + 0.0: no "-0.00"
    text = np.where(masked, masked_text, np.char.mod(f"%.{decimals}f", rounded))
    if probabilities:
        strongest = colour_max or 1.0
    else:
        strongest = float(np.nanmax(np.abs(shown))) if np.isfinite(shown).any() else 1.0
    frame = pd.DataFrame({
        "row": np.asarray(row_labels, dtype=object)[r.ravel()], "col": np.asarray(col_labels, dtype=object)[c.ravel()],
        "row position": r.ravel(), "col position": c.ravel(),
        "value": np.nan_to_num(shown).ravel(),  # masked cells keep a number: Vega drops NaN rects
        "text": text.ravel(), "masked": masked.ravel(),
        "dark": (~masked & _dark_cells(np.abs(np.nan_to_num(shown)), strongest, probabilities and scheme)).ravel(),
    })
    if probabilities:
        scale = alt.Scale(scheme=scheme, domain=[0, colour_max or 1.0]) if scheme else \
            alt.Scale(range=["#ffffff", "#08306b"], domain=[0, colour_max or 1.0])
    else:
        scale = alt.Scale(scheme="redblue", domain=[-(strongest or 1.0), strongest or 1.0], reverse=True)
    font = 13 if cell >= 18 else 10
    # sorted by position, never by the list of labels: Vega-Lite turns a sort list into an expression, and a token
    # such as "if" then breaks the chart ("Unrecognized signal name")
    x = alt.X("col:N", sort=BY_COL_POSITION, title=None,
              axis=alt.Axis(labelAngle=-60, labelFontSize=font, labelOverlap=False))
    y = alt.Y("row:N", sort=BY_ROW_POSITION, title=None, axis=alt.Axis(labelFontSize=font, labelOverlap=False))
    base = alt.Chart(frame).encode(x=x, y=y)
    colour = alt.condition("datum.masked", alt.value(MASKED_COLOUR), alt.Color("value:Q", scale=scale, title=None))
    heat = base.mark_rect().encode(color=colour, tooltip=["row", "col", alt.Tooltip("text:N", title="value")])
    layers = [heat]
    if annotate:
        size = 11 if cell < 44 else 13
        layers.append(base.mark_text(fontSize=size).encode(
            text="text:N",
            color=alt.condition("datum.dark", alt.value("white"), alt.value("black"))))
    # Streamlit fits the whole chart (axes, legend, title) into width × height: leave room for them
    label_room = 8 * max(len(str(label)) for label in row_labels) + 70
    chart = alt.layer(*layers).properties(width=cell * cols + label_room,
                                          height=cell * rows + 6 * max(len(str(label)) for label in col_labels) + 30
                                          + (24 if title else 0))
    return chart.properties(title=title) if title else chart


def _dark_cells(magnitude: np.ndarray, strongest: float, scheme: str | None) -> np.ndarray:
    """Cells drawn dark enough to need white text: high values, or low ones in schemes that start dark."""
    if scheme in _LOW_IS_DARK:
        return magnitude < 0.5 * strongest
    return magnitude >= 0.6 * strongest


def entropy_chart(curve: dict[str, np.ndarray], current_d_k: int | None = None) -> alt.Chart:
    """Mean softmax row entropy (bits) against d_k, scaled vs unscaled, with the uniform-row ceiling log2 N.

    ``curve`` as returned by ``mechanics.softmax_entropy_by_d_k``.
    """
    d_k = curve["d_k"]
    frame = pd.concat([
        pd.DataFrame({"d_k": d_k, "bits": curve["scaled"], "scores": "QKᵀ / √d_k (scaled)"}),
        pd.DataFrame({"d_k": d_k, "bits": curve["unscaled"], "scores": "QKᵀ (no scaling)"}),
    ])
    x = alt.X("d_k:Q", scale=alt.Scale(type="log", base=2), title="head width d_k",
              axis=alt.Axis(values=[int(v) for v in d_k], labelFontSize=14, titleFontSize=15))
    y = alt.Y("bits:Q", title="softmax row entropy (bits)", scale=alt.Scale(domain=[0, float(curve["ceiling"][0])]),
              axis=alt.Axis(labelFontSize=14, titleFontSize=15))
    colour = alt.Color("scores:N", title=None, scale=alt.Scale(domain=["QKᵀ / √d_k (scaled)", "QKᵀ (no scaling)"],
                                                               range=["#1f77b4", "#d62728"]),
                       legend=alt.Legend(orient="bottom", labelFontSize=14))
    lines = alt.Chart(frame).mark_line(point=True, strokeWidth=3).encode(
        x=x, y=y, color=colour, tooltip=["d_k", alt.Tooltip("bits:Q", format=".2f"), "scores"])
    ceiling = alt.Chart(pd.DataFrame({"bits": [float(curve["ceiling"][0])]})).mark_rule(strokeDash=[6, 4]).encode(
        y="bits:Q")
    label = alt.Chart(pd.DataFrame({"bits": [float(curve["ceiling"][0])], "d_k": [int(d_k[0])],
                                    "text": ["uniform row: log₂ N"]})).mark_text(
        align="left", dy=-8, fontSize=13).encode(x="d_k:Q", y="bits:Q", text="text:N")
    layers = [lines, ceiling, label]
    if current_d_k is not None:
        layers.append(alt.Chart(pd.DataFrame({"d_k": [current_d_k]})).mark_rule(color="gray").encode(x="d_k:Q"))
    return alt.layer(*layers).properties(width=560, height=320)


def mask_chart(allowed: np.ndarray, labels: list[str] | None = None, title: str = "", size: int = 220) -> alt.Chart:
    """A bool ``(queries, keys)`` allowed-mask: dark = may attend, light = hidden."""
    allowed = np.asarray(allowed, dtype=bool)
    rows, cols = allowed.shape
    labels_r = labels if labels is not None else [str(i) for i in range(rows)]
    labels_c = labels if labels is not None and len(labels) == cols else [str(j) for j in range(cols)]
    r, c = np.indices((rows, cols))
    frame = pd.DataFrame({"query": np.asarray(labels_r, dtype=object)[r.ravel()],
                          "key": np.asarray(labels_c, dtype=object)[c.ravel()],
                          "query position": r.ravel(), "key position": c.ravel(),
                          "allowed": np.where(allowed.ravel(), "may attend", "hidden (−∞)")})
    show_axes = labels is not None
    axis = alt.Axis(labelAngle=-60, labelFontSize=12) if show_axes else None
    chart = alt.Chart(frame).mark_rect(stroke="white", strokeWidth=0.5 if cols <= 32 else 0).encode(
        x=alt.X("key:N", sort=BY_KEY_POSITION, title="key" if not show_axes else None, axis=axis),
        y=alt.Y("query:N", sort=BY_QUERY_POSITION, title="query" if not show_axes else None,
                axis=alt.Axis(labelFontSize=12) if show_axes else None),
        color=alt.Color("allowed:N", scale=alt.Scale(domain=["may attend", "hidden (−∞)"],
                                                     range=["#08519c", "#eeeeee"]), legend=None),
        tooltip=["query", "key", "allowed"],
    ).properties(width=size, height=size * rows / cols + (24 if title else 0))
    return chart.properties(title=title) if title else chart


def swin_regions_chart(region_ids: np.ndarray, window: int, cell_text: np.ndarray | None = None,
                       title: str = "") -> alt.Chart:
    """Swin's region ids on the shifted grid ``(rows, cols)``, with the window borders drawn every M cells; tokens
    (``cell_text``, same shape) printed above each id when given."""
    region_ids = np.asarray(region_ids)
    rows, cols = region_ids.shape
    r, c = np.indices((rows, cols))
    frame = pd.DataFrame({"x0": c.ravel(), "x1": c.ravel() + 1, "y0": r.ravel(), "y1": r.ravel() + 1,
                          "xc": c.ravel() + 0.5, "yc": r.ravel() + 0.5, "region": region_ids.ravel(),
                          "region_text": [f"id {v}" for v in region_ids.ravel()],
                          "token": (np.asarray(cell_text, dtype=str).ravel() if cell_text is not None
                                    else [""] * region_ids.size)})
    cell = 72 if cols <= 8 else 40
    x_scale = alt.Scale(domain=[0, cols], nice=False)
    y_scale = alt.Scale(domain=[0, rows], nice=False, reverse=True)
    base = alt.Chart(frame)
    heat = base.mark_rect(stroke="white", strokeWidth=1).encode(
        x=alt.X("x0:Q", scale=x_scale, axis=None), x2="x1", y=alt.Y("y0:Q", scale=y_scale, axis=None), y2="y1",
        color=alt.Color("region:N", scale=alt.Scale(scheme="pastel1"), legend=None),
        tooltip=["region", "token"])
    centre = dict(x=alt.X("xc:Q", scale=x_scale), y=alt.Y("yc:Q", scale=y_scale))
    layers = [heat, base.mark_text(fontSize=11 if cell < 50 else 12, dy=9 if cell_text is not None else 0,
                                   color="#333").encode(text="region_text:N", **centre)]
    if cell_text is not None:
        layers.append(base.mark_text(fontSize=13, dy=-8, fontWeight="bold").encode(text="token:N", **centre))
    lines = pd.DataFrame({"at": list(range(0, max(rows, cols) + 1, window))})
    layers.append(alt.Chart(lines[lines["at"] <= cols]).mark_rule(strokeWidth=3, color="black").encode(
        x=alt.X("at:Q", scale=x_scale)))
    layers.append(alt.Chart(lines[lines["at"] <= rows]).mark_rule(strokeWidth=3, color="black").encode(
        y=alt.Y("at:Q", scale=y_scale)))
    chart = alt.layer(*layers).properties(width=cell * cols + 8, height=cell * rows + 8 + (24 if title else 0))
    return chart.properties(title=title) if title else chart


def memory_curve_chart(tokens: np.ndarray, map_bytes: np.ndarray, flash_bytes: np.ndarray,
                       budget_bytes: float | None = None, budget_label: str = "") -> alt.Chart:
    """Bytes against N on log-log axes: materialised maps (∝ N²) vs FlashAttention (∝ N), with an optional memory
    budget line (e.g. one GPU)."""
    frame = pd.concat([
        pd.DataFrame({"tokens": tokens, "bytes": np.asarray(map_bytes, dtype=float), "what": "attention maps (N²)"}),
        pd.DataFrame({"tokens": tokens, "bytes": np.asarray(flash_bytes, dtype=float), "what": "FlashAttention (N)"}),
    ])
    x = alt.X("tokens:Q", scale=alt.Scale(type="log"), title="tokens N",
              axis=alt.Axis(labelFontSize=14, titleFontSize=15, format="~s"))
    y = alt.Y("bytes:Q", scale=alt.Scale(type="log"), title="bytes",
              axis=alt.Axis(labelFontSize=14, titleFontSize=14, format="~s"))
    lines = alt.Chart(frame).mark_line(strokeWidth=3).encode(
        x=x, y=y, color=alt.Color("what:N", title=None, legend=alt.Legend(orient="bottom", labelFontSize=14),
                                  scale=alt.Scale(domain=["attention maps (N²)", "FlashAttention (N)"],
                                                  range=["#d62728", "#1f77b4"])),
        tooltip=[alt.Tooltip("tokens:Q", format=","), alt.Tooltip("bytes:Q", format=",.0f"), "what"])
    layers = [lines]
    if budget_bytes:
        layers.append(alt.Chart(pd.DataFrame({"bytes": [float(budget_bytes)]})).mark_rule(
            strokeDash=[6, 4], color="gray").encode(y="bytes:Q"))
        layers.append(alt.Chart(pd.DataFrame({"bytes": [float(budget_bytes)], "tokens": [float(np.min(tokens))],
                                              "text": [budget_label]})).mark_text(
            align="left", dy=-8, fontSize=13).encode(x="tokens:Q", y="bytes:Q", text="text:N"))
    return alt.layer(*layers).properties(width=560, height=320)


def kv_cache_chart(names: list[str], kinds: list[str], bytes_per_sequence: list[int], tokens: int) -> alt.Chart:
    """Horizontal bars: KV-cache size of one sequence of ``tokens`` tokens per model, in MiB, coloured by kind."""
    frame = pd.DataFrame({"model": names, "kind": kinds, "MiB": np.asarray(bytes_per_sequence) / 2**20})
    frame["label"] = [f"{v:,.1f} MiB" if v < 1024 else f"{v / 1024:,.2f} GiB" for v in frame["MiB"]]
    order = list(frame.sort_values("MiB", ascending=False)["model"])
    base = alt.Chart(frame).encode(
        y=alt.Y("model:N", sort=order, title=None, axis=alt.Axis(labelFontSize=14, labelLimit=320, labelOverlap=False)),
        x=alt.X("MiB:Q", title=f"KV cache of one {tokens:,}-token sequence (MiB)",
                axis=alt.Axis(labelFontSize=13, titleFontSize=14)))
    bars = base.mark_bar().encode(color=alt.Color("kind:N", scale=alt.Scale(domain=["MHA", "GQA", "MQA", "MLA"]),
                                                  legend=alt.Legend(orient="bottom", labelFontSize=14)),
                                  tooltip=["model", "kind", "label"])
    text = base.mark_text(align="left", dx=4, fontSize=13).encode(text="label:N")
    return alt.layer(bars, text).properties(width=760, height=34 * len(names) + 90)


def worked_examples_chart(examples: list[str], rows: list[str], bytes_: list[int], labels: list[str]) -> alt.Chart:
    """Horizontal bars on a log axis: the bytes of each row of each worked example (``examples[i]``, ``rows[i]``),
    labelled with ``labels[i]`` (e.g. "1.07 GB = 1 GiB"), coloured by example."""
    frame = pd.DataFrame({"example": examples, "what": [f"{e}: {r}" for e, r in zip(examples, rows)],
                          "bytes": np.asarray(bytes_, dtype=float), "label": labels, "order": range(len(rows)),
                          "start": 1.0})  # a log axis has no 0: bars start at one byte
    base = alt.Chart(frame).encode(
        y=alt.Y("what:N", sort=alt.EncodingSortField("order", op="min"), title=None,
                axis=alt.Axis(labelFontSize=13, labelLimit=520, labelOverlap=False)),
        x=alt.X("bytes:Q", scale=alt.Scale(type="log"), title="bytes",
                axis=alt.Axis(labelFontSize=13, titleFontSize=14, format="~s")))
    bars = base.mark_bar().encode(x2="start:Q", color=alt.Color("example:N", legend=None),
                                  tooltip=["what", "label"])
    text = base.mark_text(align="left", dx=4, fontSize=12).encode(text="label:N")
    return alt.layer(bars, text).properties(width=560, height=28 * len(rows) + 40)
