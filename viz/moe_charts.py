"""Mixture-of-experts routing pictures: arrays in, Altair charts (or PIL images for big matrices) out.

- ``routed_text``: the text with each token on the colour of its top-1 expert and the expert's number under it
  (Jiang et al. 2024, Mixtral, Fig. 8). Colours are Paul Tol's "light" scheme, made for text on colour and
  distinguishable with the common colour-vision deficiencies; the number makes the expert readable without colour,
  which matters beyond 9 experts where colours repeat.
- ``layer_strip``: every MoE layer's top-1 expert per token, a column per token.
- ``gate_bars``: one token's router probabilities over all experts, the dispatched top-k marked with their weights.
- ``load_heatmap`` / ``load_difference``: layer × expert share of assignments on a diverging scale centred at the
  uniform load 1/E (or at 0 for a difference), with the balance figures per layer beside it.
- ``coactivation_chart``, ``consistency_chart``, ``specialisation_chart``.
Token strings are data (text marks, tooltips), never markup.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd
from matplotlib import colormaps
from PIL import Image

from viz.heatmap import token_labels

# Paul Tol's "light" qualitative scheme (https://personal.sron.nl/~pault/): pale enough for black text on top.
EXPERT_COLOURS = ["#77AADD", "#EE8866", "#44BB99", "#EEDD88", "#FFAABB", "#99DDFF", "#BBCC33", "#AAAA00", "#DDDDDD"]
DROPPED_COLOUR = "#FFFFFF"
MAX_CHART_CELLS = 4096  # a matrix with more cells becomes an image
CHAR_PX = 7.8  # width of one character of the 13 px monospace font used for token text
# Explicit sizes are the plot area: without this Streamlit fits axes, labels and title *into* the height.
PAD = alt.AutoSizeParams(type="pad")
BY_POSITION = alt.EncodingSortField("position", op="min")


def expert_colours(num_experts: int) -> list[str]:
    """One colour per expert; the scheme repeats beyond 9 experts (the expert number then tells them apart)."""
    return [EXPERT_COLOURS[i % len(EXPERT_COLOURS)] for i in range(num_experts)]


def _expert_scale(num_experts: int) -> alt.Scale:
    return alt.Scale(domain=[f"E{i}" for i in range(num_experts)], range=expert_colours(num_experts))


def expert_legend(num_experts: int) -> alt.Chart:
    """A legend strip: each expert's colour with its number written on it."""
    frame = pd.DataFrame({"expert": [f"E{i}" for i in range(num_experts)], "index": range(num_experts)})
    per_row = 16
    frame["row"], frame["col"] = frame["index"] // per_row, frame["index"] % per_row
    base = alt.Chart(frame).encode(x=alt.X("col:O", axis=None), y=alt.Y("row:O", axis=None))
    boxes = base.mark_rect(stroke="white", strokeWidth=2).encode(
        color=alt.Color("expert:N", scale=_expert_scale(num_experts), legend=None))
    labels = base.mark_text(fontSize=12, font="monospace").encode(text="expert:N")
    return (boxes + labels).properties(width=min(per_row, num_experts) * 40, height=24 * int(frame["row"].max() + 1),
                                       title="expert colours", autosize=PAD)


def _layout(tokens: list[str], raw_tokens: list[str], width_chars: int, min_chars: float) -> pd.DataFrame:
    """Place tokens left to right in lines of ``width_chars``; a token whose text holds a newline ends its line.

    ``min_chars``: the narrowest box, so the expert number under a one-letter token still fits.
    """
    rows, x, line = [], 0.0, 0
    for position, (token, raw) in enumerate(zip(tokens, raw_tokens)):
        label = token if token.strip() else "␣"
        width = max(len(label), min_chars) + 0.6
        if x > 0 and x + width > width_chars:
            x, line = 0.0, line + 1
        rows.append({"position": position, "token": label, "x": x, "x2": x + width - 0.15, "line": line})
        x += width
        if "\n" in raw:
            x, line = 0.0, line + 1 + min(raw.count("\n") - 1, 1)
    return pd.DataFrame(rows)


