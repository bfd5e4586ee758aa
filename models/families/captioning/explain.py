"""Is a word's attention map faithful? For one word of a caption: the image tokens ranked by raw attention, by the
other explanations, and at random; their regions greyed out in that order (deletion) or revealed in that order from
an all-grey image (insertion), and the word's probability read each time with the caption forced through the decoder
(``models/analysis/faithfulness.py``: Petsiuk et al. 2018's curves, their areas, and "no better than random").

Units are the image tokens of the minis' 8 × 8 grid: a removed unit's 8 × 8 pixels become the processor's mean
(0 after normalisation, the grey Chefer et al. 2021a perturb with), so the picture the model sees is what is greyed.
The explanations of word t (its row: the step that produced it):

- ``raw_attention``: the word's map as the page draws it (a layer and head, or their means);
- ``rollout`` (Abnar & Zuidema 2020): the encoder–decoder by Chefer et al. 2021b's encoder–decoder rules through
  the ViT's self-attention, the decoder's and the cross-attention; the decoder-only VLM through the language model's
  layers (``½A + ½I`` multiplied), then carried from its image tokens through the vision tower's own rollout to the
  patches. Show, Attend and Tell has one attention and no layers to roll out;
- ``gradient_rollout`` (Chefer et al. 2021b): the same with each layer's ``E_h[(∇A ⊙ A)⁺]``; for Show, Attend and Tell
  ``(∇α_t ⊙ α_t)⁺``, its one attention weighted by the gradient of the word's logit;
- ``input_x_gradient``: each unit's pixels times the gradient of the word's logit, summed (no attention at all: the
  baseline an attention map has to beat).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import numpy as np
import torch

from models.analysis import attribution, faithfulness, rollout
from models.analysis.attribution import Explainable, Explanations
from models.analysis.records import eager_weights
from models.core import capture
from models.families.captioning import model as captioning

METHODS = {
    "raw_attention": "raw attention (the word's map as drawn)",
    "rollout": "attention rollout",
    "gradient_rollout": "gradient-weighted attention (Chefer 2021b)",
    "input_x_gradient": "input × gradient (pixels, no attention)",
}
REPLACEMENT = "the processor's mean colour (grey: 0 after normalisation)"


@dataclass(frozen=True)
class WordTarget:
    """The word explained: its position in the caption, its id, and what produced it."""

    position: int
    token_id: int
    label: str


def word_target(result: captioning.CaptionResult, word: int) -> WordTarget:
    if not result.words:
        raise ValueError("the caption is empty: there is no word to explain")
    if not 0 <= word < len(result.words):
        raise ValueError(f"word {word} does not exist: the caption has words 0..{len(result.words) - 1}")
    return WordTarget(word, int(result.word_ids[word]), f"{result.words[word]} (word {word})")


def _pixels(loaded, result) -> torch.Tensor:
    """The normalised image the mini saw (1, 3, 64, 64): its processor on the crop the run kept."""
    from PIL import Image

    if result.model_picture is None:
        raise ValueError("the faithfulness test needs the picture the mini saw; this run did not keep it")
    return captioning._pixel_values(loaded, Image.fromarray(np.array(result.model_picture))).float()


def to_patches(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """(B, 3, H, W) -> (B, units, 3·patch²), units row-major over the patch grid."""
    batch, channels, height, width = pixels.shape
    grid = pixels.reshape(batch, channels, height // patch, patch, width // patch, patch)
    return grid.permute(0, 2, 4, 1, 3, 5).reshape(batch, (height // patch) * (width // patch), -1)


def from_patches(patches: torch.Tensor, patch: int, side: int) -> torch.Tensor:
    """The inverse of ``to_patches`` for a square ``side`` px image."""
    batch = patches.shape[0]
    rows = side // patch
    grid = patches.reshape(batch, rows, rows, 3, patch, patch)
    return grid.permute(0, 3, 1, 4, 2, 5).reshape(batch, 3, side, side)


class _Forward:
    """The word's logits from a batch of images, the caption forced through the decoder up to the word."""

    def __init__(self, loaded, result, target: WordTarget):
        self.loaded, self.model, self.kind = loaded, loaded.model, loaded.architecture
        words = list(result.word_ids[:target.position])
        if self.kind == "show-attend-tell":
            self.inputs = torch.tensor([[self.model.config.bos_token_id, *words]])
        elif self.kind == "encoder-decoder":
            self.inputs = torch.tensor([[self.model.config.decoder_start_token_id, *words]])
        else:
            prompt = loaded.processor(text=captioning.vlm.prompt_text(loaded.processor, "llava", ""),
                                      images=np.array(result.model_picture), return_tensors="pt")["input_ids"]
            prompt = prompt[0].tolist()
            self.inputs = torch.tensor([[*prompt, *words]])
            self.prompt_length = len(prompt)

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels (B, 3, 64, 64) -> the word's logits (B, vocab)."""
        batch = len(pixels)
        inputs = self.inputs.expand(batch, -1)
        if self.kind == "show-attend-tell":
            return self.model(pixels, inputs)[0][:, -1]
        if self.kind == "encoder-decoder":
            return self.model(pixel_values=pixels, decoder_input_ids=inputs, use_cache=False).logits[:, -1]
        return self.model(input_ids=inputs, pixel_values=pixels, use_cache=False).logits[:, -1]


