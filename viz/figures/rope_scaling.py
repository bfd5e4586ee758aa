"""Figures of the positional page's "beyond the training length" tab (``models/lessons/positional/scaling.py``): RoPE's
wavelengths against the context under each scaling, the score against relative distance with ALiBi's bias beside it,
and SmolLM2's measured perplexity against length (the shipped ``bench/case_rope_ppl.py`` result)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from models.lessons.positional import scaling
from viz import export, lines
from viz.figure import Figure, NoOptions, combined, view

PAGE = "positional"
MEASURED = Path(__file__).resolve().parents[2] / "sample_data" / "measured" / "rope_ppl.json"
COLOURS = {"none": "#7f7f7f", "pi": "#1f77b4", "ntk": "#2ca02c", "yarn": "#d62728"}
SHORT = {"none": "no scaling", "pi": "PI (linear)", "ntk": "NTK-aware", "yarn": "YaRN"}


@dataclass(frozen=True)
class ScalingOptions:
    head_dim: int = 64  # SmolLM2-135M's
    base: float = 100000.0  # SmolLM2-135M's rope_theta
    trained: int = 8192  # L₀: SmolLM2-135M's max_position_embeddings
    factor: float = 4.0  # s: the new context is s·L₀


@view("rope_scaling", "RoPE past the training length: PI, NTK-aware and YaRN frequencies and scores", ScalingOptions,
      data="options", page=PAGE)
def rope_scaling(_, options: ScalingOptions) -> Figure:
    """Per pair: the wavelength 2π/θ'_i under each scaling (log), with L₀ and s·L₀ marked; and the score of a unit
    query and key against relative distance under each, beside ALiBi's bias (formula level)."""
    d, b, s, L0 = options.head_dim, options.base, options.factor, options.trained
    found = {kind: scaling.scaled_frequencies(kind, d, b, s, L0) for kind in scaling.SCALINGS}
    pairs = np.arange(d // 2)
    named = {SHORT[k]: scaling.wavelengths(f) for k, (f, _) in found.items()}
    colours = {SHORT[k]: c for k, c in COLOURS.items()}
    wave = lines.series_chart(pairs, named, "pair i (0 = fastest)", "wavelength 2π/θ′ᵢ (positions)", log_y=True,
                              points=False, width=340, title="wavelength of each pair", colours=colours,
                              y_format="~s", hrules={"L₀": L0, "s·L₀": s * L0})
    distances = np.unique(np.round(np.geomspace(1, s * L0 * 1.25, 400))).astype(int)
    scores = {SHORT[k]: scaling.score_by_distance(f, distances, scale) for k, (f, scale) in found.items()}
    score = lines.series_chart(distances, scores, "relative distance Δ (log)", "score of q = k (1 at Δ = 0)",
                               log_x=True, points=False, width=340, title="score against distance", colours=colours,
                               rules={"L₀": L0, "s·L₀": s * L0})
    heads = 8
    alibi = scaling.alibi_bias_by_distance(heads, distances)
    alibi_chart = lines.series_chart(distances, {f"head {h + 1}": alibi[h] for h in range(0, heads, 2)},
                                     "relative distance Δ (log)", "ALiBi bias −m_h·Δ", log_x=True, points=False,
                                     width=300, title="ALiBi (formula): the same line at any Δ",
                                     rules={"L₀": L0, "s·L₀": s * L0})
    ramp, low, high = scaling.yarn_ramp(d, b, L0)
    theta = found["none"][0]
    turns = L0 * theta / (2 * np.pi)
    past = int((scaling.wavelengths(theta) > L0).sum())
    caption = (f"d = {d}, base b = {b:g}, trained on L₀ = {L0:,} positions, target s·L₀ = {s * L0:,.0f} (s = {s:g}). "
               f"{past} of {d // 2} pairs have a wavelength longer than L₀: they never made a full turn in training, "
               f"so angles past L₀ are new to them — that is where plain RoPE breaks. PI divides every frequency by s "
               f"(the fastest pairs too); NTK-aware raises the base to {scaling.ntk_base(d, b, s):,.0f}, leaving the "
               f"fastest pair alone and dividing the slowest by s; YaRN keeps pairs 0–{int(low)} (more than 32 turns "
               f"in L₀), interpolates pairs ≥ {int(np.ceil(high))} (under 1 turn) and ramps between, and multiplies "
               f"every logit by {found['yarn'][1]:.3f}. ALiBi adds −m_h·Δ to the scores instead of rotating: the "
               "bias at distances past L₀ follows the same line (drawn from the formula, not measured).")
    table = pd.DataFrame({"pair": pairs, "turns_in_trained_context": turns, "yarn_ramp": ramp,
                          **{f"wavelength_{k}": scaling.wavelengths(f) for k, (f, _) in found.items()},
                          **{f"theta_{k}": f for k, (f, _) in found.items()}})
    arrays = {**{f"theta_{k}": f for k, (f, _) in found.items()}, "distances": distances,
              **{f"score_{k}": scores[SHORT[k]] for k in found}, "alibi_bias": alibi, "yarn_ramp": ramp}
    return Figure(
        export.file_stem("rope scaling", f"d {d}", f"base {b:g}", f"trained {L0}", f"factor {s:g}"),
        charts=(wave, score, alibi_chart), layout=((1, 1), (1,)), caption=caption,
        table=lambda: table, payload=lambda: {**dataclasses.asdict(options), **arrays,
                                              "logit_scale": {k: v for k, (_, v) in found.items()}},
        arrays=lambda: arrays, metadata=dataclasses.asdict(options))


MEASURED_LONG = MEASURED.with_name("rope_ppl_long.json")  # past the trained context, when it has been run


def measured_perplexity(path: Path = MEASURED) -> dict:
    """A shipped ``bench/case_rope_ppl.py`` result."""
    if not path.exists():
        raise ValueError(f"no measurement at {path}; run: python -m bench.case_rope_ppl")
    return json.loads(path.read_text())


NAMES = {"default": "no scaling", "linear": "PI (linear)", "dynamic": "dynamic NTK", "yarn": "YaRN"}


def _perplexity_chart(measured: dict):
    kinds = measured["kinds"]
    colours = {"no scaling": COLOURS["none"], "PI (linear)": COLOURS["pi"], "dynamic NTK": COLOURS["ntk"],
               "YaRN": COLOURS["yarn"]}
    ends = next(iter(kinds.values()))["bucket_end"]
    series = {NAMES.get(k, k): v["prefix_perplexity"] for k, v in kinds.items()}
    trained = measured["trained_context"]
    rules = {"trained L₀": trained} if trained <= ends[-1] else None
    chart = lines.series_chart(ends, series, "tokens of context (prefix length)", "perplexity", width=340,
                               title=f"{measured['length']:,} tokens, s = {measured['factor']:g}", colours=colours,
                               rules=rules)
    where = ("inside the trained context: what each scaling costs where none is needed (PI and YaRN squeeze "
             "positions even here; dynamic NTK changes nothing below L₀)" if measured["length"] <= trained else
             f"{measured['length'] - trained:,} tokens past the trained context")
    text = (f"{measured['length']:,} tokens, {where}; scalings measured: "
            f"{', '.join(NAMES.get(k, k) for k in kinds)}. Reproduce: `{measured['command']}`.")
    return chart, text


@view("rope_perplexity", "SmolLM2's perplexity against length under each RoPE scaling (measured)", NoOptions,
      data="options", page=PAGE)
def rope_perplexity(_, options: NoOptions) -> Figure:
    """Perplexity of every prefix length from the shipped measurements (one chart per file), one line per scaling,
    the trained context marked."""
    files = [measured_perplexity()] + ([measured_perplexity(MEASURED_LONG)] if MEASURED_LONG.exists() else [])
    drawn = [_perplexity_chart(measured) for measured in files]
    first = files[0]
    caption = (f"Measured: {first['model']} on {first['text']}, one causal forward per scaling and file "
               f"({first['machine']}, nice'd on a shared 2-core machine); perplexity of the first L tokens. Trained "
               f"context L₀ = {first['trained_context']:,} (its config's max_position_embeddings). "
               + " ".join(f"({i + 1}) {text}" for i, (_, text) in enumerate(drawn)))
    if len(files) == 1:
        caption += (" Past L₀ needs forwards of more than 8,192 tokens per scaling, minutes each on a CPU: run "
                    "`python -m bench.case_rope_ppl --length 16384 --bucket 1024 --out "
                    "sample_data/measured/rope_ppl_long.json` and this tab draws it too.")
    rows = [{"file": i, "length": m["length"], "scaling": k, "tokens": e, "prefix_perplexity": p,
             "bucket_perplexity": q}
            for i, m in enumerate(files) for k, v in m["kinds"].items()
            for e, p, q in zip(v["bucket_end"], v["prefix_perplexity"], v["bucket_perplexity"])]
    charts = tuple(chart for chart, _ in drawn)
    return Figure(export.file_stem("smollm2 rope scaling perplexity", *(f"{m['length']} tokens" for m in files)),
                  chart=combined(*charts) if len(charts) > 1 else charts[0], charts=charts, caption=caption,
                  table=lambda: pd.DataFrame(rows), payload=lambda: {"measurements": files})