def routed_text(tokens: list[str], raw_tokens: list[str], top1: np.ndarray, top1_weight: np.ndarray,
                num_experts: int, kept: np.ndarray | None = None, selected: int | None = None,
                width_chars: int = 96, title: str = "") -> alt.Chart:
    """The text, each token boxed in its top-1 expert's colour with ``E<n>`` under it.

    ``tokens``: display strings; ``raw_tokens``: the text each token covers (for line breaks); ``top1``,
    ``top1_weight``: ``(tokens,)``; ``kept``: ``(tokens,)`` False where the expert was full (drawn white, "drop").
    """
    if not len(tokens) == len(raw_tokens) == len(top1) == len(top1_weight):
        raise ValueError("tokens, raw tokens and routes must have one entry per token")
    frame = _layout(tokens, raw_tokens, width_chars, min_chars=0.65 * len(f"E{num_experts - 1}"))  # 8 px digits
    frame["expert"] = [f"E{int(e)}" for e in top1]
    frame["weight"] = np.asarray(top1_weight, dtype=float)
    frame["routed"] = True if kept is None else np.asarray(kept, dtype=bool)
    frame["label"] = np.where(frame["routed"], frame["expert"], "drop")
    frame["centre"] = (frame["x"] + frame["x2"]) / 2
    frame["selected"] = frame["position"] == (selected if selected is not None else -1)
    lines = int(frame["line"].max()) + 1
    x_scale = alt.Scale(domain=[0, width_chars], nice=False, zero=True)
    y_scale = alt.Scale(domain=[-0.5, lines - 0.5], reverse=True, nice=False, zero=False)
    base = alt.Chart(frame).encode(
        y=alt.Y("line:Q", scale=y_scale, axis=None),
        tooltip=[alt.Tooltip("position:Q"), "token:N", "expert:N", alt.Tooltip("weight:Q", format=".3f",
                                                                              title="dispatch weight"), "routed:N"])
    boxes = base.mark_rect(height=30, cornerRadius=3).encode(
        x=alt.X("x:Q", scale=x_scale, axis=None), x2="x2:Q",
        color=alt.condition(alt.datum.routed, alt.Color("expert:N", scale=_expert_scale(num_experts), legend=None),
                            alt.value(DROPPED_COLOUR)),
        stroke=alt.condition(alt.datum.selected, alt.value("black"), alt.value("#999999")),
        strokeWidth=alt.condition(alt.datum.selected, alt.value(2.5), alt.value(0.4)))
    words = base.mark_text(font="monospace", fontSize=13, dy=-5).encode(
        x=alt.X("centre:Q", scale=x_scale, axis=None), text="token:N")
    numbers = base.mark_text(font="monospace", fontSize=8, dy=9, color="#333333").encode(
        x=alt.X("centre:Q", scale=x_scale, axis=None), text="label:N")
    return (boxes + words + numbers).properties(width=int(width_chars * CHAR_PX), height=36 * lines, title=title,
                                               autosize=PAD)


def layer_strip(tokens: list[str], top1: np.ndarray, layer_labels: list[str], num_experts: int,
                kept: np.ndarray | None = None, selected: int | None = None, offset: int = 0) -> alt.Chart:
    """Top-1 expert of every layer (rows) for every token (columns): ``top1`` int ``(layers, tokens)``.

    ``offset``: position of the first column in the whole input (the strip may show a window of it).
    """
    layers, count = top1.shape
    if count != len(tokens) or layers != len(layer_labels):
        raise ValueError("the strip needs one label per layer and one token per column")
    labels = token_labels(tokens)
    layer_index, token_index = np.meshgrid(np.arange(layers), np.arange(count), indexing="ij")
    frame = pd.DataFrame({
        "layer": np.asarray(layer_labels, dtype=object)[layer_index.ravel()],
        "token": np.asarray(labels, dtype=object)[token_index.ravel()],
        "position": token_index.ravel() + offset,
        "layer index": layer_index.ravel(),
        "expert": [f"E{int(e)}" for e in top1.ravel()],
        "number": [str(int(e)) for e in top1.ravel()],
        "routed": True if kept is None else kept.ravel().astype(bool),
    })
    base = alt.Chart(frame).encode(
        # sorted by position, never by a list of the tokens: Vega-Lite turns a sort list into an expression, and a
        # token such as "if" then breaks the chart ("Unrecognized signal name")
        x=alt.X("token:N", sort=BY_POSITION, title=None,
                axis=alt.Axis(labelAngle=-90, labelLimit=80, labelFontSize=10, labelOverlap=count > 60)),
        y=alt.Y("layer:N", sort=alt.EncodingSortField("layer index", op="min"), title=None),
        tooltip=["position", "token", "layer", "expert", "routed"])
    cells = base.mark_rect(stroke="white", strokeWidth=0.5).encode(
        color=alt.condition(alt.datum.routed, alt.Color("expert:N", scale=_expert_scale(num_experts), legend=None),
                            alt.value(DROPPED_COLOUR)))
    chart = cells
    if count <= 80:
        chart = chart + base.mark_text(fontSize=9, font="monospace").encode(text="number:N")
    if selected is not None and 0 <= selected - offset < count:
        marker = alt.Chart(pd.DataFrame({"token": [labels[selected - offset]], "position": [selected]})).mark_rule(
            color="black", strokeWidth=2, opacity=0.35).encode(x=alt.X("token:N", sort=BY_POSITION))
        chart = chart + marker
    return chart.properties(width=max(200, min(860, 14 * count)), height=22 * layers, autosize=PAD)


