"""The Swin's adapter for the shared explanations (models/analysis/attribution.py) and faithfulness curves
(models/analysis/faithfulness.py): a timm ``SwinTransformer`` run from its patch embeddings, with hooks that keep each
block's window attention (differentiable), per-head value vectors, residual stream (both in the block's window order)
and output, plus the ``Layout`` that carries every per-window matrix back to the stage's token grid.

- **Windows and shifts.** A block computes attention in windows of the *rolled* map (cyclic shift by −s, then padded
  to whole windows). ``window_ids`` records, for every window position, which original token sits there, so
  ``Layout.to_grid`` puts each window's (Nw × Nw) map at the rows and columns of its original tokens: the roll and
  its reverse are undone exactly, and a token attends only within its window.
- **Patch merging.** A stage's first block reads the previous grid merged 2 × 2 (timm's ``PatchMerging``: token
  (r, c) of the coarse grid is the linear map of (2r + a, 2c + b), a, b ∈ {0, 1}); ``merges`` spreads a coarse
  token's relevance equally over those four.
- **Readout.** The head pools the last stage's tokens by their mean: the query row is 1/N over them.
- **Units** are the first grid's tokens (patches, 4 px for the usual Swins). The patch embedding (a stride-p
  convolution and a LayerNorm per patch) sees only its own patch's pixels, so replacing a patch's pixels is exactly
  replacing its embedding by the baseline image's: the curves perturb embeddings, as for the ViT
  (models/families/vit/explain.py), with the same replacements (grey mean, or blurred with σ = one patch).
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from models.analysis.attribution import Explainable, LayerRecord
from models.analysis.methods import PIXELS, SHARED
from models.analysis.pixels import (
    REPLACEMENTS,
    check_image,
    normalised,
    pixel_input,
    removed_pixels,
)
from models.analysis.windows import Layout
from models.core import hooks, images
from models.families.swin.geometry import cyclic_shift, window_partition

REPLACEMENTS = {**REPLACEMENTS, "mean": "the data config's mean colour (0 after normalisation)"}
# what the shared methods become on windows and stages, in words (the table's "what")
DESCRIPTIONS = {"grad_cam": "Grad-CAM (the last stage's tokens on their grid, channels as maps)",
                "rollout": "attention rollout (windows carried to the grid, through the merges)"}


def crop_tensor(model, crop: np.ndarray) -> torch.Tensor:
    """The model's input ``(1, 3, H, W)`` from the uint8 crop the run saw, normalised as its data config says."""
    return normalised(crop, images.data_config(model))


def blocks(model) -> list:
    return [block for stage in model.layers for block in stage.blocks]


def embed(model, pixels: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) normalised pixels -> (B, N, C) the first stage's tokens, row-major."""
    tokens = model.patch_embed(pixels)  # (B, H', W', C)
    return tokens.reshape(tokens.shape[0], -1, tokens.shape[-1])


def logits_from_embeddings(model, embeddings: torch.Tensor) -> torch.Tensor:
    """(B, N, C) -> (B, classes): the stages, the final norm and the pooled head."""
    rows, cols = (int(g) for g in model.patch_embed.grid_size)
    return model.forward_head(model.norm(model.layers(embeddings.reshape(-1, rows, cols, embeddings.shape[-1]))))


