"""The support matrix of the vision pages (ViT and Swin): a tiny random model of every architecture a user may bring
to them, saved to a folder as a user saves one (timm ``save_for_hf``; transformers ``save_pretrained`` with its image
processor), typed into the page (``families.custom(page, folder)``, ``families.load``, ``families.run``), and every
drawn map compared with an independent eager computation on the same pixels:

- transformers: the same folder loaded with ``attn_implementation="eager"`` and run with ``output_attentions=True``
  (for Swin-like models, whose outputs keep one block per stage, every block's own returned weights);
- timm: ``softmax(q kᵀ · scale + bias)`` recomputed by hand from each attention module's input and its own
  parameters (qkv, q/k norms, RoPE, relative-bias tables, Swin v2's cosine scores and continuous bias), on a second
  copy of the model running timm's fused path.

The module contract of ``tests/support_matrix.OTHER_PAGES``: ``architectures(page)``, ``check(page, name, workdir)``.
timm architectures are named ``timm:<name>``; the rest are transformers' ``config.model_type``.

    python -m tests.support_matrix --page=vit --page=swin          # all of them, printed
    python -m tests.support_matrix --page=vit timm:eva02_tiny_patch14_224 beit
"""
from __future__ import annotations

import copy
import math
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from tests import support_matrix
from tests.support_matrix import Outcome

TIMM = "timm:"
IMAGE = 32  # pixels: every tiny model takes 32 × 32 images (16 patches of 8 px, or Swin's 16 × 16 of 2 px)
SIZE = {"img_size": IMAGE, "patch_size": 8, "embed_dim": 32, "depth": 2, "num_heads": 2}
SWIN_SIZE = {"img_size": IMAGE, "patch_size": 2, "window_size": 4, "embed_dim": 16, "depths": (2, 2),
             "num_heads": (2, 4)}

# timm architectures a user brings to each page, with the sizes of their tiny copies
TIMM_MODELS = {
    "vit": {
        "vit_tiny_patch16_224": SIZE,
        "deit_tiny_patch16_224": SIZE,
        "deit_tiny_distilled_patch16_224": SIZE,  # [CLS] + [DIST]
        "deit3_small_patch16_224": SIZE,  # layer scale
        "beit_base_patch16_224": SIZE,  # relative position bias per layer
        "beitv2_base_patch16_224": SIZE,
        "vit_small_patch14_dinov2": SIZE,
        "vit_small_patch14_reg4_dinov2": SIZE,  # [CLS] + 4 registers
        "eva02_tiny_patch14_224": SIZE,  # 2-D RoPE, SwiGLU
        "vit_base_patch16_rope_reg1_gap_256": SIZE,  # RoPE with a register, no [CLS]
        "vit_small_patch16_dinov3": SIZE,  # DINOv3: RoPE, [CLS] + registers
        "vit_base_patch16_siglip_224": SIZE,  # no [CLS]; attention-pool head
        "vit_base_patch16_clip_224": SIZE,  # pre-norm
        "vit_relpos_medium_patch16_224": SIZE,  # relative position MLP bias
        "flexivit_small": SIZE,
        "vit_pe_core_tiny_patch16_384": SIZE,  # Perception Encoder: RoPE + [CLS]
        "samvit_base_patch16": {**SIZE, "global_attn_indexes": (), "window_size": 2},  # windowed: refused
        "swin_tiny_patch4_window7_224": SWIN_SIZE,  # the Swin page's: refused here
    },
    "swin": {
        "swin_tiny_patch4_window7_224": SWIN_SIZE,
        "swin_s3_tiny_224": {**SWIN_SIZE, "window_size": (4, 4)},
        "swinv2_tiny_window8_256": SWIN_SIZE,  # cosine attention, continuous position bias
        "swinv2_cr_tiny_ns_224": {"img_size": IMAGE, "patch_size": 2, "window_size": 4, "embed_dim": 16,
                                  "depths": (2, 2), "num_heads": (2, 4)},  # refused
        "vit_tiny_patch16_224": SIZE,  # the ViT page's: refused here
    },
}
# transformers vision towers and backbones not in the image-classification mapping that a user brings to the ViT page
VIT_EXTRA = ("clip_vision_model", "siglip_vision_model", "siglip2_vision_model", "chinese_clip_vision_model",
             "aimv2_vision_model", "mlcd_vision_model", "vit_mae", "dinov3_vit", "pixio", "vitpose_backbone",
             "vitdet", "tipsv2_vision_model")
SWIN_TYPES = ("swin", "swinv2", "donut-swin", "maskformer-swin")


