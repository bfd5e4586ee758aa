"""Vision Transformers from transformers on the ViT page: a folder (or hub id) whose ``config.json`` is a
transformers one — ViT, DeiT, BEiT, Data2Vec-vision, DINOv2 (with registers), DINOv3, ViT-MSN, I-JEPA, ViT-MAE, and
the vision towers of CLIP, MetaCLIP 2, SigLIP, SigLIP 2, AIMv2 — loaded with the capture attention function
(``models.core.loading.load_transformers``) and run into the same ``ViTResult`` the page's views read.

What the model sees is what its own image processor makes (``preprocessor_config.json``; without one, the
architecture's default processor at the config's image size): the crop the page draws on is that tensor with the
normalisation undone. Tokens are the prefix ([CLS], DeiT's distillation token, registers) and then the patches in
row-major order; the maps are every layer's ``softmax(q kᵀ · scaling + bias)`` recomputed from the q and k the
model handed its attention function (BEiT's relative bias arrives as an additive mask; DINOv3's and MLCD's 2-D RoPE
is already in q and k), or, for a model whose attention does not pass through the interface, its own eager maps.

Architectures that have no single grid of patches attending to each other (convolutional networks, windowed,
pooled or hierarchical attention, Swin) are refused by ``config.model_type``, saying why and where to go.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from models.core import capture, vision_checkpoints, loading
from models.core.vision_checkpoints import image_size, patch_size, vision_config
from models.core.specs import ModelSpec

# transformers' model types the ViT page draws: one grid of patches (+ prefix tokens) under global attention
DRAWN = ("vit", "deit", "beit", "data2vec-vision", "dinov2", "dinov2_with_registers", "dinov3_vit", "vit_msn",
         "ijepa", "vit_mae", "clip", "clip_vision_model", "metaclip_2", "metaclip_2_vision_model", "siglip",
         "siglip_vision_model", "siglip2", "siglip2_vision_model", "chinese_clip", "chinese_clip_vision_model",
         "aimv2", "aimv2_vision_model", "mlcd", "mlcd_vision_model", "pixio", "vitpose_backbone", "sapiens2",
         "tipsv2", "tipsv2_vision_model")
SWIN_PAGE = ("swin", "swinv2", "donut-swin", "maskformer-swin")
_CONVOLUTIONAL = ("bit", "convnext", "convnextv2", "efficientnet", "hgnet_v2", "mobilenet_v1", "mobilenet_v2",
                  "pp_lcnet", "pp_lcnet_v3", "pp_lcnet_v4", "regnet", "resnet", "textnet", "dinov3_convnext",
                  "rt_detr_resnet", "uvdoc_backbone", "van")
# why a model type is not drawn here, in words (the model type is named before it)
NOT_DRAWN = {
    **{name: "is a convolutional network: it mixes pixels with convolutions and has no attention to draw"
       for name in _CONVOLUTIONAL},
    "poolformer": "mixes its tokens by average pooling (PoolFormer): it has no attention to draw",
    "focalnet": "mixes its tokens by focal modulation, not softmax attention, so there is no map to draw",
    "swiftformer": "mixes its tokens with additive attention that gives no query × key map",
    "pvt": "attends to a spatially reduced copy of its tokens (fewer keys than queries, a grid per stage)",
    "pvt_v2": "attends to a spatially reduced copy of its tokens (fewer keys than queries, a grid per stage)",
    "segformer": "attends to a spatially reduced copy of its tokens (fewer keys than queries, a grid per stage)",
    "levit": "shrinks its token grid inside attention (subsampling stages), so no one grid holds its maps",
    "cvt": "has a token grid of its own at each of its three stages (convolutional projections), not one grid",
    "mobilevit": "attends among the pixels at one offset of every patch, not among patches",
    "mobilevitv2": "uses separable linear attention, which gives no query × key map",
    "dinat": "attends within a sliding neighbourhood of each token (neighbourhood attention, NATTEN)",
    "hiera": "attends within mask units of a hierarchy of token grids, not over one grid",
    "vitdet": "attends within windows in the layers its config lists (window_block_indices), so those layers have "
              "no map over the whole grid",
    "perceiver": "attends from a set of learned latents to the pixels (cross-attention), not among patches",
    "imagegpt": "is a causal model over colour-cluster pixels, not patches; its preprocessing is not an image crop",
    "shieldgemma2": "is a vision–language safety classifier built on Gemma 3: a language model reads its image "
                    "tokens, which is not a ViT's grid of patches attending to each other",
    "timm_backbone": "wraps a timm backbone for a detector; type the timm model's own name or folder instead",
}
# the auto class a checkpoint of each kind is loaded with (the head its weights hold, never a random one)
CLASSIFIER_SUFFIX = "ForImageClassification"


def _windowed(config) -> bool:
    """ViTDet's windowed layers (its default config attends globally everywhere)."""
    return bool(getattr(config, "window_block_indices", None)) and int(getattr(config, "window_size", 0) or 0) > 0


