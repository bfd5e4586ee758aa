"""Figures of the mechanics page ("how attention works — and what it costs"), one builder per figure.

No model family: every view draws from its options alone (``data="options"``). The layer views compute the toy layer
through ``models.lessons.mechanics`` (a real sentence's MiniLM embeddings, seeded weights, float64, a few milliseconds), the
cost views through ``models.lessons.cost``; only the KV-cache comparison reads something slow (the app's models' configs),
as an analysis the app caches once. Every option's default is what the page shows first.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.lessons import cost, mechanics
from viz import export, mechanics_charts
from viz.figure import Figure, NoOptions, combined, view

PAGE = "mechanics"
SENTENCE = "The animal didn't cross the street because it was too tired to walk."
MASK_SETTINGS = mechanics.MASK_SETTINGS


@dataclass(frozen=True)
class LayerOptions:
    """The toy layer: a sentence, its embeddings, the layer's sizes and the mask (models/lessons/mechanics.py)."""

    sentence: str = SENTENCE
    source: str = "minilm"  # "minilm": MiniLM's word embeddings × a seeded projection; "random": a seeded table
    d_model: int = 8  # D: a row of X fits on a slide
    heads: int = 2  # H
    d_head: int = 4  # d_k, independent of D to show why √d_k matters
    seed: int = 0
    scaled: bool = True  # divide the scores by √d_k
    mask: str = "none"  # one of models.lessons.mechanics.MASK_KINDS
    other: str | None = None  # None: self-attention; a sentence: cross-attention, keys and values from it
    # the mask's settings; None: the page's first choice for the sentence's length (mechanics.mask_parameters)
    real_tokens: int | None = None  # padding
    prefix: int | None = None  # prefix LM
    window: int | None = None  # sliding window, global + local
    causal: bool = True  # sliding window
    stride: int | None = None  # strided sparse
    global_tokens: tuple[int, ...] = (0,)  # global + local
    grid_rows: int | None = None  # Swin: the tokens laid out on grid_rows × (N / grid_rows)
    swin_window: int | None = None  # Swin: M
    shift: int | None = None  # Swin: s


@dataclass(frozen=True)
class StepsOptions(LayerOptions):
    head: int = 0
    step: str = ""  # a step's key (models.lessons.mechanics.step_outline); "": the first matrix multiplication
    all_steps: bool = False


@dataclass(frozen=True)
class EntropyOptions(LayerOptions):
    pass


@dataclass(frozen=True)
class HeadsOptions(LayerOptions):
    scheme: str = "viridis"  # probabilities' colour scale (presentation mode: cividis)


@dataclass(frozen=True)
class MaskOptions(LayerOptions):
    head: int = 0
    scheme: str = "viridis"


def _settings(options: LayerOptions) -> dict:
    return {name: getattr(options, name) for name in MASK_SETTINGS}


LAYER = mechanics.LAYER_OPTIONS + ("other",)  # what the toy layer's analysis reads (its cache key)


def _layer_parts(options: LayerOptions) -> tuple[str, ...]:
    return (f"D {options.d_model}", f"H {options.heads}", f"dk {options.d_head}",
            "scaled" if options.scaled else "unscaled", f"seed {options.seed}")


def _check_head(head: int, heads: int) -> None:
    if not 0 <= head < heads:
        raise ValueError(f"head {head} is outside 0..{heads - 1}: the layer has {heads} heads")


def _mask_text(trace: mechanics.AttentionTrace) -> str:
    return "−∞" if math.isinf(trace.mask_value) else f"−{abs(trace.mask_value):g}"


# --- step by step --------------------------------------------------------------------------------------------------

@view("layer_steps", "The layer step by step: the four matrix multiplications", StepsOptions,
      analysis=mechanics.layer_trace, analysis_options=LAYER, page=PAGE)
