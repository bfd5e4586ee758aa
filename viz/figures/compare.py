"""Two runs compared (``models.analysis.compare``): a layer × head map of how differently each head attends in the
two runs, its mean per layer, and the chosen head of both runs side by side with their difference."""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.analysis import compare
from viz import export, heatmap
from viz.figure import Figure, view
from viz.heatmap import PAD


@dataclass(frozen=True)
class CompareOptions:
    text2: str = ""  # the second prompt; "" = the same prompt (then model2 must be given)
    model2: str = ""  # a second model with the same tokenizer; "" = the same model
    distance: str = "js"  # "js" or "tv"; with different token counts a head statistic (e.g. "entropy_bits")
    layer: int = 0  # the head shown side by side
    head: int = 0
    scheme: str = "viridis"


def _difference_chart(delta: np.ndarray, tokens: list[str], allowed: np.ndarray, title: str) -> alt.Chart:
    labels = heatmap.token_labels(tokens)
    q, k = np.meshgrid(np.arange(delta.shape[0]), np.arange(delta.shape[1]), indexing="ij")
    frame = pd.DataFrame({"query": np.asarray(labels, dtype=object)[q.ravel()],
                          "key": np.asarray(labels, dtype=object)[k.ravel()],
                          "query position": q.ravel(), "key position": k.ravel(), "difference": delta.ravel(),
                          "state": np.where(allowed.ravel(), "visible", "masked")})
    reach = max(float(np.abs(delta).max()), 1e-6)
    side = max(200, min(400, 24 * len(tokens)))
    return alt.Chart(frame).mark_rect().encode(
        x=alt.X("key:N", sort=heatmap.BY_KEY_POSITION, title="key", axis=alt.Axis(labelAngle=-90, labelLimit=70)),
        y=alt.Y("query:N", sort=heatmap.BY_QUERY_POSITION, title="query", axis=alt.Axis(labelLimit=70)),
        color=alt.condition(alt.datum.state == "masked", alt.value(heatmap.MASKED_HEX),
                            alt.Color("difference:Q", scale=alt.Scale(scheme="redblue", domain=[-reach, reach],
                                                                      reverse=True),
                                      legend=alt.Legend(title="second − first", orient="bottom"))),
        tooltip=["query", "query position", "key", "key position", alt.Tooltip("difference:Q", format="+.4f")],
    ).properties(width=side, height=side, title=title, autosize=PAD)


def _per_layer_chart(found: compare.Comparison) -> alt.Chart:
    frame = pd.DataFrame({"layer": np.arange(len(found.per_layer)), "value": found.per_layer.astype(float)})
    return alt.Chart(frame).mark_bar(color="steelblue").encode(
        x=alt.X("layer:O"), y=alt.Y("value:Q", title=f"mean over heads: {found.measure_label}"),
        tooltip=["layer", alt.Tooltip("value:Q", format=".4f")],
    ).properties(width=min(640, 18 * len(frame) + 40), height=160, autosize=PAD, title="Per layer")


def side_by_side(found: compare.Comparison, layer: int, head: int, scheme: str) -> tuple:
    """The head ``(layer, head)`` of both runs, and their difference when the tokens pair up (small inputs)."""
    maps_a, maps_b = found.first.maps("self"), found.second.maps("self")
    a, b = maps_a.head(layer, head), maps_b.head(layer, head)  # checks layer and head with a message
    if max(a.shape[0], b.shape[0]) > heatmap.MAX_CHART_TOKENS:
        return ()
    size = 300
    charts = [heatmap.attention_chart(a, maps_a.query_tokens, maps_a.key_tokens, maps_a.allowed(layer),
                                      f"first: layer {layer} head {head}", scheme, size=size, compact=True,
                                      linked=False),
              heatmap.attention_chart(b, maps_b.query_tokens, maps_b.key_tokens, maps_b.allowed(layer),
                                      f"second: layer {layer} head {head}", scheme, size=size, compact=True,
                                      linked=False)]
    if found.same_length:
        charts.append(_difference_chart(b - a, maps_a.query_tokens, maps_a.allowed(layer) | maps_b.allowed(layer),
                                        "difference"))
    return tuple(charts)


@view("compare", "Two runs compared, head by head", CompareOptions, analysis=compare.compare_runs,
      analysis_options=("text2", "model2", "distance"),
      example=("The Eiffel Tower is in the city of", CompareOptions(text2="The Colosseum is in the city of")))
def compare_runs(found: compare.Comparison, options: CompareOptions) -> Figure:
    """The layer × head map (JSON ``per_head``: ``[layer][head]``), the per-layer means, and one head side by side."""
    maps = found.first.maps("self")
    group = maps.num_heads // max(1, int(getattr(maps, "num_kv_heads", 0) or maps.num_heads))
    per_head = heatmap.head_statistic_chart(found.per_head, found.measure_label, (options.layer, options.head),
                                            options.scheme, group_size=group)
    shown = side_by_side(found, options.layer, options.head, options.scheme)
    strongest = np.unravel_index(int(np.argmax(found.per_head)), found.per_head.shape)
    caption = (f"First: {found.first_label!r}; second: {found.second_label!r}. {found.note} The most different head: "
               f"layer {int(strongest[0])} head {int(strongest[1])} ({found.per_head[strongest]:.3f}). Click a cell "
               "to see that head of both runs side by side."
               + ("" if shown else " (Inputs longer than 64 tokens: the side-by-side maps are left out.)"))
    first_tokens, second_tokens = found.first.maps("self").query_tokens, found.second.maps("self").query_tokens
    return Figure(
        export.file_stem(found.first.model.short_name, found.first.input_name, "compare", found.second.input_name,
                         found.second.model.short_name, found.measure),
        # the page draws charts[0] clickable; then the per-layer means, and the two maps side by side, their
        # difference under them (three in a row would crowd a laptop's column)
        charts=(per_head, _per_layer_chart(found)) + shown, layout=((1,), (1,), (1, 1)),
        caption=caption,
        table=lambda: pd.DataFrame(found.per_head, index=pd.Index(range(found.per_head.shape[0]), name="layer"),
                                   columns=[f"head {h}" for h in range(found.per_head.shape[1])]),
        payload=lambda: {"first": {"model": found.first.model.short_name, "tokens": list(first_tokens)},
                         "second": {"model": found.second.model.short_name, "tokens": list(second_tokens)},
                         "same_length": found.same_length, "measure": found.measure,
                         "measure_label": found.measure_label, "note": found.note, "per_head": found.per_head,
                         "per_layer": found.per_layer},
        arrays=lambda: {"per_head": found.per_head, "per_layer": found.per_layer},
        metadata={"first": found.first_label, "second": found.second_label, "measure": found.measure,
                  "models": f"{found.first.model.short_name} / {found.second.model.short_name}"})
