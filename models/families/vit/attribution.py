"""Class-specific attributions for a ViT, computed with captum, and how well they agree with attention rollout.

- Integrated Gradients (Sundararajan et al. 2017, "Axiomatic Attribution for Deep Networks"):
  ``IG_i(x) = (x_i − x'_i) · ∫₀¹ ∂F_c(x' + α(x − x'))/∂x_i dα``, Riemann-approximated with ``steps`` points; the
  baseline ``x'`` is a black image (pixel value 0, normalised as the model's data config says).
- Occlusion (Zeiler & Fergus 2014): replace one patch at a time by the same black baseline and record how much the
  class logit drops; window = stride = one ViT patch, so each score belongs to exactly one token.
- GradientSHAP (Lundberg & Lee 2017, captum's ``GradientShap``): expected gradients × (input − baseline) over random
  points between the input and baselines drawn from {black, white, grey}, with small Gaussian noise.

Pixel attributions ``(3, H, W)`` are summed over colour channels, then pooled per patch as the sum of absolute
values (how much a patch matters, in either direction), so they compare one-to-one with rollout's ``(rows, cols)``.
Agreement is Spearman's rank correlation ρ between the two per-patch maps (ties get average ranks):
ρ = 1 when both order the patches the same way, 0 when unrelated, −1 when reversed.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from models import families
from models.analysis.pixels import Attribution, ExplainedClass, patch_pool, per_patch
from models.core import images
from models.families.vit import explain as vit_explain
from models.families.vit.explain import crop_tensor  # noqa: F401  (re-exported: the tests read it here)
from models.families.vit.model import LoadedVision, ViTResult

METHODS = {
    "integrated_gradients": "Integrated Gradients",
    "occlusion": "Occlusion",
    "gradient_shap": "GradientSHAP",
}


def _baseline(loaded: LoadedVision, value: float, like: torch.Tensor) -> torch.Tensor:
    """A constant image (``value`` in [0, 1] on every channel) normalised as the model's data config says."""
    mean = torch.tensor(loaded.data_config["mean"], dtype=like.dtype, device=like.device).view(1, 3, 1, 1)
    std = torch.tensor(loaded.data_config["std"], dtype=like.dtype, device=like.device).view(1, 3, 1, 1)
    return ((torch.full_like(like, value) - mean) / std).contiguous()


def explain(loaded: LoadedVision, result: ViTResult, options) -> ExplainedClass:
    """The attribution view's analysis: ``options.method`` for class ``options.target`` (None: the top prediction)
    with ``options.steps``, on the crop ``result`` saw."""
    if not result.predictions:
        raise ValueError(result.explanation or "this model has no classifier, so there is no class to attribute")
    target = result.predictions[0].token_id if options.target is None else options.target
    own = getattr(families.get(loaded.spec.family).explainer, "class_attribution", None)
    if own is not None:  # a family with its own way to attribute a class (Swin: windows carried back to the grid)
        return own(loaded, result, target, options.method, options.steps)
    if options.method not in METHODS and options.method in all_methods():
        return ExplainedClass(result, attribute_shared(loaded, result, target, options.method, options.steps))
    return ExplainedClass(result, attribute_crop(loaded, result.image.image, target, options.method, options.steps))


def all_methods() -> dict[str, str]:
    """The pixel methods here and the shared token methods (models/analysis/attribution.py): rollout, value norms,
    ALTI, gradient rollout, Grad-CAM, input × gradient (``integrated_gradients`` here stays the pixel one)."""
    from models.analysis import attribution

    return {**METHODS, **{m: t for m, t in attribution.METHODS.items() if m not in METHODS}}


def attribute_shared(loaded: LoadedVision, result: ViTResult, target: int, method: str, steps: int) -> Attribution:
    """A shared method's per-patch scores as an ``Attribution`` (pixels: each patch's score over its pixels)."""
    from models.analysis import attribution

    found = attribution.explain(vit_explain.from_result(loaded, result, target), (method,), ig_steps=max(2, steps))
    return per_patch(result, found, method, target, loaded.label_names[target])


