"""One explanation method's relevance over the input tokens (GPT, encoder, translation): the CLI's
``--view attribution --method M`` on the text pages (``app/cli.py`` maps ``attribution`` there to this view; the ViT
page's own ``attribution`` view draws pixel maps)."""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.analysis import explanations as explainable
from models.core.text import with_marks
from viz import export
from viz.figure import Figure, view
from viz.heatmap import PAD


@dataclass(frozen=True)
class TokenAttributionOptions:
    method: str = "gradient_rollout"  # a name in models.analysis.methods.METHODS
    target: int | None = None  # GPT: a vocabulary id; translation: an output position; None: the default target
    token: str = ""  # GPT: a target token as typed; encoder: a reference sentence ("" = its own embedding)
    replacement: str = "mean"
    ig_steps: int = 32


@view("token_attribution", "One explanation method's relevance of each input token", TokenAttributionOptions,
      analysis=explainable.attribution, analysis_options=("method", "target", "token", "replacement", "ig_steps"))
def token_attribution(found, options: TokenAttributionOptions) -> Figure:
    ex, explained, model = found
    scores = np.asarray(explained.scores[options.method], dtype=np.float32)
    names = list(ex.unit_names)  # one per unit
    frame = pd.DataFrame({"position": list(ex.units), "token": [f"{i}: {t}" for i, t in zip(ex.units, names)],
                          "score": scores.astype(np.float64)})
    chart = alt.Chart(frame).mark_bar().encode(
        x=alt.X("token:N", sort=alt.EncodingSortField("position", op="min"), title=None,
                axis=alt.Axis(labelAngle=-50, labelLimit=110, labelOverlap=False)),
        y=alt.Y("score:Q", title="relevance"),
        color=alt.condition(alt.datum.score >= 0, alt.value("steelblue"), alt.value("#c44e52")),
        tooltip=["token", alt.Tooltip("score:Q", format=".4g")],
    ).properties(width=min(900, 34 * len(names)), height=220, autosize=PAD)
    settings = {"model": model, "method": options.method, "target": ex.target_name}
    what = explained.describe(options.method)
    payload = {**settings, "what": what, "target_kind": ex.target_kind, "tokens": names,
               "positions": list(ex.units), "scores": scores, "replacement": ex.replacement,
               "target_probability": explained.probability, "notes": list(ex.notes)}
    if explained.ig_delta is not None:
        payload["integrated_gradients_delta"] = explained.ig_delta
        payload["integrated_gradients_difference"] = explained.ig_difference
    return Figure(export.file_stem(model.split("/")[-1], options.method, f"target {ex.target_name}"), chart=chart,
                  caption=with_marks(f"{what}: each input token's relevance for "
                                     f"{ex.target_name!r} ({ex.target_kind}).", names, [ex.target_name]),
                  table=lambda: frame, payload=payload,
                  arrays=lambda: {"scores": scores, "positions": np.asarray(ex.units)},
                  metadata={k: str(v) for k, v in settings.items()})