def gate_bars(probs: np.ndarray, chosen: np.ndarray, weights: np.ndarray, entropy: float,
              title: str = "", kept: np.ndarray | None = None) -> alt.Chart:
    """One token's router distribution ``probs`` ``(E,)``; ``chosen``/``weights`` ``(k,)`` are what was dispatched.

    Chosen experts are drawn in their colour and labelled "top-r · w=…"; the dashed rule is the uniform 1/E.
    """
    num_experts = probs.shape[0]
    rank = np.zeros(num_experts, dtype=int)
    weight = np.zeros(num_experts)
    routed = np.ones(num_experts, dtype=bool)
    for r, (e, w) in enumerate(zip(chosen, weights)):
        rank[int(e)], weight[int(e)] = r + 1, float(w)
        if kept is not None:
            routed[int(e)] = bool(kept[r])
    frame = pd.DataFrame({
        "expert": [f"E{i}" for i in range(num_experts)], "probability": probs.astype(float), "rank": rank,
        "dispatch weight": weight, "chosen": rank > 0,
        "mark": [((f"top-{r} · w={w:.2f}" if num_experts <= 16 else str(r)) + ("" if ok else " (full)")) if r else ""
                 for r, w, ok in zip(rank, weight, routed)],
    })
    order = [f"E{i}" for i in range(num_experts)]
    base = alt.Chart(frame).encode(
        x=alt.X("expert:N", sort=order, title="expert", axis=alt.Axis(labelAngle=0 if num_experts <= 16 else -90)),
        tooltip=["expert", alt.Tooltip("probability:Q", format=".4f"), "rank",
                 alt.Tooltip("dispatch weight:Q", format=".4f")])
    bars = base.mark_bar(stroke="black").encode(
        y=alt.Y("probability:Q", title="router probability", scale=alt.Scale(domain=[0, max(1e-6, float(
            probs.max()) * 1.25)])),
        color=alt.condition(alt.datum.chosen, alt.Color("expert:N", scale=_expert_scale(num_experts), legend=None),
                            alt.value("#E8E8E8")),
        strokeWidth=alt.condition(alt.datum.chosen, alt.value(1.5), alt.value(0)))
    marks = base.mark_text(dy=-8, fontSize=11).encode(y="probability:Q", text="mark:N")
    uniform = alt.Chart(pd.DataFrame({"u": [1.0 / num_experts]})).mark_rule(strokeDash=[4, 4], color="#555555") \
        .encode(y="u:Q")
    full_title = f"{title} · entropy {entropy:.2f} nats ({entropy / np.log(num_experts):.0%} of the maximum " \
                 f"log {num_experts})" if num_experts > 1 else title
    return (bars + marks + uniform).properties(height=240, width=max(300, min(860, 44 * num_experts)),
                                               title=full_title, autosize=PAD)