def attribute(loaded: LoadedVision, image, target: int, method: str = "integrated_gradients",
              steps: int = 32) -> Attribution:
    """Explain class ``target`` of ``loaded`` on ``image`` (PIL or UserImage) with ``method`` (see ``attribute_crop``)."""
    return attribute_crop(loaded, images.preprocess(image, loaded.data_config).crop, target, method, steps)


def attribute_crop(loaded: LoadedVision, crop: np.ndarray, target: int, method: str = "integrated_gradients",
                   steps: int = 32) -> Attribution:
    """Explain class ``target`` of ``loaded`` on its input crop (uint8 ``(H, W, 3)``) with ``method``.

    ``steps``: integration points (IG) or samples (GradientSHAP); cost ≈ ``steps`` forward+backward passes.
    Occlusion costs one forward per patch (196 for ViT-B/16), batched.
    """
    from captum.attr import GradientShap, IntegratedGradients, Occlusion

    if not loaded.is_classifier:
        raise ValueError("this model has no classifier, so there is no class to attribute")
    if not 0 <= target < len(loaded.label_names):
        raise ValueError(f"class {target} does not exist: this model has classes 0..{len(loaded.label_names) - 1}")
    if method not in METHODS:
        raise ValueError(f"unknown attribution method {method!r}; use one of {', '.join(all_methods())}")
    if not 2 <= steps <= 256:
        raise ValueError(f"steps must be between 2 and 256; got {steps}")
    model = loaded.model
    dtype = next(model.parameters()).dtype
    inputs = crop_tensor(loaded, crop).to(loaded.device, dtype)
    black = _baseline(loaded, 0.0, inputs)
    patch, grid = _patches(loaded, crop)
    if not loaded.is_timm:  # a transformers classifier returns an output object: captum reads its logits
        if model.config.model_type.startswith("siglip2"):
            raise ValueError("SigLIP 2 reads its image as a sequence of patches of a size it chooses per image, so "
                             "pixel attributions are not offered for it; rollout and the attention views are.")
        classifier = model

        def model(pixels):  # noqa: F811 - captum's forward function
            return classifier(pixel_values=pixels).logits
    started = time.perf_counter()
    delta = None
    with torch.enable_grad():
        if method == "integrated_gradients":
            result, deltas = IntegratedGradients(model).attribute(
                inputs, baselines=black, target=target, n_steps=steps, internal_batch_size=min(steps, 16),
                return_convergence_delta=True)
            delta = float(deltas.abs().max())
        elif method == "occlusion":
            result = Occlusion(model).attribute(
                inputs, sliding_window_shapes=(3, *patch), strides=(3, *patch), baselines=black, target=target,
                perturbations_per_eval=16)
        else:  # stochastic: captum draws baselines and noise from the global RNGs
            baselines = torch.cat([black, _baseline(loaded, 1.0, inputs), _baseline(loaded, 0.5, inputs)])
            result = GradientShap(model).attribute(inputs, baselines=baselines, target=target, n_samples=steps,
                                                   stdevs=0.05)
    pixels = result[0].detach().float().sum(0).cpu().numpy()  # (H, W)
    seconds = time.perf_counter() - started
    return Attribution(method, target, loaded.label_names[target], pixels, patch_pool(pixels, grid, patch),
                       seconds, delta)


def _patches(loaded: LoadedVision, crop: np.ndarray) -> tuple[tuple[int, int], tuple[int, int]]:
    """(patch size, patch grid) in pixels of ``crop`` for a timm or a transformers ViT."""
    if loaded.is_timm:
        model = loaded.model
        return tuple(int(p) for p in model.patch_embed.patch_size), tuple(int(g) for g in model.patch_embed.grid_size)
    from models.core import vision_checkpoints

    patch = vision_checkpoints.patch_size(loaded.model.config)
    return patch, (crop.shape[0] // patch[0], crop.shape[1] // patch[1])


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's ρ between two maps of the same shape (flattened); NaN when either map is constant."""
    from scipy.stats import rankdata

    x, y = rankdata(np.ravel(a)), rankdata(np.ravel(b))
    if x.shape != y.shape:
        raise ValueError(f"maps of different sizes cannot be compared: {np.shape(a)} vs {np.shape(b)}")
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])
