"""The ViT's adapter for the shared explanations (models/analysis/attribution.py) and faithfulness
curves (models/analysis/faithfulness.py): a timm ``VisionTransformer`` run from its token
embeddings, with hooks that keep each layer's attention (differentiable), per-head value vectors and
residual stream.

Units are the patch tokens; the target is a class read from [CLS] (query 0). A removed patch is
replaced by the data config's mean colour (0 after normalisation: the grey Chefer et al. 2021a
perturb with) or, with ``replacement="blur"``, by the same patch of the image blurred with σ = one
patch. Because the patch embedding is a linear map of each patch's own pixels, replacing a patch's
pixels is exactly replacing its token embedding by the baseline image's, so the curves perturb
embeddings and every method and curve shares one code path."""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from models.analysis import attribution
from models.analysis.attribution import Explainable, LayerRecord
from models.analysis.methods import PIXELS, SHARED
from models.analysis.pixels import (
    REPLACEMENTS,
    check_image,
    normalised,
    pixel_input,
    removed_pixels,
)
from models.core import hooks
from models.families.vit.model import LoadedVision, ViTResult, loaded_dtype


def crop_tensor(loaded: LoadedVision, crop: np.ndarray) -> torch.Tensor:
    """The model's input ``(1, 3, H, W)`` from the uint8 crop it saw ``(H, W, 3)``."""
    return normalised(crop, loaded.data_config)


def _offered(model: torch.nn.Module) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The methods this ViT offers, and why any are missing: the attention methods read [CLS]'s row,
    and value norms and ALTI need plain multi-head attention; the pixel methods need neither."""
    pooled = getattr(model, "global_pool", "token") != "token"
    if getattr(model, "cls_token", None) is None or pooled:
        return PIXELS, ("this ViT does not classify from a [CLS] token, so there is no single row "
                        "to explain: only the pixel methods (occlusion, GradientSHAP, IG on "
                        "pixels) apply",)
    for block in model.blocks:
        attention = block.attn
        if getattr(attention, "gate", None) is not None or not isinstance(
                getattr(attention, "norm", torch.nn.Identity()), torch.nn.Identity):
            return tuple(m for m in (*SHARED, *PIXELS) if m not in ("value_norms", "alti")), (
                f"{type(model).__name__}'s attention has a gate or an output norm; value norms and "
                "ALTI need plain multi-head attention",)
    return (*SHARED, *PIXELS), ()


def embed(model: torch.nn.Module, pixels: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) normalised pixels -> (B, N, D) what the first block reads."""
    return model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(pixels))))


def logits_from_embeddings(model: torch.nn.Module, embeddings: torch.Tensor) -> torch.Tensor:
    """(B, N, D) -> (B, classes): the blocks, the final norm and the head."""
    return model.forward_head(model.norm(model.blocks(embeddings)))


@contextmanager
def recording(model: torch.nn.Module):
    """Hooks on every block for this call's forwards inside the block (``hooks.installed``):
    attention at ``attn_drop`` (fused attention is off on a loaded ViT), values from ``qkv`` through
    each head's slice of ``proj`` (and the layer scale), the block's input. Yields the list of
    ``LayerRecord`` it fills."""
    records = [LayerRecord() for _ in model.blocks]

    def block_hooks(block, record: LayerRecord) -> list[hooks.Hook]:
        attention = block.attn
        heads, head_dim = attention.num_heads, attention.head_dim

        def keep_input(module, inputs):
            record.residual = inputs[0]

        def keep_attention(module, inputs, output):
            record.attention = output

        def keep_values(module, inputs, output):
            batch, n, _ = output.shape
            v = output.reshape(batch, n, 3, heads, head_dim)[:, :, 2].transpose(1, 2)  # (B, H, N, hd)

            def values():
                weight = attention.proj.weight.reshape(-1, heads, head_dim)  # (D, H, hd): W_O split by head
                per_head = torch.einsum("bhnk,dhk->bhnd", v, weight)  # (B, H, N, D)
                gamma = getattr(block.ls1, "gamma", None)
                return per_head * gamma if gamma is not None else per_head

            record.values_from = values

        return [hooks.before(block, keep_input), hooks.after(attention.attn_drop, keep_attention),
                hooks.after(attention.qkv, keep_values)]

    with hooks.installed(block_hooks(block, record) for block, record in zip(model.blocks, records)):
        yield records