def describe_refusal(model_type: str, where: str, config=None) -> str | None:
    """The refusal for ``model_type`` typed as ``where``, in words; None for a model type this page draws."""
    if model_type in DRAWN or (model_type == "vitdet" and config is not None and not _windowed(config)):
        return None
    if model_type in SWIN_PAGE:
        return (f"'{where}' is a model of type {model_type}: a Swin Transformer attends within shifted windows of a "
                "hierarchy of grids, which the Swin page draws. Open the Swin page and type it there.")
    reason = NOT_DRAWN.get(model_type)
    if reason is not None:
        return f"'{where}' is a model of type {model_type}, which {reason}. The ViT page draws Vision " \
               f"Transformers: {_examples()}."
    return (f"'{where}' is a model of type {model_type or '(none given)'}, which the ViT page does not know how to "
            f"lay out as one grid of patches. It draws {_examples()}; a model that is none of these is refused rather "
            "than drawn on a wrong grid. docs/MODELS.md lists every architecture.")


def _examples() -> str:
    return "ViT, DeiT, BEiT, DINOv2 (with registers), DINOv3, SigLIP and CLIP vision towers, or any timm ViT"


# --- loading --------------------------------------------------------------------------------------------------------

def unwrapped_timm(spec: ModelSpec) -> torch.nn.Module:
    """The timm model inside a ``TimmWrapper`` checkpoint, with its classifier when the checkpoint has one: the
    ViT page then reads it as it reads any timm model."""
    import transformers

    from models.core import construction

    source = str(loading.spec_folder(spec) or spec.id)
    local_only = spec.source != "hub"
    with loading.library_errors(spec):
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False, local_files_only=local_only)
        architectures = list(getattr(config, "architectures", None) or [])
        wrapper = transformers.TimmWrapperForImageClassification if any(
            a.endswith(CLASSIFIER_SUFFIX) for a in architectures) else transformers.TimmWrapperModel
        with construction.LOCK:
            model = wrapper.from_pretrained(source, config=config, local_files_only=local_only,
                                            use_safetensors=None)
    return model.timm_model


def model_class(config):
    """The class to load: the checkpoint's image classifier when its weights hold one (``architectures``), else the
    vision tower of a dual encoder (CLIP, SigLIP, …), else the base model: never a head initialised at random."""
    import transformers
    from transformers.models.auto import modeling_auto

    model_type = config.model_type
    architectures = list(getattr(config, "architectures", None) or [])
    classifiers = modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES
    if any(a.endswith(CLASSIFIER_SUFFIX) for a in architectures) and model_type in classifiers:
        return transformers.AutoModelForImageClassification
    tower = modeling_auto.MODEL_MAPPING_NAMES.get(f"{model_type}_vision_model")
    if tower and getattr(config, "vision_config", None) is not None:
        return VisionTower(getattr(transformers, tower))
    if model_type in modeling_auto.MODEL_MAPPING_NAMES:
        return transformers.AutoModel
    backbones = modeling_auto.MODEL_FOR_BACKBONE_MAPPING_NAMES
    if model_type in backbones:
        return getattr(transformers, backbones[model_type])
    return transformers.AutoModel


class VisionTower:
    """A dual encoder's vision tower (CLIP, SigLIP, …) read from the whole checkpoint: the tower's class built from
    the checkpoint's ``vision_config`` (its weights are the checkpoint's ``vision_model.*``; the text tower's are
    left unread)."""

    def __init__(self, tower_class):
        self.tower_class = tower_class
        self.__name__ = tower_class.__name__

    def from_pretrained(self, source, config=None, **kwargs):
        return self.tower_class.from_pretrained(source, config=vision_config(config), **kwargs)

    def _from_config(self, config, **kwargs):
        return self.tower_class._from_config(vision_config(config), **kwargs)


def check_config(spec: ModelSpec, config) -> None:
    """Refuse, before any weight is read, what this page cannot draw."""
    refusal = describe_refusal(str(getattr(config, "model_type", "")), spec.id, config)
    if refusal is not None:
        raise ValueError(refusal)


