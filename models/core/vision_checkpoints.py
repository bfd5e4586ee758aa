"""Transformers vision checkpoints on the vision pages (ViT, Swin): which library reads what a user typed (a
transformers ``config.json`` names a ``model_type``; one timm saved names an ``architecture``), the model's own
image processor, and the crop the model saw (its input with the rescaling and normalisation undone), so that every
overlay lands on exactly the pixels behind each patch.

The processor is the checkpoint's own (``preprocessor_config.json``), or, in a folder saved without one, the
architecture's default processor resized to the config's image size, and the page says so.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from models.core import loading
from models.core.specs import ModelSpec


TIMM_WRAPPER = "timm_wrapper"  # a timm model saved through transformers (its weights under ``timm_model.``)


def typed_config(spec: ModelSpec) -> dict | None:
    """The ``config.json`` of what ``spec`` names, as a dict: a local folder's (checked against the allowed
    folders), a hub repository's (from the hub cache, or downloaded); None for a declared model, a bare timm name
    (``vit_base_…``) and a hub id whose config cannot be read (timm then reads it and says what went wrong)."""
    import json

    if spec.source == "local":
        folder = loading.resolve_local_folder(spec.id)
        try:
            return json.loads((folder / "config.json").read_text())
        except (OSError, ValueError) as error:
            raise ValueError(f"'{spec.id}' has a config.json that is not valid JSON ({loading.first_line(error)}); "
                             "save the model again.") from None
    name = spec.id.strip()
    if spec.source != "hub" or "/" not in name or name.startswith(("timm/", "hf-hub:")):
        return None
    try:
        from huggingface_hub import hf_hub_download

        return json.loads(Path(hf_hub_download(name, "config.json")).read_text())
    except Exception:  # noqa: BLE001 - unknown here: timm reads it and says what went wrong, as it always did
        return None


def is_transformers(config: dict | None) -> bool:
    """A transformers checkpoint (``model_type``), not one timm saved (``architecture``, no model type)."""
    return bool(config) and bool(config.get("model_type")) and config.get("model_type") != TIMM_WRAPPER


def is_timm_wrapper(config: dict | None) -> bool:
    return bool(config) and config.get("model_type") == TIMM_WRAPPER


def _pair(value) -> tuple[int, int]:
    if isinstance(value, (list, tuple)):
        return int(value[0]), int(value[-1])
    return int(value), int(value)


def vision_config(config):
    """The config of the vision part (a CLIP/SigLIP checkpoint's ``vision_config``), else the config itself."""
    return getattr(config, "vision_config", None) or config


def image_size(config) -> tuple[int, int]:
    """(height, width) in pixels the config says the model takes."""
    vision = vision_config(config)
    size = getattr(vision, "image_size", None)
    if size is None and getattr(vision, "num_patches", None):  # SigLIP 2: a patch budget, square by default
        side = int(round(float(vision.num_patches) ** 0.5))
        height, width = patch_size(config)
        return side * height, side * width
    return _pair(size or 224)


def patch_size(config) -> tuple[int, int]:
    """(height, width) in pixels of one patch."""
    return _pair(getattr(vision_config(config), "patch_size", 16))


def processor_for(spec: ModelSpec, source: str, config, **defaults) -> tuple[Any, str]:
    """The checkpoint's own image processor, or (no ``preprocessor_config.json``) its architecture's default one
    at the config's image size (``defaults`` replace that size: SigLIP 2's patch budget); and a note for the page
    when it is the default."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    local_only = spec.source != "hub"
    if spec.source == "hub" or (Path(source) / "preprocessor_config.json").is_file():
        try:
            with loading.library_errors(spec):
                return transformers.AutoImageProcessor.from_pretrained(source, local_files_only=local_only), ""
        except ValueError:
            if spec.source != "hub":
                raise  # a folder's own processor that does not load: say so, never replace it silently
    model_type = str(config.model_type)
    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type) or IMAGE_PROCESSOR_MAPPING_NAMES.get(
        model_type.removesuffix("_vision_model")) or {"torchvision": "ViTImageProcessor"}
    name = names.get("torchvision") or names.get("pil")
    processor_class = getattr(transformers, name)
    height, width = image_size(config)
    sized = defaults or {"size": {"height": height, "width": width}}
    if not defaults and getattr(processor_class(), "crop_size", None) is not None:
        sized["crop_size"] = {"height": height, "width": width}
    return processor_class(**sized), (
        f"This folder has no preprocessor_config.json, so images are prepared by {name}'s defaults at the config's "
        f"{width} × {height} px; save the model's processor beside it (processor.save_pretrained(folder)) to use "
        "its own.")


def mean_and_std(processor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The normalisation the processor applies (0 and 1 when it does not normalise)."""
    if not getattr(processor, "do_normalize", True):
        return (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
    mean = getattr(processor, "image_mean", None) or (0.5, 0.5, 0.5)
    std = getattr(processor, "image_std", None) or (0.5, 0.5, 0.5)
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def undo_normalisation(processor, pixels: torch.Tensor) -> np.ndarray:
    """(3, H, W) as the processor made it -> uint8 (H, W, 3): the pixels the model saw."""
    mean, std = mean_and_std(processor)
    values = pixels.detach().float().cpu()
    values = values * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]
    if getattr(processor, "do_rescale", True):
        values = values / float(getattr(processor, "rescale_factor", 1 / 255) or 1 / 255)
    return np.clip(np.rint(values.permute(1, 2, 0).numpy()), 0, 255).astype(np.uint8)


def describe(processor, size: tuple[int, int]) -> str:
    """How the processor turned the image into the model's input, in words (``size``: height, width)."""
    said = f"{type(processor).__name__}: resized and cropped to {size[1]} × {size[0]} px"
    if getattr(processor, "do_normalize", True):
        mean, std = mean_and_std(processor)
        said += (f", normalised with mean {tuple(round(m, 3) for m in mean)} and std "
                 f"{tuple(round(s, 3) for s in std)}")
    return said


def pixels_of(processor, picture, device: str, dtype: torch.dtype) -> tuple[torch.Tensor, np.ndarray, str]:
    """``(pixel_values (1, 3, H, W) on device, the crop uint8 (H, W, 3), how it was made)`` for a model that takes
    a plain image tensor."""
    pixels = processor(images=picture, return_tensors="pt")["pixel_values"]
    size = (int(pixels.shape[-2]), int(pixels.shape[-1]))
    return pixels.to(device, dtype), undo_normalisation(processor, pixels[0]), describe(processor, size)
