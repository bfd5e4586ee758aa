"""The explanation methods, one class each with one verb, ``attribute`` (captum's shape), registered
once in ``METHODS``: the table the pages' pickers, the CLI, the faithfulness tables and the notebook
read. ``attribution.explain(ex, methods)`` runs them on a family's adapter; the math on recorded
tensors is models/analysis/relevance.py.

Each method scores every *unit* of one input (a patch, a token) for one target: how much of the
target's score it is credited with; higher = more relevant. ``y`` is the target's logit (Chefer et
al. back-propagate the one-hot logit); the faithfulness curves read its probability."""
from __future__ import annotations

import numpy as np
import torch

from models.analysis import relevance, rollout
from models.analysis.pixels import PixelInput, patch_pool
from models.analysis.windows import Windowed

RANDOM = "random"  # the faithfulness baseline: random orders, which every method is compared with
RANDOM_NAME = "Random order"  # how the random baseline is named in tables and legends


class Method:
    """One explanation method (captum's shape: a class, one verb). ``attribute(recorded)`` ->
    (units,) scores, higher = more relevant; ``recorded`` (``models.analysis.attribution.Recorded``)
    is the one forward (and backward) of the adapter that every attention and gradient method reads,
    with the settings of this call.

    ``name``: its key (the CLI's ``--method``, the JSON's, the files'); ``label``: how tables and
    legends name it; ``short``: a small tile's label (drawn with PIL's default font: no ×);
    ``what``: what it computes, in words.
    ``reads``: what it needs, "attention" (the recorded forward), "gradient" (and its backward),
    "model" (forwards of its own through the adapter) or "pixels" (forwards of its own on the image,
    ``Explainable.pixels``). ``needs``: the ``Explainable`` field it cannot work without, when not
    every adapter sets it. ``compared``: whether the faithfulness table compares it by default;
    ``takes_steps``: whether ``explain``'s ``ig_steps`` changes its numbers."""

    name = ""
    label = ""
    short = ""
    what = ""
    reads = "attention"
    needs: str | None = None
    compared = True
    takes_steps = False

    def attribute(self, recorded) -> torch.Tensor | np.ndarray:
        raise NotImplementedError


METHODS: dict[str, Method] = {}  # every method, in the order tables and legends list them


def register(cls: type[Method]) -> type[Method]:
    """Add a method to ``METHODS`` (timm's ``register_model``: the table is what exists)."""
    METHODS[cls.name] = cls()
    return cls


@register
class RawAttention(Method):
    """One layer's attention row of the query the target reads, one head or the heads averaged
    (default: the last layer's head mean); an encoder–decoder's decoder cross-attention."""

    name, label, short = "raw_attention", "Raw attention", "attention"
    what = "raw attention (chosen layer and head; default the last layer's head mean)"

    def attribute(self, recorded):
        if recorded.ex.drawn is not None:
            scores, which = recorded.ex.drawn(recorded.layer, recorded.head)
            recorded.descriptions[self.name] = f"raw attention ({which})"
            return scores
        chosen = recorded.pool[recorded.layer]
        chosen = chosen.mean(-3) if recorded.head is None else chosen[..., recorded.head, :, :]
        if recorded.layout is not None:
            return recorded.carried({recorded.layer: Windowed(chosen)})
        return recorded.row(chosen)


def _rolled_windows(fused: torch.Tensor) -> Windowed:
    """(nW, Nw, Nw) -> rollout's ``(A + I)``, rows normalised, per window."""
    rolled = [rollout.attention_rollout([window.unsqueeze(0)]) for window in fused]
    return Windowed(torch.stack(rolled))


@register
class Rollout(Method):
    """Attention rollout (Abnar & Zuidema 2020, eq. 1; models/analysis/rollout.py): ``(½A + ½I)``
    multiplied through the layers; an encoder–decoder by Chefer et al. 2021b's rules with ones for
    gradients."""

    name, label, short, what = "rollout", "Attention rollout", "rollout", "attention rollout"

    def attribute(self, recorded):
        detached = recorded.detached
        if recorded.ex.rolled is not None:
            return recorded.ex.rolled(recorded.by_kind(detached), None)
        if recorded.layout is not None:
            return recorded.carried({i: _rolled_windows(w.mean(1)) for i, w in enumerate(detached)})
        if recorded.encoder_decoder:
            return recorded.row(relevance.encoder_decoder_rollout(*recorded.stacks(detached)))
        return recorded.row(rollout.attention_rollout(detached))


