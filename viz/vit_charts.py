"""Small Altair charts for the ViT page: mean attention distance against depth (the ViT paper's Fig. 7, right) and
where the [CLS] token's attention goes among the prefix tokens ([CLS], [DIST], registers). Pure: arrays in, charts out.
"""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

# Drawn at its own width × height with the title, axes and legend around it. Without an autosize of its own,
# Streamlit gives a chart "fit", which squeezes all of that into width × height and flattens a short chart.
PAD = alt.AutoSizeParams(type="pad", contains="padding")


def attention_distance_chart(distances: np.ndarray, image_pixels: int) -> alt.Chart:
    """One point per head: x = layer, y = mean attention distance in pixels ``(layers, heads)``; the dashed line is
    the mean distance between two random points of the crop (≈ 0.52 × side), the "attend everywhere" level."""
    layers, heads = distances.shape
    layer_index, head_index = np.meshgrid(np.arange(layers), np.arange(heads), indexing="ij")
    frame = pd.DataFrame({"layer": layer_index.ravel(), "head": head_index.ravel(),
                          "distance": distances.ravel().astype(float)})
    points = alt.Chart(frame).mark_circle(size=70, opacity=0.8).encode(
        x=alt.X("layer:Q", title="network depth (layer)", scale=alt.Scale(domain=[-0.5, layers - 0.5]),
                axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("distance:Q", title="mean attention distance (pixels)",
                scale=alt.Scale(domain=[0, max(float(frame["distance"].max()), 0.55 * image_pixels)])),
        color=alt.Color("head:N", title="head", scale=alt.Scale(scheme="tableau20")),
        tooltip=["layer", "head", alt.Tooltip("distance:Q", format=".1f", title="pixels")],
    )
    uniform = alt.Chart(pd.DataFrame({"y": [0.5214 * image_pixels]})).mark_rule(strokeDash=[4, 4], color="grey"
                                                                                   ).encode(y="y:Q")
    return (points + uniform).properties(width=520, height=300, autosize=PAD)


def prefix_share_chart(shares: np.ndarray, prefix_names: tuple[str, ...], title: str) -> alt.Chart:
    """Stacked bars per head: the share of one query's attention on each prefix token, ``(heads, prefix)``."""
    heads, prefix = shares.shape
    frame = pd.DataFrame({"head": np.repeat(np.arange(heads), prefix), "token": list(prefix_names) * heads,
                          "share": shares.ravel().astype(float)})
    return alt.Chart(frame).mark_bar().encode(
        x=alt.X("head:O", title="head"),
        y=alt.Y("share:Q", title="share of attention", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%")),
        color=alt.Color("token:N", title="prefix token"),
        tooltip=["head", "token", alt.Tooltip("share:Q", format=".1%")],
    ).properties(title=title, width=min(520, 40 * heads + 60), height=200, autosize=PAD)


def norm_histogram_chart(norms: np.ndarray, flagged: np.ndarray, threshold: float, title: str) -> alt.Chart:
    """How many patches have each output norm (Darcet et al. 2024, Fig. 3): ``norms`` and ``flagged`` (bool) of the
    same shape, one value per patch; the flagged (high-norm) patches in their own colour, the outlier threshold as a
    dashed rule."""
    norms = np.asarray(norms, dtype=float).ravel()
    flagged = np.asarray(flagged, dtype=bool).ravel()
    frame = pd.DataFrame({"norm": norms, "kind": np.where(flagged, "high-norm (outlined)", "other patches")})
    bars = alt.Chart(frame).mark_bar().encode(
        x=alt.X("norm:Q", bin=alt.Bin(maxbins=40), title="output norm ‖x‖ after the last layer"),
        y=alt.Y("count():Q", title="patches", stack=True),
        color=alt.Color("kind:N", title=None, sort=["other patches", "high-norm (outlined)"],
                        scale=alt.Scale(domain=["other patches", "high-norm (outlined)"],
                                        range=["#9ca3af", "#d62728"]),
                        legend=alt.Legend(orient="top")),
        tooltip=[alt.Tooltip("count():Q", title="patches"), "kind:N"],
    )
    rule = alt.Chart(pd.DataFrame({"norm": [float(threshold)]})).mark_rule(strokeDash=[4, 4], color="black").encode(
        x="norm:Q", tooltip=[alt.Tooltip("norm:Q", format=".1f", title="outlier above")])
    return (bars + rule).properties(title=title, width=420, height=200, autosize=PAD)
