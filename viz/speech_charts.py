"""Drawing speech: a log-mel spectrogram with what the decoder attended to under it, on one time axis.

Pure: arrays in, a ``PIL.Image`` (matplotlib's object API, no pyplot, so nothing global) or an Altair chart out.
A cross-attention map is ``(output tokens, frames)`` with 20 ms frames; the spectrogram has 10 ms frames, so both are
drawn against seconds.
"""
from __future__ import annotations

import io

import altair as alt
import numpy as np
import pandas as pd
from PIL import Image

from viz.heatmap import PAD, token_labels

MEL_SECONDS_PER_FRAME = 0.01
CROSS_SECONDS_PER_FRAME = 0.02


def _render(figure) -> Image.Image:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def spectrogram_with_attention(mel: np.ndarray, weights: np.ndarray | None, tokens: list[str],
                               words: list[tuple[str, float, float]] = (), title: str = "",
                               width_inches: float = 11.0) -> Image.Image:
    """``mel (mel bins, mel frames)`` above ``weights (tokens, frames)`` (20 ms frames, rows scaled to their own maximum
    so every token's peak shows), sharing the time axis in seconds; ``words`` (text, start, end) marked on top."""
    from matplotlib.figure import Figure as MplFigure

    seconds = mel.shape[1] * MEL_SECONDS_PER_FRAME
    rows = 0 if weights is None else weights.shape[0]
    mel_height, row_height = 1.6, 0.22
    height = mel_height + (0.6 + rows * row_height if rows else 0) + 0.9
    figure = MplFigure(figsize=(width_inches, height))
    ratios = [mel_height] + ([0.6 + rows * row_height] if rows else [])
    axes = figure.subplots(len(ratios), 1, sharex=True, gridspec_kw={"height_ratios": ratios}, squeeze=False)[:, 0]
    axes[0].imshow(mel, origin="lower", aspect="auto", cmap="magma", extent=(0, seconds, 0, mel.shape[0]),
                   interpolation="nearest")
    axes[0].set_ylabel("mel bin")
    if title:
        axes[0].set_title(title, fontsize=10, loc="left", pad=16)
    for text, start, end in words:
        axes[0].axvline(start, color="white", linewidth=0.6, alpha=0.7)
        axes[0].text((start + end) / 2, mel.shape[0] + 1, text, ha="center", va="bottom", fontsize=8,
                     clip_on=False)
    if rows:
        peak = weights.max(axis=1, keepdims=True)
        scaled = weights / np.where(peak > 0, peak, 1.0)
        axes[1].imshow(scaled, aspect="auto", cmap="Blues", interpolation="nearest", vmin=0, vmax=1,
                       extent=(0, weights.shape[1] * CROSS_SECONDS_PER_FRAME, rows - 0.5, -0.5))
        axes[1].set_yticks(range(rows))
        axes[1].set_yticklabels(token_labels(tokens), fontsize=8)
        axes[1].set_ylabel("output token")
        for _, start, _ in words:
            axes[1].axvline(start, color="crimson", linewidth=0.5, alpha=0.5)
    axes[-1].set_xlabel("time (s)")
    axes[-1].set_xlim(0, seconds)
    figure.tight_layout()
    return _render(figure)


def attention_over_time(weights: np.ndarray, title: str = "", highlight: tuple[float, float] | None = None
                        ) -> alt.Chart:
    """One output token's attention over the frames ``(frames,)`` as an area against seconds; ``highlight`` shades
    a (start, end) span (the word the token belongs to)."""
    frame = pd.DataFrame({"time": np.arange(len(weights)) * CROSS_SECONDS_PER_FRAME,
                          "weight": weights.astype(float)})
    area = alt.Chart(frame).mark_area(line=True, opacity=0.6).encode(
        x=alt.X("time:Q", title="time (s)"), y=alt.Y("weight:Q", title="attention weight"),
        tooltip=[alt.Tooltip("time:Q", format=".2f"), alt.Tooltip("weight:Q", format=".4f")])
    layers = [area]
    if highlight is not None:
        span = pd.DataFrame({"start": [highlight[0]], "end": [highlight[1]]})
        layers.insert(0, alt.Chart(span).mark_rect(color="orange", opacity=0.25).encode(x="start:Q", x2="end:Q"))
    return alt.layer(*layers).properties(title=title, width=620, height=220, autosize=PAD)


def timing_chart(rows: list[dict]) -> alt.Chart:
    """Words on the time axis: our DTW over the converted model's cross-attention against CTranslate2's ``align()``
    (``rows``: word, start, end, ct2_start, ct2_end)."""
    records = []
    for index, row in enumerate(rows):
        label = f"{index + 1}. {row['word']}"
        records.append({"word": label, "order": index, "start": row["start"], "end": row["end"],
                        "source": "this app (transformers)"})
        records.append({"word": label, "order": index, "start": row["ct2_start"], "end": row["ct2_end"],
                        "source": "CTranslate2 align()"})
    frame = pd.DataFrame(records)
    return alt.Chart(frame).mark_bar(height=8).encode(
        x=alt.X("start:Q", title="time (s)"), x2="end:Q",
        y=alt.Y("word:N", sort=alt.EncodingSortField("order", op="min"), title=None),
        yOffset="source:N", color=alt.Color("source:N", legend=alt.Legend(orient="bottom", title=None)),
        tooltip=["word", "source", alt.Tooltip("start:Q", format=".2f"), alt.Tooltip("end:Q", format=".2f")],
    ).properties(width=620, height=max(120, 26 * len(rows)), autosize=PAD)
