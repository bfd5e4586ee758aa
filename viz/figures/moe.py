"""Figures of the mixture-of-experts page (one builder per figure, registered with ``viz.figure.view``): the text by
top-1 expert, the expert colours, every layer's choice per token, one token's gate, expert load and balance,
co-activation, cross-layer consistency, specialisation by token category, and two prompts' load difference.

Builders read a ``models.families.moe.model.RoutingResult`` (or an analysis of one: the specialisation baseline, a pair of runs)
and draw with ``viz.moe_charts``; the statistics come from ``models.analysis.routing``. Layers are numbered 0.. in model
order among the MoE layers; titles and files name them as the page does ("block 3", the transformer block).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from PIL import Image

from models.analysis import routing as stats
from models.core import limits
from models.families.moe.model import (
    SAMPLES,
    PromptPair,
    RoutingResult,
    per_category,
    prompt_pair,
)
from viz import export, moe_charts
from viz.figure import Figure, NoOptions, view


def _stem(result: RoutingResult, *parts) -> str:
    return export.file_stem(result.model.short_name, result.input_name, *parts)


def _metadata(result: RoutingResult, **settings) -> dict[str, str]:
    return {"model": result.model.key, "input": result.input_name, **{k: str(v) for k, v in settings.items()}}


def _payload(result: RoutingResult, **numbers) -> dict:
    """What every JSON file of a routing says besides its numbers: the model, the routed text, tokens, layers."""
    routing = result.routing
    return {"model": result.model.key, "text": routing.text, "tokens": routing.tokens, "layers": routing.layer_labels,
            **numbers}


def _drawn(drawing) -> dict:
    """``viz.moe_charts`` draws big matrices as images and the rest as charts (a pair: a map and its summary beside it):
    the Figure fields each one goes in."""
    if isinstance(drawing, Image.Image):
        return {"image": drawing}
    if isinstance(drawing, tuple):
        return {"charts": drawing, "layout": ((3, 1),)}
    return {"chart": drawing}


# --- tokens by expert ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RoutedOptions:
    layer: int = 0  # the MoE layer, counted 0.. among the MoE layers
    token: int | None = 0  # the token framed in black; None frames none
    width_chars: int = 96  # characters per line (the "two prompts" columns use 56)
    label: str = "top-1 expert of each token"  # the title, before the layer's name


@view("routed_text", "Tokens by expert: the text coloured by each token's top-1 expert", RoutedOptions)
def routed_text(result: RoutingResult, options: RoutedOptions) -> Figure:
    """The text, each token on its top-1 expert's colour with the expert's number under it (Mixtral, Fig. 8)."""
    routing, layer = result.routing, options.layer
    routing.check_layer(layer)
    if options.token is not None:
        routing.check_token(options.token)
    label = routing.layer_label(layer)
    top1, weight, kept = routing.top1[layer], routing.top_weights[layer, :, 0], routing.kept[layer, :, 0]
    chart = moe_charts.routed_text(routing.tokens, routing.raw_tokens, top1, weight, routing.num_experts, kept,
                             selected=options.token, width_chars=options.width_chars,
                             title=f"{options.label}, {label}")
    arrays = {"probs": routing.probs[layer], "top_experts": routing.top_experts[layer],
              "top_weights": routing.top_weights[layer], "kept": routing.kept[layer]}
    return Figure(
        _stem(result, "routing", label), chart=chart,
        table=lambda: pd.DataFrame({"token": routing.tokens, "category": routing.categories, "top-1 expert": top1,
                                    "top-1 weight": weight, "kept": kept}),
        payload=lambda: _payload(result, layer=label, **arrays), arrays=arrays,
        metadata=_metadata(result, layer=label))


@view("expert_legend", "Expert colours", NoOptions)
def expert_legend(result: RoutingResult, options: NoOptions) -> Figure:
    """Each expert's colour with its number on it (colours repeat beyond 9 experts; the numbers do not)."""
    experts = result.routing.num_experts
    colours = moe_charts.expert_colours(experts)
    return Figure(export.file_stem(result.model.short_name, "expert colours"), chart=moe_charts.expert_legend(experts),
                  width="stretch",
                  table=lambda: pd.DataFrame({"expert": range(experts), "colour": colours}),
                  payload=lambda: {"model": result.model.key, "experts": list(range(experts)), "colours": colours},
                  metadata={"model": result.model.key})


@dataclass(frozen=True)
class StripOptions:
    token: int | None = 0  # the token marked by a rule; the strip shows a window of tokens around it
    window: int = 60  # tokens shown (the column labels stay readable)