def baseline_pixels(loaded: LoadedVision, crop: np.ndarray, replacement: str) -> torch.Tensor:
    """The input with every patch removed (``removed_pixels``) for a loaded ViT."""
    return removed_pixels(crop, loaded.data_config, int(loaded.model.patch_embed.patch_size[0]), replacement)


def explainable(loaded: LoadedVision, crop: np.ndarray, target: int | None = None, replacement: str = "mean",
                batch_size: int = 64) -> Explainable:
    """The adapter for class ``target`` (None: the top prediction) on ``crop`` (uint8 (H, W, 3), the
    model's input size)."""
    if not loaded.is_classifier:
        raise ValueError("this model has no classifier (DINOv2 is a self-supervised backbone), so there is no class to "
                         "explain or to measure faithfulness for; pick the mini ViT shapes or a hub ViT with ImageNet "
                         "classes")
    if not loaded.is_timm:
        raise ValueError(f"the explanations, the class attributions and the faithfulness curves read a timm ViT's "
                         f"blocks (embeddings, per-head values, residual stream); this "
                         f"{loaded.model.config.model_type} model was loaded by transformers, so they are not "
                         "offered for it. Its attention views, rollout and positions work; the same architecture "
                         "saved with timm (timm.models.save_for_hf) gets all of them.")
    check_image(crop)
    classes = len(loaded.label_names)
    if isinstance(target, str):
        raise ValueError(f"a ViT explains a class index (0..{classes - 1}), not a typed token {target!r}")
    if target is not None and not 0 <= target < classes:
        raise ValueError(f"class {target} does not exist: this model has classes 0..{classes - 1}")
    model = loaded.model
    methods, notes = _offered(model)
    dtype = loaded_dtype(loaded)
    with torch.no_grad():
        pixels = crop_tensor(loaded, crop).to(loaded.device, dtype)
        embeddings = embed(model, pixels)
        baseline = embed(model, baseline_pixels(loaded, crop, replacement).to(loaded.device, dtype))
        if target is None:
            target = int(logits_from_embeddings(model, embeddings)[0].argmax())
    prefix = int(model.num_prefix_tokens)
    rows, cols = (int(g) for g in model.patch_embed.grid_size)
    baseline[:, :prefix] = embeddings[:, :prefix]  # [CLS] and registers are never removed
    names = tuple(f"patch ({r}, {c})" for r in range(rows) for c in range(cols))
    return Explainable(embeddings, baseline, tuple(range(prefix, prefix + rows * cols)), 0, target,
                       loaded.label_names[target], lambda e: logits_from_embeddings(model, e),
                       lambda: recording(model), names, REPLACEMENTS[replacement], batch_size,
                       notes=notes, methods=methods,
                       pixels=pixel_input(model, crop, loaded.data_config, loaded.device))


def from_result(loaded: LoadedVision, result: ViTResult, target: int | None, replacement: str = "mean",
                batch_size: int = 64) -> Explainable:
    """The adapter for the crop a run saw."""
    return explainable(loaded, result.image.image, target, replacement, batch_size)


# --- the pointing game and IoU on generated shapes (the segmentation test of Chefer et al. 2021a,
# on our data) -----

LOCALISATION_SEED = 31337  # a stream of its own: the mini was trained on seed 0 and tested on seed 987654
MAX_LOCALISATION_IMAGES = 2000


