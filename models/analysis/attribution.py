"""Running the explanation methods (models/analysis/methods.py, the one table of them) on a family's
adapter.

A family offers the methods through an ``Explainable`` (``Family.explainer``,
models/families/<name>/explain.py): the input's embeddings and the baseline that replaces a removed
unit, the target read at one position, a forward from embeddings, and records of each layer's
attention. ``explain(ex, methods)`` runs one forward with the attention kept differentiable (and one
backward when a gradient method is asked for), ``Recorded``, which every attention and gradient
method reads; Integrated Gradients, value zeroing and the pixel methods run forwards of their own.

``Recorded`` lays that forward out as the model's geometry says, and a method reads the target's row
the same way on each:
- one token sequence (ViT, GPT, BERT): the query's row ([CLS], the last token);
- an encoder–decoder (units: source tokens): raw attention, value norms and Grad-CAM read the
  decoder's cross-attention at the target's row, the rollouts follow Chefer et al. 2021b's
  encoder–decoder rules;
- windows and stages (Swin, a ``Layout``: models/analysis/windows.py): each layer's per-window
  matrices carried to its token grid, the rolled-out methods propagated from the pooled readout down
  through the patch merges (``Layout.carry``), Grad-CAM on the last stage's tokens on their grid;
- a model the shared rules do not describe gives its own rollout (``Explainable.rolled``: a VLM's
  language model read through its vision tower) or draws raw attention itself
  (``Explainable.drawn``: captioning's maps from the run).
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from models.analysis.methods import METHODS, SHARED
from models.analysis.pixels import PixelInput
from models.analysis.windows import Layout, Windowed

# Integrated Gradients' scores should sum to y(x) − y(baseline); off by more than this share, its
# map is not trusted
COMPLETENESS_TOLERANCE = 0.05


@dataclass
class LayerRecord:
    """What one layer's hooks saw in one forward; batch item 0 is the explained input.

    ``attention`` (B, H, N, N) with its graph (so its gradient can be asked for); ``values``
    (B, H, N, D): ``f^h(x_j)``, what each head would add to the residual stream for token j at full
    attention, computed on first use from what the hook kept (``values_from``), so a method that
    does not read a layer's values does not pay for them; ``residual`` (B, N, D): the block's input
    ``x``."""

    attention: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    # (B, …, D) the block's output, any token layout (a Layout's Grad-CAM reads the last one,
    # flattened to (B, N, D))
    output: torch.Tensor | None = None
    # "self" (one sequence); in an encoder–decoder "encoder", "decoder" (self) or "cross"
    kind: str = "self"
    values_from: Callable[[], torch.Tensor] | None = None
    _values: torch.Tensor | None = None

    @property
    def values(self) -> torch.Tensor:
        if self._values is None:
            if self.values_from is None:
                raise RuntimeError("this layer's values were not recorded")
            self._values = self.values_from()
        return self._values


@dataclass
class Explainable:
    """What a family gives the methods for one input and one target (models/families/vit/explain.py
    for the ViT).

    ``logits(embeddings (B, N, D)) -> (B, C)``: the target's distribution read at ``query``;
    ``record()`` a context manager yielding a list that the forwards run inside fill with one
    ``LayerRecord`` per layer."""

    embeddings: torch.Tensor  # (1, N, D) the input as the first block reads it
    baseline: torch.Tensor  # (1, N, D) the same with every unit removed (as ``replacement`` says)
    units: tuple[int, ...]  # positions that are scored and removed: patches, tokens after the first
    query: int  # the position the target is read at: [CLS], the last token
    target: int
    target_name: str
    logits: Callable[[torch.Tensor], torch.Tensor]
    record: Callable[[], AbstractContextManager]
    unit_names: tuple[str, ...]
    replacement: str  # what replaces a removed unit, in words (the page and the JSON say it)
    batch_size: int = 64  # perturbed inputs per forward in the curves
    notes: tuple[str, ...] = ()
    layout: "Layout | None" = None  # windows, merges, a pooled readout (Swin); None: one sequence
    # the methods this adapter offers (``METHODS``' names); the faithfulness table compares those
    # whose ``Method.compared`` is set
    methods: tuple[str, ...] = field(default_factory=lambda: SHARED)
    # (B, C) from ``logits`` -> (B,): the score explained (default: the target's logit) and what the
    # curves read (default: the target's softmax probability); a family whose target is no class (a
    # sentence embedding) sets both
    score_of: Callable[[torch.Tensor], torch.Tensor] | None = None
    probability_of: Callable[[torch.Tensor], torch.Tensor] | None = None
    target_kind: str = "class"  # what the target is, in words (the page and the JSON say it)
    measure: str = "target probability"  # what the curves read, in words
    # value zeroing: ``zeroed(keep (B, N))`` -> (B, D) the representation the target is read from,
    # with the value vectors of the positions where ``keep`` is 0 zeroed (an encoder–decoder: in
    # every cross-attention); None: the family does not offer value zeroing
    zeroed: Callable[[torch.Tensor], torch.Tensor] | None = None
    # positions Integrated Gradients' path keeps at the input (a causal LM's first token, its
    # attention sink: moved towards the baseline, it makes the path so steep that 32-128 steps miss
    # completeness by 400-2,000% on SmolLM2)
    ig_fixed: tuple[int, ...] = ()
    columns: tuple[int, ...] | None = None  # the units' keys in the attention (None: ``units``)
    # a method in words where this family computes it differently (Swin: on the grid, through the
    # merges); ``Method.what`` otherwise
    descriptions: dict[str, str] = field(default_factory=dict)
    # raw attention as the page draws the target's map, for a family whose maps are drawn from the
    # run (captioning): (layer, head) -> ((units,) scores, which map in words); None: the recorded
    # forward's
    drawn: Callable[[int | None, int | None], tuple[np.ndarray, str]] | None = None
    # rollout through stacks the shared rules do not describe (a VLM: the language model, then its
    # vision tower): (attention by record kind, gradients by kind or None for plain rollout) ->
    # (units,)
    rolled: Callable[[dict, dict | None], torch.Tensor] | None = None
    pixels: PixelInput | None = None  # an image family's input as pixels, for the pixel methods

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs[:, self.target] if self.score_of is None else self.score_of(outputs)

    def ig_baseline(self) -> torch.Tensor:
        """Integrated Gradients' baseline: ``baseline`` with the ``ig_fixed`` positions as in the
        input."""
        if not self.ig_fixed:
            return self.baseline
        kept = self.baseline.clone()
        kept[:, list(self.ig_fixed)] = self.embeddings[:, list(self.ig_fixed)]
        return kept

    def probability(self, outputs: torch.Tensor) -> torch.Tensor:
        if self.probability_of is None:
            return outputs.float().softmax(-1)[:, self.target]
        return self.probability_of(outputs).float()

    def is_top(self, outputs: torch.Tensor) -> torch.Tensor:
        """Whether the target is still the prediction (B,) bool: the top class, or a probability
        above ½."""
        if self.probability_of is None:
            return outputs.argmax(-1) == self.target
        return self.probability(outputs) > 0.5


@dataclass(frozen=True)
class RawAttentionSource:
    """Where raw attention's scores were read: a layer and head (None: the head mean), counted from
    0, and on an encoder–decoder which attention the layer counts in."""

    layer: int
    head: int | None
    # "decoder cross-attention" on an encoder–decoder; None: the model's only one
    attention: str | None = None

    def as_dict(self) -> dict:
        """As the JSON download writes it."""
        found = {"layer": self.layer, "head": self.head}
        return found if self.attention is None else {**found, "attention": self.attention}


@dataclass(frozen=True)
class Explanations:
    """Per-unit scores ``(len(units),)`` float32 for each method computed, higher = more relevant.
    """

    scores: dict[str, np.ndarray]
    seconds: dict[str, float]
    score: float  # the target's logit on the input
    probability: float  # the target's probability on the input
    ig_difference: float | None = None  # y(x) − y(baseline), what IG's scores should sum to
    raw_attention: RawAttentionSource | None = None  # where raw attention was read
    # a method in words where a family computes it differently; ``Method.what`` otherwise
    descriptions: dict[str, str] = field(default_factory=dict)
    # |Σ scores − (y(x) − y(baseline))| of the methods with a completeness axiom (the integral's
    # error)
    deltas: dict[str, float] = field(default_factory=dict)
    pixels: dict[str, np.ndarray] = field(default_factory=dict)  # (H, W) maps of the pixel methods

    @property
    def ig_delta(self) -> float | None:
        """Integrated Gradients' |Σ IG − (y(x) − y(baseline))|."""
        return self.deltas.get("integrated_gradients")

    def describe(self, method: str) -> str:
        """``method`` in words: raw attention with the layer and head it was read from."""
        chosen = self.raw_attention if method == "raw_attention" else None
        if chosen is None:
            return self.descriptions.get(method, METHODS[method].what)
        head = "head mean" if chosen.head is None else f"head {chosen.head}"
        where = f"{chosen.attention} " if chosen.attention else ""
        return f"raw attention ({where}layer {chosen.layer}, {head})"