@view("layer_strip", "Every MoE layer's top-1 expert, token by token", StripOptions)
def layer_strip(result: RoutingResult, options: StripOptions) -> Figure:
    """A column per token, a row per MoE layer, the cell's number the top-1 expert (white: dropped by capacity), for
    ``window`` tokens around the selected one."""
    routing, count = result.routing, len(result.routing.tokens)
    if options.window < 1:
        raise ValueError("the strip's window must hold at least 1 token")
    if options.token is not None:
        routing.check_token(options.token)
    position = options.token or 0
    start = max(0, min(position - options.window // 2, count - options.window))
    shown = slice(start, min(start + options.window, count))
    tokens, top1, kept = routing.tokens[shown], routing.top1[:, shown], routing.kept[:, shown, 0]
    labels = routing.layer_labels
    where = f"tokens {shown.start}-{shown.stop - 1}"
    chart = moe_charts.layer_strip(tokens, top1, labels, routing.num_experts, kept, selected=options.token, offset=start)
    return Figure(
        _stem(result, "top-1 expert per layer", where), chart=chart,
        caption=f"Every MoE layer for tokens {shown.start}–{shown.stop - 1} (the token slider scrolls): a column per "
                "token, a row per layer, the number is the top-1 expert; white = dropped.",
        table=lambda: pd.DataFrame(top1, index=pd.Index(labels, name="layer"),
                                   columns=[f"{shown.start + i}:{t}" for i, t in enumerate(tokens)]),
        payload=lambda: _payload(result, positions=np.arange(shown.start, shown.stop), top1=top1, kept=kept),
        arrays=lambda: {"positions": np.arange(shown.start, shown.stop), "top1": top1, "kept": kept},
        metadata=_metadata(result, tokens=where))


# --- one token's gate ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GateOptions:
    layer: int = 0
    token: int = 0


@view("gate", "One token's gate: router probabilities over every expert", GateOptions)
def gate(result: RoutingResult, options: GateOptions) -> Figure:
    """One token's router distribution over all experts, the dispatched top-k coloured and labelled with their
    weights; the title gives its entropy."""
    routing, layer, position = result.routing, options.layer, options.token
    routing.check_layer(layer)
    routing.check_token(position)
    label = routing.layer_label(layer)
    probs = routing.probs[layer, position]
    arrays = {"probs": probs, "top_experts": routing.top_experts[layer, position],
              "top_weights": routing.top_weights[layer, position]}
    chart = moe_charts.gate_bars(probs, arrays["top_experts"], arrays["top_weights"], float(stats.router_entropy(probs)),
                           f"token {position}, {label}", routing.kept[layer, position])
    return Figure(
        _stem(result, "gate", label, f"token {position}"), chart=chart,
        caption="Bars: the router's probability for every expert. Coloured bars are the experts the token was "
                "dispatched to, labelled with their rank (and, up to 16 experts, the weight that multiplied their "
                f"{'input' if routing.weights_scale_input else 'output'}; hover for it otherwise). Dashed line: "
                "uniform 1/E.",
        table=lambda: pd.DataFrame({"expert": range(routing.num_experts), "probability": probs}),
        payload=lambda: _payload(result, layer=label, token=position, **arrays), arrays=arrays,
        metadata=_metadata(result, layer=label, token=position))


# --- load and balance ----------------------------------------------------------------------------------------------

@view("load", "Load and balance: each expert's share of every layer's assignments", NoOptions)
def load(result: RoutingResult, options: NoOptions) -> Figure:
    """Layer × expert share of assignments, white at the uniform 1/E; the load's coefficient of variation and the
    Switch auxiliary loss per layer beside it."""
    routing = result.routing
    summary = stats.summarise_routing(routing)
    labels = routing.layer_labels
    arrays = {"load": summary.load, "load_cv": summary.cv, "aux_loss": summary.aux_loss}
    return Figure(
        _stem(result, "expert load"), **_drawn(moe_charts.load_heatmap(summary.load, labels, summary.cv, summary.aux_loss)),
        table=lambda: pd.DataFrame(summary.load, index=pd.Index(labels, name="layer"),
                                   columns=[f"expert {e}" for e in range(routing.num_experts)]),
        payload=lambda: _payload(result, **arrays), arrays=arrays, metadata=_metadata(result))


# --- co-activation and layers --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CoactivationOptions:
    layer: int = 0


@view("coactivation", "Co-activation: how often two experts serve the same token", CoactivationOptions)
def coactivation(result: RoutingResult, options: CoactivationOptions) -> Figure:
    """Expert × expert share of tokens whose chosen experts include both; the diagonal is each expert's share."""
    routing, layer = result.routing, options.layer
    routing.check_layer(layer)
    label = routing.layer_label(layer)
    matrix = stats.coactivation(routing.top_experts[layer], routing.num_experts)
    names = [f"expert {e}" for e in range(routing.num_experts)]
    return Figure(
        _stem(result, "coactivation", label), **_drawn(moe_charts.coactivation_chart(matrix)),
        caption="Share of tokens whose chosen experts include both i and j; the diagonal is each expert alone."
                + (" Top-1 routing fills only the diagonal." if routing.top_k == 1 else ""),
        table=lambda: pd.DataFrame(matrix, index=pd.Index(names, name="expert"), columns=names),
        payload=lambda: _payload(result, layer=label, coactivation=matrix), arrays={"coactivation": matrix},
        metadata=_metadata(result, layer=label))


@dataclass(frozen=True)
class ConsistencyOptions:
    scheme: str = "viridis"  # a sequential Vega scheme (the page's colour scale; cividis in presentation mode)


@view("consistency", "Cross-layer consistency of the top-1 choice", ConsistencyOptions)
def consistency(result: RoutingResult, options: ConsistencyOptions) -> Figure:
    """Normalised mutual information between two layers' top-1 experts (expert numbers are arbitrary per layer), and
    how often consecutive tokens keep their top-1 expert against chance (Mixtral §5)."""
    routing = result.routing
    labels = routing.layer_labels
    nmi = stats.cross_layer_consistency(routing.top1)
    repeat, chance = stats.consecutive_repeat_rate(routing.top1)
    arrays = {"nmi": nmi, "consecutive_repeat": repeat, "chance_repeat": chance}
    return Figure(
        _stem(result, "cross-layer consistency"), **_drawn(moe_charts.consistency_chart(nmi, labels, options.scheme)),
        caption="Normalised mutual information between two layers' top-1 experts (1: one predicts the other, up to "
                "renaming). Consecutive tokens keep their top-1 expert: "
                + ", ".join(f"{o:.0%} (chance {c:.0%})" for o, c in zip(repeat, chance)) + " per layer (Mixtral §5).",
        table=lambda: pd.DataFrame(nmi, index=pd.Index(labels, name="layer"), columns=labels),
        payload=lambda: _payload(result, **arrays), arrays=arrays, metadata=_metadata(result))


# --- specialisation ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpecialisationOptions:
    shuffles: int = stats.SHUFFLES  # shuffled routings behind the baseline


@view("specialisation", "Specialisation: token category against expert, vs shuffled routing",
      SpecialisationOptions, analysis=stats.specialisation_of_run, analysis_options=("shuffles",))
def specialisation(data: stats.RunSpecialisation, options: SpecialisationOptions) -> Figure:
    """Mutual information between each token's category and its experts per layer (bars), against the same routes
    shuffled across tokens (ticks: mean and 95th percentile)."""
    result, found = data.result, data.specialisation
    labels = result.routing.layer_labels
    arrays = {"observed_bits": found.observed, "shuffled_mean_bits": found.shuffled_mean,
              "shuffled_p95_bits": found.shuffled_p95}
    chart = moe_charts.specialisation_chart(found.observed, found.shuffled_mean, found.shuffled_p95, labels,
                                      found.category_entropy)
    return Figure(
        _stem(result, "specialisation"), chart=chart,
        caption=f"Mutual information between each token's category and its experts, against the same routes "
                f"shuffled across tokens ({data.shuffles} times). Tokens counted per category: "
                f"{per_category(found.counts)}. Categories come "
                "from the token's characters and whether its line reads as code (models/analysis/routing.py).",
        table=lambda: pd.DataFrame(arrays, index=pd.Index(labels, name="layer")),
        payload=lambda: _payload(result, shuffles=data.shuffles, category_counts=found.counts,
                                 category_entropy_bits=found.category_entropy, **arrays),
        arrays=arrays, metadata=_metadata(result, shuffles=data.shuffles))


# --- two prompts ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadDifferenceOptions:
    prompt_a: str = SAMPLES["Prose"]
    prompt_b: str = SAMPLES["Code"]
    max_tokens: int = limits.DEFAULT_TOKENS  # each prompt is cut to this many tokens


@view("load_difference", "Two prompts: expert load of A minus B", LoadDifferenceOptions,
      analysis=prompt_pair, analysis_options=("prompt_a", "prompt_b", "max_tokens"))
def load_difference(pair: PromptPair, options: LoadDifferenceOptions) -> Figure:
    """Layer × expert difference of the two prompts' expert load, in percentage points, centred at 0."""
    routing_a, routing_b = pair.a.routing, pair.b.routing
    load_a = stats.expert_load(routing_a.top_experts, routing_a.num_experts)
    load_b = stats.expert_load(routing_b.top_experts, routing_b.num_experts)
    model = pair.a.model
    arrays = {"load_a": load_a, "load_b": load_b, "difference": load_a - load_b}
    return Figure(
        export.file_stem(model.short_name, "load difference", pair.a.input_name[:20], pair.b.input_name[:20]),
        **_drawn(moe_charts.load_difference(load_a, load_b, routing_a.layer_labels, "A", "B")), width="stretch",
        payload=lambda: {"model": model.key, "prompt_a": routing_a.text, "prompt_b": routing_b.text,
                         "layers": routing_a.layer_labels, **arrays},
        arrays=arrays, metadata={"model": model.key, "prompt_a": pair.a.input_name, "prompt_b": pair.b.input_name})
