"""Figures of the mechanics page's linear-attention tab (``models/lessons/linear_attention.py``): softmax, linear and flow
attention on the same Q, K, V of the page's sentence; causal linear attention as an RNN, step by step; and the
measured time and memory against N. The toy layer is an analysis in models/lessons/linear_attention.py (``toy_layer``);
defaults are what the page shows first.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.lessons import linear_attention as la
from models.lessons import mechanics
from viz import export, lines, mechanics_charts
from viz.figure import Figure, NoOptions, combined, view
from viz.figures.mechanics import PAGE, SENTENCE


@dataclass(frozen=True)
class LinearOptions:
    """One head of the page's toy layer (``models.lessons.mechanics``): its Q, K, V feed all three attentions."""

    sentence: str = SENTENCE
    source: str = "minilm"
    d_model: int = 8
    heads: int = 2
    d_head: int = 4
    seed: int = 0
    head: int = 0
    scheme: str = "viridis"


@dataclass(frozen=True)
class RecurrentOptions(LinearOptions):
    step: int | None = None  # the token whose update is shown; None: the last


LAYER = ("sentence", "source", "d_model", "heads", "d_head", "seed")  # what the toy layer's analysis reads


def _qkv(trace: mechanics.AttentionTrace, options: LinearOptions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not 0 <= options.head < options.heads:
        raise ValueError(f"head {options.head} is outside 0..{options.heads - 1}: the layer has {options.heads} heads")
    h = options.head
    return trace.q[h], trace.k[h], trace.v[h]  # (N, d_k) each


def _parts(options: LinearOptions) -> tuple[str, ...]:
    return (f"D {options.d_model}", f"H {options.heads}", f"dk {options.d_head}", f"seed {options.seed}",
            f"head {options.head}")


@view("linear_attention", "Softmax vs linear vs flow attention on the same Q, K, V", LinearOptions,
      analysis=la.toy_layer, analysis_options=LAYER, page=PAGE)
def linear_attention_view(trace: mechanics.AttentionTrace, options: LinearOptions) -> Figure:
    """The three implicit attention matrices side by side, and each output's distance from softmax's per token."""
    q, k, v = _qkv(trace, options)
    result = la.compare(q, k, v, trace.config.scale)
    labels = mechanics_charts.unique_labels(trace.query_tokens)
    annotate = len(labels) <= 12
    maps = [(result.softmax_matrix, "softmax(QKᵀ/√d_k)"), (result.linear_matrix, "linear: φ(Q)φ(K)ᵀ, φ = elu+1"),
            (result.flow_matrix, "flow attention (Flowformer)")]
    parts = tuple(mechanics_charts.matrix_chart(matrix, labels, labels, title, probabilities=True, width=230, annotate=annotate,
                                      colour_max=float(matrix.max()), scheme=options.scheme)
                  for matrix, title in maps)
    difference = lines.grouped_bars(labels, {"linear − softmax": result.difference_linear,
                                             "flow − softmax": result.difference_flow},
                                    "‖output − softmax output‖₂", "How far each output row is from softmax's",
                                    width=240, height=18 * len(labels), horizontal=True,
                                    colours={"linear − softmax": "#1f77b4", "flow − softmax": "#ff7f0e"})
    norm = float(np.linalg.norm(result.softmax_output, axis=1).mean())
    caption = (f"Same Q, K, V (head {options.head}, {len(labels)} tokens, d_k = {options.d_head}). Linear attention "
               "never forms the matrix: it sums φ(K)ᵀV (d_k × d_v) once and reads it with each φ(q_i); the matrix "
               "drawn is what it implies. Mean distance from the softmax output: linear "
               f"{result.difference_linear.mean():.3f}, flow {result.difference_flow.mean():.3f} (softmax output rows "
               f"have norm {norm:.3f} on average). Flow-attention rows need not sum to 1: its sigmoid allocation and "
               "softmax competition move weight between tokens; its colours run to its own largest entry.")
    arrays = {"softmax_matrix": result.softmax_matrix, "linear_matrix": result.linear_matrix,
              "flow_matrix": result.flow_matrix, "softmax_output": result.softmax_output,
              "linear_output": result.linear_output, "flow_output": result.flow_output,
              "difference_linear": result.difference_linear, "difference_flow": result.difference_flow}
    return Figure(
        export.file_stem("linear vs softmax vs flow attention", *_parts(options), options.sentence[:40]),
        charts=parts + (difference,), layout=((1, 1),),  # two by two: softmax | linear, flow | the difference
        caption=caption,
        table=lambda: pd.DataFrame({"token": trace.query_tokens, "difference_linear": result.difference_linear,
                                    "difference_flow": result.difference_flow,
                                    "flow_allocation": result.flow.allocation,
                                    "flow_competition": result.flow.competition}),
        payload=lambda: {"sentence": options.sentence, "tokens": trace.query_tokens, "head": options.head, **arrays},
        arrays=lambda: arrays, metadata={"input": options.sentence, "settings": " ".join(_parts(options))})


@view("linear_recurrent", "Causal linear attention as an RNN: the running state, step by step", RecurrentOptions,
      analysis=la.toy_layer, analysis_options=LAYER, page=PAGE)
def linear_recurrent(trace: mechanics.AttentionTrace, options: RecurrentOptions) -> Figure:
    """At one step i: the state S_i = S_{i−1} + φ(k_i)v_iᵀ, the normaliser z_i, and the output row Y_i from the
    recurrence beside the same row of the causal implicit matrix times V."""
    q, k, v = _qkv(trace, options)
    n = len(trace.query_tokens)
    step = n - 1 if options.step is None else options.step
    if not 0 <= step < n:
        raise ValueError(f"step {step} is outside 0..{n - 1}: the sentence has {n} tokens")
    rnn = la.causal_linear_recurrent(q, k, v)
    matrix = la.linear_attention_matrix(q, k, causal=True)  # (N, N), zero above the diagonal
    by_matrix = matrix @ v  # (N, d_v)
    labels = mechanics_charts.unique_labels(trace.query_tokens)
    features = [str(i) for i in range(options.d_head)]
    token = labels[step]
    parts = (
        mechanics_charts.matrix_chart(matrix, labels, labels, "causal implicit matrix", probabilities=True, width=330,
                            annotate=n <= 12, colour_max=1.0, masked=~np.tril(np.ones((n, n), dtype=bool)),
                            masked_text="", scheme=options.scheme),
        mechanics_charts.matrix_chart(rnn.states[step], [f"φ(k)·{i}" for i in features], [f"v·{i}" for i in features],
                            f"state S after {token}", width=260),
        mechanics_charts.matrix_chart(np.stack([rnn.normalisers[step]]), ["z"], [f"φ(k)·{i}" for i in features],
                            f"normaliser z after {token}", width=260),
        mechanics_charts.matrix_chart(np.stack([rnn.outputs[step], by_matrix[step]]), ["RNN: φ(q)ᵀS / φ(q)ᵀz", "matrix row · V"],
                            features, f"output at {token}", width=260),
    )
    error = float(np.abs(rnn.outputs - by_matrix).max())
    caption = (f"Step {step} of {n}: the state is {options.d_head} × {options.d_head} numbers (and z, {options.d_head})"
               f" whatever the length — an RNN. The recurrence and the masked matrix agree on every token to "
               f"{error:.1e} (largest difference over all {n} steps).")
    arrays = {"states": rnn.states, "normalisers": rnn.normalisers, "outputs_recurrent": rnn.outputs,
              "outputs_matrix": by_matrix, "causal_matrix": matrix}
    return Figure(
        export.file_stem("causal linear attention rnn", *_parts(options), f"step {step}", options.sentence[:40]),
        charts=parts, layout=((1, 1),), caption=caption,
        table=lambda: pd.DataFrame(rnn.outputs, index=pd.Index(labels, name="token"),
                                   columns=[f"y{i}" for i in features]),
        payload=lambda: {"sentence": options.sentence, "tokens": trace.query_tokens, "step": step, **arrays},
        arrays=lambda: arrays, metadata={"input": options.sentence, "step": step,
                                         "settings": " ".join(_parts(options))})


@view("linear_attention_cost", "Softmax vs linear attention: measured time and memory against N", NoOptions,
      data="options", page=PAGE)
def linear_attention_cost(_, options: NoOptions) -> Figure:
    """The shipped measurement (``bench/case_linear_attention.py``): seconds and peak bytes against N, log-log."""
    measured = la.measured_cost()
    frame = pd.DataFrame(measured["rows"])
    tokens = sorted(frame["tokens"].unique())

    def column(method: str, field: str) -> np.ndarray:
        by_n = frame[frame["method"] == method].set_index("tokens")[field]
        return np.array([by_n.get(n, np.nan) for n in tokens], dtype=np.float64)

    colours = {"softmax (N × N)": "#d62728", "linear (φ(K)ᵀV first)": "#1f77b4"}
    time_chart = lines.series_chart(tokens, {"softmax (N × N)": column("softmax", "seconds"),
                                             "linear (φ(K)ᵀV first)": column("linear", "seconds")},
                                    "tokens N", "seconds (median)", log_x=True, log_y=True, width=420,
                                    title="time", colours=colours)
    memory_chart = lines.series_chart(tokens, {"softmax (N × N)": column("softmax", "peak_bytes"),
                                               "linear (φ(K)ᵀV first)": column("linear", "peak_bytes")},
                                      "tokens N", "peak bytes", log_x=True, log_y=True, width=420,
                                      title="memory", colours=colours, y_format="~s")
    s = measured["settings"]
    caption = (f"Measured on {measured['machine']}: one head, d_k = {s['d_k']}, {s['dtype']}, {s['threads']} thread, "
               f"{s['library']}; memory = peak of numpy's allocations during one call. Doubling N multiplies "
               "softmax's memory by 4 and linear attention's by 2. Reproduce: `" + measured["command"] + "`.")
    return Figure(export.file_stem("linear vs softmax attention cost measured"),
                  chart=combined(time_chart, memory_chart), charts=(time_chart, memory_chart), caption=caption,
                  table=lambda: frame, payload=lambda: measured)
