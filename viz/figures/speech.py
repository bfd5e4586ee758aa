"""Figures of the speech page (Whisper): the log-mel spectrogram, cross-attention of every output token over the
audio frames drawn under it on one time axis, one decoding step, and word timestamps from cross-attention compared
with CTranslate2's own ``align()``.

Encoder self-attention (1,500 × 1,500 frames) and decoder self-attention are the shared views (``head``,
``head_zoom`` in viz/figures/attention.py with ``kind`` = "encoder" or "decoder").
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.core.audio import SECONDS_PER_ENCODER_FRAME
from models.core.results import STEP_CONVENTION
from models.families.speech import model as speech
from models.families.speech import timing
from models.families.speech.model import SpeechResult
from models.core import selection
from models.core.selection import Head, Layer
from viz import export, heatmap, speech_charts
from viz.figure import Figure, NoOptions, view

CROSS_CAPTION = (
    "Top: the log-mel spectrogram Whisper's encoder read (80 mel bins, 128 for large-v3; 10 ms frames), with the "
    "words where the alignment heads' cross-attention places them (dynamic time warping). Bottom: each output token's "
    "cross-attention over the audio's 20 ms encoder frames (row t is the decoder position that produced token t); "
    "each row is scaled to its own maximum. Every row sums to 1 over all 1,500 frames, the 30 s window's padding "
    "included; only the frames holding audio are drawn.")


def _stem(result: SpeechResult, *parts) -> str:
    return export.file_stem(result.model.short_name, result.input_name, *parts)


def _heads_name(layer: Layer, head: Head) -> str:
    """How a choice of heads is named in file names."""
    if head == selection.NAMED:
        return "alignment heads"
    return ("all layers" if layer == selection.ALL else f"layer {layer}") + " " + \
        ("all heads" if head == selection.MEAN else f"head {head}")


def _about(result: SpeechResult) -> dict:
    out = result.output
    return {"model": result.model.key, "text": out.text, "task": out.task, "language": out.language}


@selection.checked
@dataclass(frozen=True)
class SpeechCrossOptions:
    layer: Layer = selection.ALL  # a decoder layer, or every layer ("all")
    head: Head = selection.NAMED  # the alignment heads ("alignment"), a head, or every head ("mean")


@view("cross", "Cross-attention over the audio", SpeechCrossOptions)
def speech_cross(result: SpeechResult, options: SpeechCrossOptions) -> Figure:
    weights, described = speech.cross_attention(result, options.layer, options.head)
    frames = result.audio_frames
    shown = weights[:, :frames]
    out = result.output
    words = [(w.text, w.start, w.end) for w in result.words]
    mel = result.mel[:, :2 * frames]
    image = speech_charts.spectrogram_with_attention(mel, shown, out.output_tokens, words,
                                               f"{result.model.key}: cross-attention, {described}")
    times = [f"{i * SECONDS_PER_ENCODER_FRAME:.2f}s" for i in range(frames)]
    return Figure(
        _stem(result, "cross", _heads_name(options.layer, options.head)), image=image,
        caption=CROSS_CAPTION, width="stretch",
        table=lambda: export.matrix_frame(shown, out.output_tokens, times),
        payload=lambda: {**_about(result), "heads": described, "tokens": out.output_tokens,
                         "token_ids": out.output_ids, "frames": frames, "seconds_per_frame": SECONDS_PER_ENCODER_FRAME,
                         "words": [{"word": w, "start": a, "end": b} for w, a, b in words],
                         "alignment_heads": [list(pair) for pair in result.alignment_heads], "weights": shown},
        # the full rows (1,500 frames, padding included: they sum to 1) and the spectrogram the encoder read
        arrays=lambda: {"cross_attention": weights, "log_mel": result.mel},
        metadata={**_about(result), "heads": described, "audio_frames": frames})


@view("spectrogram", "Log-mel spectrogram", NoOptions)
def spectrogram(result: SpeechResult, options: NoOptions) -> Figure:
    frames = 2 * result.audio_frames
    mel = result.mel[:, :frames]
    image = speech_charts.spectrogram_with_attention(mel, None, [], [(w.text, w.start, w.end) for w in result.words],
                                               f"log-mel spectrogram, {result.seconds:.2f} s")
    return Figure(
        _stem(result, "log-mel"), image=image, width="stretch",
        caption=f"{mel.shape[0]} mel bins (0–8 kHz, Slaney scale) every 10 ms from a 25 ms Hann window, log10, "
                "floored 8 below the maximum, scaled as (x + 4) / 4: what Whisper's encoder reads. The full 30 s "
                "window (3,000 frames, zero-padded) is in the NPZ.",
        table=lambda: pd.DataFrame(mel.T, index=[f"{i / 100:.2f}s" for i in range(frames)],
                                   columns=[f"mel {b}" for b in range(mel.shape[0])]),
        payload=lambda: {**_about(result), "seconds": result.seconds, "frames": frames, "log_mel": mel},
        arrays=lambda: {"log_mel": result.mel}, metadata=_about(result))


@selection.checked
@dataclass(frozen=True)
class SpeechStepOptions:
    step: int = 1  # the output token, counted from 1
    layer: Layer = selection.ALL
    head: Head = selection.NAMED


@view("speech_step", "Step through decoding", SpeechStepOptions)
def speech_step(result: SpeechResult, options: SpeechStepOptions) -> Figure:
    steps, out, t = result.generation, result.output, options.step
    if not 1 <= t <= len(steps):
        raise ValueError(f"step {t} does not exist: the output has {len(steps)} tokens")
    chosen = steps[t - 1]
    weights, described = speech.cross_attention(result, options.layer, options.head)
    attention = weights[chosen.query, :result.audio_frames]  # the row whose distribution chose it
    word = next((w for w in result.words if w.tokens[0] <= t - 1 < w.tokens[1]), None)
    candidates = [c.token for c in chosen.candidates]
    probabilities = np.array([c.probability for c in chosen.candidates])
    charts = (speech_charts.attention_over_time(attention, f"Step {t}, {chosen.token!r}: where it listened ({described})",
                                          None if word is None else (word.start, word.end)),
              heatmap.probability_bars(candidates, list(probabilities), f"Top candidates at step {t}",
                                       highlight=chosen.token))
    beams = f" (beam width {out.num_beams})" if out.num_beams > 1 else ""
    return Figure(
        _stem(result, f"step {t}", _heads_name(options.layer, options.head)), charts=charts,
        caption=f"{STEP_CONVENTION} Decoding: {out.strategy}{beams}. Attention and probabilities come from one "
                "teacher-forced forward over the final output. Orange: the word this token belongs to, timed by DTW.",
        payload={**_about(result), "step": t, "token": chosen.token, "probability": chosen.probability,
                 "heads": described, "candidates": candidates, "candidate_probabilities": probabilities,
                 "attention": attention},
        arrays={"attention": attention, "candidate_probabilities": probabilities},
        metadata={**_about(result), "step": t, "heads": described})


@view("word_timestamps", "Word timestamps against CTranslate2's align()", NoOptions,
      analysis=timing.ctranslate2_alignment)
def word_timestamps(comparison: dict, options: NoOptions) -> Figure:
    rows = comparison["words"]
    table = pd.DataFrame(rows)
    return Figure(
        export.file_stem(comparison["model"], comparison["input"], "word timestamps"),
        chart=speech_charts.timing_chart(rows),
        caption=f"Each word's start and end from this app's DTW over the converted model's alignment heads, and from "
                f"CTranslate2's own align() on the same spectrogram. Largest difference "
                f"{comparison['max_difference']:.2f} s, mean {comparison['mean_difference']:.3f} s.",
        table=table, payload=comparison,
        arrays=lambda: {"start": table["start"].to_numpy(), "end": table["end"].to_numpy(),
                        "ct2_start": table["ct2_start"].to_numpy(), "ct2_end": table["ct2_end"].to_numpy()},
        metadata={"model": comparison["model"], "max_difference": comparison["max_difference"]})