def window_ids(block) -> torch.Tensor:
    """(nW, Nw) long: the original (row-major) token id at each window position of the block's rolled, padded map;
    -1 for padding. The same roll, pad and partition the block applies to its input."""
    height, width = (int(r) for r in block.input_resolution)
    window = tuple(int(w) for w in block.window_size)
    shift = tuple(int(s) for s in block.shift_size)
    rolled = cyclic_shift(np.arange(height * width).reshape(height, width), shift)  # torch.roll(x, -shift)
    hp, wp = -(-height // window[0]) * window[0], -(-width // window[1]) * window[1]
    ids = np.full((hp, wp), -1, dtype=np.int64)
    ids[:height, :width] = rolled
    return torch.from_numpy(window_partition(ids, window).reshape(-1, window[0] * window[1]).copy())


def merge_matrix(coarse: tuple[int, int], fine: tuple[int, int]) -> torch.Tensor:
    """(Hc·Wc, Hf·Wf): coarse token (r, c) takes 1/k of each of the k ≤ 4 fine tokens (2r + a, 2c + b) inside the
    fine grid (timm pads an odd grid with zeros, which carry no relevance)."""
    out = torch.zeros(coarse[0] * coarse[1], fine[0] * fine[1])
    for r in range(coarse[0]):
        for c in range(coarse[1]):
            children = [(2 * r + a) * fine[1] + 2 * c + b for a in (0, 1) for b in (0, 1)
                        if 2 * r + a < fine[0] and 2 * c + b < fine[1]]
            out[r * coarse[1] + c, children] = 1.0 / len(children)
    return out


def layout(model) -> Layout:
    """Where every block's windows sit on its grid, the merges between stages, and the mean readout."""
    every = blocks(model)
    tokens = [int(b.input_resolution[0]) * int(b.input_resolution[1]) for b in every]
    merges = {}
    for index in range(1, len(every)):
        before, now = tuple(every[index - 1].input_resolution), tuple(every[index].input_resolution)
        if before != now:
            merges[index] = merge_matrix(now, before)
    return Layout(tokens, [window_ids(b) for b in every], merges, torch.full((tokens[-1],), 1.0 / tokens[-1]))


def _windows_of(ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """(B, H, W, C) -> (B·nW, Nw, C) as the block partitions it (rolled by −shift, padded with zeros, window by
    window), read through the block's ``window_ids`` so the windows are exactly the ``Layout``'s."""
    batch, channels = x.shape[0], x.shape[-1]
    flat = x.reshape(batch, -1, channels)
    padded = torch.cat([flat, flat.new_zeros(batch, 1, channels)], 1)  # the last row stands for the padding
    index = torch.where(ids >= 0, ids, flat.shape[1]).to(x.device)
    return padded[:, index].reshape(-1, ids.shape[-1], channels)


@contextmanager
def recording(model):
    """Hooks on every block for this call's forwards inside the block (``hooks.installed``): window attention at
    ``attn.softmax``, values from ``qkv`` through each head's slice of ``proj``, the block's input partitioned into
    its windows, and the block's output ``(B, H, W, C)``. Yields the list of ``LayerRecord``."""
    every = blocks(model)
    records = [LayerRecord() for _ in every]

    def block_hooks(block, record: LayerRecord) -> list[hooks.Hook]:
        attention = block.attn
        heads = attention.num_heads
        ids = window_ids(block)

        def keep_input(module, inputs):
            record.residual = _windows_of(ids, inputs[0])

        def keep_output(module, inputs, output):
            record.output = output  # (B, H, W, C), the tensor the next block reads (so it has a gradient)

        def keep_attention(module, inputs, output):
            record.attention = output

        def keep_values(module, inputs, output):
            batch, n, _ = output.shape
            v = output.reshape(batch, n, 3, heads, -1)[:, :, 2].transpose(1, 2)  # (B·nW, H, Nw, hd)

            def values():
                weight = attention.proj.weight.reshape(attention.proj.weight.shape[0], heads, -1)  # (D, H, hd)
                return torch.einsum("bhnk,dhk->bhnd", v, weight)  # (B·nW, H, Nw, D)

            record.values_from = values

        return [hooks.before(block, keep_input), hooks.after(block, keep_output),
                hooks.after(attention.softmax, keep_attention), hooks.after(attention.qkv, keep_values)]

    with hooks.installed(block_hooks(block, record) for block, record in zip(every, records)):
        yield records


def baseline_pixels(model, crop: np.ndarray, replacement: str) -> torch.Tensor:
    """The input with every patch removed: grey (``mean``) or blurred (``blur``), normalised, (1, 3, H, W)."""
    return removed_pixels(crop, images.data_config(model), int(model.patch_embed.patch_size[0]), replacement)


def check_explainable(model) -> None:
    """Refuse, in words, a Swin this adapter does not decompose: it reads timm's v1 blocks (pre-norm, scaled
    dot-product scores, values from the fused qkv projection)."""
    from timm.models.swin_transformer import SwinTransformer

    if isinstance(model, SwinTransformer):
        return
    what = "Swin v2 normalises each attention output after its residual branch (post-norm) and scores with " \
        "cosine similarity" if type(model).__name__ == "SwinTransformerV2" else \
        f"this {getattr(getattr(model, 'config', None), 'model_type', type(model).__name__)} model was loaded by " \
        "transformers"
    raise ValueError(f"The explanations and faithfulness curves decompose timm's Swin v1 blocks; {what}, so they "
                     "are not offered for it. Its window attention, masks, bias and every other view are exact.")


def explainable(loaded, crop: np.ndarray, label_names: list[str] | None, target: int | None = None,
                replacement: str = "mean", batch_size: int = 32) -> Explainable:
    """The adapter for class ``target`` (None: the top prediction) on ``crop`` (uint8 (H, W, 3), the model's input
    size)."""
    from models.families.swin.model import class_names

    model = loaded.model
    check_explainable(model)
    check_image(crop)
    classes = int(model.num_classes)
    if classes == 0:
        raise ValueError("this Swin has no classifier head, so there is no class to explain")
    if isinstance(target, str):
        raise ValueError(f"a Swin explains a class index (0..{classes - 1}), not a typed token {target!r}")
    if target is not None and not 0 <= target < classes:
        raise ValueError(f"class {target} does not exist: this model has classes 0..{classes - 1}")
    if getattr(model, "absolute_pos_embed", None) is not None:
        raise ValueError("this Swin adds an absolute position embedding after the patch embedding; the adapter "
                         "perturbs patch embeddings and supports Swins without one (timm's default)")
    dtype = next(model.parameters()).dtype
    with torch.no_grad():
        embeddings = embed(model, crop_tensor(model, crop).to(loaded.device, dtype))
        baseline = embed(model, baseline_pixels(model, crop, replacement).to(loaded.device, dtype))
        if target is None:
            target = int(logits_from_embeddings(model, embeddings)[0].argmax())
    names = label_names or class_names(model)[0]
    rows, cols = (int(g) for g in model.patch_embed.grid_size)
    return Explainable(embeddings, baseline, tuple(range(rows * cols)), 0, target,
                       names[target] if names else f"class {target}", lambda e: logits_from_embeddings(model, e),
                       lambda: recording(model), tuple(f"patch ({r}, {c})" for r in range(rows) for c in range(cols)),
                       REPLACEMENTS[replacement], batch_size,
                       notes=("the head averages the last stage's tokens, so every method starts from that mean",),
                       layout=layout(model), methods=(*SHARED, *PIXELS), descriptions=DESCRIPTIONS,
                       pixels=pixel_input(model, crop, images.data_config(model), loaded.device))


def from_result(loaded, result, target: int | None, replacement: str = "mean", batch_size: int = 32) -> Explainable:
    """The adapter for the crop a run saw."""
    from models.families.swin.model import class_names

    check_explainable(loaded.model)
    return explainable(loaded, result.image.image, class_names(loaded.model)[0], target, replacement, batch_size)