@register
class ValueNorms(Method):
    """Kobayashi et al. 2020, "Attention is Not Only a Weight", eq. 5: ``‖Σ_h α^h_qj f^h(x_j)‖``
    with ``f^h(x) = (LN(x) W_V^h + b_V^h) W_O^h`` (times the layer scale, if any): the size of what
    token ``j`` adds to the query's attention output in the last layer, not only the weight it gets.
    """

    name, label, short = "value_norms", "Value norms", "value norms"
    what = "value-weighted norms ‖α·f(x)‖"

    def attribute(self, recorded):
        last = len(recorded.pool) - 1
        values = recorded.item(recorded.pool_layers[last].values, recorded.pool_index[last])
        if recorded.layout is not None:
            matrix = relevance.value_norm_matrix(recorded.pool[last], values)
            return recorded.carried({last: Windowed(matrix)})
        row = relevance.value_norm_row(recorded.pool[last], values, recorded.ex.query)
        return recorded.pick(row)


@register
class Alti(Method):
    """Ferrando et al. 2022 (relevance.alti_matrix) per layer, the layers' contribution matrices
    multiplied like rollout."""

    name, label, short, what = "alti", "ALTI", "ALTI", "ALTI (residual-aware, rolled out)"

    def attribute(self, recorded):
        if recorded.encoder_decoder:
            raise ValueError("ALTI reads one token sequence; an encoder–decoder needs ALTI+'s "
                             "rules for cross-attention (Ferrando et al. 2022b): use value zeroing")
        parts = [(attention, recorded.item(layer.values, i), recorded.item(layer.residual, i))
                 for i, (attention, layer) in enumerate(zip(recorded.detached, recorded.layers))]
        if recorded.layout is not None:
            return recorded.carried({
                i: Windowed(torch.stack([relevance.alti_matrix(*window) for window in zip(*layer)]))
                for i, layer in enumerate(parts)})
        return recorded.row(relevance.product([relevance.alti_matrix(*p) for p in parts]))


@register
class GradientRollout(Method):
    """Chefer et al. 2021b, eq. 5–6: ``Ā_l = E_h[(∇A_l ⊙ A_l)⁺]``, ``R ← R + Ā_l · R`` from
    ``R = I``; the query's row (an encoder–decoder: their eq. 6–11). Class-specific."""

    name, label, short = "gradient_rollout", "Gradient rollout", "grad rollout"
    what = "gradient-weighted rollout (Chefer 2021b)"
    reads = "gradient"

    def attribute(self, recorded):
        detached, gradients = recorded.detached, recorded.gradients
        if recorded.ex.rolled is not None:
            return recorded.ex.rolled(recorded.by_kind(detached), recorded.by_kind(gradients))
        if recorded.layout is not None:
            return recorded.carried({i: Windowed(relevance.gradient_fusion(w, g), identity=1.0)
                                     for i, (w, g) in enumerate(zip(detached, gradients))})
        if recorded.encoder_decoder:
            return recorded.row(relevance.encoder_decoder_rollout(*recorded.stacks(detached),
                                                                  recorded.by_kind(gradients)))
        return recorded.row(relevance.gradient_rollout(detached, gradients))