def _matrix_image(values: np.ndarray, cmap: str, vmin: float, vmax: float, max_px: int = 700) -> Image.Image:
    table = colormaps[cmap]
    scaled = np.clip((values - vmin) / max(vmax - vmin, 1e-12), 0, 1)
    rgb = (table(scaled)[..., :3] * 255).round().astype(np.uint8)
    scale = max(1, max_px // max(values.shape))
    return Image.fromarray(rgb).resize((rgb.shape[1] * scale, rgb.shape[0] * scale), Image.NEAREST)


def _matrix_chart(values: np.ndarray, rows: list[str], cols: list[str], row_title: str, col_title: str,
                  value_title: str, scale: alt.Scale, fmt: str, annotate: bool, max_width: int = 860,
                  square: bool = False) -> alt.Chart:
    """A small annotated heatmap; fields get plain names (a "." in a Vega field name means a nested field)."""
    r, c = np.meshgrid(np.arange(values.shape[0]), np.arange(values.shape[1]), indexing="ij")
    frame = pd.DataFrame({"row": np.asarray(rows, dtype=object)[r.ravel()],
                          "col": np.asarray(cols, dtype=object)[c.ravel()],
                          "row position": r.ravel(), "col position": c.ravel(),
                          "value": values.ravel().astype(float)})
    frame["text"] = [format(v, fmt) for v in frame["value"]]
    flat = len(cols) <= 16 and max(len(str(label)) for label in cols) <= 4
    base = alt.Chart(frame).encode(
        x=alt.X("col:N", sort=alt.EncodingSortField("col position", op="min"), title=col_title,
                axis=alt.Axis(labelAngle=0 if flat else -45)),
        y=alt.Y("row:N", sort=alt.EncodingSortField("row position", op="min"), title=row_title),
        tooltip=[alt.Tooltip("row:N", title=row_title), alt.Tooltip("col:N", title=col_title),
                 alt.Tooltip("value:Q", title=value_title, format=fmt)])
    chart = base.mark_rect().encode(color=alt.Color("value:Q", scale=scale, title=value_title))
    if annotate:
        chart = chart + base.mark_text(fontSize=9).encode(text="text:N")
    width = min(max_width, 40 * len(cols))
    height = width * len(rows) // len(cols) if square else min(700, max(60, 22 * len(rows)))
    return chart.properties(width=width, height=height)


def load_heatmap(load: np.ndarray, layer_labels: list[str], cv: np.ndarray, aux_loss: np.ndarray):
    """Layer × expert share of assignments, white at the uniform 1/E, blue below, orange above; CV and the Switch
    auxiliary loss per layer beside it. ``load`` ``(layers, E)``. Returns the two charts, or an image for huge E."""
    layers, num_experts = load.shape
    uniform = 1.0 / num_experts
    if load.size > MAX_CHART_CELLS:
        return _matrix_image(load, "PuOr_r", 0.0, 2 * uniform)
    top = max(float(load.max()), 2 * uniform)
    scale = alt.Scale(domain=[0.0, uniform, top], range=["#2166AC", "#F7F7F7", "#E08214"], type="linear")
    cols = [f"E{i}" for i in range(num_experts)]
    heat = _matrix_chart(load, list(layer_labels), cols, "layer", "expert", f"share (uniform = {uniform:.1%})",
                         scale, ".0%", num_experts <= 16, max_width=560)
    figures = pd.DataFrame({"layer": list(layer_labels), "load CV": cv.astype(float),
                            "Switch aux loss": aux_loss.astype(float)})
    bars = alt.Chart(figures).mark_bar(color="#777777").encode(
        y=alt.Y("layer:N", sort=list(layer_labels), title=None, axis=alt.Axis(labels=False, ticks=False)),
        x=alt.X("load CV:Q", title="load CV (0 = even)"),
        tooltip=["layer", alt.Tooltip("load CV:Q", format=".3f"), alt.Tooltip("Switch aux loss:Q", format=".3f")])
    text = bars.mark_text(align="left", dx=3, fontSize=10).encode(
        text=alt.Text("Switch aux loss:Q", format=".2f"))
    side = (bars + text).properties(width=160, height=min(700, max(60, 22 * layers)),
                                    title="CV · label = aux loss")
    return heat, side  # laid out side by side by the page (each fits its own column)


def load_difference(load_a: np.ndarray, load_b: np.ndarray, layer_labels: list[str], name_a: str, name_b: str):
    """``load_a - load_b`` ``(layers, E)`` on a diverging scale centred at 0 (orange: more in A, blue: more in B)."""
    diff = load_a - load_b
    if diff.size > MAX_CHART_CELLS:
        top = max(float(np.abs(diff).max()), 1e-6)
        return _matrix_image(diff, "PuOr_r", -top, top)
    top = max(float(np.abs(diff).max()), 1e-6)
    scale = alt.Scale(domain=[-top, 0.0, top], range=["#2166AC", "#F7F7F7", "#E08214"])
    cols = [f"E{i}" for i in range(diff.shape[1])]
    return _matrix_chart(diff * 100, list(layer_labels), cols, "layer", "expert",
                         f"{name_a} − {name_b} (points)",
                         alt.Scale(domain=[-top * 100, 0.0, top * 100], range=scale.range), "+.0f",
                         diff.shape[1] <= 16).properties(autosize=PAD)


def coactivation_chart(matrix: np.ndarray):
    """``(E, E)`` share of tokens routed to both experts; the diagonal is each expert's own share."""
    num_experts = matrix.shape[0]
    if matrix.size > MAX_CHART_CELLS:
        return _matrix_image(matrix, "Blues", 0.0, max(float(matrix.max()), 1e-6))
    names = [f"E{i}" for i in range(num_experts)]
    return _matrix_chart(matrix, names, names, "expert i", "expert j", "share of tokens",
                         alt.Scale(scheme="blues", domain=[0, max(float(matrix.max()), 1e-6)]), ".0%",
                         num_experts <= 12, max_width=330, square=True).properties(autosize=PAD)


def consistency_chart(nmi: np.ndarray, layer_labels: list[str], scheme: str = "viridis"):
    """``(L, L)`` normalised mutual information between layers' top-1 choices, 0..1, in a sequential Vega
    ``scheme`` (the same colours for the image drawn for many layers)."""
    if nmi.size > MAX_CHART_CELLS:
        return _matrix_image(nmi, {"blues": "Blues", "greys": "Greys"}.get(scheme, scheme), 0.0, 1.0)
    return _matrix_chart(nmi, list(layer_labels), list(layer_labels), "layer a", "layer b", "NMI",
                         alt.Scale(scheme=scheme, domain=[0, 1]), ".2f", len(layer_labels) <= 8,
                         max_width=300, square=True) \
        .properties(autosize=PAD)


def specialisation_chart(observed: np.ndarray, shuffled_mean: np.ndarray, shuffled_p95: np.ndarray,
                         layer_labels: list[str], ceiling: float) -> alt.Chart:
    """MI (bits) between token category and expert per layer: bars; shuffled routing: grey tick (mean) and a
    dashed tick (95th percentile). ``ceiling``: H(category), the largest MI possible."""
    frame = pd.DataFrame({"layer": list(layer_labels), "observed": observed.astype(float),
                          "shuffled mean": shuffled_mean.astype(float), "shuffled 95%": shuffled_p95.astype(float)})
    order = list(layer_labels)
    base = alt.Chart(frame).encode(
        x=alt.X("layer:N", sort=order, title=None, axis=alt.Axis(labelAngle=-45, labelOverlap=False)),
        tooltip=["layer", alt.Tooltip("observed:Q", format=".4f"), alt.Tooltip("shuffled mean:Q", format=".4f"),
                 alt.Tooltip("shuffled 95%:Q", format=".4f")])
    bars = base.mark_bar(color="#4477AA").encode(
        y=alt.Y("observed:Q", title="I(category; expert), bits", scale=alt.Scale(domain=[0, max(
            ceiling, float(observed.max()) * 1.1, 1e-3)])))
    mean_tick = base.mark_tick(color="#BB5566", thickness=3, size=30).encode(y="shuffled mean:Q")
    p95_tick = base.mark_tick(color="#BB5566", thickness=1, size=30, strokeDash=[3, 2]).encode(y="shuffled 95%:Q")
    return (bars + mean_tick + p95_tick).properties(height=220, width=max(240, 70 * len(order)), autosize=PAD,
                                                    title=f"bars: measured · red ticks: shuffled routing "
                                                          f"(mean, 95th pct) · ceiling H(category) = {ceiling:.2f}")
