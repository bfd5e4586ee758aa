"""The captioning family's adapter for the shared explanations (models/analysis/attribution.py) and
faithfulness curves (models/analysis/faithfulness.py): is a word's attention map faithful? For one
word of a caption, the image tokens ranked by raw attention, by the other explanations and at
random; their regions greyed out in that order (deletion) or revealed in that order from an all-grey
image (insertion), and the word's probability read each time with the caption forced through the
decoder.

On the minis the units are the image tokens of the 8 × 8 grid, and the adapter's "embeddings" are
their pixels (each unit's 8 × 8 × 3 values): a removed unit's pixels become the processor's mean (0
after normalisation, the grey Chefer et al. 2021a perturb with), so the picture the model sees is
what is greyed. The methods of word t (its row: the step that produced it):

- ``raw_attention``: the word's map as the page draws it (a layer and head, or their means;
  ``Explainable.drawn``);
- ``rollout``: the encoder–decoder by Chefer et al. 2021b's encoder–decoder rules through the ViT's
  self-attention, the decoder's and the cross-attention (the shared rule, [CLS] left out of the
  units' keys); the decoder-only VLM through the language model's layers, then carried from its
  image tokens through the vision tower's own rollout to the patches (``Explainable.rolled``). Show,
  Attend and Tell has one attention and no layers to roll out;
- ``gradient_rollout``: the same with each layer's ``E_h[(∇A ⊙ A)⁺]``; Show, Attend and Tell's one
  attention α_t is recorded as a cross-attention of one head and one query, for which the rule is
  ``(∇α_t ⊙ α_t)⁺``;
- ``input_x_gradient``: each unit's pixels times the gradient of the word's logit, summed (no
  attention at all: the baseline an attention map has to beat).

On a hub VLM only raw attention is tested, on the picture as the page draws it (``HUB_NOTE``)."""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from models.analysis import faithfulness, relevance, rollout
from models.analysis.attribution import Explainable, LayerRecord
from models.analysis.records import eager_weights
from models.core import capture
from models.families.captioning import model as captioning

PATCH = 8  # the minis' image token: 8 × 8 px of their 64 px picture
# what the minis offer
METHODS = ("raw_attention", "rollout", "gradient_rollout", "input_x_gradient")
REPLACEMENT = "the processor's mean colour (grey: 0 after normalisation)"
DESCRIPTIONS = {"gradient_rollout": "gradient-weighted attention (Chefer 2021b)",
                "input_x_gradient": "input × gradient (pixels, no attention)"}
TARGET_KIND = "a caption word, teacher-forced"


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
    """The word's logits from a batch of images, the caption forced through the decoder up to the
    word."""

    def __init__(self, loaded, result, position: int):
        self.loaded, self.model, self.kind = loaded, loaded.model, loaded.architecture
        words = list(result.word_ids[:position])
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

    def stepped(self, pixels: torch.Tensor, records: list[LayerRecord]) -> torch.Tensor:
        """Show, Attend and Tell step by step (one image), its last α_t kept in ``records`` as a
        cross-attention (1, 1 head, 1 query, L) that the word's step reads, so its gradient is
        α_t's."""
        model = self.model
        annotations, projected, hidden, cell = model.start(model.encode(pixels))
        for t in range(self.inputs.shape[1] - 1):
            _, (hidden, cell), _, _ = model.step(self.inputs[:, t], (hidden, cell), annotations,
                                                 projected)
        alpha = model.attention(hidden, projected).view(1, 1, 1, -1)  # the word's α_t
        records.append(LayerRecord(attention=alpha, kind="cross"))
        logits, _, _, _ = model.step(self.inputs[:, -1], (hidden, cell), annotations, projected,
                                     alpha.view(1, -1))
        return logits


def _kind(architecture: str, name: str) -> str:
    """A mini's attention module by name: ``encoder`` / ``decoder`` / ``cross`` for the
    encoder–decoder, ``vision`` / ``language`` for the VLM."""
    if architecture == "encoder-decoder":
        if "crossattention" in name:
            return "cross"
        return "encoder" if name.startswith("encoder.") else "decoder"
    return "vision" if "vision_tower" in name else "language"


