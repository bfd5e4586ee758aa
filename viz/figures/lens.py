"""The logit lens of a causal LM's prompt run (``models.analysis.lens``): a layer × position grid of each layer's top
token, coloured by the probability that layer gives the model's final prediction, and that prediction's rank by layer
at the last position read."""
from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import numpy as np
import pandas as pd

from models.analysis import lens
from viz import export
from viz.figure import Figure, view
from viz.heatmap import PAD

CELL_HEIGHT = 16  # px per layer row
GRID_WIDTH = 640  # px the grid's positions share: fits a laptop's page column (64 positions: 10 px, no text)
TEXT_MIN_CELL = 34  # px: narrower cells show colour only; the tooltip still names the token


@dataclass(frozen=True)
class LensOptions:
    positions: int = 16  # how many positions, ending at ``last`` (at most 64)
    last: int = -1  # the last position read; -1 = the input's last token
    scheme: str = "viridis"


def _cells(found: lens.Lens) -> pd.DataFrame:
    rows = []
    for layer in range(found.num_layers + 1):
        for column, position in enumerate(found.positions):
            candidates = found.top_tokens[layer][column]
            rows.append({
                "layer": layer, "layer name": found.layer_label(layer), "position": position,
                "input": f"{position}: {found.tokens[position]}", "top token": candidates[0],
                "top probability": float(found.top_probs[layer, column, 0]),
                "final token": found.final_tokens[column],
                "final token probability": float(found.final_probs[layer, column]),
                "final token rank": int(found.final_ranks[layer, column]),
                "top 5": "  ".join(f"{token} {p:.0%}" for token, p in zip(candidates, found.top_probs[layer, column])),
            })
    return pd.DataFrame(rows)


def lens_grid_chart(cells: pd.DataFrame, found: lens.Lens, scheme: str) -> alt.Chart:
    cell_width = max(8, GRID_WIDTH // len(found.positions))
    order = [f"{p}: {found.tokens[p]}" for p in found.positions]
    layers = [found.layer_label(layer) for layer in range(found.num_layers, -1, -1)]  # the output on top
    base = alt.Chart(cells).encode(
        x=alt.X("input:N", sort=order, title="input position: token (the prediction is for the next one)",
                axis=alt.Axis(labelAngle=-50, labelLimit=110)),
        y=alt.Y("layer name:N", sort=layers, title=None),
    )
    rect = base.mark_rect().encode(
        color=alt.Color("final token probability:Q", scale=alt.Scale(scheme=scheme, domain=[0, 1]),
                        title="p(final prediction)"),
        tooltip=["layer name", "input", "top token", alt.Tooltip("top probability:Q", format=".1%"), "top 5",
                 "final token", alt.Tooltip("final token probability:Q", format=".1%"), "final token rank"],
    )
    chart = rect
    if cell_width >= TEXT_MIN_CELL:
        text = base.mark_text(fontSize=9, limit=cell_width - 2).encode(
            text="top token:N",
            color=alt.condition(alt.datum["final token probability"] > 0.55, alt.value("black"), alt.value("white")))
        chart = rect + text
    return chart.properties(width=cell_width * len(found.positions), height=CELL_HEIGHT * (found.num_layers + 1),
                            autosize=PAD,  # not Streamlit's "fit", which squeezes the cells
                            title="Each layer's top next token (final norm + unembedding)")


def lens_rank_chart(found: lens.Lens) -> alt.Chart:
    column = len(found.positions) - 1
    frame = pd.DataFrame({"layer": np.arange(found.num_layers + 1),
                          "rank": found.final_ranks[:, column] + 1,
                          "probability": found.final_probs[:, column]})
    return alt.Chart(frame).mark_line(point=True).encode(
        x=alt.X("layer:Q", title="layer (0 = embeddings)", axis=alt.Axis(tickMinStep=1, format="d")),
        y=alt.Y("rank:Q", scale=alt.Scale(type="log"), sort="descending",
                title=f"rank of {found.final_tokens[column]!r} (1 = top)"),
        tooltip=["layer", "rank", alt.Tooltip("probability:Q", format=".2%")],
    ).properties(width=GRID_WIDTH, height=180, autosize=PAD,
                 title=f"After token {found.positions[-1]}: the final prediction's rank by layer")


@view("lens", "Logit lens: what each layer predicts", LensOptions, analysis=lens.logit_lens,
      analysis_options=("positions", "last"))
def logit_lens(found: lens.Lens, options: LensOptions) -> Figure:
    """The grid and the rank curve; the files hold every layer's top-5 tokens and probabilities, and the final
    prediction's probability and rank, at each position read (JSON: one entry per layer, the last the output)."""
    cells = _cells(found)
    first, last = found.positions[0], found.positions[-1]
    column = len(found.positions) - 1
    final_layer_of = next((layer for layer in range(found.num_layers + 1)
                           if found.final_ranks[layer:, column].max() == 0), found.num_layers)
    caption = (f"Layer 0 is the embeddings; the top row is the model's output. After token {last} the model "
               f"predicts {found.final_tokens[column]!r} ({found.final_probs[-1, column]:.0%}); it is the top token "
               f"from {found.layer_label(final_layer_of)} on. Hover a cell for its top 5.")
    return Figure(
        export.file_stem(found.model, found.input_name, f"{found.stream} logit lens".strip(),
                         f"positions {first}-{last}"),
        charts=(lens_grid_chart(cells, found, options.scheme), lens_rank_chart(found)), vertical=True,
        caption=caption,
        table=lambda: cells,
        payload=lambda: {
            "model": found.model, "positions": list(found.positions),
            "tokens": [found.tokens[p] for p in found.positions], "next_token": found.final_tokens[-1],
            "layers": [{"layer": layer, "name": found.layer_label(layer),
                        "top_token": [cell[0] for cell in found.top_tokens[layer]],
                        "top_prob": found.top_probs[layer, :, 0], "final_token_prob": found.final_probs[layer],
                        "final_token_rank": found.final_ranks[layer],
                        "top_5": [list(cell) for cell in found.top_tokens[layer]],
                        "top_5_prob": found.top_probs[layer]}
                       for layer in range(found.num_layers + 1)]},
        arrays=lambda: {"positions": np.asarray(found.positions), "top_ids": found.top_ids,
                        "top_probs": found.top_probs, "final_ids": found.final_ids,
                        "final_probs": found.final_probs, "final_ranks": found.final_ranks},
        metadata={"model": found.model, "input": found.input_name, "layers": "0 = embeddings, last = output"})


@view("decoder_lens", "Logit lens of the decoder, step by step", LensOptions, analysis=lens.decoder_logit_lens,
      analysis_options=("positions", "last"))
def decoder_logit_lens(found: lens.Lens, options: LensOptions) -> Figure:
    """The same grid and files for an encoder–decoder's decoder: one column per output step (its input token is the
    one produced before it), each layer's top token for the step's output."""
    return logit_lens(found, options)