@contextlib.contextmanager
def differentiable_attention(model):
    """Inside the block, this thread's attention calls of ``model`` run an eager softmax kept with its graph; yields
    ``{module name: [weights (B, H, q, k), …]}`` in call order (the model is untouched: ``capture.overriding``)."""
    capture.require_interface(model, "Explanations that differentiate through attention")
    names = {id(m): name for name, m in model.named_modules()}
    kept: dict[str, list[torch.Tensor]] = {}

    def eager_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        weights, value = eager_weights(module, query, key, value, attention_mask, scaling, kwargs)
        kept.setdefault(names.get(id(module), "?"), []).append(weights)
        return (weights @ value).transpose(1, 2).contiguous(), weights

    with capture.overriding(eager_attention):
        yield kept


def _explain(result, target: WordTarget, forward: _Forward, pixels: torch.Tensor, layer, head
             ) -> tuple[dict[str, np.ndarray], dict[str, float], float, float]:
    """Every method's scores over the 64 units, and the word's logit and probability on the untouched image."""
    patch = 8
    scores, seconds = {}, {}
    started = time.perf_counter()
    raw = captioning.word_attention(result, layer, head)[target.position]
    scores["raw_attention"] = raw.astype(np.float32)
    seconds["raw_attention"] = time.perf_counter() - started
    began = time.perf_counter()
    leaf = pixels.detach().clone().requires_grad_(True)
    with torch.enable_grad():
        if forward.kind == "show-attend-tell":
            model = forward.model
            annotations, projected, hidden, cell = model.start(model.encode(leaf))
            for t in range(forward.inputs.shape[1] - 1):
                _, (hidden, cell), _, _ = model.step(forward.inputs[:, t], (hidden, cell), annotations, projected)
            alpha = model.attention(hidden, projected)  # (1, L): the word's α_t, a variable of the last step
            logits, _, _, _ = model.step(forward.inputs[:, -1], (hidden, cell), annotations, projected, alpha)
            logit = logits[0, target.token_id]
            gradient_alpha, gradient_pixels = torch.autograd.grad(logit, [alpha, leaf])
            scores["gradient_rollout"] = (gradient_alpha * alpha).clamp(min=0)[0].detach().numpy()
        else:
            with differentiable_attention(forward.model) as kept:
                logits = forward(leaf)
            logit = logits[0, target.token_id]
            attentions = _ordered_attention(forward, kept)
            # (1, H, q, k) each, as the forward used them; one that does not depend on the image (the first decoder
            # self-attention, teacher-forced) has no gradient: zeros
            moving = [a for _, a in attentions if a.requires_grad]
            found = iter(torch.autograd.grad(logit, [leaf, *moving], allow_unused=True))
            gradient_pixels = next(found)
            gradients = []
            for _, weights in attentions:
                gradient = next(found) if weights.requires_grad else None
                gradients.append((gradient if gradient is not None else torch.zeros_like(weights))[0])
            rolled, weighted = _rollouts(forward, [(kind, a[0]) for kind, a in attentions], gradients)
            scores["rollout"], scores["gradient_rollout"] = rolled, weighted
        patches, grads = to_patches(leaf.detach(), patch)[0], to_patches(gradient_pixels, patch)[0]
        scores["input_x_gradient"] = (patches * grads).sum(-1).numpy()
    shared = time.perf_counter() - began
    for name in scores:
        seconds.setdefault(name, shared)
    probability = float(torch.softmax(logits.detach().float().reshape(-1, logits.shape[-1])[-1], -1)[
        target.token_id])
    ordered = {m: np.asarray(scores[m], dtype=np.float32) for m in METHODS if m in scores}
    return ordered, seconds, float(logit.detach()), probability