def compared(ex: Explainable) -> tuple[str, ...]:
    """The methods ``ex`` offers that are compared by default (``Method.compared``: not the pixel
    methods, drawn on their own), or a ValueError saying why there are none."""
    found = tuple(m for m in ex.methods if METHODS[m].compared)
    if not found:
        raise ValueError(" ".join(ex.notes) or "this model offers no explanation to compare")
    return found


def check_methods(methods, ex: Explainable | None = None) -> tuple[str, ...]:
    """``methods`` as a tuple of names, or a ValueError naming what is unknown or not offered by
    ``ex``."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(map(repr, unknown))}; choose from "
                         f"{', '.join(METHODS)}")
    if ex is not None:
        missing = [m for m in methods if m not in ex.methods or
                   (METHODS[m].needs is not None and getattr(ex, METHODS[m].needs) is None)]
        if missing:
            raise ValueError(f"{', '.join(missing)} is not available for this model (it offers "
                             f"{', '.join(ex.methods)})")
    return tuple(methods)


# --- running them
# -----------------------------------------------------------------------------------------

class Recorded:
    """One forward of ``ex`` with every layer's attention kept (and one backward of the target's
    score, when a gradient method is asked for): what the attention and gradient methods read,
    computed once for all of them, laid out as the model's geometry says (the module docstring).
    Also what one ``explain`` call found on the way (completeness errors, pixel maps, descriptions).
    """

    def __init__(self, ex: Explainable, gradient: bool, steps: int, layer: int | None,
                 head: int | None):
        self.ex, self.steps, self.layout = ex, steps, ex.layout
        self.units = list(ex.units)
        self.columns = list(ex.units if ex.columns is None else ex.columns)
        self.deltas: dict[str, float] = {}
        self.pixel_maps: dict[str, np.ndarray] = {}
        self.descriptions = dict(ex.descriptions)
        self.ig_difference: float | None = None
        started = time.perf_counter()
        with torch.set_grad_enabled(gradient):
            embeddings = ex.embeddings.detach().clone().requires_grad_(gradient)
            with ex.record() as layers:
                logits = ex.logits(embeddings)
            score = ex.score(logits)[0]
            self.probability = float(ex.probability(logits.detach())[0])
            attentions = [record.attention for record in layers]
            features = [layers[-1].output] if ex.layout is not None else []
            gradients = self.feature_gradient = self.embedding_gradient = None
            if gradient:
                # an attention that does not depend on the input (an encoder–decoder's first decoder
                # self-attention, teacher-forced) has no gradient: None, read as zeros
                moving = [a for a in attentions if a.requires_grad]
                found = list(torch.autograd.grad(score, [embeddings, *moving, *features],
                                                 allow_unused=True))
                self.embedding_gradient, moved = found[0], iter(found[1:1 + len(moving)])
                gradients = [next(moved) if a.requires_grad else None for a in attentions]
                self.feature_gradient = found[-1] if features else None
        self.seconds = time.perf_counter() - started
        self.score, self.embeddings, self.layers = float(score.detach()), embeddings, layers
        self.kinds = [record.kind for record in layers]
        # (H, N, N) each, or a Layout's (nW, H, Nw, Nw)
        self.detached = [self.item(a, i) for i, a in enumerate(attentions)]
        self.gradients = None if gradients is None else [
            self.item(g, i) if g is not None else torch.zeros_like(a)
            for i, (g, a) in enumerate(zip(gradients, self.detached))]
        # raw attention, value norms and Grad-CAM read an encoder–decoder's cross-attention: its
        # layers are the decoder's
        self.encoder_decoder = "cross" in self.kinds
        self.pool_index = [i for i, kind in enumerate(self.kinds)
                           if kind == "cross" or not self.encoder_decoder]
        self.pool = [self.detached[i] for i in self.pool_index]
        self.pool_layers = [layers[i] for i in self.pool_index]
        self.layer, self.head, self.source = layer, head, None
        if ex.drawn is None:
            self._choose(attentions, layer, head)

    def _choose(self, attentions: list[torch.Tensor], layer: int | None, head: int | None) -> None:
        """Raw attention's layer (negative: from the end) and head (None: the mean), checked."""
        count = len(self.pool)
        whose = "the decoder has" if self.encoder_decoder else "the model has"
        if layer is None or not -count <= layer < count:
            raise ValueError(f"layer {layer} does not exist: {whose} layers 0..{count - 1}")
        self.layer = layer % count
        heads = int(attentions[self.pool_index[self.layer]].shape[1])
        if head is not None and not 0 <= head < heads:
            raise ValueError(f"head {head} does not exist: layer {self.layer} has heads "
                             f"0..{heads - 1}")
        # which attention the layer counts in on an encoder–decoder (the table's "what" and the JSON
        # say it)
        which = "decoder cross-attention" if self.encoder_decoder else None
        self.source = RawAttentionSource(self.layer, head, which)

    def item(self, tensor: torch.Tensor, layer: int) -> torch.Tensor:
        """Batch item 0 of a recorded tensor of ``layer``, detached, float32: (…) of the explained
        input, or a ``Layout``'s first ``windows(layer)`` windows."""
        part = tensor[0] if self.layout is None else tensor[:self.layout.windows(layer)]
        return part.detach().float()

    def by_kind(self, tensors: list[torch.Tensor]) -> dict[str, list[torch.Tensor]]:
        """Per-layer tensors grouped by their record's kind, in forward order."""
        grouped: dict[str, list[torch.Tensor]] = {"encoder": [], "decoder": [], "cross": []}
        for tensor, kind in zip(tensors, self.kinds):
            grouped.setdefault(kind, []).append(tensor)
        return grouped

    def stacks(self, tensors: list[torch.Tensor]) -> tuple[list, list, list]:
        """An encoder–decoder's encoder, decoder and cross-attention layers (decoder empty: no
        self-attention, as Bergamot's SSRU)."""
        grouped = self.by_kind(tensors)
        return grouped["encoder"], grouped["decoder"], grouped["cross"]

    def row(self, matrix: torch.Tensor) -> torch.Tensor:
        """(queries, keys) -> (units,): the target's query row at the units' keys."""
        return matrix[self.ex.query, self.columns]

    def pick(self, row: torch.Tensor) -> torch.Tensor:
        """(keys,) -> (units,)."""
        return row[self.columns]

    def carried(self, matrices: dict[int, "torch.Tensor | Windowed"], start=None) -> torch.Tensor:
        """A ``Layout``'s readout row (or ``start``) carried down through ``matrices`` -> (units,).
        """
        return self.layout.carry(matrices, start)[self.units]

    def release(self) -> None:
        """Let the forward's tensors go (before the methods that run forwards of their own)."""
        self.layers = self.detached = self.gradients = self.pool = self.pool_layers = None
        self.embeddings = self.embedding_gradient = self.feature_gradient = None