def architectures(page: str) -> list[str]:
    from transformers.models.auto import modeling_auto

    timm_names = [TIMM + name for name in TIMM_MODELS[page]]
    if page == "swin":
        return timm_names + list(SWIN_TYPES) + ["vit"]
    types = set(modeling_auto.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES) | set(VIT_EXTRA)
    types |= {t for t in modeling_auto.MODEL_FOR_BACKBONE_MAPPING_NAMES if t in modeling_auto.MODEL_MAPPING_NAMES}
    return timm_names + sorted(types)


# --- building tiny models, saved as users save theirs ---------------------------------------------------------------

def build_timm(page: str, name: str, folder: Path) -> str:
    import timm

    arguments = dict(TIMM_MODELS[page][name])
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, num_classes=5, **arguments).eval()
    _randomise(model)
    timm.models.save_for_hf(model, folder, model_args=arguments, safe_serialization=True)
    return type(model).__name__


def _randomise(model: torch.nn.Module) -> None:
    """Give parameters that timm initialises to constants (zero biases and bias tables, unit layer scales)
    random values, so that every term of the attention is exercised by the comparison."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if any(part in name for part in ("relative_position_bias_table", "q_bias", "v_bias", "rel_pos",
                                             "logit_scale", "cpb_mlp", "cls_token", "reg_token", "pos_embed")):
                parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))


# sizes a tiny vision config of transformers gets beyond the text harness's (support_matrix._shrunk)
VISION_SIZES = {"image_size": IMAGE, "patch_size": 8, "num_channels": 3}
SWIN_VISION = {"image_size": IMAGE, "patch_size": 2, "embed_dim": 16, "depths": [2, 2], "num_heads": [2, 4],
               "window_size": 4, "hidden_size": 32}
VISION_OVERRIDES = {
    "swinv2": {"pretrained_window_sizes": [0, 0]},
    "maskformer-swin": {"out_features": ["stage2"], "out_indices": [2]},
    "dinov2_with_registers": {"num_register_tokens": 2},
    "dinov3_vit": {"num_register_tokens": 2},
    "vitpose_backbone": {"image_size": [IMAGE, IMAGE], "part_features": 16, "num_experts": 1},
    "sapiens2": {"num_key_value_heads_per_layer": [4, 2], "num_key_value_attention_heads": 2,
                 "num_first_full_attention_layers": 1, "num_last_full_attention_layers": 1},
    "siglip2_vision_model": {"num_patches": 16},
    "siglip2": {"vision_config": {"num_patches": 16}},
    "beit": {"use_relative_position_bias": True, "use_mean_pooling": False},
    "data2vec-vision": {"use_relative_position_bias": True, "use_mean_pooling": False},
    "timm_wrapper": {"architecture": "vit_tiny_patch16_224", "model_args": dict(SIZE)},
}


def tiny_vision_config(model_type: str):
    """A seeded tiny config of a transformers vision architecture: the text harness's sizes, 32 px images."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    values = support_matrix._shrunk(config_class().to_dict())
    sizes = SWIN_VISION if model_type in SWIN_TYPES else VISION_SIZES
    _set_sizes(values, sizes)
    for name, value in VISION_OVERRIDES.get(model_type, {}).items():
        if isinstance(value, dict) and isinstance(values.get(name), dict):
            values[name].update(value)
        else:
            values[name] = value
    for name in ("vision_config",):
        if isinstance(values.get(name), dict):
            _set_sizes(values[name], sizes)
    return config_class(**values)


def _set_sizes(values: dict, sizes: dict) -> None:
    for name in ("stage_names", "out_features", "out_indices"):  # a backbone's, named for the default depth
        values.pop(name, None)
    if isinstance(values.get("depths"), list):
        values["depths"] = [1] * len(values["depths"])
    if isinstance(values.get("hidden_sizes"), list):
        values["hidden_sizes"] = [16 * 2 ** i for i in range(len(values["hidden_sizes"]))]
    for name, value in sizes.items():
        if name in values or name in ("image_size", "patch_size"):
            keep_list = isinstance(values.get(name), list) and not isinstance(value, list)
            values[name] = [value, value] if keep_list else value
    if isinstance(values.get("num_heads"), list) and "depths" in values:
        values["num_heads"] = values["num_heads"][:len(values["depths"])]


def transformers_class(page: str, model_type: str):
    """The class a user would have saved: the image classifier where there is one, else the base model (a vision
    tower, a backbone)."""
    import transformers
    from transformers.models.auto import modeling_auto

    for mapping in ("MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES", "MODEL_MAPPING_NAMES",
                    "MODEL_FOR_BACKBONE_MAPPING_NAMES"):
        name = getattr(modeling_auto, mapping).get(model_type)
        if name:
            name = name[0] if isinstance(name, (list, tuple)) else name
            return getattr(transformers, name, None), name
    return None, ""


