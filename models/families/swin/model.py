"""Swin Transformer family: load a timm Swin (v1 or v2; or a transformers Swin, ``hf.py``), run it on an image with
every block's window attention captured, and read its structure (windows, shifts, masks, bias tables) out of the
model's own buffers.

The geometry itself (windows, the cyclic shift, masks, relative position index, cost) is pure numpy in
``models/families/swin/geometry.py``; tests compare the two. Attention is captured at each ``WindowAttention.softmax`` (fused
attention switched off per module, see ``models/core/capture_timm.py``).

A result has two views of the same attention: ``SwinResult.windows`` (``WindowAttention``: per block, the
``(windows, heads, N, N)`` maps as the model computed them on the rolled map, with the block's geometry), and the
contract's ``attention["self"]`` (``SwinAttention``: per block a dense ``(heads, H·W, H·W)`` map over that stage's
tokens in image order, zero outside each token's window). Stages differ in tokens and heads, so the dense maps are
not ``uniform``: read ``heads_in(block)`` and ``tokens_in(block)``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from models.core import capture_timm, images, loading, vision_checkpoints
from models.core.inputs import ImageInput
from models.core.loading import LoadedModel, Progress
from models.core.results import AttentionMaps, ImageInfo, ImageResult, TokenProbability
from models.core.specs import ModelSpec
from models.families.swin import hf
from models.families.swin.geometry import (
    BlockGeometry,
    StageGeometry,
    SwinStructure,
    cyclic_shift,
    padded_size,
    patch_attention_map,
    window_partition,
)

CAPTURE_DESCRIPTION = ("timm eager window attention (fused_attn off per module); softmax(QKᵀ/√d + B + mask) hooked "
                       "at each WindowAttention.softmax")
CAPTURE_V2_DESCRIPTION = ("timm Swin v2 window attention (no fused path); softmax(τ · cos(q, k) + 16·σ(B) + mask) "
                          "hooked at each WindowAttention.softmax")
FULL_EXPANSION_LIMIT = 64_000_000  # heads · N² entries above which layer(i) refuses to build the dense matrix


def _np(tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy() if tensor.is_floating_point() else tensor.detach().cpu().numpy()


def _timm_swin_classes() -> tuple[type, ...]:
    from timm.models.swin_transformer import SwinTransformer
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    return SwinTransformer, SwinTransformerV2


def _bias_table(attention) -> np.ndarray:
    """A timm window attention's bias table ``((2M−1)², heads)``: v1's learned parameter; v2's continuous bias,
    16·sigmoid(cpb_mlp(relative_coords_table)), tabulated over the window's offsets as its forward gathers it."""
    import torch

    table = getattr(attention, "relative_position_bias_table", None)
    if table is not None:
        return _np(table).astype(np.float32)
    with torch.no_grad():
        mlp = attention.cpb_mlp(attention.relative_coords_table).view(-1, attention.num_heads)
        return _np(16 * torch.sigmoid(mlp)).astype(np.float32)


def read_structure(model) -> SwinStructure:
    """Read stages, blocks, windows, shifts, masks and bias tables out of a timm ``SwinTransformer`` (v1) or
    ``SwinTransformerV2``, or a transformers Swin (``hf.read_structure``)."""
    import torch

    if hasattr(model, "config") and hasattr(model, "base_model"):
        return hf.read_structure(model)
    if not isinstance(model, _timm_swin_classes()):
        raise ValueError(f"{type(model).__name__} is not a Swin Transformer from timm (v1 or v2); this page reads "
                         "their windows, masks and bias tables. Pick a timm 'swin_*' or 'swinv2_*' model.")
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    patch = tuple(model.patch_embed.patch_size)
    image_size = tuple(model.patch_embed.img_size)
    stages, blocks = [], []
    for s, layer in enumerate(model.layers):
        merge = None
        if hasattr(layer.downsample, "reduction"):
            out_features, in_features = layer.downsample.reduction.weight.shape
            merge = (int(in_features), int(out_features))
        token_px = patch[0] * 2 ** s
        first = layer.blocks[0]
        stages.append(StageGeometry(s, tuple(layer.output_resolution), int(first.dim), len(layer.blocks),
                                    int(first.attn.num_heads), token_px, merge))
        for b, block in enumerate(layer.blocks):
            mask = block.attn_mask
            if mask is None and any(block.shift_size):  # dynamic-size models build the mask per forward
                hp, wp = padded_size(tuple(block.input_resolution), tuple(block.window_size))
                with torch.no_grad():
                    mask = block.get_attn_mask(torch.zeros(1, hp, wp, 1))
            heads = int(block.attn.num_heads)
            window_area = int(block.window_size[0]) * int(block.window_size[1])
            blocks.append(BlockGeometry(
                len(blocks), s, b, tuple(block.input_resolution), tuple(block.window_size),
                tuple(block.shift_size), heads, int(block.dim), token_px,
                None if mask is None else _np(mask).astype(np.float32),
                _np(block.attn.relative_position_index).astype(np.int64).reshape(window_area, window_area),
                _bias_table(block.attn)))
    return SwinStructure(image_size, patch, stages, blocks, version=2 if isinstance(model, SwinTransformerV2) else 1)


