"""Attention knockout (``models.analysis.knockout``): the prediction before and after chosen query → key edges are
cut in chosen layers, and the sweep of the last position's edge to each earlier token, layer window by layer
window."""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.analysis import knockout
from models.core.selection import LAST, Layer
from models.core.text import with_marks
from viz import export
from viz.figure import Figure, view
from viz.heatmap import PAD

EXAMPLE = "The Eiffel Tower is in the city of"  # SmolLM2: 9 tokens, "Eiffel Tower" at 1-3


@dataclass(frozen=True)
class KnockoutOptions:
    keys: str = ""  # key positions to cut, e.g. "2" or "1-3,5" (from 0; negative: from the end)
    queries: str = ""  # "" = the last position; "later" = every query after each key; or positions like keys
    first_layer: Layer = 0
    last_layer: Layer = LAST
    target: str = ""  # one token as typed; "" = the model's own top-1 next token


@dataclass(frozen=True)
class SweepOptions:
    window: int = 5  # layers cut at once, centred on each layer (Geva et al. use 9 of GPT-2 XL's 48)
    target: str = ""


def _prediction_chart(found: knockout.Knockout) -> alt.Chart:
    rows = [{"run": run, "order": order, "token": token, "rank": rank, "probability": p}
            for order, (run, top) in enumerate((("as it is", found.top_before), ("edges cut", found.top_after)))
            for rank, (token, p) in enumerate(top)]
    frame = pd.DataFrame(rows)
    frame["label"] = [f"{r + 1}. {t}" for r, t in zip(frame["rank"], frame["token"])]
    frame["target"] = frame["token"] == found.target
    return alt.Chart(frame).mark_bar().encode(
        y=alt.Y("label:N", sort=alt.EncodingSortField("rank", op="min"), title=None, axis=alt.Axis(labelLimit=140)),
        x=alt.X("probability:Q", scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%")),
        color=alt.condition(alt.datum.target, alt.value("crimson"), alt.value("steelblue")),
        row=alt.Row("run:N", sort=["as it is", "edges cut"], title=None),
        tooltip=["run", "token", alt.Tooltip("probability:Q", format=".2%")],
    ).properties(width=360, height=24 * knockout.TOP_K, title="Top next tokens (red: the target)").resolve_scale(
        y="independent")  # each run its own top tokens


def _edges_chart(found: knockout.Knockout) -> alt.Chart:
    """The prompt's tokens, the cut keys in red and the queries that lose them outlined."""
    frame = pd.DataFrame({"position": range(len(found.tokens)), "token": list(found.tokens),
                          "role": ["key cut" if p in found.keys else "query" if p in found.queries else "other"
                                   for p in range(len(found.tokens))]})
    frame["label"] = [f"{p}: {t}" for p, t in zip(frame["position"], frame["token"])]
    return alt.Chart(frame).mark_rect(stroke="white").encode(
        x=alt.X("label:N", sort=alt.EncodingSortField("position", op="min"), title=None,
                axis=alt.Axis(labelAngle=-50, labelLimit=110, labelOverlap=False)),  # every token named
        color=alt.Color("role:N", scale=alt.Scale(domain=["key cut", "query", "other"],
                                                  range=["crimson", "orange", "#dddddd"]), title=None),
        tooltip=["position", "token", "role"],
    ).properties(width=max(240, min(640, 44 * len(found.tokens))), height=24, autosize=PAD,  # "fit" squeezed it to nothing
                 title=f"Edges cut in layers {found.layers[0]}–{found.layers[1]}")


@view("knockout", "Attention knockout: cut query → key edges", KnockoutOptions,
      analysis=knockout.attention_knockout,
      analysis_options=("keys", "queries", "first_layer", "last_layer", "target"),
      example=(EXAMPLE, KnockoutOptions(keys="1-3")))
def attention_knockout(found: knockout.Knockout, options: KnockoutOptions) -> Figure:
    """The cut edges and the top next tokens before and after; the JSON holds both distributions' top 5 and p(target)
    with and without the cut."""
    caption = (f"p({found.target!r}) after the prompt: {found.probability:.1%} as it is, "
               f"{found.knocked_probability:.1%} with the edges from position(s) "
               f"{', '.join(map(str, found.queries))} to {', '.join(map(str, found.keys))} cut in layers "
               f"{found.layers[0]}–{found.layers[1]} ({found.relative_change:+.0%}). A cut edge is removed from the "
               "attention mask: the query spreads its attention over the keys it still sees.")
    caption = with_marks(caption, found.tokens, [token for token, _ in (*found.top_before, *found.top_after)])
    return Figure(
        export.file_stem(found.model, found.input_name, "knockout", f"keys {'-'.join(map(str, found.keys))}",
                         f"layers {found.layers[0]}-{found.layers[1]}", f"target {found.target} {found.target_id}"),
        charts=(_edges_chart(found), _prediction_chart(found)), vertical=True, caption=caption, width="stretch",
        table=lambda: pd.DataFrame([{"run": run, "rank": rank + 1, "token": token, "probability": p}
                                    for run, top in (("as it is", found.top_before), ("edges cut", found.top_after))
                                    for rank, (token, p) in enumerate(top)]),
        payload=lambda: {"model": found.model, "tokens": list(found.tokens), "keys": list(found.keys),
                         "queries": list(found.queries), "layers": list(found.layers), "target": found.target,
                         "target_id": found.target_id, "probability": found.probability,
                         "knocked_probability": found.knocked_probability,
                         "relative_change": found.relative_change,
                         "top_before": [list(pair) for pair in found.top_before],
                         "top_after": [list(pair) for pair in found.top_after]},
        arrays=lambda: {"probability": np.asarray([found.probability, found.knocked_probability])},
        metadata={"model": found.model, "input": found.input_name, "target": found.target,
                  "keys": ",".join(map(str, found.keys)), "queries": ",".join(map(str, found.queries)),
                  "layers": f"{found.layers[0]}-{found.layers[1]}"})


@view("knockout_sweep", "Attention knockout: the last token's edges, window by window", SweepOptions,
      analysis=knockout.knockout_sweep, analysis_options=("window", "target"))
def knockout_sweep(found: knockout.KnockoutSweep, options: SweepOptions) -> Figure:
    """Layers × positions: the relative change of p(target) when the last position cannot attend to that position in
    the window of layers centred on that layer. The JSON's ``change`` is ``[layer][position]``."""
    layers, positions = found.change.shape
    columns = [f"{p}: {t}" for p, t in enumerate(found.tokens)]
    frame = pd.DataFrame([{"layer": layer, "window": "{}–{}".format(*found.window_of(layer)), "position": p,
                           "token": columns[p], "change": float(found.change[layer, p]),
                           "p(target)": float(found.knocked[layer, p])}
                          for layer in range(layers) for p in range(positions)])
    reach = max(float(np.abs(found.change).max()), 1e-6)
    width = max(10, min(48, 640 // positions))
    chart = alt.Chart(frame).mark_rect().encode(
        x=alt.X("token:N", sort=columns, title="key position cut from the last position",
                axis=alt.Axis(labelAngle=-50, labelLimit=110)),
        y=alt.Y("layer:O", title=f"centre of the {found.window}-layer window"),
        color=alt.Color("change:Q", scale=alt.Scale(scheme="redblue", domain=[-reach, reach]),
                        title="relative change of p"),
        tooltip=["window", "token", alt.Tooltip("change:Q", format="+.1%"), alt.Tooltip("p(target):Q", format=".2%")],
    ).properties(width=width * positions, height=min(640, 16 * layers), autosize=PAD,
                 title=f"p({found.target!r}) when the last token cannot see one token in a window of layers")
    worst = np.unravel_index(int(np.argmin(found.change)), found.change.shape)
    caption = (f"p({found.target!r}) = {found.probability:.1%} as it is. Red: cutting that edge in those layers lowers "
               f"it (the information flows there); blue: it raises it. The largest drop, "
               f"{found.change[worst]:+.0%}, is position {int(worst[1])} ({found.tokens[int(worst[1])]!r}) in layers "
               "{}–{}.".format(*found.window_of(int(worst[0]))))
    caption = with_marks(caption, found.tokens)
    return Figure(
        export.file_stem(found.model, found.input_name, "knockout sweep", f"window {found.window}",
                         f"target {found.target} {found.target_id}"),
        chart=chart, caption=caption,
        table=lambda: pd.DataFrame(found.change, index=pd.Index(range(layers), name="window centre layer"),
                                   columns=columns),
        payload=lambda: {"model": found.model, "tokens": list(found.tokens), "window": found.window,
                         "target": found.target, "target_id": found.target_id, "probability": found.probability,
                         "windows": [list(found.window_of(layer)) for layer in range(layers)],
                         "change": found.change, "knocked_probability": found.knocked},
        arrays=lambda: {"change": found.change, "knocked_probability": found.knocked},
        metadata={"model": found.model, "input": found.input_name, "target": found.target,
                  "window": str(found.window)})
