"""Figures of the translation page: cross-attention as a word alignment (Bahdanau et al. 2015, fig. 3) with gold
links and alignment error rate (Och & Ney 2003), one decoding step (where it looked, what it chose from), and the
minis' measured quality (accuracy against sentence length, their fig. 2; AER of each head).

The translator's self-attention and the all-heads summary of its cross-attention are the shared views
(viz/figures/attention.py with ``kind`` = "encoder", "decoder" or "cross").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.core.results import STEP_CONVENTION
from models.families.translation import model as translation
from models.families.translation.model import TranslationResult
from models.minis.translation import card
from models.core import selection
from models.core.selection import Head, Layer
from viz import alignment as charts
from viz import export, heatmap
from viz.figure import Figure, NoOptions, view

OPENING = selection.OPENING  # the layer and head the model's figures open on (``opening_head``)
UNITS = ("words", "tokens")
ALIGNMENT_CAPTION = (
    "Rows: each output word, labelled with the word it produced (row t is the decoder step whose input was the "
    "previous word). Columns: source words. Each row sums to 1. Orange dots: the source word each output word "
    "attends to most. Red squares: the grammar's gold alignment (shown for the samples).")


def _stem(result: TranslationResult, *parts) -> str:
    return export.file_stem(result.model.short_name, result.input_name, *parts)


def _cross_head(result: TranslationResult, layer: Layer, head: Head) -> tuple[int | None, int | None]:
    """(layer index or None for every layer averaged, head index or None for the mean) of the cross-attention, with
    ``OPENING`` what the model opens on (the mini Transformer's best-aligned head from its card; else the last layer,
    heads averaged)."""
    if "cross" not in result.attention:
        raise ValueError(f"{result.model.key} has no attention (one fixed context vector): pick a model with "
                         "attention")
    maps = result.maps("cross")
    opening_layer, opening_head = result.opening_head
    index = selection.layer_index(layer, maps.num_layers, opening_layer, averages=True)
    return index, selection.head_index(head, maps.heads_in(index or 0), opening_head)


def _names(layer: int | None, head: int | None) -> tuple[str, str]:
    """How a layer and a head are named in file names: "all layers" / "layer 2", "mean" / "head 3"."""
    return "all layers" if layer is None else f"layer {layer}", "mean" if head is None else f"head {head}"


@selection.checked
@dataclass(frozen=True)
class AlignmentOptions:
    layer: Layer = OPENING  # a decoder layer, or "all" (averaged); "opening": the one the model opens on
    head: Head = OPENING  # a head, or "mean"; "opening": the one the model opens on
    units: str = "words"  # "words" (summed over source pieces, averaged over output pieces) or "tokens"
    width: int = 800  # pixels for the whole chart, labels and legend included (420 when two stand side by side)


@view("alignment", "Cross-attention as a word alignment", AlignmentOptions)
def alignment(result: TranslationResult, options: AlignmentOptions) -> Figure:
    """Output words (rows) × source words (columns), with each output word's most-attended source word and, for the
    grammar's samples, the gold links and the alignment error rate; an image beyond 64 words a side."""
    if options.units not in UNITS:
        raise ValueError(f"unknown units {options.units!r}; choose one of {', '.join(UNITS)}")
    layer, head = _cross_head(result, options.layer, options.head)
    found = translation.alignment_view(result, layer, head, options.units == "words")
    weights, out = found.weights, result.output
    chart = image = None
    caption = ALIGNMENT_CAPTION
    if max(weights.shape) > heatmap.MAX_CHART_TOKENS:
        image = heatmap.attention_image(weights, None, "greys")
        caption = f"{found.title} ({weights.shape[0]} × {weights.shape[1]}). {caption}"
    else:
        chart = charts.alignment_chart(weights, found.row_labels, found.column_labels, found.title, gold=found.gold,
                                       argmax=found.argmax, max_width=options.width,
                                       languages=getattr(out, "languages", ("English", "French")))
    layer_name, head_name = _names(layer, head)
    shown = {"layer": "mean" if layer is None else layer, "head": "mean" if head is None else head}
    return Figure(
        _stem(result, "cross", layer_name, head_name, options.units), chart=chart, image=image, caption=caption,
        table=lambda: export.matrix_frame(weights, found.row_labels, found.column_labels),
        # weights (output, source), links as (source, output) index pairs, AER (None without gold)
        payload={"model": result.model.key, "source": out.source_text, "translation": out.translation, **shown,
                 "units": options.units, "output_labels": found.row_labels, "source_labels": found.column_labels,
                 "weights": weights, "argmax_links": sorted(found.argmax or ()),
                 "gold_links": None if found.gold is None else sorted(found.gold),
                 "alignment_error_rate": found.aer},
        arrays=lambda: {"weights": weights},
        metadata={"model": result.model.key, "text": out.source_text, "translation": out.translation, **shown,
                  "units": options.units})