@dataclass(frozen=True, eq=False)
class WindowAttention:
    """Captured window attention of every block, as the model computed it: ``windows[b]`` float32
    ``(nW, heads, N, N)`` on the rolled, padded map (rows sum to 1, masked pairs ≈ 0), with ``geometry[b]``."""

    windows: tuple[np.ndarray, ...]
    geometry: tuple[BlockGeometry, ...]

    def __post_init__(self):
        for weights in self.windows:
            weights.setflags(write=False)

    def heads_in(self, block: int) -> int:
        return int(self.windows[block].shape[1])

    def window_head(self, block: int, head: int | None) -> np.ndarray:
        """One head's per-window maps ``(nW, N, N)`` (mean over heads when None)."""
        weights = self.windows[block]
        if head is None:
            return weights.mean(axis=1)
        if not 0 <= head < weights.shape[1]:
            raise ValueError(f"head {head} does not exist: block {block} has heads 0..{weights.shape[1] - 1}")
        return weights[:, head]

    def patch_map(self, block: int, head: int | None, query: tuple[int, int]) -> np.ndarray:
        """``patch_attention_map`` for ``block``: float32 ``(H, W)`` over the original token grid."""
        g = self.geometry[block]
        return patch_attention_map(self.window_head(block, head), query, g.resolution, g.window, g.shift)


def token_labels(resolution: tuple[int, int]) -> list[str]:
    """``r{row}c{col}`` for every token of an ``(H, W)`` grid, row-major."""
    height, width = resolution
    return [f"r{r}c{c}" for r in range(height) for c in range(width)]


@dataclass(frozen=True, eq=False)
class SwinAttention(AttentionMaps):
    """The contract's view of the window attention: per block a dense ``(heads, H·W, H·W)`` map over the block's
    tokens in original row-major order (the roll undone, exactly 0 outside each token's window and region), built
    on demand and refused above ``FULL_EXPANSION_LIMIT`` entries (56² tokens × 3 heads is 118 MB), where
    ``WindowAttention`` is the view to use. Not uniform: tokens and heads differ per stage (``tokens_in``,
    ``heads_in``)."""

    windows: WindowAttention
    kind: str = "self"
    uniform = False

    @property
    def num_layers(self) -> int:
        return len(self.windows.windows)

    @property
    def num_heads(self) -> int:
        raise ValueError("Swin's stages have different numbers of heads: use heads_in(block)")

    @property
    def query_tokens(self) -> list[str]:
        raise ValueError("Swin's stages have different tokens: use tokens_in(block)")

    key_tokens = query_tokens

    def heads_in(self, layer: int) -> int:
        self._check_layer(layer)
        return self.windows.heads_in(layer)

    def tokens_in(self, layer: int) -> tuple[list[str], list[str]]:
        self._check_layer(layer)
        labels = token_labels(self.windows.geometry[layer].resolution)
        return labels, labels

    def _dense_entries(self, layer: int) -> int:
        height, width = self.windows.geometry[layer].resolution
        return self.heads_in(layer) * (height * width) ** 2

    def _compute(self, layer: int) -> np.ndarray:
        if self._dense_entries(layer) > FULL_EXPANSION_LIMIT:
            raise ValueError(f"block {layer} as one dense matrix would hold {self._dense_entries(layer):,} entries; "
                             "use the per-window view (SwinResult.windows) for this stage")
        height, width = self.windows.geometry[layer].resolution
        heads = self.heads_in(layer)
        out = np.zeros((heads, height * width, height * width), dtype=np.float32)
        for q in range(height * width):
            for h in range(heads):
                out[h, q] = self.windows.patch_map(layer, h, divmod(q, width)).reshape(-1)
        out[:, ~self.allowed(layer)] = 0.0  # the model weighs masked pairs exp(−100) ≈ 4·10⁻⁴⁴: the contract says 0
        return out

    def allowed(self, layer: int) -> np.ndarray:
        """Boolean ``(H·W, H·W)`` in original token order: same window of the rolled map and same region."""
        g = self.windows.geometry[layer]
        height, width = g.resolution
        hp, wp = g.padded
        rolled = cyclic_shift(np.arange(height * width).reshape(height, width), g.shift)  # original id at rolled pos
        ids = np.full((hp, wp), -1, dtype=np.int64)
        ids[:height, :width] = rolled
        windows = window_partition(ids, g.window).reshape(g.num_windows, -1)  # (nW, N) original ids
        allowed = np.zeros((height * width, height * width), dtype=bool)
        for w, keep in enumerate(g.allowed()):
            tokens = windows[w]
            real = tokens >= 0
            allowed[np.ix_(tokens[real], tokens[real])] = keep[np.ix_(real, real)]
        return allowed


