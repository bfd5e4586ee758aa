"""Line and bar charts the lecture sections share (linear attention's cost, gradient norms per layer, the
next-token distribution before/after a penalty, RoPE's wavelengths and perplexity against length). Pure: arrays in,
``alt.Chart`` out; no Streamlit. Fonts sized for a projector."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from viz.heatmap import PAD

AXIS = dict(labelFontSize=14, titleFontSize=15)
LEGEND = alt.Legend(orient="bottom", labelFontSize=14, titleFontSize=14, columns=4)


def series_chart(x: np.ndarray | list, series: dict[str, np.ndarray | list], x_title: str, y_title: str,
                 log_x: bool = False, log_y: bool = False, points: bool = True, width: int = 560, height: int = 320,
                 title: str = "", rules: dict[str, float] | None = None, y_format: str = "",
                 colours: dict[str, str] | None = None, dashed: tuple[str, ...] = (),
                 hrules: dict[str, float] | None = None) -> alt.Chart:
    """Several named series against one x, one line each (NaN points are left out); ``rules``: labelled vertical
    lines (a trained context length, a chosen layer), ``hrules`` horizontal ones; ``dashed``: series drawn dashed
    (references)."""
    frames = []
    for name, values in series.items():
        values = np.asarray(values, dtype=np.float64)
        frame = pd.DataFrame({"x": np.asarray(x, dtype=np.float64), "y": values, "series": name,
                              "dashed": name in dashed})
        frames.append(frame[np.isfinite(frame["y"])])
    frame = pd.concat(frames, ignore_index=True)
    names = list(series)
    scale = alt.Scale(domain=names, range=[colours.get(n, "#7f7f7f") for n in names]) if colours else \
        alt.Scale(domain=names, scheme="category10")
    x_enc = alt.X("x:Q", title=x_title, scale=alt.Scale(type="log", base=2) if log_x else alt.Undefined,
                  axis=alt.Axis(**AXIS))
    y_axis = alt.Axis(**AXIS, format=y_format) if y_format else alt.Axis(**AXIS)
    y_enc = alt.Y("y:Q", title=y_title, scale=alt.Scale(type="log") if log_y else alt.Scale(zero=False), axis=y_axis)
    line = alt.Chart(frame).mark_line(point=points, strokeWidth=3).encode(
        x=x_enc, y=y_enc, color=alt.Color("series:N", title=None, scale=scale, legend=LEGEND),
        strokeDash=alt.condition("datum.dashed", alt.value([6, 4]), alt.value([1, 0])),
        tooltip=[alt.Tooltip("x:Q", title=x_title, format=","), alt.Tooltip("y:Q", title=y_title, format=".4g"),
                 alt.Tooltip("series:N", title="")])
    layers = [line]
    if rules:
        rule_frame = pd.DataFrame({"x": list(rules.values()), "text": list(rules)})
        layers.append(alt.Chart(rule_frame).mark_rule(color="gray", strokeDash=[4, 4]).encode(x="x:Q"))
        layers.append(alt.Chart(rule_frame).mark_text(align="left", baseline="top", dx=4, dy=4, fontSize=13,
                                                       color="gray").encode(x="x:Q", y=alt.value(0), text="text:N"))
    if hrules:
        hframe = pd.DataFrame({"y": list(hrules.values()), "text": list(hrules)})
        layers.append(alt.Chart(hframe).mark_rule(color="gray", strokeDash=[4, 4]).encode(y="y:Q"))
        layers.append(alt.Chart(hframe).mark_text(align="left", baseline="bottom", dx=4, dy=-2, fontSize=13,
                                                  color="gray").encode(y="y:Q", x=alt.value(0), text="text:N"))
    chart = alt.layer(*layers).properties(width=width, height=height, autosize=PAD)
    return chart.properties(title=title) if title else chart


def grouped_bars(categories: list[str], series: dict[str, np.ndarray | list], y_title: str, title: str = "",
                 width: int = 560, height: int = 260, colours: dict[str, str] | None = None,
                 y_format: str = ".3f", horizontal: bool = False) -> alt.Chart:
    """Bars per category, one bar per series side by side (categories keep their order; repeated names are fine
    because position, not the name, orders them)."""
    rows = []
    for name, values in series.items():
        for i, (category, value) in enumerate(zip(categories, values)):
            rows.append({"category": category, "position": i, "value": float(value), "series": name})
    frame = pd.DataFrame(rows)
    names = list(series)
    scale = alt.Scale(domain=names, range=[colours.get(n, "#7f7f7f") for n in names]) if colours else \
        alt.Scale(domain=names, scheme="category10")
    sort = alt.EncodingSortField("position", op="min")
    category = alt.X("category:N", sort=sort, title=None, axis=alt.Axis(labelAngle=-50, labelFontSize=13,
                                                                       labelOverlap=False))
    value = alt.Y("value:Q", title=y_title, axis=alt.Axis(**AXIS))
    offset = alt.XOffset("series:N", sort=names)
    if horizontal:
        category = alt.Y("category:N", sort=sort, title=None, axis=alt.Axis(labelFontSize=13, labelOverlap=False))
        value = alt.X("value:Q", title=y_title, axis=alt.Axis(**AXIS))
        offset = alt.YOffset("series:N", sort=names)
    encoding = dict(color=alt.Color("series:N", title=None, scale=scale, legend=LEGEND),
                    tooltip=["category", alt.Tooltip("value:Q", format=y_format), "series"])
    if len(names) > 1:
        encoding["yOffset" if horizontal else "xOffset"] = offset
    chart = alt.Chart(frame).mark_bar().encode(x=category if not horizontal else value,
                                               y=value if not horizontal else category, **encoding)
    chart = chart.properties(width=width, height=height, autosize=PAD)
    return chart.properties(title=title) if title else chart
