"""Head ablation (``models.analysis.ablation``): a layers × heads map of how much the target token's log-probability
changes when that one head is switched off, with GQA's key/value groups marked."""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.analysis import ablation
from viz import export
from viz.figure import Figure, view
from viz.heatmap import PAD


@dataclass(frozen=True)
class AblationOptions:
    target: str = ""  # one token as typed (e.g. " Paris"); "" = the model's own top-1 next token
    mode: str = "zero"  # "zero": the head's output set to 0; "mean": to its mean over the prompt


def _head_label(found: ablation.Ablation, head: int) -> str:
    return f"{head}" if found.kv_heads == found.num_heads else f"{head} (kv {found.kv_group(head)})"


def _cells(found: ablation.Ablation) -> pd.DataFrame:
    layers, heads = np.meshgrid(np.arange(found.num_layers), np.arange(found.num_heads), indexing="ij")
    effect = found.effect.ravel().astype(float)
    return pd.DataFrame({
        "layer": layers.ravel(), "head": heads.ravel(),
        "head label": [_head_label(found, h) for h in heads.ravel()],
        "kv group": [found.kv_group(h) for h in heads.ravel()],
        "change in log p": effect, "p with the head off": np.exp(found.clean_logprob + effect),
    })


@view("ablation", "Which heads matter: one head switched off at a time", AblationOptions,
      analysis=ablation.head_ablation, analysis_options=("target", "mode"))
def head_ablation(found: ablation.Ablation, options: AblationOptions) -> Figure:
    """Red: switching the head off lowers p(target), the head helped; blue: it raises it. The JSON's ``effect`` is
    ``[layer][head]`` Δ log p(target)."""
    cells = _cells(found)
    reach = max(float(np.abs(found.effect).max()), 1e-6)
    order = [_head_label(found, h) for h in range(found.num_heads)]
    width = min(640, 44 * found.num_heads)
    chart = alt.Chart(cells).mark_rect(stroke="white", strokeWidth=0.3).encode(
        x=alt.X("head label:N", sort=order, title="head" + (" (key/value group)" if found.kv_heads < found.num_heads
                                                             else ""), axis=alt.Axis(labelAngle=0)),
        y=alt.Y("layer:O", title="layer"),
        color=alt.Color("change in log p:Q", scale=alt.Scale(scheme="redblue", domain=[-reach, reach]),
                        title="Δ log p(target)"),
        tooltip=["layer", "head", "kv group", alt.Tooltip("change in log p:Q", format="+.3f"),
                 alt.Tooltip("p with the head off:Q", format=".2%")],
    ).properties(width=width, height=min(640, 16 * found.num_layers),
                 title=f"Δ log p({found.target!r}) with one head off ({found.mode} ablation)")
    if found.kv_heads < found.num_heads:  # a rule between key/value groups: heads sharing K and V side by side
        size = found.num_heads // found.kv_heads
        edges = pd.DataFrame({"head label": [order[g * size] for g in range(1, found.kv_heads)]})
        # a rule sits mid-band: move it half a cell left, onto the boundary
        chart = chart + alt.Chart(edges).mark_rule(color="black", strokeWidth=1.5,
                                                   xOffset=-width / found.num_heads / 2).encode(
            x=alt.X("head label:N", sort=order))
    chart = chart.properties(autosize=PAD)  # on the outermost chart only (Vega-Lite)
    strongest = np.argsort(found.effect, axis=None)[:3]
    named = ", ".join(f"layer {i // found.num_heads} head {i % found.num_heads} "
                      f"({found.effect.flat[i]:+.2f})" for i in strongest)
    caption = (f"Target {found.target!r}: p = {np.exp(found.clean_logprob):.1%} with every head on. The heads whose "
               f"loss lowers it most: {named}. Red: the head helped the target; blue: it worked against it. "
               + ("Heads in one key/value group share K and V (GQA). " if found.kv_heads < found.num_heads else "")
               + ("Zero ablation sets a head's output to 0; mean ablation to its average over the prompt."))
    return Figure(
        export.file_stem(found.model, found.input_name, "head ablation", found.mode,
                         f"target {found.target} {found.target_id}"),  # the id: a token may be all punctuation
        chart=chart, caption=caption, table=lambda: cells,
        payload=lambda: {"model": found.model, "target": found.target, "target_id": found.target_id,
                         "mode": found.mode, "clean_logprob": found.clean_logprob, "effect": found.effect,
                         "kv_heads": found.kv_heads},
        arrays=lambda: {"effect": found.effect},
        metadata={"model": found.model, "input": found.input_name, "target": found.target, "mode": found.mode})