@dataclass(frozen=True, kw_only=True)
class SwinResult(ImageResult):
    """A Swin on one image: the contract's dense ``attention["self"]``, the window maps as captured (``windows``),
    the model's structure (``structure``), and its top classes with where their names came from."""

    windows: WindowAttention
    structure: SwinStructure
    label_source: str = ""  # "ImageNet-1k", "the checkpoint's label_names", ...


def capture_windows(model, pixel_values) -> tuple[Any, list[np.ndarray]]:
    """Run ``model`` on ``pixel_values`` ``(1, 3, H, W)`` with a hook on every ``WindowAttention.softmax``.

    Returns the logits and, per block, float32 ``(nW, heads, N, N)``: the probabilities after bias and mask, as the
    block multiplies them with V. Fused attention must already be off (``capture_timm.disable_fused_attention``).
    """
    import torch

    if pixel_values.shape[0] != 1:
        raise ValueError(f"capture one image at a time, got a batch of {pixel_values.shape[0]}")
    points = capture_timm.attention_points(model, "softmax")
    keep = lambda output: output.detach().float().cpu().numpy()  # noqa: E731 (B·nW, heads, N, N) with B = 1
    with torch.inference_mode(), capture_timm.recording(model, points, keep=keep) as rec:
        logits = model(pixel_values)
    return logits, rec.per_point()


# --- loading -----------------------------------------------------------------------------------------------------

def supported_names() -> list[str]:
    """timm architecture names this page can load (``SwinTransformer`` with a bias table, ``SwinTransformerV2`` with
    its continuous bias)."""
    import timm

    return timm.list_models(module="swin_transformer") + timm.list_models(module="swin_transformer_v2")


def _check_name(spec: ModelSpec) -> None:
    """A bare architecture name must be a Swin (v1); a folder or hub repo is checked once it is created."""
    name = loading.timm_name(spec)
    if name.startswith(("local-dir:", "hf-hub:")):
        return
    base = name.split(".")[0]  # a pretrained tag such as ".ms_in22k_ft_in1k" is allowed
    if base not in supported_names():
        close = [n for n in supported_names() if base.split("_")[0] in n][:5] or supported_names()[:5]
        raise ValueError(f"'{name}' is not a timm Swin (v1 or v2) model. Try one of: {', '.join(close)}; or type "
                         "a local folder saved with timm (config.json + model.safetensors) or transformers.")


def load(spec: ModelSpec, device: str = "cpu", dtype: str = "float32",
         progress: Progress = loading._no_progress) -> hf.LoadedSwin:
    """A Swin ready for ``run``: a timm Swin (v1 or v2) with eager attention per module, or a transformers Swin
    (``hf.py``) when what the user typed has a transformers config.json; eval mode, on ``device`` in ``dtype``."""
    if vision_checkpoints.is_transformers(vision_checkpoints.typed_config(spec)):
        return hf.load(replace(spec, library="transformers"), device, dtype, progress)
    _check_name(spec)
    progress("Loading weights" + (" (downloading if not cached)" if spec.source == "hub" else ""), 0.2)
    model = loading.create_timm(spec, loading.timm_name(spec))
    if not isinstance(model, _timm_swin_classes()):
        hint = (" timm's swinv2_cr_* models compute their bias with an MLP of log-spaced offsets on every forward "
                "and are not read here; the swinv2_* models are.") if "SwinTransformerV2Cr" in type(model).__name__ \
            else " Vision Transformers (ViT, DeiT, DINOv2, EVA) are drawn on the ViT page."
        raise ValueError(f"'{spec.id}' is a {type(model).__name__}, not a Swin Transformer v1 or v2 (SwinTransformer, "
                         f"SwinTransformerV2); this page reads their windows, masks and bias tables.{hint}")
    capture_timm.disable_fused_attention(model)
    model = loading.finish(model, device, dtype, progress)
    progress("Ready", 1.0)
    from timm.models.swin_transformer_v2 import SwinTransformerV2

    description = CAPTURE_V2_DESCRIPTION if isinstance(model, SwinTransformerV2) else CAPTURE_DESCRIPTION
    names = class_names(model)[0] or [f"class {i}" for i in range(int(model.num_classes))]
    return hf.LoadedSwin(spec, model, None, device, dtype, capture=description, label_names=tuple(names))


