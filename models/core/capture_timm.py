"""Attention capture for timm vision models: eager attention switched on per module, forward hooks on the module
that receives the softmax output, removed in ``finally`` (DESIGN.md, "Capture that is proven").

timm's ``Attention`` computes ``F.scaled_dot_product_attention`` when ``fused_attn`` is True, and the weights never
exist. With ``fused_attn = False`` it computes ``attn = softmax(q kᵀ · scale + mask)`` and passes it through
``attn_drop`` (an ``nn.Dropout``, the identity in eval mode), so a forward hook on ``attn_drop`` sees exactly
softmax(QKᵀ/√d) of shape ``(B, heads, N, N)``. Swin's ``WindowAttention`` passes it through its ``softmax`` module
instead (``(B · windows, heads, Wh·Ww, Wh·Ww)``, after the shift mask). ``disable_fused_attention`` flips the flag on
each attention module after ``create_model``; it never touches timm's global switch, so other models are unaffected.

Concurrency: a cached model is shared by every browser session. Hooks act only for the call that installed them
(``models.core.hooks.installed``: removed in ``finally``, silent for anyone else's forward); what they record goes
into a ``Recording`` owned by that call, never onto the module, so two sessions can never mix their results and
need not wait for each other. Proven against an eager reference in tests/test_capture_timm.py.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch import nn

from models.core import hooks
from models.core.results import StoredAttention

CAPTURE_DESCRIPTION = "timm eager attention (fused_attn off per module); softmax(QKᵀ/√d) hooked at attn_drop"

def _softmax_attention(module: nn.Module) -> bool:
    """A window attention that always passes its weights through an ``nn.Softmax`` module of its own and has no
    fused path (timm's Swin v2 ``WindowAttention``)."""
    return not hasattr(module, "fused_attn") and isinstance(getattr(module, "softmax", None), nn.Softmax) and \
        hasattr(module, "qkv")


def disable_fused_attention(model: nn.Module) -> int:
    """Set ``fused_attn = False`` on every timm attention module of ``model``; return how many were switched.

    Call once right after ``timm.create_model`` (before the model is shared). Raises ``ValueError`` if the model has
    no timm attention module, because then nothing could be captured (Swin v2's window attention has no fused path
    and counts as captured).
    """
    switched = 0
    for module in model.modules():
        if hasattr(module, "fused_attn"):
            module.fused_attn = False
            switched += 1
    if switched == 0 and not any(_softmax_attention(m) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} has no timm attention module with a fused_attn switch, so its "
                         "attention weights cannot be captured. Pick a ViT, DeiT, DINOv2, EVA or Swin model.")
    return switched


def attention_points(model: nn.Module, submodule: str = "attn_drop") -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of the submodule that receives the softmax output in each attention block, in model order.

    ``submodule="attn_drop"`` for ViT-style ``Attention``; ``"softmax"`` for Swin's ``WindowAttention``. Only
    attention modules (those with a ``fused_attn`` flag, and Swin v2's, which always run their ``softmax``) are
    considered, so an MLP's dropout is never hooked.
    """
    points = []
    for name, module in model.named_modules():
        attention = hasattr(module, "fused_attn") or (submodule == "softmax" and _softmax_attention(module))
        if attention and isinstance(getattr(module, submodule, None), nn.Module):
            if getattr(module, "fused_attn", False):
                raise ValueError(f"{name} still uses fused attention; call disable_fused_attention(model) after "
                                 "create_model so its weights can be captured")
            points.append((f"{name}.{submodule}" if name else submodule, getattr(module, submodule)))
    return points


def keep_first_image(output: torch.Tensor) -> np.ndarray:
    """Default reducer: batch item 0 as float32 numpy, ``(heads, N, N)``."""
    return output[0].detach().float().cpu().numpy()


@dataclass
class Recording:
    """What the hooks saw during one call: ``outputs[name]`` is a list (one entry per time the module ran)."""

    names: list[str]
    outputs: dict[str, list[Any]] = field(default_factory=dict)

    def per_point(self) -> list[Any]:
        """One value per hooked point in model order; each point must have run exactly once."""
        missing = [n for n in self.names if len(self.outputs.get(n, [])) != 1]
        if missing:
            raise RuntimeError(f"attention hooks did not fire exactly once at {missing[:3]}: the model's forward "
                               "path is not the eager attention this capture expects")
        return [self.outputs[n][0] for n in self.names]


@contextmanager
def recording(model: nn.Module, points: list[tuple[str, nn.Module]],
              keep: Callable[[torch.Tensor], Any] = keep_first_image) -> Iterator[Recording]:
    """Hook ``points`` (from ``attention_points``) for the duration of the block; forwards run inside it are recorded.

    ``keep(output)`` turns each softmax output into what is stored (default: batch item 0 as float32 numpy); pass a
    reducer to keep less (e.g. only the CLS row). Hooks are removed in ``finally`` even if the forward raises.
    Usage::

        with recording(model, attention_points(model)) as rec:
            logits = model(pixel_values)
        layers = rec.per_point()   # [(heads, N, N), ...]
    """
    if not points:
        raise ValueError("nothing to hook: this model has no attention modules with captured weights")
    rec = Recording([name for name, _ in points])

    def make_hook(name: str):
        def hook(module, inputs, output):
            rec.outputs.setdefault(name, []).append(keep(output))
        return hook

    with hooks.installed(hooks.after(module, make_hook(name)) for name, module in points):
        yield rec


def vit_attention(model: nn.Module, pixel_values: torch.Tensor) -> tuple[torch.Tensor, list[np.ndarray]]:
    """Run a timm ViT on ``pixel_values`` ``(1, 3, H, W)`` and capture every layer's attention.

    Returns the model output (logits ``(1, classes)``, or features when the model has no head) and per layer the
    float32 probabilities ``(heads, N, N)`` with N = prefix tokens + patches; rows sum to 1.
    """
    points = attention_points(model, "attn_drop")
    with torch.inference_mode(), recording(model, points) as rec:
        output = model(pixel_values)
    return output, rec.per_point()


def stored_attention(layers: list, tokens: list[str]) -> StoredAttention:
    """Package captured ``(heads, N, N)`` layers as the result contract's ``StoredAttention`` (kind "self"): numpy
    arrays, or tensors left on the GPU the model ran on (copied to the host a layer at a time when a view asks)."""
    if layers and layers[0].shape[-1] != len(tokens):
        raise ValueError(f"captured attention has {layers[0].shape[-1]} keys but {len(tokens)} token names")
    return StoredAttention("self", list(tokens), list(tokens),
                           [a.detach() if hasattr(a, "detach") else np.ascontiguousarray(a, np.float32)
                            for a in layers])