def layer_steps(trace: mechanics.AttentionTrace, options: StepsOptions) -> Figure:
    """One step of the layer (or every step, stacked) as annotated matrices, per-head steps at ``head``; the files
    hold the steps shown, exactly as drawn."""
    _check_head(options.head, options.heads)
    steps = trace.steps()
    keys = [step.key for step in steps]
    step = options.step or ("q" if trace.cross else "qkv")
    if not options.all_steps and step not in keys:
        raise ValueError(f"there is no step {step!r} in this layer; the steps are: {', '.join(keys)}")
    chosen = steps if options.all_steps else [steps[keys.index(step)]]
    labels = {"query": mechanics_charts.unique_labels(trace.query_tokens), "key": mechanics_charts.unique_labels(trace.key_tokens),
              "qkv": [f"{p}{h}·{i}" for p in "QKV" for h in range(options.heads) for i in range(options.d_head)]}
    values = {s.key: s.value[options.head] if s.per_head else s.value for s in chosen}
    parts = []
    for s in chosen:
        value = values[s.key]
        rows, cols = ([str(i) for i in range(size)] if what == "feature" else labels[what]
                      for what, size in ((s.rows, value.shape[0]), (s.cols, value.shape[1])))
        finite = value[np.isfinite(value)]
        big = finite.size > 0 and np.abs(finite).max() >= 100  # scores of a wide unscaled head: fewer decimals
        parts.append(mechanics_charts.matrix_chart(value, rows, cols, masked=~trace.allowed if s.key == "masked_scores" else None,
                                         masked_text=_mask_text(trace), probabilities=s.key == "weights",
                                         decimals=1 if big else 2))
    titled = [part.properties(title=s.title) for part, s in zip(parts, chosen)]  # the file names its step
    mask = "none (cross-attention)" if trace.cross else options.mask
    shown = "all steps" if options.all_steps else step
    return Figure(
        export.file_stem("attention layer", *_layer_parts(options), "cross" if trace.cross else options.mask, shown,
                         f"head {options.head}", options.sentence[:40]),
        chart=titled[0] if len(titled) == 1 else combined(*titled, vertical=True), charts=tuple(parts), vertical=True,
        payload=lambda: {"sentence": options.sentence, "other": options.other, "query_tokens": trace.query_tokens,
                         "key_tokens": trace.key_tokens, "mask": mask, "head": options.head,
                         "steps": [s.key for s in chosen], **values},
        arrays=lambda: values,
        metadata={"input": options.sentence, "mask": mask, "head": options.head,
                  "settings": " ".join(_layer_parts(options))})


@view("entropy_by_d_k", "Why divide by √d_k: softmax row entropy against d_k", EntropyOptions,
      analysis=mechanics.layer_trace, analysis_options=LAYER, page=PAGE)
def entropy_by_d_k(trace: mechanics.AttentionTrace, options: EntropyOptions) -> Figure:
    """Mean softmax row entropy against the head width, scaled vs unscaled (the current d_k marked); the caption
    gives this layer's own mean entropy."""
    curve = mechanics.softmax_entropy_by_d_k(trace.x_query, heads=options.heads)  # each (len(d_ks),)
    keys = len(trace.key_tokens)
    caption = (f"Mean softmax row entropy of this layer: **{trace.row_entropy_bits().mean():.2f} bits** (a uniform "
               f"row over {keys} keys: {np.log2(keys):.2f} bits). q·k sums d_k products, so its spread grows like "
               "√d_k: without the scaling the rows saturate towards one-hot and the softmax gradients vanish. Turn the "
               "toggle off and raise d_k to see it in the matrices above.")
    parts = (f"D {options.d_model}", f"H {options.heads}", f"seed {options.seed}", options.source)
    return Figure(
        export.file_stem("softmax entropy by dk", *parts, options.sentence[:40]),
        chart=mechanics_charts.entropy_chart(curve, current_d_k=options.d_head), caption=caption,
        table=lambda: pd.DataFrame(curve).set_index("d_k"),
        payload=lambda: {"sentence": options.sentence, "tokens": trace.query_tokens, **curve},
        arrays=lambda: curve, metadata={"input": options.sentence, "settings": " ".join(parts)})


@view("multi_vs_single_head", "Multi-head vs one head of the same width", HeadsOptions,
      analysis=mechanics.self_layer_trace, analysis_options=mechanics.LAYER_OPTIONS, page=PAGE)
