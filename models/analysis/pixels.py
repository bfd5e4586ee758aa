"""Images as the units of an explanation, for any image family's adapter
(models/families/vit/explain.py, models/families/swin/explain.py): the crop a run saw turned back
into the model's input, the baseline that replaces a removed patch, the input as pixels for the
pixel methods (``PixelInput``), and what a class attribution is (per pixel and per patch) whoever
computed it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFilter

REPLACEMENTS = {"mean": "the data config's mean colour (grey: 0 after normalisation)",
                "blur": "the same patch of the image blurred with σ = one patch"}


def normalised(crop: np.ndarray, config: dict) -> torch.Tensor:
    """``(1, 3, H, W)`` from a uint8 crop ``(H, W, 3)``: timm's ToTensor and Normalize with
    ``config``'s mean and std, the steps of ``images.preprocess`` after the crop, so an attribution
    explains exactly the run's input."""
    pixels = torch.from_numpy(np.ascontiguousarray(crop)).permute(2, 0, 1).float().div(255)
    mean = torch.tensor(config["mean"], dtype=torch.float32).view(3, 1, 1)
    std = torch.tensor(config["std"], dtype=torch.float32).view(3, 1, 1)
    return pixels.sub(mean).div(std).unsqueeze(0).contiguous()


def removed_pixels(crop: np.ndarray, config: dict, patch: int, replacement: str) -> torch.Tensor:
    """The input with every patch removed: grey (``mean``: 0 after normalisation) or blurred with σ
    = one ``patch`` (``blur``), normalised with ``config``, (1, 3, H, W)."""
    if replacement not in REPLACEMENTS:
        raise ValueError(f"unknown replacement {replacement!r}; choose from {', '.join(REPLACEMENTS)}")
    if replacement == "mean":
        return torch.zeros_like(normalised(crop, config))
    return normalised(np.asarray(Image.fromarray(crop).filter(ImageFilter.GaussianBlur(patch))), config)


@dataclass(frozen=True)
class PixelInput:
    """An image family's input as pixels, for the methods that attribute on them
    (models/analysis/methods.py's ``PixelMethod``s)."""

    model: torch.nn.Module  # normalised pixels (B, 3, H, W) -> logits (B, classes)
    pixels: torch.Tensor  # (1, 3, H, W) the crop the run saw, normalised, as the model takes it
    config: dict  # the data config the pixels were normalised with (its ``mean`` and ``std``)
    patch: tuple[int, int]  # a patch's pixels (rows, cols)
    grid: tuple[int, int]  # patches (rows, cols)

    def constant(self, value: float) -> torch.Tensor:
        """A constant image (``value`` in [0, 1] on every channel), normalised like ``pixels``."""
        like = self.pixels
        mean, std = (torch.tensor(self.config[name], dtype=like.dtype, device=like.device)
                     .view(1, 3, 1, 1) for name in ("mean", "std"))
        return ((torch.full_like(like, value) - mean) / std).contiguous()


def pixel_input(model: torch.nn.Module, crop: np.ndarray, config: dict, device) -> PixelInput:
    """The crop a run saw (uint8 (H, W, 3)) as a timm model's pixels, with its patch grid."""
    pixels = normalised(crop, config).to(device, next(model.parameters()).dtype)
    return PixelInput(model, pixels, config, tuple(int(p) for p in model.patch_embed.patch_size),
                      tuple(int(g) for g in model.patch_embed.grid_size))


def check_image(crop: np.ndarray) -> None:
    if np.ptp(crop) == 0:
        raise ValueError("the image is blank (one colour everywhere): there is nothing to attribute, and removing a "
                         "patch changes nothing. Pick or upload an image with something in it.")


@dataclass(frozen=True)
class Attribution:
    """One method's attribution of one class, per pixel and per patch."""

    method: str  # a key of models.analysis.methods.METHODS
    target: int  # class index explained
    target_name: str
    pixels: np.ndarray  # (H, W) float32, signed, summed over channels
    patch_scores: np.ndarray  # (rows, cols) float32, sum of |pixels| per patch
    seconds: float
    convergence_delta: float | None = None  # IG only: |Σ attributions − (F(x) − F(x'))|, small = accurate integral


def patch_pool(pixels: np.ndarray, grid: tuple[int, int], patch_size: tuple[int, int]) -> np.ndarray:
    """Sum of |pixels| inside each patch: ``(H, W)`` -> ``(rows, cols)``."""
    rows, cols = grid
    ph, pw = patch_size
    cropped = np.abs(pixels[: rows * ph, : cols * pw])
    return cropped.reshape(rows, ph, cols, pw).sum(axis=(1, 3)).astype(np.float32)


@dataclass(frozen=True)
class ExplainedClass:
    """One class of one run explained: the run (its crop, patch grid and maps, which the figure
    draws on and compares with rollout) and the attribution."""

    result: Any  # the run explained (a ViTResult or SwinResult: its crop, patch grid, maps)
    attribution: Attribution
    rollout: np.ndarray | None = None  # (rows, cols) the rollout to compare with, when the run has no ViT rollout (Swin)


def per_patch(result, found, method: str, target: int, name: str) -> Attribution:
    """A method's per-patch scores (``found``: ``attribution.Explanations``) as an ``Attribution``:
    a pixel method's own map, or each patch's score spread over its pixels."""
    grid, patch = result.image.patch_grid, result.image.patch_size
    scores = found.scores[method].reshape(grid).astype(np.float32)
    pixels = found.pixels.get(method)
    if pixels is None:
        pixels = np.kron(scores, np.ones(patch, dtype=np.float32))
    return Attribution(method, target, name, pixels, scores, found.seconds[method],
                       found.deltas.get(method))


def rank_correlation(a: np.ndarray, b: np.ndarray) -> float:
    """Spearman's ρ between two maps of the same shape (flattened; ties get average ranks): 1 when
    both order the patches alike, 0 unrelated, −1 reversed; NaN when either map is constant."""
    from scipy.stats import rankdata

    x, y = rankdata(np.ravel(a)), rankdata(np.ravel(b))
    if x.shape != y.shape:
        raise ValueError(f"maps of different sizes cannot be compared: {np.shape(a)} vs "
                         f"{np.shape(b)}")
    if x.std() == 0 or y.std() == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])
