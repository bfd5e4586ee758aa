"""Figure of the mechanics page's Pre-LN vs Post-LN tab (``models/lessons/norm_placement.py``): every layer's gradient norm at
initialisation in each placement (Xiong et al. 2020, Fig. 3, recomputed on a small stack), and the last layer's
against the stack's depth (their Theorem 1). The small stacks are built and run by the view's analysis
(``models.lessons.norm_placement.placement_gradients``); this module only draws."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.lessons import norm_placement as npl
from viz import export, lines
from viz.figure import Figure, combined, view
from viz.figures.mechanics import PAGE

SHORT = {"post": "Post-LN", "pre": "Pre-LN"}
COLOURS = {"Post-LN": "#d62728", "Pre-LN": "#1f77b4"}


@dataclass(frozen=True)
class NormOptions:
    layers: int = 12  # N: the stack's depth
    d_model: int = 128
    group: str = "ffn_w2"  # whose gradient: one of models.lessons.norm_placement.PARAMETERS
    seeds: int = 2  # stacks averaged (each its own initialisation and batch)
    seed: int = 0


@view("norm_placement", "Pre-LN vs Post-LN: gradient norm per layer at initialisation", NormOptions,
      analysis=npl.placement_gradients, analysis_options=("layers", "d_model", "group", "seeds", "seed"), page=PAGE)
def norm_placement(found: npl.PlacementGradients, options: NormOptions) -> Figure:
    """Gradient norm of each layer's weights (``group``) at initialisation, Post-LN against Pre-LN; beside it the
    last layer's against the depth (one seed)."""
    norms, depth = found.norms, found.depth
    layer_index = np.arange(1, options.layers + 1)
    what = npl.PARAMETERS[options.group]
    per_layer = lines.series_chart(layer_index, {SHORT[p]: norms[p][options.group] for p in npl.PLACEMENTS},
                                   "layer (1 = next to the input)", f"‖∂loss/∂W‖ of {what}", width=330,
                                   title=f"every layer of a {options.layers}-layer stack", colours=COLOURS)
    reference = depth["pre"][0] * np.sqrt(depth["depth"][0] / depth["depth"])  # 1/√L through Pre-LN's first point
    by_depth = lines.series_chart(depth["depth"], {**{SHORT[p]: depth[p] for p in npl.PLACEMENTS}, "∝ 1/√L": reference},
                                  "depth L (layers in the stack)", "last layer's gradient norm", width=330,
                                  title="the last layer against depth", colours={**COLOURS, "∝ 1/√L": "#7f7f7f"},
                                  dashed=("∝ 1/√L",))
    post, pre = norms["post"][options.group], norms["pre"][options.group]
    caption = (f"At Xavier initialisation, {options.seeds} seeded stacks of {options.layers} layers (d_model = "
               f"{options.d_model}, 4 heads, causal LM loss on random tokens, float64), one backward pass each. "
               f"Post-LN: top layer {post[-1]:.3f} vs first {post[0]:.3f} — the gradient grows towards the output, "
               f"and the last layer's does not shrink as the stack deepens. Pre-LN: top {pre[-1]:.3f} vs first "
               f"{pre[0]:.3f}, and every layer's falls like 1/√L with depth. That is why deep Post-LN needs learning-"
               "rate warm-up: at the full rate Adam's first steps on those top layers are too large and training "
               "diverges; Pre-LN starts at the full rate.")
    table = pd.DataFrame({"layer": layer_index, **{f"{p}_{g}": norms[p][g] for p in npl.PLACEMENTS
                                                   for g in npl.PARAMETERS}})
    arrays = {**{f"{p}_{g}": norms[p][g] for p in npl.PLACEMENTS for g in npl.PARAMETERS},
              **{f"by_depth_{k}": v for k, v in depth.items()}}
    return Figure(
        export.file_stem("pre vs post ln gradient norms", f"{options.layers} layers", f"d {options.d_model}",
                         options.group, f"{options.seeds} seeds", f"seed {options.seed}"),
        chart=combined(per_layer, by_depth), charts=(per_layer, by_depth), caption=caption, table=lambda: table,
        payload=lambda: {**dataclasses.asdict(options), **arrays,
                         "loss": {p: float(norms[p]["loss"][0]) for p in npl.PLACEMENTS}},
        arrays=lambda: arrays, metadata={"settings": " ".join(f"{k}={v}" for k, v in
                                                              dataclasses.asdict(options).items())})