@register
class GradCam(Method):
    """Selvaraju et al. 2017, as Chefer et al. 2021a apply it to a ViT: the last layer's heads are
    the channels, ``w_h = mean_ij ∂y/∂A^h_ij``, map ``ReLU(Σ_h w_h A^h)`` in the query's row (on the
    last block's tokens instead, a model read from one token has zero gradient at every other
    token). A ``Layout``: the classic one on the last stage's tokens on their grid."""

    name, label, short = "grad_cam", "Grad-CAM", "Grad-CAM"
    what = "Grad-CAM (last layer's heads as channels)"
    reads = "gradient"

    def attribute(self, recorded):
        if recorded.layout is not None:
            output = recorded.layers[-1].output
            channels = output.shape[-1]
            start = relevance.grad_cam_tokens(output[0].detach().reshape(-1, channels),
                                              recorded.feature_gradient[0].reshape(-1, channels))
            return recorded.carried({}, start)
        last = len(recorded.pool) - 1
        gradient = recorded.gradients[recorded.pool_index[last]]
        return recorded.row(relevance.grad_cam(recorded.pool[last], gradient))


@register
class IntegratedGradients(Method):
    """Sundararajan et al. 2017 (captum): on the input embeddings, from the baseline where every
    unit is removed (the replacement the deletion curves use), summed over the embedding dimension
    (signed). Completeness: the scores sum to ``y(x) − y(baseline)``."""

    name, label, short = "integrated_gradients", "Integrated Gradients", "IG"
    what = "Integrated Gradients (embeddings, captum)"
    reads, takes_steps = "model", True

    def attribute(self, recorded):
        from captum.attr import IntegratedGradients as Captum

        ex, steps = recorded.ex, recorded.steps

        def forward(embeddings):
            return ex.score(ex.logits(embeddings))

        with torch.enable_grad():
            found, delta = Captum(forward).attribute(
                ex.embeddings, baselines=ex.ig_baseline(), n_steps=steps,
                internal_batch_size=min(steps, ex.batch_size), return_convergence_delta=True)
        recorded.deltas[self.name] = float(delta.abs().max())
        recorded.ig_difference = recorded.score - float(ex.score(ex.logits(ex.ig_baseline()))[0])
        return found[0].detach().float().sum(-1)[list(ex.units)]  # (N,) summed over the dimension


@register
class InputXGradient(Method):
    """Shrikumar et al. 2016: ``x · ∂y/∂x`` on the input embeddings, summed over the dimension."""

    name, label, short = "input_x_gradient", "Input × gradient", "input x grad"
    what = "input × gradient (embeddings)"
    reads = "gradient"

    def attribute(self, recorded):
        embeddings = recorded.embeddings[0].detach().float()
        gradient = recorded.embedding_gradient[0]
        return (embeddings * gradient.float()).sum(-1)[recorded.units]


@register
class ValueZeroing(Method):
    """Mohebbi et al. 2023, "Quantifying Context Mixing in Transformers", adapted to cross-attention
    (encoder–decoders, ``Explainable.zeroed``): for each source unit ``j``, its value vector ``v_j``
    is set to zero in the cross-attention of every decoder layer at once (the encoder and the
    decoder's own inputs unchanged) and the decoder's output ``h`` at the target's position is
    recomputed; ``j``'s score is ``max(0, 1 − cos(h^{¬j}, h))``, normalised to sum to 1. One batched
    forward (a row per unit). It measures what reaches the target through ``j``'s slot of the
    encoder output, not the encoder's own mixing."""

    name, label, short = "value_zeroing", "Value zeroing", "value zeroing"
    what = ("value zeroing (Mohebbi 2023) via cross-attention: 1 − cos of the target position's "
            "decoder output when the token's value is zeroed in every cross-attention, normalised")
    reads, needs = "model", "zeroed"

    def attribute(self, recorded):
        ex = recorded.ex
        n, units = ex.embeddings.shape[1], list(ex.units)
        keep = torch.ones(1 + len(units), n, device=ex.embeddings.device)
        keep[torch.arange(1, 1 + len(units)), units] = 0.0  # row 0: nothing zeroed (the reference)
        found = torch.cat([ex.zeroed(keep[i:i + ex.batch_size]).float()
                           for i in range(0, len(keep), ex.batch_size)])
        cosine = torch.nn.functional.cosine_similarity(found[1:], found[:1], dim=-1)
        distance = (1 - cosine).clamp(min=0)
        return distance / distance.sum().clamp(min=1e-12)