def _ordered_attention(forward: _Forward, kept: dict[str, list[torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """(kind, weights (1, H, q, k)) in forward order: ``encoder`` / ``decoder`` / ``cross`` for the
    encoder–decoder, ``vision`` / ``language`` for the VLM."""
    found = []
    for name, calls in kept.items():
        weights = calls[0]
        if forward.kind == "encoder-decoder":
            kind = "cross" if "crossattention" in name else "encoder" if name.startswith("encoder.") else "decoder"
        else:
            kind = "vision" if "vision_tower" in name else "language"
        found.append((kind, weights))
    return found


def _rollouts(forward: _Forward, attentions, gradients) -> tuple[np.ndarray, np.ndarray]:
    """Rollout and gradient rollout of the word's row over the 64 patches (the module docstring)."""
    by_kind: dict[str, list] = {}
    grads: dict[str, list] = {}
    for (kind, weights), gradient in zip(attentions, gradients):
        by_kind.setdefault(kind, []).append(weights.detach().float())
        grads.setdefault(kind, []).append(gradient.detach().float())
    if forward.kind == "encoder-decoder":
        plain = attribution.encoder_decoder_rollout(by_kind["encoder"], by_kind["decoder"], by_kind["cross"])
        weighted = attribution.encoder_decoder_rollout(by_kind["encoder"], by_kind["decoder"], by_kind["cross"],
                                                       grads)
        return plain[-1, 1:].numpy(), weighted[-1, 1:].numpy()  # the word's row, [CLS] left out
    images = forward.prompt_length - 1  # the image placeholders come first, then <bos>
    row_plain = rollout.attention_rollout(by_kind["language"])[-1, :images]
    row_weighted = attribution.gradient_rollout(by_kind["language"], grads["language"])[-1, :images]
    vision_plain = rollout.attention_rollout(by_kind["vision"])[1:, 1:]  # image token i = the ViT's output at i + 1
    vision_weighted = attribution.gradient_rollout(by_kind["vision"], grads["vision"])[1:, 1:]
    return (row_plain @ vision_plain).numpy(), (row_weighted @ vision_weighted).numpy()


def word_faithfulness(loaded, result: captioning.CaptionResult, word: int, steps: int = 16, seeds: int = 5,
                      layer: int | None = None, head: int | None = None,
                      progress=lambda step, fraction: None) -> faithfulness.Faithfulness:
    """Every explanation of word ``word`` and its deletion and insertion curves against ``seeds`` random orders."""
    target = word_target(result, word)
    if loaded.spec.source != "mini":
        if loaded.architecture != "decoder-only":
            raise ValueError("the faithfulness test runs on the minis and on decoder-only VLMs")
        return _vlm_faithfulness(loaded, result, target, steps, seeds, layer, head, progress)
    started = time.perf_counter()
    pixels = _pixels(loaded, result)
    forward = _Forward(loaded, result, target)
    progress("explanations", 0.0)
    scores, seconds, logit, probability = _explain(result, target, forward, pixels, layer, head)
    patches = to_patches(pixels, 8)
    rows = pixels.shape[-1] // 8

    def logits_of(batch_patches: torch.Tensor) -> torch.Tensor:
        return forward(from_patches(batch_patches, 8, pixels.shape[-1]))

    units = tuple(range(patches.shape[1]))
    names = tuple(f"cell ({r}, {c})" for r in range(rows) for c in range(rows))
    ex = Explainable(patches, torch.zeros_like(patches), units, target.position, target.token_id, target.label,
                     logits_of, contextlib.nullcontext, names, REPLACEMENT, batch_size=32)
    which = captioning.describe_layer(result, layer, head)
    explanations = Explanations(scores, seconds, logit, probability,
                                descriptions={"raw_attention": f"raw attention ({which})", **{
                                    m: METHODS[m] for m in scores if m != "raw_attention"}})
    with torch.no_grad():
        curves, random = faithfulness.measure(ex, explanations, steps, seeds,
                                              lambda step, fraction: progress(step, 0.1 + 0.9 * fraction))
    notes = () if "rollout" in scores else (
        "Show, Attend and Tell has one attention and no layers: there is no rollout to compare.",)
    return faithfulness.Faithfulness(result.model.key, result.input_name, target.token_id, target.label,
                                     probability, REPLACEMENT, len(units), steps, explanations, curves, random, names,
                                     time.perf_counter() - started, result, "a caption word, teacher-forced", notes)


# --- a hub VLM: regions of the picture greyed out, raw attention against random ------------------------------------

HUB_NOTE = ("On a hub VLM the test runs on the picture as the page draws it (at most "
            f"{captioning.DISPLAY_SIDE} px a side), greyed region by region and processed again; its units are the "
            "image tokens of the finest frames (the tiles, when there are tiles), and a thumbnail token's attention "
            "is shared among the units it overlaps by area. Only raw attention is tested: rollout and gradients "
            "through a hub VLM cost too much on a CPU.")


def _finest_units(regions) -> np.ndarray:
    """The tokens whose regions are units: every frame but a global thumbnail that tiles already cover."""
    names = [f.name for f in regions.frames]
    tiled = any(name.startswith("tile") for name in names)
    keep = [i for i, name in enumerate(names) if not (tiled and name == "global thumbnail")]
    tokens = np.flatnonzero(np.isin(regions.frame_of, keep))
    return tokens[regions.areas()[tokens] > 0]


def unit_scores(values: np.ndarray, boxes: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Each unit's own value plus every other token's value shared by overlap area (a thumbnail token covering four
    units gives each a quarter): (units,)."""
    unit_boxes = boxes[units]
    scores = values[units].astype(np.float64).copy()
    others = np.setdiff1d(np.arange(len(values)), units)
    for token in others:
        x0, y0, x1, y1 = boxes[token]
        area = max((x1 - x0) * (y1 - y0), 1e-12)
        overlap = (np.clip(np.minimum(unit_boxes[:, 2], x1) - np.maximum(unit_boxes[:, 0], x0), 0, None) *
                   np.clip(np.minimum(unit_boxes[:, 3], y1) - np.maximum(unit_boxes[:, 1], y0), 0, None))
        scores += values[token] * overlap / area
    return scores.astype(np.float32)


def _vlm_faithfulness(loaded, result, target: WordTarget, steps: int, seeds: int, layer, head, progress):
    from PIL import Image

    started = time.perf_counter()
    model, processor = loaded.model, loaded.processor
    picture = np.asarray(result.image.image)
    height, width = picture.shape[:2]
    settings = result.settings
    geometry_boxes = result.regions.scaled(width, height)
    units = _finest_units(result.regions)
    if len(units) < 2:
        raise ValueError("there is only one image region: nothing to order")
    grey = np.round(np.asarray(getattr(processor.image_processor, "image_mean", (0.5, 0.5, 0.5))) * 255)
    words = list(result.word_ids[:target.position])
    model_type = model.config.model_type

    def pictures_for(removed: torch.Tensor) -> list:
        made = []
        for row in removed:
            edited = picture.copy()
            for x0, y0, x1, y1 in np.rint(geometry_boxes[units[row.numpy()]]).astype(int):
                edited[y0:y1, x0:x1] = grey
            made.append(Image.fromarray(edited))
        return made

    def logits_of(batch: torch.Tensor) -> torch.Tensor:
        removed = batch[..., 0] > 0.5  # (b, units): the perturbation mask the curves asked for
        found = []
        for edited in pictures_for(removed):
            inputs = captioning.vlm.processor_inputs(loaded, edited, settings.instruction, settings.tiles)
            grown = captioning._extended(inputs, [*words, target.token_id], model_type)  # the words before it
            found.append(model(**grown, use_cache=False).logits[:, -1].float())
        return torch.cat(found)

    scores = {"raw_attention": unit_scores(captioning.word_attention(result, layer, head)[target.position],
                                           geometry_boxes, units)}
    with torch.no_grad():
        reference = logits_of(torch.zeros(1, len(units), 1))
    probability = float(torch.softmax(reference[0], -1)[target.token_id])
    names = tuple(f"{result.regions.frames[result.regions.frame_of[u]].name} token {u}" for u in units)
    ex = Explainable(torch.zeros(1, len(units), 1), torch.ones(1, len(units), 1), tuple(range(len(units))),
                     target.position, target.token_id, target.label, logits_of, contextlib.nullcontext, names,
                     "the processor's mean colour, in the picture before processing", batch_size=4)
    which = captioning.describe_layer(result, layer, head)
    explanations = Explanations(scores, {"raw_attention": 0.0}, float(reference[0, target.token_id]), probability,
                                descriptions={"raw_attention": f"raw attention ({which})"})
    with torch.no_grad():
        curves, random = faithfulness.measure(ex, explanations, steps, seeds, progress)
    return faithfulness.Faithfulness(result.model.key, result.input_name, target.token_id, target.label,
                                     probability, ex.replacement, len(units), steps, explanations, curves, random,
                                     names, time.perf_counter() - started, result, "a caption word, teacher-forced",
                                     (HUB_NOTE,))
