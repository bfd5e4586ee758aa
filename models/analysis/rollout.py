"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers", eq. 1).

Residual connections carry each token's own state past every attention layer, so a layer's effective mixing is
modelled as ``Â_l = 0.5 · A_l + 0.5 · I``. Rollout multiplies these through the layers::

    R_l = Â_l · R_{l-1},   R_0 = I        →   R_L = Â_L · … · Â_1          (N, N), rows sum to 1

``R_L[0, prefix:]`` (the [CLS] row, patch columns) says how much of each input patch flows into the [CLS] token the
classifier reads. Heads are fused per layer first (``head_fusion``: mean as in the paper; max and min as in Gildenblat's
vit-explain, which also introduced ``discard_ratio``: the lowest fraction of each fused matrix is set to 0 before the
identity is added, keeping only strong paths; the [CLS]→[CLS] entry is never discarded). After fusion (max/min rows
no longer sum to 1) and discarding, ``Â = (A + I)`` is renormalised row by row, which equals ``0.5 · A + 0.5 · I`` for
a mean-fused, undiscarded ``A``.

Works on numpy arrays or torch tensors (on any device, so the first rollout of a GPU run never leaves the GPU) and
returns the same kind it was given.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attention: torch.Tensor, head_fusion: str) -> torch.Tensor:
    """``(heads, N, N)`` -> ``(N, N)`` by mean, max or min over heads."""
    if head_fusion == "mean":
        return attention.mean(dim=0)
    if head_fusion == "max":
        return attention.amax(dim=0)
    if head_fusion == "min":
        return attention.amin(dim=0)
    raise ValueError(f"unknown head fusion {head_fusion!r}; use one of {', '.join(HEAD_FUSIONS)}")


def discard_lowest(fused: torch.Tensor, discard_ratio: float) -> torch.Tensor:
    """Zero the lowest ``discard_ratio`` fraction of the entries of ``fused`` ``(N, N)``, keeping entry (0, 0)."""
    if not 0.0 <= discard_ratio < 1.0:
        raise ValueError(f"discard ratio must be in [0, 1); got {discard_ratio}")
    count = int(fused.numel() * discard_ratio)
    if count == 0:
        return fused
    flat = fused.flatten().clone()
    lowest = flat.topk(count, largest=False).indices
    lowest = lowest[lowest != 0]
    flat[lowest] = 0
    return flat.view_as(fused)


def rollout_steps(layers: Sequence, head_fusion: str = "mean", discard_ratio: float = 0.0) -> list:
    """``R_1, …, R_L`` (rollout after each layer), each ``(N, N)``, same array kind as the input layers."""
    if len(layers) == 0:
        raise ValueError("rollout needs at least one attention layer")
    as_numpy = isinstance(layers[0], np.ndarray)
    steps = []
    result = None
    for attention in layers:
        attention = (torch.tensor(attention, dtype=torch.float32) if as_numpy  # a copy: shared arrays are read-only
                     else attention.float())  # (heads, N, N)
        if attention.dim() != 3 or attention.shape[1] != attention.shape[2]:
            raise ValueError(f"each layer must be (heads, N, N) self-attention; got {tuple(attention.shape)}")
        fused = discard_lowest(fuse_heads(attention, head_fusion), discard_ratio)  # (N, N)
        augmented = fused + torch.eye(fused.shape[-1], device=fused.device, dtype=fused.dtype)
        augmented = augmented / augmented.sum(dim=-1, keepdim=True)  # rows sum to 1
        result = augmented if result is None else augmented @ result  # R_l = Â_l · R_{l-1}
        steps.append(result)
    return [s.cpu().numpy() for s in steps] if as_numpy else steps


def attention_rollout(layers: Sequence, head_fusion: str = "mean", discard_ratio: float = 0.0):
    """Rollout through all ``layers`` (each ``(heads, N, N)``) -> ``(N, N)``; rows sum to 1."""
    return rollout_steps(layers, head_fusion, discard_ratio)[-1]


def cls_rollout(layers: Sequence, num_prefix_tokens: int, grid: tuple[int, int], head_fusion: str = "mean",
                discard_ratio: float = 0.0, query: int = 0):
    """How much each patch flows into token ``query`` (default [CLS]): ``(rows, cols)``, summing to ≤ 1 (the rest
    flows from prefix tokens). For a model without a [CLS] token pass ``query=None``: the mean over patch queries."""
    rolled = attention_rollout(layers, head_fusion, discard_ratio)
    rows, cols = grid
    if rolled.shape[-1] != num_prefix_tokens + rows * cols:
        raise ValueError(f"{rolled.shape[-1]} tokens do not match {num_prefix_tokens} prefix tokens + a "
                         f"{rows} × {cols} patch grid")
    patch_part = rolled[num_prefix_tokens:, num_prefix_tokens:]
    row = patch_part.mean(0) if query is None else rolled[query, num_prefix_tokens:]
    return row.reshape(rows, cols)