def explain(ex: Explainable, methods=None, ig_steps: int = 32, layer: int | None = -1,
            head: int | None = None,
            progress: Callable[[str, float], None] = lambda step, fraction: None) -> Explanations:
    """Every method in ``methods`` (default: ``compared(ex)``) for ``ex``'s target: one
    forward (+ one backward when a gradient method is asked for), then the methods with forwards of
    their own. ``ig_steps``: Integrated Gradients' steps (the pixel methods' steps or samples);
    ``layer``, ``head``: raw attention's layer (negative: from the end; None: the mean over layers,
    where the family draws its own maps) and head (None: the mean)."""
    names = check_methods(compared(ex) if methods is None else methods, ex)
    if not 2 <= ig_steps <= 256:
        raise ValueError(f"integrated gradients takes 2 to 256 steps, not {ig_steps}")
    chosen = [METHODS[name] for name in names]
    progress("forward and backward pass", 0.0)
    recorded = Recorded(ex, any(m.reads == "gradient" for m in chosen), ig_steps, layer, head)
    scores: dict[str, np.ndarray] = {}
    seconds: dict[str, float] = {}
    on_the_pass = [m for m in chosen if m.reads in ("attention", "gradient")]
    for method in [*on_the_pass, *(m for m in chosen if m not in on_the_pass)]:
        if method not in on_the_pass:
            recorded.release()
            progress(method.label, 0.5)
        began = time.perf_counter()
        with torch.no_grad():
            found = method.attribute(recorded)
        if isinstance(found, torch.Tensor):
            found = found.float().cpu().numpy()
        scores[method.name] = np.asarray(found).astype(np.float32)
        shared = recorded.seconds if method in on_the_pass else 0.0  # the forward it read
        seconds[method.name] = time.perf_counter() - began + shared
    progress("explanations done", 1.0)
    return Explanations({name: scores[name] for name in names}, seconds, recorded.score,
                        recorded.probability, recorded.ig_difference, recorded.source,
                        recorded.descriptions, recorded.deltas, recorded.pixel_maps)