def multi_vs_single_head(trace: mechanics.AttentionTrace, options: HeadsOptions) -> Figure:
    """The first (up to) three heads' weights beside one head of width H·d_k, two by two, each coloured from 0 to its
    largest weight; the files hold every head (self-attention: ``other`` is not read)."""
    single = mechanics.one_wide_head(trace)
    labels = mechanics_charts.unique_labels(trace.query_tokens)
    maps = [(trace.weights[h], f"head {h} of {options.heads}") for h in range(min(options.heads, 3))]
    maps.append((single.weights[0], "one head"))
    parts = tuple(mechanics_charts.matrix_chart(weights, labels, labels, title, probabilities=True, width=380, annotate=False,
                                      colour_max=float(weights.max()), scheme=options.scheme)
                  for weights, title in maps)
    width = options.heads * options.d_head
    return Figure(
        export.file_stem("multi vs single head", *_layer_parts(options), options.mask, options.sentence[:40]),
        charts=parts, layout=((1, 1),),  # two by two
        caption=(f"The same width H·d_k = {width}, split into {options.heads} heads of {options.d_head} (each free to "
                 f"look somewhere else) or kept as one head of {width} (one pattern for everything). Colours run from "
                 "0 to each map's largest weight."),
        payload=lambda: {"tokens": trace.query_tokens, "heads": trace.weights, "one_head": single.weights[0]},
        arrays=lambda: {"heads": trace.weights, "one_head": single.weights[0]},
        metadata={"input": options.sentence, "mask": options.mask, "settings": " ".join(_layer_parts(options))})


# --- masks ---------------------------------------------------------------------------------------------------------

@view("masked_softmax", "A mask on the scores, then the softmax", MaskOptions,
      analysis=mechanics.self_layer_trace, analysis_options=mechanics.LAYER_OPTIONS, page=PAGE)
def masked_softmax(trace: mechanics.AttentionTrace, options: MaskOptions) -> Figure:
    """One head's scores with the mask added (grey: hidden keys) beside its softmax (hidden keys 0, rows sum to 1);
    self-attention (``other`` is not read)."""
    _check_head(options.head, options.heads)
    tokens, head = trace.query_tokens, options.head
    settings = mechanics.mask_parameters(options.mask, len(tokens), **_settings(options))
    labels = mechanics_charts.unique_labels(tokens)
    scores, weights = trace.masked_scores[head], trace.weights[head]  # (N, N) each
    parts = (mechanics_charts.matrix_chart(scores, labels, labels, "scores + mask", masked=~trace.allowed,
                                 masked_text=_mask_text(trace), width=380),
             mechanics_charts.matrix_chart(weights, labels, labels, "softmax", probabilities=True, width=380,
                                 scheme=options.scheme))
    return Figure(
        export.file_stem("mask", options.mask, *(f"{k} {v}" for k, v in settings.items()), f"head {head}",
                         options.sentence[:40]),
        chart=combined(*parts), charts=parts,  # the export built once here: the figure is cached, the page is not
        table=lambda: export.matrix_frame(weights, tokens, tokens),
        payload=lambda: {"tokens": tokens, "mask": options.mask, "settings": {k: str(v) for k, v in settings.items()},
                         "head": head, "allowed": trace.allowed, "masked_scores": scores, "weights": weights},
        arrays=lambda: {"allowed": trace.allowed, "masked_scores": scores, "weights": weights},
        metadata={"input": options.sentence, "mask": options.mask, "head": head,
                  "settings": " ".join(f"{k}={v}" for k, v in settings.items())})


@dataclass(frozen=True)
class SwinOptions:
    sentence: str = SENTENCE
    grid_rows: int | None = None  # None: the squarest grid
    swin_window: int | None = None  # None: the grid's smallest window M > 1
    shift: int | None = None  # None: M // 2


@view("swin_mask_regions", "How Swin builds its mask: region ids after the cyclic shift", SwinOptions,
      analysis=mechanics.swin_regions, analysis_options=("sentence", "grid_rows", "swin_window", "shift"), page=PAGE)
def swin_mask_regions(found: mechanics.SwinRegions, options: SwinOptions) -> Figure:
    """The sentence's tokens on a grid after the roll by −s, with Swin's region ids; thick lines: the M × M windows."""
    tokens, rows, window, shift = found.tokens, found.rows, found.window, found.shift
    regions, rolled = found.region_ids, found.shifted_tokens  # (rows, cols) each
    return Figure(
        export.file_stem("swin regions", f"grid {rows}x{len(tokens) // rows}", f"M {window}", f"shift {shift}",
                         options.sentence[:40]),
        chart=mechanics_charts.swin_regions_chart(regions, window, rolled),
        table=lambda: pd.DataFrame(regions),
        payload=lambda: {"sentence": options.sentence, "window": window, "shift": shift,
                         "shifted_tokens": rolled.tolist(), "region_ids": regions},
        arrays=lambda: {"region_ids": regions}, metadata={"input": options.sentence, "window": window,
                                                          "shift": shift})


@dataclass(frozen=True)
class ZooOptions:
    tokens: int = 16  # the sentence's length