@contextlib.contextmanager
def differentiable_attention(forward: _Forward):
    """Inside the block, this thread's attention calls of the mini run an eager softmax kept with
    its graph; yields the ``LayerRecord`` of each attention module's first call, in call order (the
    model is untouched: ``capture.overriding``)."""
    model = forward.model
    capture.require_interface(model, "Explanations that differentiate through attention")
    names = {id(m): name for name, m in model.named_modules()}
    records: list[LayerRecord] = []
    seen: set[str] = set()

    def eager_attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        weights, value = eager_weights(module, query, key, value, attention_mask, scaling, kwargs)
        name = names.get(id(module), "?")
        if name not in seen:
            seen.add(name)
            records.append(LayerRecord(attention=weights, kind=_kind(forward.kind, name)))
        return (weights @ value).transpose(1, 2).contiguous(), weights

    with capture.overriding(eager_attention):
        yield records


def _through_the_tower(images: int):
    """The VLM mini's rollout: the word's row through the language model over its ``images`` image
    tokens, then through the vision tower (image token i is the ViT's output i + 1, after [CLS])."""
    def rolled(attention: dict, gradients: dict | None) -> torch.Tensor:
        if gradients is None:
            row = rollout.attention_rollout(attention["language"])[-1, :images]
            return row @ rollout.attention_rollout(attention["vision"])[1:, 1:]
        row = relevance.gradient_rollout(attention["language"], gradients["language"])[-1, :images]
        return row @ relevance.gradient_rollout(attention["vision"], gradients["vision"])[1:, 1:]

    return rolled


def _drawn(result: captioning.CaptionResult, position: int, layer: int | None, head: int | None
           ) -> tuple[np.ndarray, str]:
    """The word's map as the page draws it over the image tokens, and which map in words; ``layer``
    negative counts from the end (the shared convention), None is the mean over layers."""
    if layer is not None and layer < 0:
        layer += captioning.image_layers(result)
    found = captioning.word_attention(result, layer, head)[position]
    return found, captioning.describe_layer(result, layer, head)


def _word(result: captioning.CaptionResult, word: int) -> tuple[int, int, str]:
    """The word explained: its position in the caption, its id, and its label."""
    if not result.words:
        raise ValueError("the caption is empty: there is no word to explain")
    if not 0 <= word < len(result.words):
        raise ValueError(f"word {word} does not exist: the caption has words "
                         f"0..{len(result.words) - 1}")
    return word, int(result.word_ids[word]), f"{result.words[word]} (word {word})"


def from_result(loaded, result, target, replacement: str = "mean", batch_size: int = 32
                ) -> Explainable:
    """The adapter for word ``target`` (its position in the caption; None: the first) of a caption
    run."""
    if replacement != "mean":
        raise ValueError("a removed region becomes the processor's mean colour, not "
                         f"{replacement!r}")
    position, token_id, label = _word(result, 0 if target is None else target)
    if loaded.spec.source != "mini":
        if loaded.architecture != "decoder-only":
            raise ValueError("the faithfulness test runs on the minis and on decoder-only VLMs")
        return _hub(loaded, result, position, token_id, label)
    pixels = _pixels(loaded, result)
    forward = _Forward(loaded, result, position)
    side = pixels.shape[-1]
    recording: dict = {}

    @contextlib.contextmanager
    def record():
        if forward.kind == "show-attend-tell":
            recording["records"] = []
            try:
                yield recording["records"]
            finally:
                recording.pop("records")
        else:
            with differentiable_attention(forward) as records:
                yield records

    def logits(patches: torch.Tensor) -> torch.Tensor:
        image = from_patches(patches, PATCH, side)
        if "records" in recording:
            return forward.stepped(image, recording["records"])
        return forward(image)

    def drawn(layer, head) -> tuple[np.ndarray, str]:
        scores, which = _drawn(result, position, layer, head)
        return scores.astype(np.float32), which

    patches = to_patches(pixels, PATCH)
    rows = side // PATCH
    units = tuple(range(patches.shape[1]))
    sat = forward.kind == "show-attend-tell"
    query = 0 if sat else position  # Show, Attend and Tell's α_t is recorded as its only row
    names = tuple(f"cell ({r}, {c})" for r in range(rows) for c in range(rows))
    notes = ("Show, Attend and Tell has one attention and no layers: there is no rollout to "
             "compare.",)
    columns = rolled = None
    if forward.kind == "encoder-decoder":
        columns = tuple(u + 1 for u in units)  # the encoder's tokens after [CLS]
    elif forward.kind == "decoder-only":
        rolled = _through_the_tower(forward.prompt_length - 1)  # image tokens, then <bos>
    return Explainable(patches, torch.zeros_like(patches), units, query, token_id, label, logits,
                       record, names, REPLACEMENT, batch_size, notes=notes if sat else (),
                       methods=tuple(m for m in METHODS if not (sat and m == "rollout")),
                       target_kind=TARGET_KIND, descriptions=DESCRIPTIONS, drawn=drawn,
                       columns=columns, rolled=rolled)


