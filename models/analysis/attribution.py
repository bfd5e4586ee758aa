"""Explanations beyond raw attention, one implementation for every family that gives an ``Explainable`` adapter.

Each method scores every *unit* (a patch, a token) for one target: how much of the target's score it is credited
with; higher = more relevant. One forward with the attention kept differentiable, and one backward, give all the
attention-based and gradient methods at once; Integrated Gradients costs ``steps`` more forwards and backwards.

- ``raw_attention``: one layer's attention row of the query the target reads ([CLS], the last token), one head or
  the heads averaged (default: the last layer's head mean).
- ``rollout`` (Abnar & Zuidema 2020, eq. 1; ``models/analysis/rollout.py``): ``(½A + ½I)`` multiplied through layers.
- ``value_norms`` (Kobayashi et al. 2020, "Attention is Not Only a Weight", eq. 5): ``‖Σ_h α^h_qj f^h(x_j)‖`` with
  ``f^h(x) = (LN(x) W_V^h + b_V^h) W_O^h`` (times the layer scale, if any): the size of what token ``j`` actually
  adds to the query's attention output in the last layer, not only the weight it gets.
- ``alti`` (Ferrando et al. 2022, "Measuring the Mixing of Contextual Information in the Transformer", eq. 6–8):
  each layer's output ``y_i = Σ_j T_i(x_j)`` with ``T_i(x_j) = Σ_h α^h_ij f^h(x_j) + δ_ij x_j`` (the residual
  included); the contribution of ``j`` to ``i`` is ``max(0, ‖y_i‖₁ − ‖y_i − T_i(x_j)‖₁)`` normalised per row, and
  the layers' contribution matrices are multiplied like rollout. The output projection's bias belongs to no token
  and is left out (pre-LN blocks: no norm after the sum).
- ``gradient_rollout`` (Chefer et al. 2021b, "Generic Attention-model Explainability", eq. 5–6):
  ``Ā_l = E_h[(∇A_l ⊙ A_l)⁺]``, ``R ← R + Ā_l · R`` from ``R = I``; the query's row. Class-specific.
- ``grad_cam`` (Selvaraju et al. 2017, as Chefer et al. 2021a apply it to a ViT): the last layer's heads are the
  channels: ``w_h = mean_ij ∂y/∂A^h_ij``, map ``ReLU(Σ_h w_h A^h)`` in the query's row. (On the last block's tokens
  instead, a model read from one token has zero gradient at every other token, so the map would be empty.)
- ``integrated_gradients`` (Sundararajan et al. 2017; captum): on the input embeddings, from the baseline where
  every unit is removed (the same replacement the deletion curves use), summed over the embedding dimension
  (signed). Completeness: the scores sum to ``y(x) − y(baseline)``.
- ``input_x_gradient`` (Shrikumar et al. 2016): ``x · ∂y/∂x`` on the input embeddings, summed over the dimension.

- ``value_zeroing`` (Mohebbi et al. 2023, "Quantifying Context Mixing in Transformers", adapted to cross-attention;
  encoder–decoders only, ``Explainable.zeroed``): for each source unit ``j``, its value vector ``v_j`` is set to zero
  in the cross-attention of every decoder layer at once (the encoder and the decoder's own inputs unchanged) and the
  decoder's output representation ``h`` at the target's position is recomputed; ``j``'s score is the cosine distance
  ``max(0, 1 − cos(h^{¬j}, h))``, normalised to sum to 1 over the units. One batched forward (a row per unit). It
  measures what reaches the target through ``j``'s slot of the encoder output, not the encoder's own mixing.

``y`` is the target's logit (Chefer et al. back-propagate the one-hot logit); the faithfulness curves read its
probability (models/analysis/faithfulness.py).

Hierarchical, windowed models (Swin) add a ``Layout``: each layer's per-window matrices are carried back to that
layer's full token grid (the cyclic shift undone), a stage's grid reaches the previous one through its 2 × 2 patch
merge, and the target reads the mean of the last layer's tokens. Every rolled-out method is then the readout row
propagated down through the same per-layer matrices (``Layout.carry``), and Grad-CAM is the classic one on the last
stage's tokens reshaped to their grid (mean pooling gives every token a gradient).
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from models.analysis import rollout

METHODS = {
    "raw_attention": "raw attention (chosen layer and head; default the last layer's head mean)",
    "rollout": "attention rollout",
    "value_norms": "value-weighted norms ‖α·f(x)‖",
    "alti": "ALTI (residual-aware, rolled out)",
    "gradient_rollout": "gradient-weighted rollout (Chefer 2021b)",
    "grad_cam": "Grad-CAM (last layer's heads as channels)",
    "integrated_gradients": "Integrated Gradients (embeddings, captum)",
    "input_x_gradient": "input × gradient (embeddings)",
}
# methods only some families offer (``Explainable.methods`` names them); METHODS stays the set every family shares
EXTRA_METHODS = {
    "value_zeroing": "value zeroing (Mohebbi 2023) via cross-attention: 1 − cos of the target position's decoder "
                     "output when the token's value is zeroed in every cross-attention, normalised",
}
ALL_METHODS = {**METHODS, **EXTRA_METHODS}
# how tables, legends and messages name each method (the keys stay the CLI's and the JSON's names)
NAMES = {
    "raw_attention": "Raw attention",
    "rollout": "Attention rollout",
    "value_norms": "Value norms",
    "alti": "ALTI",
    "gradient_rollout": "Gradient rollout",
    "grad_cam": "Grad-CAM",
    "integrated_gradients": "Integrated Gradients",
    "input_x_gradient": "Input × gradient",
    "value_zeroing": "Value zeroing",
}
RANDOM = "random"  # the faithfulness baseline: random orders, which every method is compared with
RANDOM_NAME = "Random order"  # how the random baseline is named in tables and legends


def method_name(method: str) -> str:
    """A method as tables and legends name it ("grad_cam" -> "Grad-CAM")."""
    return RANDOM_NAME if method == RANDOM else NAMES.get(method, method)


# Integrated Gradients' scores should sum to y(x) − y(baseline); off by more than this share, its map is not trusted
COMPLETENESS_TOLERANCE = 0.05
GRADIENT_METHODS = ("gradient_rollout", "grad_cam", "input_x_gradient")
ATTENTION_METHODS = ("raw_attention", "rollout", "value_norms", "alti")


@dataclass
class LayerRecord:
    """What one layer's hooks saw in one forward; batch item 0 is the explained input.

    ``attention`` (B, H, N, N) with its graph (so its gradient can be asked for); ``values`` (B, H, N, D):
    ``f^h(x_j)``, what each head would add to the residual stream for token j at full attention, computed on first
    use from what the hook kept (``values_from``), so a method that does not read a layer's values does not pay for
    them; ``residual`` (B, N, D): the block's input ``x``."""

    attention: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    output: torch.Tensor | None = None  # (B, …, D) the block's output, any token layout (a Layout's Grad-CAM reads
    # the last one, flattened to (B, N, D))
    kind: str = "self"  # "self" (one sequence); in an encoder–decoder "encoder", "decoder" (self) or "cross"
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
    """What a family gives the shared methods for one input and one target (models/families/vit/explain.py for the ViT).

    ``logits(embeddings (B, N, D)) -> (B, C)``: the target's distribution read at ``query``; ``record()`` a context
    manager yielding a list that the forwards run inside fill with one ``LayerRecord`` per layer."""

    embeddings: torch.Tensor  # (1, N, D) the input as the first block reads it
    baseline: torch.Tensor  # (1, N, D) the same with every unit removed (replaced as ``replacement`` says)
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
    layout: "Layout | None" = None  # windows, merges and a pooled readout (Swin); None: one flat token sequence
    methods: tuple[str, ...] = tuple(METHODS)  # the methods that apply to this family
    # (B, C) from ``logits`` -> (B,): the score explained (default: the target's logit) and what the curves read
    # (default: the target's softmax probability); a family whose target is no class (a sentence embedding) sets both
    score_of: Callable[[torch.Tensor], torch.Tensor] | None = None
    probability_of: Callable[[torch.Tensor], torch.Tensor] | None = None
    target_kind: str = "class"  # what the target is, in words (the page and the JSON say it)
    measure: str = "target probability"  # what the curves read, in words
    # value zeroing: ``zeroed(keep (B, N))`` -> (B, D) the representation the target is read from, with the value
    # vectors of the positions where ``keep`` is 0 zeroed (an encoder–decoder: in every cross-attention); None: the
    # family does not offer value zeroing
    zeroed: Callable[[torch.Tensor], torch.Tensor] | None = None
    # positions Integrated Gradients' path keeps at the input (a causal LM's first token, its attention sink: moved
    # towards the baseline, it makes the path so steep that 32-128 steps miss completeness by 400-2,000% on SmolLM2)
    ig_fixed: tuple[int, ...] = ()

    def score(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs[:, self.target] if self.score_of is None else self.score_of(outputs)

    def ig_baseline(self) -> torch.Tensor:
        """Integrated Gradients' baseline: ``baseline`` with the ``ig_fixed`` positions as in the input."""
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
        """Whether the target is still the prediction (B,) bool: the top class, or a probability above ½."""
        if self.probability_of is None:
            return outputs.argmax(-1) == self.target
        return self.probability(outputs) > 0.5



@dataclass
class Layout:
    """Where a windowed, hierarchical model's per-layer matrices live (Swin; built by models/families/swin/explain.py).

    Layer ``l`` has ``tokens[l]`` tokens (its stage's grid, row-major) and computes attention in ``len(window_ids[l])``
    windows: ``window_ids[l]`` (nW, Nw) long holds, for each window position as the model saw it (rolled by the
    cyclic shift, padded), the original token id (-1: padding). Recorded tensors hold the windows of the whole batch,
    ``(B·nW, …)``; item 0 is the first nW. ``merges[l]`` (N_l, N_{l-1}) maps the previous layer's grid onto layer
    l's where a patch merge sits between them (1/k for each of the k ≤ 4 tokens merged). The target reads
    ``readout`` (N_last,) of the last layer's tokens (global average pooling: 1/N each)."""

    tokens: list[int]
    window_ids: list[torch.Tensor]
    merges: dict[int, torch.Tensor]
    readout: torch.Tensor

    def windows(self, layer: int) -> int:
        return int(self.window_ids[layer].shape[0])

    def to_grid(self, layer: int, windows: torch.Tensor) -> torch.Tensor:
        """Per-window matrices ``(nW, …, Nw, Nw)`` of ``layer`` (as recorded: windows first) -> ``(…, N, N)`` over
        its token grid in original order: entry (i, j) is the window entry of tokens i and j when they share a
        window, else 0 (padding dropped)."""
        windows = windows.movedim(0, -3)  # (…, nW, Nw, Nw)
        ids = self.window_ids[layer].to(windows.device)
        n = self.tokens[layer]
        rows = ids.unsqueeze(-1).expand(*ids.shape, ids.shape[-1])
        cols = ids.unsqueeze(-2).expand(*ids.shape, ids.shape[-1])
        keep = (rows >= 0) & (cols >= 0)
        lead = windows.shape[:-3]
        out = windows.new_zeros(*lead, n * n)
        out[..., rows[keep] * n + cols[keep]] = windows[..., keep]
        return out.view(*lead, n, n)

    def times(self, layer: int, row: torch.Tensor, windows: torch.Tensor, identity: float = 0.0) -> torch.Tensor:
        """``row · (identity · I + to_grid(layer, windows))`` without the (N, N) matrix: row (N,), windows
        (nW, Nw, Nw). Each window's query entries are gathered, multiplied with its map, and added back at its
        keys (what the dense product does, since a token meets only its own window)."""
        ids = self.window_ids[layer].to(row.device)
        keep = ids >= 0
        gathered = row.new_zeros(ids.shape)
        gathered[keep] = row[ids[keep]]
        mixed = torch.einsum("wa,wab->wb", gathered, windows.float())  # (nW, Nw)
        return (row * identity).index_add(0, ids[keep], mixed[keep])

    def carry(self, matrices: dict[int, "torch.Tensor | Windowed"], start: torch.Tensor | None = None
              ) -> torch.Tensor:
        """The readout row (or ``start`` over the last layer's tokens) through ``matrices[l]`` from the last layer
        down, merges included: ``r · M_L · G_L · … · M_1`` -> (N_0,) over the first layer's tokens. ``M_l`` is a
        dense (N_l, N_l) tensor or ``Windowed`` (per-window maps plus a multiple of I); a layer without one passes
        the row on unchanged."""
        row = (self.readout if start is None else start).float()
        for layer in reversed(range(len(self.tokens))):
            matrix = matrices.get(layer)
            if isinstance(matrix, Windowed):
                row = self.times(layer, row, matrix.windows, matrix.identity)
            elif matrix is not None:
                row = row @ matrix.float()
            if layer in self.merges:
                row = row @ self.merges[layer].to(row.device)
        return row


@dataclass
class Windowed:
    """One layer's matrix ``identity · I + to_grid(windows)`` kept per window (nW, Nw, Nw): Swin-B at 384 px has
    9,216 first-stage tokens, and its dense matrix would take 340 MB."""

    windows: torch.Tensor
    identity: float = 0.0


@dataclass(frozen=True)
class RawAttentionSource:
    """Where raw attention's scores were read: a layer and head (None: the head mean), counted from 0, and on an
    encoder–decoder which attention the layer counts in."""

    layer: int
    head: int | None
    attention: str | None = None  # "decoder cross-attention" on an encoder–decoder; None: the model's only one

    def as_dict(self) -> dict:
        """As the JSON download writes it."""
        found = {"layer": self.layer, "head": self.head}
        return found if self.attention is None else {**found, "attention": self.attention}


@dataclass(frozen=True)
class Explanations:
    """Per-unit scores ``(len(units),)`` float32 for each method computed, higher = more relevant."""

    scores: dict[str, np.ndarray]
    seconds: dict[str, float]
    score: float  # the target's logit on the input
    probability: float  # the target's probability on the input
    ig_delta: float | None = None  # |Σ IG − (y(x) − y(baseline))|: the integral's error
    ig_difference: float | None = None  # y(x) − y(baseline), what IG's scores should sum to
    raw_attention: RawAttentionSource | None = None  # where raw attention was read
    # a method in words where a family computes it differently (Swin: on the grid, through the merges); the shared
    # words (attribution.METHODS) otherwise
    descriptions: dict[str, str] = field(default_factory=dict)


def check_methods(methods) -> tuple[str, ...]:
    unknown = [m for m in methods if m not in ALL_METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(map(repr, unknown))}; choose from {', '.join(ALL_METHODS)}")
    return tuple(methods)


# --- the math, on recorded tensors (pure) ---------------------------------------------------------------------------

def value_norm_matrix(attention: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``‖Σ_h α^h_ij f^h(x_j)‖₂`` for every (i, j): attention (…, H, N, N), values (…, H, N, D) -> (…, N, N)
    (leading dimensions: windows)."""
    return torch.einsum("...hij,...hjd->...ijd", attention, values).norm(dim=-1)  # (N, N, D) summed over heads first


def value_norm_row(attention: torch.Tensor, values: torch.Tensor, query: int) -> torch.Tensor:
    """Row ``query`` of ``value_norm_matrix`` without the (N, N, D) tensor: (N,)."""
    return torch.einsum("hj,hjd->jd", attention[:, query], values).norm(dim=-1)


def alti_matrix(attention: torch.Tensor, values: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """One layer's ALTI contributions (N, N), rows summing to 1: attention (H, N, N), values (H, N, D), residual
    (N, D) the block's input."""
    transformed = torch.einsum("hij,hjd->ijd", attention, values)  # (N, N, D): T_i(x_j) without the residual
    n = residual.shape[0]
    index = torch.arange(n, device=residual.device)
    transformed[index, index] += residual  # δ_ij x_j
    output = transformed.sum(1, keepdim=True)  # (N, 1, D): y_i
    contributions = (output.abs().sum(-1) - (output - transformed).abs().sum(-1)).clamp(min=0)  # (N, N)
    return contributions / contributions.sum(-1, keepdim=True).clamp(min=1e-12)


def value_zeroing(ex: Explainable) -> torch.Tensor:
    """Mohebbi et al. 2023's value zeroing through ``ex.zeroed`` (see the module docstring): (units,) cosine
    distances of the target's representation with each unit's value zeroed, normalised to sum to 1."""
    if ex.zeroed is None:
        raise ValueError("value zeroing is not available for this model")
    n, units = ex.embeddings.shape[1], list(ex.units)
    keep = torch.ones(1 + len(units), n, device=ex.embeddings.device)
    keep[torch.arange(1, 1 + len(units)), units] = 0.0  # row 0: nothing zeroed (the reference)
    found = torch.cat([ex.zeroed(keep[i:i + ex.batch_size]).float() for i in range(0, len(keep), ex.batch_size)])
    distance = (1 - torch.nn.functional.cosine_similarity(found[1:], found[:1], dim=-1)).clamp(min=0)
    return distance / distance.sum().clamp(min=1e-12)


def gradient_rollout(attentions: list[torch.Tensor], gradients: list[torch.Tensor] | None = None) -> torch.Tensor:
    """Chefer et al. 2021b: ``R = I``; per layer ``Ā = E_h[(∇A ⊙ A)⁺]``, ``R ← R + Ā·R``. Each attention (H, N, N);
    ``gradients`` None stands for all ones (then R = 2^L × plain rollout, the test's independent check)."""
    n = attentions[0].shape[-1]
    result = torch.eye(n, dtype=torch.float32, device=attentions[0].device)
    for index, attention in enumerate(attentions):
        fused = gradient_fusion(attention, None if gradients is None else gradients[index])  # (N, N)
        result = result + fused @ result
    return result


def gradient_fusion(attention: torch.Tensor, gradient: torch.Tensor | None) -> torch.Tensor:
    """``Ā = E_h[(∇A ⊙ A)⁺]``: attention, gradient (…, H, N, N) -> (…, N, N); ``gradient`` None stands for ones."""
    weighted = attention.float() if gradient is None else gradient.float() * attention.float()
    return weighted.clamp(min=0).mean(-3)


def _residual_normalised(relevance: torch.Tensor) -> torch.Tensor:
    """Chefer et al. 2021b eq. 9–10: ``R̄ = R̂ + I`` with ``R̂ = R − I`` divided by its row sums (rows of zeros stay
    zero)."""
    eye = torch.eye(relevance.shape[0], dtype=relevance.dtype, device=relevance.device)
    hat = relevance - eye
    return hat / hat.sum(-1, keepdim=True).where(hat.sum(-1, keepdim=True).abs() > 1e-12, torch.ones(())) + eye


def encoder_decoder_rollout(encoder: list[torch.Tensor], decoder: list[torch.Tensor], cross: list[torch.Tensor],
                            gradients: dict[str, list[torch.Tensor]] | None = None) -> torch.Tensor:
    """Chefer et al. 2021b's rules for an encoder–decoder: the relevance ``R^{qs}`` (T, S) of each decoder position
    (query) for each source token. Encoder self-attention (S, S) each: ``R^{ss} ← R^{ss} + Ā R^{ss}`` from I (eq. 6);
    per decoder layer, self-attention (T, T): ``R^{qq} ← R^{qq} + Ā R^{qq}``, ``R^{qs} ← R^{qs} + Ā R^{qs}`` (eq. 7–8),
    then cross-attention (T, S): ``R^{qs} ← R^{qs} + (R̄^{qq})ᵀ Ā R̄^{ss}`` (eq. 11; ``R^{qq}`` is unchanged since
    the source never attends to the output). ``Ā = E_h[(∇A ⊙ A)⁺]``; ``gradients`` None stands for all ones (then it
    is rollout's propagation rule, which is the app's "rollout" for encoder–decoders). ``decoder`` empty: a decoder
    without self-attention (Bergamot's SSRU), whose ``R^{qq}`` stays I: no attention mixes its positions."""
    def fused(attention: torch.Tensor, kind: str, index: int) -> torch.Tensor:
        return gradient_fusion(attention, None if gradients is None else gradients[kind][index])

    sources, outputs = cross[0].shape[-1], cross[0].shape[-2]
    r_ss = torch.eye(sources)
    for index, attention in enumerate(encoder):
        r_ss = r_ss + fused(attention, "encoder", index) @ r_ss
    r_qq, r_qs = torch.eye(outputs), torch.zeros(outputs, sources)
    normalised_ss = _residual_normalised(r_ss)
    for index, cross_attention in enumerate(cross):
        if decoder:
            a_qq = fused(decoder[index], "decoder", index)
            r_qq, r_qs = r_qq + a_qq @ r_qq, r_qs + a_qq @ r_qs
        r_qs = r_qs + _residual_normalised(r_qq).T @ fused(cross_attention, "cross", index) @ normalised_ss
    return r_qs


def grad_cam(attention: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """attention, gradient (H, N, N) of the last layer -> (N, N) ``ReLU(Σ_h w_h A^h)`` with ``w_h`` the mean gradient
    of head h (Chefer et al. 2021a's Grad-CAM baseline for ViT; the sum is their mean over heads × H)."""
    weights = gradient.mean(dim=(1, 2), keepdim=True)  # (H, 1, 1)
    return (weights * attention).mean(0).clamp(min=0)


def grad_cam_tokens(features: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """Classic Grad-CAM (Selvaraju et al. 2017) on tokens reshaped to their grid: features, gradient (N, C) of one
    layer's output -> (N,) ``ReLU(Σ_c w_c F_c)`` with ``w_c`` the gradient of channel c averaged over the grid."""
    return (features.float() @ gradient.float().mean(0)).clamp(min=0)


def _rolled(matrices: list[torch.Tensor]) -> torch.Tensor:
    result = matrices[0]
    for matrix in matrices[1:]:
        result = matrix @ result
    return result


# --- running them ---------------------------------------------------------------------------------------------------

def _integrated_gradients(ex: Explainable, steps: int) -> tuple[np.ndarray, float]:
    from captum.attr import IntegratedGradients

    def forward(embeddings):
        return ex.score(ex.logits(embeddings))

    with torch.enable_grad():
        found, delta = IntegratedGradients(forward).attribute(
            ex.embeddings, baselines=ex.ig_baseline(), n_steps=steps,
            internal_batch_size=min(steps, ex.batch_size), return_convergence_delta=True)
    per_position = found[0].detach().float().sum(-1)  # (N,)
    return per_position[list(ex.units)].cpu().numpy(), float(delta.abs().max())


def explain(ex: Explainable, methods=tuple(METHODS), ig_steps: int = 32, layer: int = -1, head: int | None = None,
            progress: Callable[[str, float], None] = lambda step, fraction: None) -> Explanations:
    """Every method in ``methods`` for ``ex``'s target: one forward (+ one backward when a gradient method is asked
    for), then IG. ``layer``, ``head``: raw attention's layer (negative: from the end) and head (None: the mean)."""
    methods = check_methods(methods)
    unsupported = [m for m in methods if m not in ex.methods]
    if unsupported:
        raise ValueError(f"{', '.join(unsupported)} is not available for this model (it offers "
                         f"{', '.join(ex.methods)})")
    if not 2 <= ig_steps <= 256:
        raise ValueError(f"integrated gradients takes 2 to 256 steps, not {ig_steps}")
    scores: dict[str, np.ndarray] = {}
    seconds: dict[str, float] = {}
    needs_grad = any(m in GRADIENT_METHODS for m in methods)
    progress("forward and backward pass", 0.0)
    started = time.perf_counter()
    with torch.set_grad_enabled(needs_grad):
        embeddings = ex.embeddings.detach().clone().requires_grad_(needs_grad)
        with ex.record() as layers:
            logits = ex.logits(embeddings)
        score = ex.score(logits)[0]
        probability = float(ex.probability(logits.detach())[0])
        attentions = [record.attention for record in layers]
        features = [layers[-1].output] if ex.layout is not None else []
        gradients = feature_grad = embedding_grad = None
        if needs_grad:
            # an attention that does not depend on the input (an encoder–decoder's first decoder self-attention,
            # teacher-forced) has no gradient: None, read as zeros
            moving = [a for a in attentions if a.requires_grad]
            found = list(torch.autograd.grad(score, [embeddings, *moving, *features], allow_unused=True))
            embedding_grad, moved = found[0], iter(found[1:1 + len(moving)])
            gradients = [next(moved) if a.requires_grad else None for a in attentions]
            feature_grad = found[-1] if features else None
    pass_seconds = time.perf_counter() - started
    with torch.no_grad():
        encoder_decoder = any(record.kind == "cross" for record in layers)
        # raw attention reads an encoder–decoder's cross-attention: its layers are the decoder's
        pool = [a for a, r in zip(attentions, layers) if r.kind == "cross"] if encoder_decoder else attentions
        whose = "the decoder has" if encoder_decoder else "the model has"
        if layer < -len(pool) or layer >= len(pool):
            raise ValueError(f"layer {layer} does not exist: {whose} layers 0..{len(pool) - 1}")
        layer_index = layer % len(pool)
        heads = int(pool[layer].shape[1])
        if head is not None and not 0 <= head < heads:
            raise ValueError(f"head {head} does not exist: layer {layer_index} has heads 0..{heads - 1}")

        def timed(name: str, compute: Callable[[], torch.Tensor]) -> None:
            if name in methods:
                began = time.perf_counter()
                scores[name] = compute().float().cpu().numpy().astype(np.float32)
                seconds[name] = time.perf_counter() - began + pass_seconds

        if ex.layout is not None:
            _explain_layout(ex, timed, layers, attentions, gradients, feature_grad, embeddings, embedding_grad,
                            layer, head)
        elif encoder_decoder:
            _explain_encoder_decoder(ex, timed, layers, attentions, gradients, embeddings, embedding_grad, layer,
                                     head)
        else:
            _explain_flat(ex, timed, layers, attentions, gradients, embeddings, embedding_grad, layer, head)
        timed("value_zeroing", lambda: value_zeroing(ex))  # its own batched forward, not the recorded one
    del layers, attentions, gradients
    delta = difference = None
    if "integrated_gradients" in methods:
        progress(f"integrated gradients ({ig_steps} steps)", 0.5)
        began = time.perf_counter()
        scores["integrated_gradients"], delta = _integrated_gradients(ex, ig_steps)
        seconds["integrated_gradients"] = time.perf_counter() - began
        with torch.no_grad():
            difference = float(score.detach()) - float(ex.score(ex.logits(ex.ig_baseline()))[0])
    progress("explanations done", 1.0)
    ordered = {m: scores[m] for m in methods}
    # which attention the layer counts in on an encoder–decoder (the table's "what" and the JSON say it)
    source = RawAttentionSource(layer_index, head, "decoder cross-attention" if encoder_decoder else None)
    descriptions = {}
    if ex.layout is not None:  # what differs in words (the table's "what")
        descriptions = {"grad_cam": "Grad-CAM (the last stage's tokens on their grid, channels as maps)",
                        "rollout": "attention rollout (windows carried to the grid, through the merges)"}
    return Explanations(ordered, seconds, float(score.detach()), probability, delta, difference, source,
                        descriptions)


def _input_x_gradient(timed, embeddings, embedding_grad, units) -> None:
    """Each unit's embedding times its gradient, summed over the embedding's channels."""
    timed("input_x_gradient", lambda: (embeddings[0].detach().float() * embedding_grad[0].float()).sum(-1)[units])


def _explain_flat(ex, timed, layers, attentions, gradients, embeddings, embedding_grad, layer, head) -> None:
    """One token sequence throughout (ViT, GPT): every method is the query's row."""
    units = list(ex.units)
    detached = [a[0].detach().float() for a in attentions]  # (H, N, N) each
    timed("raw_attention", lambda: (detached[layer].mean(0) if head is None else detached[layer][head])[
        ex.query, units])
    timed("rollout", lambda: rollout.attention_rollout(detached)[ex.query, units])
    timed("value_norms", lambda: value_norm_row(detached[-1], layers[-1].values[0].detach().float(),
                                                ex.query)[units])
    timed("alti", lambda: _rolled([alti_matrix(a, r.values[0].detach().float(), r.residual[0].detach().float())
                                   for a, r in zip(detached, layers)])[ex.query, units])
    if gradients is not None:
        grads = [g[0].float() if g is not None else torch.zeros_like(a) for g, a in zip(gradients, detached)]
        timed("gradient_rollout", lambda: gradient_rollout(detached, grads)[ex.query, units])
        timed("grad_cam", lambda: grad_cam(detached[-1], grads[-1])[ex.query, units])
        _input_x_gradient(timed, embeddings, embedding_grad, units)


def _explain_layout(ex, timed, layers, attentions, gradients, feature_grad, embeddings, embedding_grad, layer,
                    head) -> None:
    """Windows and stages (``ex.layout``): each layer's per-window matrices carried to its grid, rolled out from the
    pooled readout down through the patch merges to the first grid (the units)."""
    lay = ex.layout
    units = list(ex.units)
    count = len(attentions)
    layer = layer % count
    windows = [a[:lay.windows(i)].detach().float() for i, a in enumerate(attentions)]  # (nW, H, Nw, Nw) each

    def row(matrices: dict[int, Windowed], start=None) -> torch.Tensor:
        return lay.carry(matrices, start)[units]

    def rolled(fused: torch.Tensor) -> Windowed:  # (nW, Nw, Nw) -> rollout's (A + I), rows normalised, per window
        return Windowed(torch.stack([rollout.attention_rollout([window.unsqueeze(0)]) for window in fused]))

    chosen = windows[layer].mean(1) if head is None else windows[layer][:, head]
    timed("raw_attention", lambda: row({layer: Windowed(chosen)}))
    timed("rollout", lambda: row({i: rolled(w.mean(1)) for i, w in enumerate(windows)}))

    def values(i: int) -> torch.Tensor:
        return layers[i].values[:lay.windows(i)].detach().float()  # (nW, H, Nw, D)

    last = count - 1
    timed("value_norms", lambda: row({last: Windowed(value_norm_matrix(windows[last], values(last)))}))

    def alti_layer(i: int) -> Windowed:
        residual = layers[i].residual[:lay.windows(i)].detach().float()  # (nW, Nw, D)
        return Windowed(torch.stack([alti_matrix(a, v, r) for a, v, r in zip(windows[i], values(i), residual)]))

    timed("alti", lambda: row({i: alti_layer(i) for i in range(count)}))
    if gradients is not None:
        grads = [g[:lay.windows(i)].float() if g is not None else torch.zeros_like(w)
                 for i, (g, w) in enumerate(zip(gradients, windows))]
        timed("gradient_rollout", lambda: row({i: Windowed(gradient_fusion(w, g), identity=1.0)
                                               for i, (w, g) in enumerate(zip(windows, grads))}))
        output, channels = layers[-1].output, layers[-1].output.shape[-1]
        timed("grad_cam", lambda: row({}, grad_cam_tokens(output[0].detach().reshape(-1, channels),
                                                          feature_grad[0].reshape(-1, channels))))
        _input_x_gradient(timed, embeddings, embedding_grad, units)


def _explain_encoder_decoder(ex, timed, layers, attentions, gradients, embeddings, embedding_grad, layer,
                             head) -> None:
    """The same methods on an encoder–decoder: units are source tokens, ``ex.query`` the decoder position whose
    prediction is the target; attention maps are read from the cross-attention, rollouts follow Chefer's rules."""
    units = list(ex.units)
    detached = [a[0].detach().float() for a in attentions]  # (H, T or S, S or T) each
    kinds = [record.kind for record in layers]
    by_kind = {kind: [a for a, k in zip(detached, kinds) if k == kind] for kind in ("encoder", "decoder", "cross")}
    cross_records = [record for record in layers if record.kind == "cross"]
    chosen = by_kind["cross"][layer]  # explain() checked the layer and head against the cross-attention
    timed("raw_attention", lambda: (chosen.mean(0) if head is None else chosen[head])[ex.query, units])
    timed("rollout", lambda: encoder_decoder_rollout(by_kind["encoder"], by_kind["decoder"], by_kind["cross"])[
        ex.query, units])
    timed("value_norms", lambda: value_norm_row(by_kind["cross"][-1], cross_records[-1].values[0].detach().float(),
                                                ex.query)[units])
    if gradients is not None:
        grads = [g[0].float() if g is not None else torch.zeros_like(a) for g, a in zip(gradients, detached)]
        grads_by_kind = {kind: [g for g, k in zip(grads, kinds) if k == kind] for kind in by_kind}
        timed("gradient_rollout", lambda: encoder_decoder_rollout(by_kind["encoder"], by_kind["decoder"],
                                                                  by_kind["cross"], grads_by_kind)[ex.query, units])
        timed("grad_cam", lambda: grad_cam(by_kind["cross"][-1], grads_by_kind["cross"][-1])[ex.query, units])
        _input_x_gradient(timed, embeddings, embedding_grad, units)