def probe_inputs_for(config):
    """The probe's forward arguments: one blank image at the model's size (``load_transformers``)."""

    def inputs(model) -> dict:
        height, width = image_size(config)
        device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
        if config.model_type.startswith("siglip2"):
            rows, cols = height // patch_size(config)[0], width // patch_size(config)[1]
            ph, pw = patch_size(config)
            return {"pixel_values": torch.zeros(1, rows * cols, 3 * ph * pw, device=device, dtype=dtype),
                    "pixel_attention_mask": torch.ones(1, rows * cols, dtype=torch.long, device=device),
                    "spatial_shapes": torch.tensor([[rows, cols]], device=device)}
        pixels = torch.zeros(1, 3, height, width, device=device, dtype=dtype)
        return {"pixel_values": pixels, **_extra_arguments(model, pixels.shape[-2:])}

    return inputs


def _extra_arguments(model, size) -> dict:
    """What a model needs besides the pixels to see every patch in order: ViT-MAE's masking noise, sorted."""
    if model.config.model_type == "vit_mae":
        ph, pw = patch_size(model.config)
        patches = (int(size[0]) // ph) * (int(size[1]) // pw)
        return {"noise": torch.arange(patches, dtype=torch.float32, device=next(model.parameters()).device)[None]}
    return {}


@dataclass(frozen=True)
class Parts:
    """What the ViT family keeps of a transformers load besides the model."""

    processor: Any
    notes: tuple[str, ...]
    label_names: tuple[str, ...]
    data_config: dict


def load(spec: ModelSpec, device: str, dtype: str, progress) -> tuple[loading.LoadedModel, Parts]:
    """A transformers vision model through the capture attention function (its eager path when its attention does
    not pass through the interface), with its image processor."""
    import transformers

    source = str(loading.spec_folder(spec) or spec.id)
    # the config first: what the probe feeds depends on it (load_transformers reads it again, from the cache)
    with loading.library_errors(spec):
        config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=False,
                                                         local_files_only=spec.source != "hub")
    check_config(spec, config)
    notes: list[str] = []
    if config.model_type == "vit_mae" and float(getattr(config, "mask_ratio", 0.0) or 0.0) > 0:
        notes.append(f"ViT-MAE hides {config.mask_ratio:.0%} of the patches at random while it pre-trains; here it "
                     "sees every patch, in order (mask ratio 0), so that each one is drawn.")

    def check(config) -> None:
        check_config(spec, config)
        if config.model_type == "vit_mae":
            config.mask_ratio = 0.0  # the config the model is built with: every patch, every run

    loaded = loading.load_transformers(spec, model_class, device, dtype, progress, check_config=check,
                                       tokenizer=False, probe_inputs=probe_inputs_for(config))
    model = loaded.model
    defaults = {}
    if model.config.model_type.startswith("siglip2"):  # a patch budget, not a size
        defaults = {"max_num_patches": int(getattr(vision_config(model.config), "num_patches", 256)),
                    "patch_size": patch_size(model.config)[0]}
    processor, note = vision_checkpoints.processor_for(spec, source, model.config, **defaults)
    if note:
        notes.append(note)
    labels = ()
    if getattr(model, "main_input_name", "") == "pixel_values" and CLASSIFIER_SUFFIX in type(model).__name__:
        id2label = getattr(model.config, "id2label", None) or {}
        labels = tuple(str(id2label.get(i, f"class {i}")) for i in range(int(model.config.num_labels)))
    height, width = image_size(model.config)
    if not model.config.model_type.startswith("siglip2"):  # the size its processor makes (DINOv2: 224, not 518)
        from PIL import Image

        blank = processor(images=Image.new("RGB", (width, height)), return_tensors="pt")["pixel_values"]
        height, width = int(blank.shape[-2]), int(blank.shape[-1])
    mean, std = vision_checkpoints.mean_and_std(processor)
    # the processor's normalisation, for the pixel attributions and baselines (models/analysis/pixels.py)
    data_config = {"input_size": (3, height, width), "mean": mean, "std": std, "interpolation": "bicubic",
                   "crop_pct": 1.0, "crop_mode": "center"}
    return loaded, Parts(processor, tuple(notes), labels, data_config)


