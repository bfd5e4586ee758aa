"""Alignment figures for translation: the soft alignment matrix of Bahdanau et al. (2015, fig. 3) with gold and
argmax links on top, accuracy against sentence length (their fig. 2), and alignment error rate per layer and head.

Pure: arrays and lists in, ``alt.Chart`` out. Token and word strings are data (sort lists), never expressions.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from viz.heatmap import token_labels

GOLD_COLOUR = "#d62728"
ARGMAX_COLOUR = "#ff7f0e"
BY_SOURCE_POSITION = alt.EncodingSortField("source position", op="min")
BY_OUTPUT_POSITION = alt.EncodingSortField("output position", op="min")


def alignment_chart(weights: np.ndarray, output_labels: list[str], source_labels: list[str], title: str = "",
                    gold: set[tuple[int, int]] | None = None, argmax: set[tuple[int, int]] | None = None,
                    scheme: str = "greys", max_width: int = 800,
                    languages: tuple[str, str] = ("English", "French")) -> alt.Chart:
    """Output words (rows) × source words (columns), white = 0, black = 1 as in the paper.

    ``gold`` / ``argmax``: links ``(source index, output index)`` drawn as a red frame / an orange dot.
    ``max_width``: pixels for the whole chart, labels and legend included (Streamlit fits it into that).
    ``languages``: (source, output), the axis titles."""
    if weights.shape != (len(output_labels), len(source_labels)):
        raise ValueError(f"alignment {weights.shape} does not match {len(output_labels)} output and "
                         f"{len(source_labels)} source labels")
    out_labels, src_labels = token_labels(output_labels), token_labels(source_labels)
    rows, cols = np.meshgrid(np.arange(weights.shape[0]), np.arange(weights.shape[1]), indexing="ij")
    frame = pd.DataFrame({
        "output": np.asarray(out_labels, dtype=object)[rows.ravel()],
        "source": np.asarray(src_labels, dtype=object)[cols.ravel()],
        "output position": rows.ravel(), "source position": cols.ravel(),
        "weight": weights.ravel().astype(float),
    })
    # sorted by position, never by the list of words: Vega-Lite turns a sort list into an expression, and a word
    # such as "if" then breaks the chart ("Unrecognized signal name")
    x = alt.X("source:N", sort=BY_SOURCE_POSITION, title=f"source ({languages[0]})",
              axis=alt.Axis(orient="top", labelAngle=-60, labelLimit=110, labelOverlap=False))
    y = alt.Y("output:N", sort=BY_OUTPUT_POSITION, title=f"output ({languages[1]})",
              axis=alt.Axis(labelLimit=110, labelOverlap=False))  # every word labelled, as in the paper
    cells = alt.Chart(frame).mark_rect().encode(
        x=x, y=y, color=alt.Color("weight:Q", scale=alt.Scale(scheme=scheme, domain=[0, 1]),
                                  legend=alt.Legend(title="attention")),
        tooltip=["output", "source", alt.Tooltip("weight:Q", format=".3f")])
    # Streamlit fits the whole chart (axis labels and legend included) into width × height: leave room for them.
    # Cells of ~22 px keep every word label readable; the width stays within a page column.
    width = min(max_width, 24 * len(src_labels) + 200)
    height = 22 * len(out_labels) + 140
    layers = [cells]
    side = max(6, min(20, (int(width) - 200) // len(src_labels), (int(height) - 140) // len(out_labels)))

    def marks(links: set[tuple[int, int]]) -> alt.Chart:
        ordered = sorted(links)
        return alt.Chart(pd.DataFrame({"source": [src_labels[s] for s, _ in ordered],
                                       "output": [out_labels[t] for _, t in ordered],
                                       "source position": [s for s, _ in ordered],
                                       "output position": [t for _, t in ordered]})).encode(x=x, y=y)

    if gold:
        layers.append(marks(gold).mark_square(filled=False, color=GOLD_COLOUR, strokeWidth=2.5,
                                              size=int(1.3 * side * side)))
    if argmax:
        layers.append(marks(argmax).mark_circle(color=ARGMAX_COLOUR, opacity=1.0, size=int(0.3 * side * side)))
    return alt.layer(*layers).properties(width=width, height=height, title=title)


def accuracy_by_length_chart(rows: list[dict], title: str = "Exact match against source length") -> alt.Chart:
    """rows: {"model", "bucket", "low", "accuracy", "count"} per model and length bucket -> one line per model."""
    frame = pd.DataFrame(rows)
    if frame.empty:
        raise ValueError("no accuracy measurements to draw")
    order = list(frame.sort_values("low")["bucket"].drop_duplicates())
    return alt.Chart(frame).mark_line(point=True).encode(
        x=alt.X("bucket:N", sort=order, title="source sentence length (words)", axis=alt.Axis(labelAngle=0)),
        y=alt.Y("accuracy:Q", title="exact-match accuracy", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%")),
        color=alt.Color("model:N", title="model"),
        tooltip=["model", "bucket", alt.Tooltip("accuracy:Q", format=".1%"), "count"],
    ).properties(title=title, height=300)


def aer_grid_chart(per_head: np.ndarray, title: str = "Alignment error rate per layer and head") -> alt.Chart:
    """``(layers, heads)`` AER values as a labelled heatmap; low (good) is dark."""
    layers, heads = np.meshgrid(np.arange(per_head.shape[0]), np.arange(per_head.shape[1]), indexing="ij")
    frame = pd.DataFrame({"layer": layers.ravel(), "head": heads.ravel(), "AER": per_head.ravel().astype(float)})
    base = alt.Chart(frame).encode(x=alt.X("head:O", title="head"), y=alt.Y("layer:O", title="decoder layer"))
    cells = base.mark_rect().encode(
        color=alt.Color("AER:Q", scale=alt.Scale(scheme="greens", reverse=True, domain=[0, 1])),
        tooltip=["layer", "head", alt.Tooltip("AER:Q", format=".3f")])
    labels = base.mark_text(fontSize=12).encode(
        text=alt.Text("AER:Q", format=".2f"),
        color=alt.condition(alt.datum.AER < 0.5, alt.value("white"), alt.value("black")))
    return (cells + labels).properties(title=title, width=70 * per_head.shape[1] + 160,
                                      height=40 * per_head.shape[0] + 90)  # whole chart: axes and legend included