def build_transformers(page: str, model_type: str, folder: Path) -> str:
    """Save a seeded tiny random model of ``model_type`` and its architecture's image processor (at 32 px)."""
    config = tiny_vision_config(model_type)
    model_class, name = transformers_class(page, model_type)
    if model_class is None:
        raise LookupError(f"transformers has no class {name or 'for ' + model_type}")
    with torch.device("meta"):
        meta = model_class._from_config(copy.deepcopy(config))
    parameters = sum(p.numel() for p in meta.parameters())
    if parameters > support_matrix.MAX_PARAMETERS:
        raise LookupError(f"{parameters / 1e6:.0f} M parameters after shrinking (the harness missed a size)")
    torch.manual_seed(0)
    model = model_class._from_config(copy.deepcopy(config), attn_implementation="eager").eval()
    _randomise(model)
    try:  # the tiny model must run as transformers made it, or it is this harness's fault
        from models.families.vit import hf

        with torch.inference_mode():
            model(**hf.probe_inputs_for(config)(model))
    except Exception as error:
        raise LookupError(f"the tiny model does not run in eager: {type(error).__name__}: "
                          f"{str(error).splitlines()[0][:160] if str(error) else ''}") from error
    model.save_pretrained(folder)
    processor = _processor(model_type, config)
    if processor is not None:
        processor.save_pretrained(folder)
    return name


def _processor(model_type: str, config):
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type) or IMAGE_PROCESSOR_MAPPING_NAMES.get(
        model_type.removesuffix("_vision_model"))
    if not names or model_type == "timm_wrapper":  # timm's own data config travels in config.json
        return None
    processor_class = getattr(transformers, names.get("torchvision") or names.get("pil"))
    if model_type.startswith("siglip2"):
        return processor_class(max_num_patches=16, patch_size=8)
    sizes = {"size": {"height": IMAGE, "width": IMAGE}}
    if getattr(processor_class(), "crop_size", None) is not None:
        sizes["crop_size"] = {"height": IMAGE, "width": IMAGE}
    return processor_class(**sizes)


def _save_config_only(model_type: str, folder: Path) -> bool:
    """A folder with the architecture's config and no weights; False when not even its config can be made."""
    from transformers import CONFIG_MAPPING

    try:
        config = tiny_vision_config(model_type)
    except Exception:  # noqa: BLE001
        try:
            config = CONFIG_MAPPING[model_type]()
        except Exception:  # noqa: BLE001
            return False
    config.save_pretrained(folder)
    return True


# --- independent references ------------------------------------------------------------------------------------------

def _softmax(scores: torch.Tensor) -> np.ndarray:
    return scores.float().softmax(-1).numpy()


def _qk_fused(module, x: torch.Tensor, bias_names=("q_bias", "k_bias", "v_bias")):
    """q, k ``(B, H, N, d)`` from a fused qkv projection (with BEiT/EVA/Swin v2's separate q/v biases)."""
    batch, tokens, _ = x.shape
    heads = module.num_heads
    q_bias = getattr(module, bias_names[0], None)
    if q_bias is not None:
        bias = torch.cat([q_bias, getattr(module, bias_names[1]), getattr(module, bias_names[2])])
        qkv = torch.nn.functional.linear(x, module.qkv.weight, bias)
    else:
        qkv = module.qkv(x)
    qkv = qkv.reshape(batch, tokens, 3, heads, -1).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1]


