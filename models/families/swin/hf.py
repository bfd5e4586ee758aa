"""Swin Transformers from transformers on the Swin page: a folder (or hub id) whose ``config.json`` is a transformers
Swin (``swin``, ``swinv2``, ``donut-swin``, ``maskformer-swin``), read into the same ``SwinResult`` as a timm Swin.

Capture: Swin's attention passes through transformers' ``AttentionInterface`` with the relative position bias and
the shifted-window mask (−100 between regions) as one additive mask per window, so ``WindowRecorder`` keeps each
call's ``softmax(q kᵀ · scaling + mask)`` for every window while SDPA computes the output. Swin v2, Donut's and
MaskFormer's Swins compute attention their own way (v2: cosine scores times a learned temperature, plus
16·sigmoid of an MLP's continuous bias); they are loaded with their eager attention and each block's own returned
weights are read (``output_attentions=True``), the eager path.

Structure (what the views draw): stages and blocks as the model ran them (transformers narrows a window to the
grid and drops its shift when the grid is no larger than one window, at run time), the relative position index
and bias table of each block (Swin v2: its MLP's output over every offset, the table its bias is gathered from),
and the shift masks, which follow the region scheme of ``geometry.py`` exactly as transformers builds them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from models.core import capture, hooks, vision_checkpoints, loading
from models.core.specs import ModelSpec
from models.families.swin.geometry import (
    BlockGeometry,
    StageGeometry,
    SwinStructure,
    padded_size,
    region_ids,
    shifted_window_mask,
)

SWIN_TYPES = ("swin", "swinv2", "donut-swin", "maskformer-swin")
CLASSIFIER_SUFFIX = "ForImageClassification"
WINDOW_CAPTURE = ("AttentionInterface 'capture' (SDPA forward); each window's softmax(QKᵀ/√d + B + mask) "
                  "recomputed from the block's q, k and the additive mask it handed SDPA")


def check_config(spec: ModelSpec, config) -> None:
    """Refuse, before any weight is read, a transformers model that is no Swin."""
    model_type = str(getattr(config, "model_type", ""))
    if model_type in SWIN_TYPES:
        return
    raise ValueError(f"'{spec.id}' is a model of type {model_type or '(none given)'}, not a Swin Transformer: this "
                     f"page reads Swin's windows, shifts and bias tables ({', '.join(SWIN_TYPES)} from "
                     "transformers, or a timm 'swin_*' / 'swinv2_*' model). Vision Transformers such as ViT, DeiT, "
                     "BEiT, DINOv2 and CLIP are drawn on the ViT page.")


def model_class(config):
    """The checkpoint's image classifier when its weights hold one (``architectures``), else the base model."""
    import transformers

    architectures = list(getattr(config, "architectures", None) or [])
    if any(a.endswith(CLASSIFIER_SUFFIX) for a in architectures):
        return transformers.AutoModelForImageClassification
    return transformers.AutoModel


def probe_inputs_for(config):
    def inputs(model) -> dict:
        height, width = vision_checkpoints.image_size(config)
        parameter = next(model.parameters())
        return {"pixel_values": torch.zeros(1, 3, height, width, device=parameter.device, dtype=parameter.dtype)}

    return inputs


@dataclass(eq=False)
class LoadedSwin(loading.LoadedModel):
    """A Swin ready to run; ``processor`` is a transformers model's image processor (None: a timm Swin)."""

    processor: Any = None
    label_names: tuple[str, ...] = field(default=())


def load(spec: ModelSpec, device: str, dtype: str, progress) -> LoadedSwin:
    """A transformers Swin through the capture attention function, or its eager path where its attention does not
    pass through the interface, with its image processor."""
    import transformers

    source = str(loading.spec_folder(spec) or spec.id)
    with loading.library_errors(spec):
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False,
                                                         local_files_only=spec.source != "hub")
    check_config(spec, config)
    # no probe here: a Swin's outputs keep one map per stage (or none), so whether its attention reaches the
    # capture function is asked of its blocks, below
    loaded = loading.load_transformers(spec, model_class, device, dtype, progress,
                                       check_config=lambda c: check_config(spec, c), tokenizer=False)
    model = loaded.model
    if not _reaches_interface(model, probe_inputs_for(config)(model)):
        progress("Loading its own eager attention (its maps are read as each block returns them)", 0.9)
        del model, loaded
        loaded = _eager(spec, source, device, dtype)
        model = loaded.model
    processor, note = vision_checkpoints.processor_for(spec, source, model.config)
    labels = ()
    if CLASSIFIER_SUFFIX in type(model).__name__:
        id2label = getattr(model.config, "id2label", None) or {}
        labels = tuple(str(id2label.get(i, f"class {i}")) for i in range(int(model.config.num_labels)))
    eager = capture.on_eager_path(model)
    description = capture.EAGER_PATH_DESCRIPTION if eager else WINDOW_CAPTURE
    return LoadedSwin(spec, model, None, device, dtype, capture=description, notes=(note,) if note else (),
                      processor=processor, label_names=labels)


def _reaches_interface(model, inputs: dict) -> bool:
    """Whether a blank image's forward hands every block's attention to the capture function."""
    recorder = WindowRecorder(model)
    with torch.inference_mode(), capture.observing(model, recorder):
        model(**inputs)
    return len(recorder.windows) == sum(len(stage) for stage in blocks_of(model))