# --- running --------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Prepared:
    """An image as the model's processor made it: the forward's arguments and the crop they show."""

    inputs: dict  # pixel_values (+ what the architecture needs) on the model's device and dtype
    crop: np.ndarray  # uint8 (H, W, 3): the pixels the model saw, normalisation undone
    grid: tuple[int, int]  # (rows, cols) of patches
    patch: tuple[int, int]  # (height, width) of one patch in pixels of ``crop``
    patches: int  # real patch tokens (rows · cols): SigLIP 2 pads its sequence beyond them
    description: str


def prepare(loaded: loading.LoadedModel, processor, pil) -> Prepared:
    """Run the model's image processor on ``pil`` and arrange its output for the forward."""
    model = loaded.model
    config = model.config
    device, dtype = loaded.device, loading.torch_dtype(loaded.dtype)
    ph, pw = patch_size(config)
    name = type(processor).__name__
    if config.model_type.startswith("siglip2"):  # NaFlex: patches already cut, padded to the patch budget
        out = processor(images=pil, return_tensors="pt")
        pixels = out["pixel_values"]
        rows, cols = (int(v) for v in out["spatial_shapes"][0])
        real = pixels[0, :rows * cols].reshape(rows, cols, ph, pw, 3)  # (rows, cols, ph, pw, C)
        image = real.permute(4, 0, 2, 1, 3).reshape(3, rows * ph, cols * pw)
        inputs = {"pixel_values": pixels.to(device, dtype),
                  "pixel_attention_mask": out["pixel_attention_mask"].to(device),
                  "spatial_shapes": out["spatial_shapes"].to(device)}
        crop = vision_checkpoints.undo_normalisation(processor, image)
        return Prepared(inputs, crop, (rows, cols), (ph, pw), rows * cols,
                        f"{name}: resized to {cols * pw} × {rows * ph} px ({rows} × {cols} patches within its "
                        f"budget of {pixels.shape[1]})")
    pixels, crop, said = vision_checkpoints.pixels_of(processor, pil, device, dtype)
    height, width = int(pixels.shape[-2]), int(pixels.shape[-1])
    if height % ph or width % pw:
        raise ValueError(f"the model's image processor ({name}) makes {width} × {height} px images, which do not "
                         f"split into its {pw} × {ph} px patches; save a processor that crops to a multiple of "
                         "the patch size")
    inputs = {"pixel_values": pixels, **_extra_arguments(model, (height, width))}
    return Prepared(inputs, crop, (height // ph, width // pw), (ph, pw), (height // ph) * (width // pw), said)


def prefix_names(model, prefix: int) -> tuple[str, ...]:
    """Names of the ``prefix`` tokens before the patches, from the embeddings' own parameters: [CLS], DeiT's
    distillation token, registers; ``[PREFIX i]`` when the parameters do not account for them (``prefix`` −1: the
    names the parameters give, however many)."""
    names: list[str] = []
    found = {name.rsplit(".", 1)[-1]: p for name, p in model.named_parameters() if ".embeddings." in f".{name}"}
    if "cls_token" in found or "class_embedding" in found:
        names.append("[CLS]")
    if "distillation_token" in found:
        names.append("[DIST]")
    registers = found.get("register_tokens")
    if registers is not None:
        names += [f"[REG{i}]" for i in range(int(registers.shape[-2]))]
    if prefix >= 0 and len(names) != prefix:
        names = [f"[PREFIX{i}]" for i in range(prefix)]
    return tuple(names)


def position_similarity(model, grid: tuple[int, int], prefix: int) -> np.ndarray | None:
    """Cosine similarity of the learned absolute position embeddings of every pair of patch positions
    ``(rows, cols, rows, cols)``; None without a learned table of exactly this grid (RoPE, relative bias,
    interpolated sizes)."""
    rows, cols = grid
    for name, parameter in model.named_parameters():
        if ".embeddings." not in f".{name}" or not (name.endswith("position_embeddings") or
                                                   name.endswith("position_embedding.weight")):
            continue
        table = parameter.detach().float().cpu().reshape(-1, parameter.shape[-1])  # (positions, D)
        if len(table) not in (rows * cols, rows * cols + prefix, rows * cols + 1):
            return None
        unit = torch.nn.functional.normalize(table[-rows * cols:], dim=-1)
        return (unit @ unit.T).reshape(rows, cols, rows, cols).numpy()
    return None


@dataclass(frozen=True)
class Run:
    """One forward's maps and what the ViT result needs from it."""

    attention: Any  # StoredAttention over the tokens
    tokens: list[str]
    prefix: tuple[str, ...]
    prepared: Prepared
    logits: torch.Tensor | None
    token_norms: np.ndarray  # (layers, N)
    position_similarity: np.ndarray | None


def check_budget(model, prepared: Prepared, budget_bytes: int) -> None:
    """Refuse, before the forward, an image whose every layer's float32 maps would not fit in ``budget_bytes``
    (the page holds them all for the rollout, the distances and the head grid)."""
    vision = vision_config(model.config)
    layers = int(getattr(vision, "num_hidden_layers", 0) or 0)
    heads = int(getattr(vision, "num_attention_heads", 0) or 0)
    tokens = prepared.patches + len(prefix_names(model, -1))  # the prefix its embeddings name ([CLS], registers)
    needed = layers * heads * tokens * tokens * 4
    if needed > budget_bytes:
        rows, cols = prepared.grid
        raise ValueError(f"At the {cols * prepared.patch[1]} × {rows * prepared.patch[0]} px its image processor "
                         f"makes, this {model.config.model_type} model sees {tokens:,} tokens, and every layer's "
                         f"attention maps ({layers} layers × {heads} heads × {tokens:,}²) would take "
                         f"{needed / 2**20:,.0f} MB, more than the {budget_bytes // 2**20} MB this page keeps for one "
                         "image. Save a processor that makes smaller images beside the model (if the model "
                         "interpolates its position embeddings), or use a timm copy of it, which the page re-creates "
                         "at 224 px.")


def run(loaded: loading.LoadedModel, processor, pil, budget_bytes: int | None = None) -> Run:
    """Prepare ``pil``, run the model once with its attention recorded, and lay the maps out over the tokens
    (refused before the forward when they would not fit in ``budget_bytes``)."""
    from models.core.results import StoredAttention

    model = loaded.model
    prepared = prepare(loaded, processor, pil)
    if budget_bytes is not None:
        check_budget(model, prepared, budget_bytes)
    with loading.friendly_out_of_memory(loaded.device, f"running {loaded.spec.key}"), torch.inference_mode(), \
            capture.recording(model) as recorder:
        output = model(**prepared.inputs, output_hidden_states=True)
    kinds = recorder.kinds()
    if "self" not in kinds:
        raise ValueError(f"{capture.model_type(model)} gave no self-attention maps for this image (it gave: "
                         f"{', '.join(kinds) or 'none'}), so nothing can be drawn. docs/MODELS.md lists what each "
                         "architecture shows.")
    total = _token_count(recorder)
    prefix = total - prepared.patches
    if model.config.model_type.startswith("siglip2"):
        prefix = 0  # its sequence is the patches and then padding, which the maps leave out
    if prefix < 0:
        raise ValueError(f"{capture.model_type(model)} attends over {total} tokens, fewer than the "
                         f"{prepared.patches} patches of its {prepared.grid[0]} × {prepared.grid[1]} grid: it pools "
                         "or drops patches, so its maps cannot be laid on the image.")
    names = prefix_names(model, prefix)
    rows, cols = prepared.grid
    tokens = list(names) + [f"patch ({r}, {c})" for r in range(rows) for c in range(cols)]
    kept = range(len(tokens))
    maps = recorder.attention_maps("self", query_positions=kept if len(tokens) != total else None,
                                   key_positions=kept if len(tokens) != total else None,
                                   query_tokens=tokens, key_tokens=tokens)
    layers = [maps.layer(i) for i in range(maps.num_layers)]
    numbers = tuple(maps.layer_number(i) for i in range(maps.num_layers))
    attention = StoredAttention("self", tokens, tokens, [np.ascontiguousarray(a) for a in layers],
                                layer_numbers=numbers)
    states = [h for h in (getattr(output, "hidden_states", None) or ()) if h.shape[1] >= len(tokens)]
    states = states[-len(layers):] if len(states) >= len(layers) else states
    norms = np.stack([h[0, :len(tokens)].float().norm(dim=-1).cpu().numpy() for h in states]) if states else \
        np.zeros((len(layers), len(tokens)), np.float32)
    logits = getattr(output, "logits", None)
    return Run(attention, tokens, names, prepared, logits if isinstance(logits, torch.Tensor) else None,
               norms.astype(np.float32), position_similarity(model, prepared.grid, prefix))


def _token_count(recorder) -> int:
    """Tokens the recorded self-attention spans (keys of its first layer)."""
    if "self" in recorder.records:
        return int(recorder.records["self"][0].key.shape[2])
    return int(recorder.stored["self"][0][1].shape[-1])
