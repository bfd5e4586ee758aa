"""Figures of the GPT page's decoding penalties (``models/analysis/penalties.py``): the next-token distribution at a
generated step before and after each of the presence, frequency and repetition penalties, and beam-search
hypotheses ranked with and without the length penalty. Both read a generation (``run_options``) and the model."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pandas as pd

from models.analysis import penalties
from models.core import decoding
from viz import export, lines
from viz.figure import Figure, combined, view

BEFORE, AFTER = "before", "after"
COLOURS = {BEFORE: "#9e9e9e", AFTER: "#d62728"}


@dataclass(frozen=True)
class PenaltyOptions:
    step: int = 1  # the generated token (1-based) whose distribution is shown
    presence: float = 1.0  # OpenAI's range is −2..2; 0 = off
    frequency: float = 1.0
    repetition: float = 1.3  # CTRL's paper suggests 1.2; 1 = off
    top: int = 6  # candidates: the top ones before and after each penalty


@view("decoding_penalties", "Decoding penalties: the next-token distribution before and after", PenaltyOptions,
      analysis=penalties.penalty_effect, analysis_options=("step", "presence", "frequency", "repetition", "top"),
      run_options=True)
def decoding_penalties(effect: penalties.PenaltyEffect, options: PenaltyOptions) -> Figure:
    """One panel per penalty: the candidates' probabilities before (grey) and after (red); a candidate's label
    says how often it was generated so far (×n) or that it is only in the prompt (·)."""
    def mark(i: int) -> str:
        return f" ×{effect.counts[i]}" if effect.counts[i] else (" ·" if effect.in_context[i] else "")

    labels = [f"{label}{mark(i)}" for i, label in enumerate(effect.labels)]
    titles = {"presence": f"presence −{effect.values['presence']:g} if generated",
              "frequency": f"frequency −{effect.values['frequency']:g} × count",
              "repetition": f"repetition ÷{effect.values['repetition']:g} if in context"}
    parts = tuple(lines.grouped_bars(labels, {BEFORE: effect.before, AFTER: effect.after[name]}, "probability",
                                     titles[name], width=200, height=22 * len(labels), colours=COLOURS,
                                     horizontal=True) for name in decoding.PENALTIES)
    caption = (f"Step {effect.step}: the model's raw next-token distribution after {effect.context_tokens} tokens "
               f"(it generated {effect.chosen_label!r} here, with the settings used). ×n: generated n times so far, "
               "what presence and frequency penalties count (the prompt is not penalised, as in OpenAI's "
               "definition); ·: only in "
               "the prompt, which the repetition penalty also sees. Presence subtracts a flat amount once a token "
               "has appeared; frequency subtracts per repeat; repetition divides a positive logit (multiplies a "
               "negative one) for anything in the context.")
    table = pd.DataFrame({"token": effect.labels, "id": effect.candidates, "generated_count": effect.counts,
                          "in_context": effect.in_context, "before": effect.before,
                          **{f"after_{name}": effect.after[name] for name in decoding.PENALTIES}})
    return Figure(
        export.file_stem(effect.model, "penalties", f"step {effect.step}",
                         *(f"{name} {value:g}" for name, value in effect.values.items()), effect.input_name),
        chart=combined(*parts), charts=parts, caption=caption, table=lambda: table,
        payload=lambda: {"step": effect.step, "values": effect.values, "chosen_id": effect.chosen,
                         "candidates": table.to_dict(orient="records")},
        arrays=lambda: {"candidates": effect.candidates, "before": effect.before,
                        **{f"after_{n}": effect.after[n] for n in decoding.PENALTIES}},
        metadata={"model": effect.model, "input": effect.input_name, "step": effect.step})


@dataclass(frozen=True)
class LengthOptions:
    alpha: float = 2.0  # the length penalty α (transformers' default is 1.0; 0 ranks by total log-probability)
    beams: int = 4


@view("length_penalty", "Beam search's length penalty: hypotheses ranked by Σ log p and by Σ log p / L^α",
      LengthOptions, analysis=penalties.beam_hypotheses, analysis_options=("alpha", "beams"), run_options=True)
def length_penalty(beams: penalties.BeamHypotheses, options: LengthOptions) -> Figure:
    """Each returned hypothesis's total log-probability (α = 0, before) and its length-penalised score (after),
    as bars on their own axes; the table has the texts."""
    labels = [f"#{i + 1} ({n} tokens)" for i, n in enumerate(beams.lengths)]
    before = lines.grouped_bars(labels, {"Σ log p (α = 0)": beams.sum_logprobs}, "total log-probability",
                                "before: ranked by Σ log p", width=220, height=30 * len(labels),
                                colours={"Σ log p (α = 0)": COLOURS[BEFORE]}, horizontal=True)
    after = lines.grouped_bars(labels, {f"Σ log p / L^{beams.alpha:g}": beams.scores}, "score",
                               f"after: α = {beams.alpha:g}", width=220, height=30 * len(labels),
                               colours={f"Σ log p / L^{beams.alpha:g}": COLOURS[AFTER]}, horizontal=True)
    order_before = list(pd.Series(beams.sum_logprobs).rank(ascending=False, method="first").astype(int))
    order_after = list(pd.Series(beams.scores).rank(ascending=False, method="first").astype(int))
    same = len(set(beams.lengths)) == 1
    caption = ("Every hypothesis has the same length, so dividing by L^α cannot reorder them: the length penalty "
               "matters only when beams end (end-of-text) at different lengths — try a chat-formatted prompt."
               if same else
               f"Rank by Σ log p: {order_before}; by the penalised score: {order_after}. α > 0 spreads each "
               "hypothesis's cost over its length, so longer ones are no longer punished for every extra token.")
    table = pd.DataFrame({"hypothesis": labels, "text": beams.texts, "length": beams.lengths,
                          "sum_logprob": beams.sum_logprobs, "score": beams.scores,
                          "transformers_score": beams.library_scores, "rank_before": order_before,
                          "rank_after": order_after})
    return Figure(
        export.file_stem(beams.model, "length penalty", f"alpha {beams.alpha:g}", f"{beams.beams} beams",
                         beams.input_name),
        chart=combined(before, after), charts=(before, after), caption=caption, table=lambda: table,
        payload=lambda: {**dataclasses.asdict(options), "hypotheses": table.to_dict(orient="records")},
        metadata={"model": beams.model, "input": beams.input_name, "alpha": beams.alpha})