def _timm_map(module, args, kwargs) -> np.ndarray:
    """softmax of one timm attention call, from the module's input and its own parameters."""
    from timm.layers import apply_rot_embed_cat

    x = args[0]
    name = type(module).__name__
    if name == "WindowAttention" and hasattr(module, "logit_scale"):  # Swin v2: cosine scores, continuous bias
        q, k = _qk_fused(module, x)
        scores = torch.nn.functional.normalize(q, dim=-1) @ torch.nn.functional.normalize(k, dim=-1).transpose(-2, -1)
        scores = scores * torch.clamp(module.logit_scale, max=math.log(100.0)).exp()
        table = module.cpb_mlp(module.relative_coords_table).view(-1, module.num_heads)
        n = q.shape[2]
        bias = table[module.relative_position_index.view(-1)].view(n, n, -1).permute(2, 0, 1)
        scores = scores + 16 * torch.sigmoid(bias)[None]
        return _masked(scores, kwargs.get("mask", args[1] if len(args) > 1 else None))
    if name == "WindowAttention":  # Swin v1
        q, k = _qk_fused(module, x)
        scores = (q * module.scale) @ k.transpose(-2, -1)
        n = q.shape[2]
        table = module.relative_position_bias_table[module.relative_position_index.view(-1)]
        scores = scores + table.view(n, n, -1).permute(2, 0, 1)[None]
        return _masked(scores, kwargs.get("mask", args[1] if len(args) > 1 else None))
    if getattr(module, "qkv", None) is not None:
        q, k = _qk_fused(module, x)
    else:
        batch, tokens, _ = x.shape
        q = module.q_proj(x).reshape(batch, tokens, module.num_heads, -1).transpose(1, 2)
        k = module.k_proj(x).reshape(batch, tokens, getattr(module, "num_kv_heads", module.num_heads),
                                     -1).transpose(1, 2)
    identity = torch.nn.Identity()
    q, k = getattr(module, "q_norm", identity)(q), getattr(module, "k_norm", identity)(k)
    rope = kwargs.get("rope")
    if rope is not None:
        prefix, half = module.num_prefix_tokens, getattr(module, "rotate_half", False)
        q = torch.cat([q[:, :, :prefix], apply_rot_embed_cat(q[:, :, prefix:], rope, half=half)], dim=2)
        k = torch.cat([k[:, :, :prefix], apply_rot_embed_cat(k[:, :, prefix:], rope, half=half)], dim=2)
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q * module.scale) @ k.transpose(-2, -1)
    if getattr(module, "relative_position_bias_table", None) is not None:  # BEiT
        scores = scores + module._get_rel_pos_bias()
    if kwargs.get("shared_rel_pos_bias") is not None:
        scores = scores + kwargs["shared_rel_pos_bias"]
    if getattr(module, "rel_pos", None) is not None:  # relpos ViT: its bias module adds to the scores
        scores = scores + module.rel_pos.get_bias()
    if kwargs.get("attn_mask") is not None:
        scores = scores + kwargs["attn_mask"]
    return _softmax(scores)


def _masked(scores: torch.Tensor, mask) -> np.ndarray:
    """Swin's shifted-window mask ``(nW, N, N)`` added per window; returns ``(B·nW, H, N, N)``."""
    if mask is not None:
        windows = mask.shape[0]
        scores = scores.view(-1, windows, *scores.shape[1:]) + mask[None, :, None]
        scores = scores.view(-1, *scores.shape[2:])
    return _softmax(scores)


def timm_reference(folder: Path, pixels: torch.Tensor) -> list[np.ndarray]:
    """Every attention call's map of a second copy of the model (timm's fused path), by ``_timm_map``."""
    import timm

    from models.core import hooks

    import json

    import transformers

    if json.loads((folder / "config.json").read_text()).get("model_type") == "timm_wrapper":
        model = transformers.TimmWrapperForImageClassification.from_pretrained(folder).timm_model.eval()
    else:
        model = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    maps: list[np.ndarray] = []

    def keep(module, args, kwargs):
        maps.append(_timm_map(module, args, kwargs))

    modules = [m for m in model.modules() if type(m).__name__ in ("Attention", "EvaAttention", "AttentionRope",
                                                                  "RelPosAttention", "WindowAttention")]
    with torch.no_grad(), hooks.installed(hooks.before(m, keep, with_kwargs=True) for m in modules):
        model(pixels)
    return maps


def transformers_reference(folder: Path, loaded, inputs: dict, swin: bool = False) -> list[np.ndarray]:
    """Every layer's map from the same folder run by transformers' eager attention, in model order."""
    import transformers

    from models.core import hooks

    config = transformers.AutoConfig.from_pretrained(folder)
    if swin:
        from models.families.swin import hf
    else:
        from models.families.vit import hf
    if config.model_type == "vit_mae":
        config.mask_ratio = 0.0  # as the page runs it: every patch (the page says so)
    model = hf.model_class(config).from_pretrained(folder, config=config, attn_implementation="eager",
                                                   dtype=torch.float32).eval()
    arguments = {k: (v.float() if v.is_floating_point() else v) for k, v in inputs.items()}
    if not swin:
        with torch.no_grad():
            output = model(**arguments, output_attentions=True)
        return [a[0].float().numpy() for a in output.attentions if isinstance(a, torch.Tensor)]
    maps: list[np.ndarray] = []

    def keep(module, args, output):
        maps.append(output[1].float().numpy())

    blocks = [block for stage in model.base_model.encoder.layers for block in stage.blocks]
    with torch.no_grad(), hooks.installed(hooks.after(b, keep) for b in blocks):
        model(**arguments, output_attentions=True, output_hidden_states=True)  # MaskFormer's Swin needs both
    return maps