@view("mask_zoo", "The whole mask zoo", ZooOptions, data="options", page=PAGE)
def mask_zoo(_, options: ZooOptions) -> Figure:
    """Every mask of the zoo on ``tokens`` tokens with illustrative settings (``mechanics.zoo``), four to a row."""
    patterns = mechanics.zoo(options.tokens)  # kind -> bool (N, N)
    parts = tuple(mechanics_charts.mask_chart(pattern, title=mechanics.MASK_KINDS[kind].title, size=210)
                  for kind, pattern in patterns.items())
    return Figure(
        export.file_stem("mask zoo", f"{options.tokens} tokens"),
        charts=parts, layout=((1, 1, 1, 1),),  # four to a row
        payload=lambda: {"tokens": options.tokens, "allowed": patterns}, arrays=lambda: patterns,
        metadata={"tokens": options.tokens})


# --- cost ------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryOptions:
    heads: int = 12  # ViT-B/16's
    layers: int = 12
    dtype: str = "float32"  # one of models.lessons.cost.DTYPE_BYTES
    batch: int = 1


@view("attention_memory", "Memory of the attention maps against N, and FlashAttention's", MemoryOptions,
      data="options", page=PAGE)
def attention_memory(_, options: MemoryOptions) -> Figure:
    """Bytes of every map (∝ N²) and of FlashAttention's statistics (∝ N) for N from 10 to a million, log-log, with
    one 80 GB GPU for scale."""
    memory = {name: np.asarray(values) for name, values in
              cost.memory_curve(options.heads, options.layers, options.dtype, options.batch).items()}
    chart = mechanics_charts.memory_curve_chart(memory["tokens"], memory["attention_map_bytes"], memory["flash_bytes"], 80e9,
                                      "one 80 GB GPU")
    return Figure(
        export.file_stem("attention memory", f"H {options.heads}", f"L {options.layers}", options.dtype,
                         f"B {options.batch}"),
        chart=chart, table=lambda: pd.DataFrame(memory),
        payload=lambda: {**dataclasses.asdict(options), **memory}, arrays=lambda: memory,
        metadata=dataclasses.asdict(options))


@view("worked_examples", "Worked examples: what attention maps cost", NoOptions, data="options", page=PAGE)
def worked_examples(_, options: NoOptions) -> Figure:
    """Every row of the lecture's worked examples (``cost.worked_examples``, computed, not typed) as bars of bytes."""
    examples = cost.worked_examples()
    rows = [(example.title, row) for example in examples for row in example.rows]
    return Figure(
        export.file_stem("attention cost worked examples"),
        chart=mechanics_charts.worked_examples_chart([title for title, _ in rows], [row.label for _, row in rows],
                                           [row.bytes for _, row in rows],
                                           [f"{cost.decimal_bytes(row.bytes)} = {cost.binary_bytes(row.bytes)}"
                                            for _, row in rows]),
        table=lambda: pd.DataFrame(cost.worked_examples_table(examples)),
        payload=lambda: {"examples": [dataclasses.asdict(example) for example in examples]})


@dataclass(frozen=True)
class KVOptions:
    tokens: int = 4096  # the sequence's length
    dtype: str = "float16"  # the cache's precision


@view("kv_cache", "KV cache: what generation keeps per token, model by model", KVOptions,
      analysis=cost.kv_cache_presets, page=PAGE)
def kv_cache(presets: cost.KVPresets, options: KVOptions) -> Figure:
    """One sequence's KV cache per model (the app's own, read from their configs, then published ones) as bars, and
    a table of each model's heads and bytes per token; the caption has the MLA notes and the configs not read."""
    specs = presets.specs
    sizes = [spec.bytes_per_sequence(options.tokens, options.dtype) for spec in specs]  # validates the options
    rows = cost.kv_table(list(specs), options.tokens, options.dtype)
    notes = cost.mla_notes(specs) + (["Not read: " + "; ".join(presets.skipped)] if presets.skipped else [])
    return Figure(
        export.file_stem("kv cache", f"{options.tokens} tokens", options.dtype),
        chart=mechanics_charts.kv_cache_chart([s.name for s in specs], [s.kind for s in specs], sizes, options.tokens),
        table=pd.DataFrame(rows), caption="\n\n".join(notes),
        payload=lambda: {"tokens": options.tokens, "dtype": options.dtype, "models": rows,
                         "bytes_per_sequence": {s.name: size for s, size in zip(specs, sizes)},
                         "specs": [dataclasses.asdict(s) for s in specs], "not_read": list(presets.skipped)})