# --- one run -----------------------------------------------------------------------------------------------------

def class_names(model) -> tuple[list[str] | None, str]:
    """Class names for the model's head and where they came from; ``(None, reason)`` when unknown."""
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    names = cfg.get("label_names")
    if names and len(names) == model.num_classes:
        return [str(n) for n in names], "the checkpoint's label_names"
    if model.num_classes == 1000:
        from timm.data import ImageNetInfo

        info = ImageNetInfo()
        return [info.index_to_description(i).split(",")[0] for i in range(1000)], "ImageNet-1k"
    return None, f"{model.num_classes} classes without names"


def run(loaded: LoadedModel, inputs: ImageInput, options: None = None, top_k: int = 5) -> SwinResult:
    """Preprocess the image as the model's data config (timm) or its image processor (transformers) says, run the
    model with window-attention capture."""
    import torch

    model = loaded.model
    processor = getattr(loaded, "processor", None)
    dtype = next(model.parameters()).dtype
    if processor is None:
        prepared = images.preprocess(inputs.pil, images.data_config(model))
        pixels, crop, said = prepared.tensor.to(device=loaded.device, dtype=dtype), prepared.crop, \
            f"input {prepared.describe()}"
    else:
        pixels, crop, said = vision_checkpoints.pixels_of(processor, inputs.pil, loaded.device, dtype)
        said = f"input prepared by the model's {said}"
    image_size = tuple(vision_checkpoints.image_size(model.config)) if processor is not None else \
        tuple(model.patch_embed.img_size)
    if tuple(crop.shape[:2]) != image_size:
        raise ValueError(f"the model's preprocessing produced a {crop.shape[1]} × {crop.shape[0]} crop but the model "
                         f"takes {image_size[1]} × {image_size[0]}; save a processor (or data config) for its size")
    with loading.friendly_out_of_memory(loaded.device, f"running {loaded.spec.key}"):
        if processor is None:
            logits, captured = capture_windows(model, pixels)
        else:
            logits, captured = hf.capture_windows(loaded, pixels)
    structure = read_structure(model)  # after the forward: transformers narrows windows at run time
    if len(captured) != len(structure.blocks):
        raise RuntimeError(f"{len(captured)} window maps captured for {len(structure.blocks)} blocks")
    for geometry, weights in zip(structure.blocks, captured):
        expected = (geometry.num_windows, geometry.heads, geometry.window[0] * geometry.window[1])
        if weights.shape[:3] != expected:
            raise RuntimeError(f"{geometry.label}: captured {weights.shape}, expected windows/heads/N {expected}")

    windows = WindowAttention(tuple(captured), tuple(structure.blocks))
    first = structure.blocks[0].resolution
    names, label_source = class_names(model) if processor is None else \
        (list(loaded.label_names) or None, "the checkpoint's id2label" if loaded.label_names else "no classifier")
    predictions = ()
    if names is not None and logits is not None:
        probs = torch.softmax(logits[0].float(), -1).cpu()
        top = torch.topk(probs, min(top_k, probs.numel()))
        predictions = tuple(TokenProbability(names[i], int(i), float(p)) for p, i in zip(top.values, top.indices))
    return SwinResult(model=loaded.info(), tokens=token_labels(first), attention={"self": SwinAttention(windows)},
                      input_name=inputs.name,
                      image=ImageInfo(crop, first, structure.patch_size, 0, ()),
                      notices=loaded.notes + inputs.notes + (said,) + _path_notice(loaded),
                      predictions=predictions,
                      windows=windows, structure=structure, label_source=label_source)


def _path_notice(loaded: LoadedModel) -> tuple[str, ...]:
    """What the page says when the maps come from the model's own eager attention."""
    from models.core import capture

    if loaded.capture != capture.EAGER_PATH_DESCRIPTION:
        return ()
    return (f"{capture.model_type(loaded.model)} computes attention its own way (not through transformers' "
            "AttentionInterface), so every block's window maps are the ones its eager attention returns.",)
