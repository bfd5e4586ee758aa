"""Activation patching (``models.analysis.patching``): how much of the clean answer's logit difference each clean
activation restores in the corrupted run, for the residual stream (point × position) and for each head."""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.analysis import patching
from viz import export
from viz.figure import Figure, view
from viz.heatmap import PAD

RECOVERED = alt.Scale(scheme="redblue", domain=[-1, 1], reverse=True, clamp=True)  # red: restores the clean answer


@dataclass(frozen=True)
class PatchingOptions:
    corrupt: str = ""  # the corrupted prompt, the same number of tokens as the clean one
    clean_answer: str = ""  # one token; "" = the clean prompt's own top-1 next token
    corrupted_answer: str = ""  # one token; "" = the corrupted prompt's own top-1


def _residual_chart(found: patching.Patching) -> alt.Chart:
    points, positions = found.residual.shape
    columns = [f"{p}: {found.clean_tokens[p]}" for p in range(positions)]
    frame = pd.DataFrame([{"point": patching.point_label(point), "order": point, "position": columns[p],
                           "clean token": found.clean_tokens[p], "corrupted token": found.corrupted_tokens[p],
                           "recovered": float(found.residual[point, p])}
                          for point in range(points) for p in range(positions)])
    width = max(10, min(48, 640 // positions))
    return alt.Chart(frame).mark_rect().encode(
        x=alt.X("position:N", sort=columns, title="position: clean token", axis=alt.Axis(labelAngle=-50)),
        y=alt.Y("point:N", sort=[patching.point_label(i) for i in range(points - 1, -1, -1)], title=None),
        color=alt.Color("recovered:Q", scale=RECOVERED, title="recovered"),
        tooltip=["point", "clean token", "corrupted token", alt.Tooltip("recovered:Q", format=".0%")],
    ).properties(width=width * positions, height=14 * points, autosize=PAD,
                 title="Residual stream patched at one position")


def _heads_chart(found: patching.Patching) -> alt.Chart:
    layers, heads = found.heads.shape
    group = heads // found.kv_heads
    frame = pd.DataFrame([{"layer": layer, "head": head, "kv group": head // group,
                           "recovered": float(found.heads[layer, head])}
                          for layer in range(layers) for head in range(heads)])
    return alt.Chart(frame).mark_rect(stroke="white", strokeWidth=0.3).encode(
        x=alt.X("head:O", title="head" + (f" ({group} per key/value group)" if group > 1 else "")),
        y=alt.Y("layer:O"), color=alt.Color("recovered:Q", scale=RECOVERED, title="recovered"),
        tooltip=["layer", "head", "kv group", alt.Tooltip("recovered:Q", format=".0%")],
    ).properties(width=min(400, 36 * heads), height=14 * layers, autosize=PAD,
                 title="One head's output patched at every position")


@view("patching", "Activation patching: what carries the clean answer", PatchingOptions,
      analysis=patching.activation_patching, analysis_options=("corrupt", "clean_answer", "corrupted_answer"),
      example=("The Eiffel Tower is in the city of", PatchingOptions("The Colosseum is in the city of")))
def activation_patching(found: patching.Patching, options: PatchingOptions) -> Figure:
    """The JSON's ``residual`` is ``[point][position]`` (point 0: entering layer 1; point l: after layer l) and
    ``heads`` is ``[layer][head]``, each the recovered fraction of the logit difference."""
    earlier = found.residual[:, :-1] if found.residual.shape[1] > 1 else found.residual  # before the last position
    best = np.unravel_index(int(np.argmax(earlier)), earlier.shape)
    caption = (f"Logit difference logit({found.clean_answer!r}) − logit({found.corrupted_answer!r}): "
               f"{found.clean_difference:+.2f} on the clean prompt, {found.corrupted_difference:+.2f} on the corrupted "
               "one. Each cell: that clean activation put into the corrupted run; 100% = the clean difference is "
               "back, 0% = nothing changed. The last position carries everything by the last layer; before it, "
               f"the most recovered elsewhere is {found.residual[best]:.0%}: {patching.point_label(int(best[0]))}, "
               f"at position {int(best[1])} ({found.clean_tokens[int(best[1])]!r}).")
    return Figure(
        export.file_stem(found.model, found.input_name, "patching",
                         f"{found.clean_answer} vs {found.corrupted_answer}"),
        charts=(_residual_chart(found), _heads_chart(found)), vertical=True, caption=caption,
        table=lambda: pd.DataFrame(found.residual, index=[patching.point_label(i)
                                                         for i in range(found.residual.shape[0])],
                                   columns=[f"{p}: {t}" for p, t in enumerate(found.clean_tokens)]),
        payload=lambda: {"model": found.model, "clean_tokens": list(found.clean_tokens),
                         "corrupted_tokens": list(found.corrupted_tokens), "clean_answer": found.clean_answer,
                         "corrupted_answer": found.corrupted_answer,
                         "clean_logit_difference": found.clean_difference,
                         "corrupted_logit_difference": found.corrupted_difference,
                         "points": [patching.point_label(i) for i in range(found.residual.shape[0])],
                         "residual": found.residual, "heads": found.heads, "kv_heads": found.kv_heads},
        arrays=lambda: {"residual": found.residual, "heads": found.heads},
        metadata={"model": found.model, "clean": " ".join(found.clean_tokens),
                  "corrupted": " ".join(found.corrupted_tokens)})