@dataclass(frozen=True)
class Localisation:
    """Per method (and ``random``): the pointing game hit rate and mean IoU over ``images``
    generated shapes.

    A *hit*: the method's top patch touches the shape (any of its pixels). *IoU*: between the
    patches the method scores above its own mean (the threshold Chefer et al. 2021a binarise with)
    and the patches the shape covers at least half of. ``random`` scores each patch with uniform
    noise (one draw per image)."""

    model: str
    images: int
    seed: int
    methods: tuple[str, ...]
    hits: np.ndarray  # (methods + 1, images) bool; the last row is random
    iou: np.ndarray  # (methods + 1, images) float
    correct: np.ndarray  # (images,) bool: the model's top class was the shape's class
    seconds: float

    def summary(self) -> dict[str, dict[str, float]]:
        names = [*self.methods, "random"]
        n = max(1, self.images)
        return {name: {"pointing_game": float(self.hits[i].mean()), "pointing_game_se":
                       float(self.hits[i].std() / np.sqrt(n)), "iou": float(self.iou[i].mean()),
                       "iou_se": float(self.iou[i].std() / np.sqrt(n))} for i, name in enumerate(names)}


def patch_coverage(mask: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """Fraction of each patch's pixels on the shape: bool (H, W) -> float (rows, cols)."""
    rows, cols = grid
    height, width = mask.shape
    return mask.reshape(rows, height // rows, cols, width // cols).mean(axis=(1, 3))


def pointing_and_iou(scores: np.ndarray, coverage: np.ndarray) -> tuple[bool, float]:
    """scores, coverage (units,) -> (top patch touches the shape, IoU of above-mean patches with ≥
    half-covered)."""
    hit = bool(coverage[int(np.argmax(scores))] > 0)
    predicted, truth = scores > scores.mean(), coverage >= 0.5
    union = (predicted | truth).sum()
    return hit, float((predicted & truth).sum() / union) if union else 0.0


def localisation(loaded: LoadedVision, images: int = 32, seed: int = LOCALISATION_SEED,
                 methods=SHARED, ig_steps: int = 16,
                 progress=lambda step, fraction: None) -> Localisation:
    """The pointing game and IoU of every method on ``images`` held-out generated shapes (the true
    class as target)."""
    from models.minis.vit_shapes import data

    methods = attribution.check_methods(methods)
    if loaded.spec.source != "mini" or loaded.spec.id != "vit_shapes":
        raise ValueError("the pointing game needs images whose object masks are known: pick the mini ViT shapes "
                         "(its generator draws every shape's mask)")
    if not 1 <= images <= MAX_LOCALISATION_IMAGES:
        raise ValueError(f"the pointing game runs on 1 to {MAX_LOCALISATION_IMAGES} images, not {images}")
    rng = np.random.default_rng(seed)
    noise = np.random.default_rng(seed + 1)
    hits = np.zeros((len(methods) + 1, images), dtype=bool)
    iou = np.zeros((len(methods) + 1, images), dtype=np.float32)
    correct = np.zeros(images, dtype=bool)
    grid = tuple(int(g) for g in loaded.model.patch_embed.grid_size)
    started = time.perf_counter()
    for index in range(images):
        progress(f"image {index + 1}/{images}", index / images)
        sample = data.make_sample(rng)
        ex = explainable(loaded, sample.image, sample.label)
        found = attribution.explain(ex, methods, ig_steps)
        with torch.no_grad():
            correct[index] = int(ex.logits(ex.embeddings)[0].argmax()) == sample.label
        coverage = patch_coverage(sample.mask, grid).ravel()
        for row, method in enumerate(methods):
            hits[row, index], iou[row, index] = pointing_and_iou(found.scores[method], coverage)
        hits[-1, index], iou[-1, index] = pointing_and_iou(noise.random(coverage.size), coverage)
    progress("done", 1.0)
    return Localisation(loaded.spec.key, images, seed, methods, hits, iou, correct, time.perf_counter() - started)