def _eager(spec: ModelSpec, source: str, device: str, dtype: str) -> loading.LoadedModel:
    """The model again with its own eager attention (``capture.EAGER_PATH``): Swin v2, Donut's and MaskFormer's
    Swins compute attention without the interface and return each block's weights when asked."""
    import transformers

    from models.core import construction

    local_only = spec.source != "hub"
    with loading.library_errors(spec, device=device):
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False, local_files_only=local_only)
        with construction.LOCK:
            model = model_class(config).from_pretrained(
                source, config=config, dtype=loading.torch_dtype(dtype), attn_implementation=capture.EAGER_PATH,
                trust_remote_code=False, use_safetensors=None, local_files_only=local_only)
    model = loading.finish(model, device, dtype)
    return loading.LoadedModel(spec, model, None, device, dtype, capture=capture.EAGER_PATH_DESCRIPTION)


# --- running --------------------------------------------------------------------------------------------------------

class WindowRecorder(capture.Recorder):
    """Each attention call's weights, for every window at once: ``(windows, heads, N, N)`` float32 numpy, computed
    as SDPA applies the mask it is handed (an additive float mask, or a boolean one)."""

    def __init__(self, model):
        super().__init__(module_names={id(m): n for n, m in model.named_modules()},
                         model_type=capture.model_type(model))
        self.windows: list[np.ndarray] = []

    def record(self, module, query, key, attention_mask, kwargs) -> None:
        if key.shape[1] != query.shape[1]:
            key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        scaling = kwargs.get("scaling")
        scaling = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        scores = (query.float() @ key.float().transpose(-2, -1)) * scaling  # (windows, heads, N, N)
        if attention_mask is not None:
            mask = attention_mask[..., -key.shape[2]:]
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, float("-inf"))
            else:
                scores = scores + mask.float()
        self.windows.append(scores.softmax(-1).detach().cpu().numpy())


def blocks_of(model) -> list[list[torch.nn.Module]]:
    """Each stage's blocks, in order."""
    return [list(stage.blocks) for stage in model.base_model.encoder.layers]


def capture_windows(loaded: LoadedSwin, pixels: torch.Tensor) -> tuple[torch.Tensor | None, list[np.ndarray]]:
    """Run the model on ``pixels`` ``(1, 3, H, W)``; the logits (None without a classifier) and every block's
    window attention ``(windows, heads, N, N)`` float32."""
    model = loaded.model
    with torch.inference_mode():
        if capture.on_eager_path(model):
            kept: list[np.ndarray] = []

            def keep(module, inputs, output):
                kept.append(output[1].detach().float().cpu().numpy())

            every = [block for stage in blocks_of(model) for block in stage]
            with hooks.installed(hooks.after(block, keep) for block in every):
                # MaskFormer's Swin collects its maps wrongly, and fails, unless it also returns hidden states;
                # the maps are read from each block, not from what the model collects
                output = model(pixel_values=pixels, output_attentions=True, output_hidden_states=True)
        else:
            recorder = WindowRecorder(model)
            with capture.observing(model, recorder):
                output = model(pixel_values=pixels)
            kept = recorder.windows
    logits = getattr(output, "logits", None)
    return logits if isinstance(logits, torch.Tensor) else None, kept


def _pair(value) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def _bias_module(block) -> torch.nn.Module:
    for module in block.modules():
        if hasattr(module, "relative_position_index"):
            return module
    raise ValueError(f"{type(block).__name__} has no relative position index; this page reads Swin blocks")


def _bias_table(module) -> tuple[np.ndarray, bool]:
    """((2M−1)², heads) float32 and whether it is Swin v2's continuous bias (16·sigmoid of an MLP)."""
    with torch.no_grad():
        if hasattr(module, "relative_position_bias_table"):
            return module.relative_position_bias_table.detach().float().cpu().numpy(), False
        mlp = module.continuous_position_bias_mlp(module.relative_coords_table)
        heads = int(getattr(module, "num_attention_heads", mlp.shape[-1]))
        table = 16 * torch.sigmoid(mlp.reshape(-1, heads))
    return table.detach().float().cpu().numpy(), True


def read_structure(model) -> SwinStructure:
    """Stages and blocks of a transformers Swin as its last forward ran them (windows and shifts are narrowed at
    run time where a grid is no larger than a window)."""
    config = model.config
    patch, image = _pair(config.patch_size), _pair(config.image_size)
    resolution = (-(-image[0] // patch[0]), -(-image[1] // patch[1]))
    stages, blocks, merge = [], [], None
    continuous = False
    for s, stage_blocks in enumerate(blocks_of(model)):
        stage = model.base_model.encoder.layers[s]
        token_px = patch[0] * 2 ** s
        heads = None
        for b, block in enumerate(stage_blocks):
            window = _pair(block.window_size)
            shift = _pair(block.shift_size)
            module = _bias_module(block)
            table, continuous = _bias_table(module)
            heads = int(table.shape[1])
            n = window[0] * window[1]
            index = module.relative_position_index.detach().cpu().numpy().astype(np.int64).reshape(n, n)
            mask = None
            if any(shift):
                mask = shifted_window_mask(region_ids(padded_size(resolution, window), window, shift), window)
            blocks.append(BlockGeometry(len(blocks), s, b, resolution, window, shift, heads,
                                        int(block.layernorm_before.normalized_shape[0]), token_px, mask, index,
                                        table.astype(np.float32)))
        dim = int(stage_blocks[0].layernorm_before.normalized_shape[0])
        stages.append(StageGeometry(s, resolution, dim, len(stage_blocks), heads, token_px, merge))
        merge = None
        if getattr(stage, "downsample", None) is not None:  # transformers merges at the end of a stage
            out_features, in_features = stage.downsample.reduction.weight.shape
            merge = (int(in_features), int(out_features))
            resolution = ((resolution[0] + 1) // 2, (resolution[1] + 1) // 2)
    return SwinStructure(image, patch, stages, blocks, version=2 if continuous else 1)