def word_faithfulness(loaded, result: captioning.CaptionResult, word: int, steps: int = 16,
                      seeds: int = 5, layer: int | None = None, head: int | None = None,
                      progress=lambda step, fraction: None) -> faithfulness.Faithfulness:
    """Every explanation of word ``word`` and its deletion and insertion curves against ``seeds``
    random orders (``layer``, ``head``: raw attention's map; None: the means)."""
    ex = from_result(loaded, result, word)
    return faithfulness.faithfulness(ex, result.model.key, result.input_name, steps=steps,
                                     seeds=seeds, progress=progress, result=result, layer=layer,
                                     head=head)


# --- a hub VLM: regions of the picture greyed out, raw attention against random
# ---------------------------

HUB_NOTE = ("On a hub VLM the test runs on the picture as the page draws it (at most "
            f"{captioning.DISPLAY_SIDE} px a side), greyed region by region and processed "
            "again; its units are the image tokens of the finest frames (the tiles, when there "
            "are tiles), and a thumbnail token's attention is shared among the units it overlaps "
            "by area. Only raw attention is tested: rollout and gradients through a hub VLM cost "
            "too much on a CPU.")


def _finest_units(regions) -> np.ndarray:
    """The tokens whose regions are units: every frame but a global thumbnail that tiles already
    cover."""
    names = [f.name for f in regions.frames]
    tiled = any(name.startswith("tile") for name in names)
    keep = [i for i, name in enumerate(names) if not (tiled and name == "global thumbnail")]
    tokens = np.flatnonzero(np.isin(regions.frame_of, keep))
    return tokens[regions.areas()[tokens] > 0]


def unit_scores(values: np.ndarray, boxes: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Each unit's own value plus every other token's value shared by overlap area (a thumbnail
    token covering four units gives each a quarter): (units,)."""
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


def _hub(loaded, result, position: int, token_id: int, label: str) -> Explainable:
    """A hub VLM's adapter: its "embeddings" say which units are removed (1) in each picture the
    curves ask for; each is greyed, processed again and run with the caption forced up to the word.
    """
    from PIL import Image

    model, processor = loaded.model, loaded.processor
    picture = np.asarray(result.image.image)
    height, width = picture.shape[:2]
    settings = result.settings
    boxes = result.regions.scaled(width, height)
    units = _finest_units(result.regions)
    if len(units) < 2:
        raise ValueError("there is only one image region: nothing to order")
    grey = np.round(np.asarray(getattr(processor.image_processor, "image_mean", (0.5, 0.5, 0.5))) * 255)
    words = list(result.word_ids[:position])
    model_type = model.config.model_type

    def pictures_for(removed: torch.Tensor) -> list:
        made = []
        for row in removed:
            edited = picture.copy()
            for x0, y0, x1, y1 in np.rint(boxes[units[row.numpy()]]).astype(int):
                edited[y0:y1, x0:x1] = grey
            made.append(Image.fromarray(edited))
        return made

    def logits(batch: torch.Tensor) -> torch.Tensor:
        removed = batch[..., 0] > 0.5  # (b, units): the perturbation mask the curves asked for
        found = []
        for edited in pictures_for(removed):
            inputs = captioning.vlm.processor_inputs(loaded, edited, settings.instruction, settings.tiles)
            # the caption up to the word
            grown = captioning._extended(inputs, [*words, token_id], model_type)
            found.append(model(**grown, use_cache=False).logits[:, -1].float())
        return torch.cat(found)

    def drawn(layer, head) -> tuple[np.ndarray, str]:
        values, which = _drawn(result, position, layer, head)
        return unit_scores(values, boxes, units), which

    names = tuple(f"{result.regions.frames[result.regions.frame_of[u]].name} token {u}" for u in units)
    count = len(units)
    return Explainable(torch.zeros(1, count, 1), torch.ones(1, count, 1), tuple(range(count)),
                       position, token_id, label, logits, lambda: contextlib.nullcontext([]), names,
                       "the processor's mean colour, in the picture before processing",
                       batch_size=4, notes=(HUB_NOTE,), methods=("raw_attention",),
                       target_kind=TARGET_KIND, drawn=drawn)