@selection.checked
@dataclass(frozen=True)
class DecodingStepOptions:
    step: int = 1  # the output token, counted from 1
    layer: Layer = OPENING  # of the cross-attention, as in AlignmentOptions
    head: Head = OPENING


@view("decoding_step", "Step through decoding", DecodingStepOptions)
def decoding_step(result: TranslationResult, options: DecodingStepOptions) -> Figure:
    """One output step: the source attention of the decoder position that produced it (when the model attends) and
    the top candidates the token was chosen from."""
    steps, out, t = result.generation, result.output, options.step
    if not 1 <= t <= len(steps):
        raise ValueError(f"step {t} does not exist: the translation has {len(steps)} output tokens")
    chosen = steps[t - 1]
    candidates = [c.token for c in chosen.candidates]
    probabilities = np.array([c.probability for c in chosen.candidates])
    arrays = {"candidate_probabilities": probabilities}
    parts, where, drawn = [f"step {t}"], {}, []
    if "cross" in result.attention:  # the fixed-context GRU reads one vector at every step: nothing to draw
        layer, head = _cross_head(result, options.layer, options.head)
        maps = result.maps("cross")
        arrays["source_attention"] = translation.cross_weights(maps, layer, head)[chosen.query]
        described = translation.describe_view(maps, layer, head)
        drawn.append(heatmap.token_bars(arrays["source_attention"], out.source_tokens,
                                        f"Source attention at step {t} ({described})"))
        parts += ["cross", *_names(layer, head)]
        where = {"layer": "mean" if layer is None else layer, "head": "mean" if head is None else head}
    drawn.append(heatmap.probability_bars(candidates, list(probabilities), f"Top candidates at step {t}",
                                          highlight=chosen.token))
    beams = f" (beam width {out.num_beams})" if out.num_beams > 1 else ""
    return Figure(
        _stem(result, *parts), charts=tuple(drawn), layout=((3, 2),) if len(drawn) > 1 else (), width="stretch",
        caption=f"{STEP_CONVENTION} Decoding: {out.strategy}{beams}. Attention and probabilities come from one "
                "teacher-forced forward over the final output, so they belong to the chosen hypothesis; under beam "
                "search the chosen token need not be the most probable.",
        payload={"model": result.model.key, "source": out.source_text, "step": t, "token": chosen.token,
                 "probability": chosen.probability, **where, "source_tokens": out.source_tokens,
                 "candidates": candidates, **arrays},
        arrays=arrays, metadata={"model": result.model.key, "text": out.source_text, "step": t, **where})


@view("accuracy_by_length", "The minis' exact match against source length", NoOptions,
      analysis=translation.measured_quality)
def accuracy_by_length(metrics: dict, options: NoOptions) -> Figure:
    """Exact match of each mini on held-out sentences, per source-length bucket (Bahdanau et al. 2015, fig. 2)."""
    rows = card.length_rows(metrics)
    return Figure(
        "translation-minis_exact-match-by-length", chart=charts.accuracy_by_length_chart(rows), width="stretch",
        caption="Held-out generated sentences. Without attention, one fixed vector must carry the whole sentence, and "
                "accuracy falls as sentences grow (Cho et al. 2014; Bahdanau et al. 2015, fig. 2).",
        table=lambda: pd.DataFrame(rows), payload=metrics)


@view("aer_grid", "The mini Transformer's alignment error rate per head", NoOptions,
      analysis=translation.measured_quality)
def aer_grid(metrics: dict, options: NoOptions) -> Figure:
    """AER of each cross-attention head of the mini Transformer against the grammar's gold links (held out)."""
    measured = metrics.get("models", {}).get("transformer", {}).get("alignment")
    if not measured:
        raise ValueError("The mini Transformer's alignment was not measured: train it with "
                         "`python -m models.minis.translation.train --models transformer`.")
    per_head, per_layer = np.array(measured["per_head"]), np.array(measured["per_layer"])
    return Figure(
        "translation-mini-transformer_aer-per-layer-and-head",
        chart=charts.aer_grid_chart(per_head, "Mini Transformer: AER of each cross-attention head"),
        caption="Per decoder layer, heads averaged: " + ", ".join(
            f"layer {i}: {v:.3f}" for i, v in enumerate(per_layer)) +
            f"; all layers and heads averaged: {measured['all_layers_average']:.3f}.",
        table=lambda: pd.DataFrame(per_head, index=pd.Index(range(len(per_head)), name="layer"),
                                   columns=[f"head {h}" for h in range(per_head.shape[1])]),
        payload={"per_head": per_head, "per_layer": per_layer, "all_layers_average": measured["all_layers_average"],
                 "best_head": measured["best_head"]},
        arrays=lambda: {"per_head": per_head, "per_layer": per_layer})