# --- the check -------------------------------------------------------------------------------------------------------

def check(page: str, name: str, workdir: Path) -> Outcome:
    """Build, save, type into ``page``, run on the cat photo, compare every map with its reference."""
    from models import families
    from models.core import images
    from models.core.inputs import ImageInput

    outcome = Outcome(page, name)
    started = time.perf_counter()
    folder = workdir / f"{page}-{name.replace(':', '-')}"
    is_timm = name.startswith(TIMM)
    config_only = ""
    try:
        outcome.architecture = build_timm(page, name[len(TIMM):], folder) if is_timm else \
            build_transformers(page, name, folder)
    except Exception as error:  # noqa: BLE001 - the harness's own failure, reported as "not built"
        outcome.message = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else ''}"
        if is_timm or not _save_config_only(name, folder):
            return _done(outcome, started, folder)
        # no tiny model, but its config: a page that refuses by architecture does so before reading weights
        config_only = f" (config only: the harness could not build a tiny model: {outcome.message})"
    picture = images.load_sample("cat")
    try:
        loaded = families.load(families.custom(page, str(folder)), "cpu", "float32")
        result = families.run(loaded, ImageInput(picture, "sample cat"))
        outcome.path = loaded.capture
        outcome.kinds = list(result.attention)
    except ValueError as error:
        outcome.status = "refused"
        outcome.message = str(error) + config_only
        named = name[len(TIMM):] if is_timm else name
        if named not in outcome.message and not is_timm:
            outcome.status = "crash"
            outcome.message = f"refused without naming {named}: {outcome.message}"
        return _done(outcome, started, folder)
    except Exception as error:  # noqa: BLE001 - a crash is what the matrix exists to find
        if config_only:  # not a model the harness could build: not counted
            outcome.status = "not built"
            return _done(outcome, started, folder)
        outcome.status = "crash"
        outcome.message = f"{type(error).__name__}: {error}"[:500] + "\n" + traceback.format_exc(limit=-3)[-1500:]
        return _done(outcome, started, folder)
    try:
        drawn, reference = _pairs(page, loaded, result, folder, picture)
        if len(drawn) != len(reference):
            raise AssertionError(f"{len(drawn)} layers drawn, the reference has {len(reference)}")
        worst = 0.0
        for layer, (got, want) in enumerate(zip(drawn, reference)):
            if got.shape != want.shape:
                raise AssertionError(f"layer {layer}: drawn {got.shape}, reference {want.shape}")
            worst = max(worst, float(np.abs(got - want).max()))
        outcome.layers = len(drawn)
        outcome.max_difference = worst
        from models.core import capture

        eager = loaded.capture == capture.EAGER_PATH_DESCRIPTION or "eager path" in loaded.capture
        outcome.status = ("exact (eager path)" if eager else "exact") if worst <= support_matrix.TOLERANCE \
            else "wrong"
    except Exception as error:  # noqa: BLE001
        outcome.status = "wrong"
        outcome.message = f"compared with eager: {type(error).__name__}: {error}"[:500]
    return _done(outcome, started, folder)


def _done(outcome: Outcome, started: float, folder: Path) -> Outcome:
    outcome.seconds = time.perf_counter() - started
    outcome.message = outcome.message.replace(str(folder), "<folder>")  # the same words on every run and machine
    return outcome


def _pairs(page: str, loaded, result, folder: Path, picture) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(drawn maps, reference maps), layer by layer, on the same pixels."""
    from models.core import images

    if page == "vit":
        maps = result.attention["self"]
        drawn = [maps.layer(i) for i in range(maps.num_layers)]
        if loaded.processor is None:  # timm
            pixels = images.preprocess(picture, loaded.data_config).tensor
            return drawn, [m[0] for m in timm_reference(folder, pixels)]  # batch item 0 of (1, H, N, N)
        from models.families.vit import hf

        prepared = hf.prepare(loaded, loaded.processor, picture.image)
        reference = transformers_reference(folder, loaded, prepared.inputs)
        tokens = len(result.tokens)
        return drawn, [m[:, :tokens, :tokens] for m in reference]
    drawn = list(result.windows.windows)
    if getattr(loaded, "processor", None) is None:  # timm Swin
        pixels = images.preprocess(picture, images.data_config(loaded.model)).tensor
        return drawn, timm_reference(folder, pixels)
    from models.core import vision_checkpoints

    pixels, _, _ = vision_checkpoints.pixels_of(loaded.processor, picture.image, "cpu", torch.float32)
    return drawn, transformers_reference(folder, loaded, {"pixel_values": pixels}, swin=True)