class PixelMethod(Method):
    """A captum method on an image family's pixels (``Explainable.pixels``): the pixel map (H, W),
    summed over the colour channels, pooled per patch as the sum of absolute values (how much a
    patch matters in either direction), which are the units' scores. Drawn on its own (the ViT's
    attribution tab), not compared in the faithfulness table by default: on ViT-B occlusion alone is
    196 forwards."""

    reads, needs, compared, takes_steps = "pixels", "pixels", False, True

    def attribute(self, recorded):
        image, target = recorded.ex.pixels, recorded.ex.target
        with torch.enable_grad():
            found, delta = self.on_pixels(image, target, recorded.steps)
        pixels = found[0].detach().float().sum(0).cpu().numpy()  # (H, W)
        recorded.pixel_maps[self.name] = pixels
        if delta is not None:
            recorded.deltas[self.name] = delta
        return patch_pool(pixels, image.grid, image.patch).ravel()

    def on_pixels(self, image: PixelInput, target: int, steps: int
                  ) -> tuple[torch.Tensor, float | None]:
        """(1, 3, H, W) attributions and, for a method with completeness, its error."""
        raise NotImplementedError


@register
class PixelIntegratedGradients(PixelMethod):
    """Integrated Gradients (Sundararajan et al. 2017) on the pixels: ``IG_i(x) = (x_i − x'_i) ·
    ∫₀¹ ∂F_c(x' + α(x − x'))/∂x_i dα`` with ``steps`` points from a black image (pixel value 0,
    normalised as the model's data config says)."""

    name, label, short = "pixel_integrated_gradients", "Integrated Gradients (pixels)", "IG pixels"
    what = "Integrated Gradients on the pixels from a black image, |attribution| per patch (captum)"

    def on_pixels(self, image, target, steps):
        from captum.attr import IntegratedGradients as Captum

        found, deltas = Captum(image.model).attribute(
            image.pixels, baselines=image.constant(0.0), target=target, n_steps=steps,
            internal_batch_size=min(steps, 16), return_convergence_delta=True)
        return found, float(deltas.abs().max())


@register
class Occlusion(PixelMethod):
    """Zeiler & Fergus 2014: one patch at a time replaced by the black image, the class logit's drop
    recorded; window = stride = one patch, so each score belongs to exactly one token."""

    name, label, short = "occlusion", "Occlusion", "occlusion"
    what = "occlusion: the logit's drop with each patch black, |attribution| per patch (captum)"
    takes_steps = False

    def on_pixels(self, image, target, steps):
        from captum.attr import Occlusion as Captum

        window = (3, *image.patch)
        found = Captum(image.model).attribute(image.pixels, sliding_window_shapes=window,
                                              strides=window, baselines=image.constant(0.0),
                                              target=target, perturbations_per_eval=16)
        return found, None


@register
class GradientShap(PixelMethod):
    """GradientSHAP (Lundberg & Lee 2017, captum's ``GradientShap``): expected gradients ×
    (input − baseline) over random points between the input and baselines drawn from {black, white,
    grey}, with small Gaussian noise; ``steps`` samples (captum draws them from the global random
    generators)."""

    name, label, short = "gradient_shap", "GradientSHAP", "GradientSHAP"
    what = "GradientSHAP from black, white and grey images, |attribution| per patch (captum)"

    def on_pixels(self, image, target, steps):
        from captum.attr import GradientShap as Captum

        baselines = torch.cat([image.constant(0.0), image.constant(1.0), image.constant(0.5)])
        return Captum(image.model).attribute(image.pixels, baselines=baselines, target=target,
                                             n_samples=steps, stdevs=0.05), None


# the methods every adapter offers unless it says otherwise (``Explainable.methods``), and those an
# image family adds (``Explainable.pixels``)
SHARED = tuple(name for name, method in METHODS.items() if method.needs is None)
PIXELS = tuple(name for name, method in METHODS.items() if method.needs == "pixels")


def method_name(method: str) -> str:
    """A method as tables and legends name it ("grad_cam" -> "Grad-CAM")."""
    if method == RANDOM:
        return RANDOM_NAME
    return METHODS[method].label if method in METHODS else method
