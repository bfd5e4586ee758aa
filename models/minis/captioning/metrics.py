"""How good a captioning mini is, and how well its attention points at what each word names.

- **Caption accuracy**: the greedy caption equals the grammar's reference word for word (exact match); the share of
  objects whose colour, shape and position the caption says right (``scenes.parse``); next-word accuracy with the
  reference forced through the decoder.
- **Pointing game** (Zhang et al. 2016, "Top-down Neural Attention by Excitation Backprop"), per word, with the
  reference caption forced through the decoder so every noun is scored: the word's map over the 8 × 8 grid is a
  *hit* when its most-attended cell touches the mask of the object the word names (any of its pixels). Scored for
  nouns (shape words) and colour words. **Right object**: in scenes with two or three objects, whether the object
  covering most of the top cell is the word's own (a colour word that looks at another shape is wrong even when that
  shape is also red). **Random**: the exact hit rate of a uniformly random cell, the share of cells the object
  touches.

A word's map is row t of the maps from ``architectures.teacher_forced`` (the attention used to produce word t), one
per layer and head; the *default* map is their mean (Show, Attend and Tell has one), and the best single layer is
chosen on a validation stream and reported on the test stream, so nothing is selected on the numbers reported.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from models.minis.captioning import architectures, scenes, vocabulary

SCORED_ROLES = ("shape", "colour")
PATCH = architectures.PATCH


def cell_coverage(mask: np.ndarray, grid: int = architectures.GRID) -> np.ndarray:
    """Pixels of ``mask`` (bool (H, W)) in each cell of the ``grid × grid`` grid, float (grid², ) row-major."""
    side = mask.shape[0] // grid
    return mask.reshape(grid, side, grid, side).sum(axis=(1, 3)).astype(np.float32).ravel()


@dataclass(frozen=True)
class WordPoint:
    """One scored word: which object it names, and for each map (layer, head) its top cell."""

    role: str
    objects: int  # objects in the scene
    top_cells: np.ndarray  # int (layers, heads) top cell of each head's map
    default_cell: int  # top cell of the mean map
    coverage: np.ndarray  # (objects, cells) pixels of each object in each cell
    own: int  # the word's object


def point(word_maps: np.ndarray, scene: scenes.Scene) -> list[WordPoint]:
    """``word_maps`` float (layers, heads, T ≥ words, cells) of the reference caption (row t produced word t) ->
    one ``WordPoint`` per colour or shape word."""
    coverage = np.stack([cell_coverage(o.mask) for o in scene.objects])
    found = []
    for t, word in enumerate(scene.words):
        if word.role not in SCORED_ROLES:
            continue
        maps = word_maps[:, :, t]  # (layers, heads, cells)
        found.append(WordPoint(word.role, len(scene.objects), maps.argmax(-1), int(maps.mean((0, 1)).argmax()),
                               coverage, word.object))
    return found


def hit(coverage: np.ndarray, own: int, cell) -> np.ndarray:
    """Whether ``cell`` (any shape of ints) touches object ``own``."""
    return coverage[own][cell] > 0


def right_object(coverage: np.ndarray, own: int, cell) -> np.ndarray:
    """Whether the object covering most of ``cell`` is ``own`` (False when the cell touches no object)."""
    cell = np.asarray(cell)
    most = coverage[:, cell]  # (objects, ...)
    return (most.argmax(0) == own) & (most.max(0) > 0)


def summarise(points: list[WordPoint], role: str) -> dict:
    """Hit rates of one role's words: the default (mean) map, every head, the right-object rate and random."""
    chosen = [p for p in points if p.role == role]
    if not chosen:
        return {}
    hits = np.array([hit(p.coverage, p.own, p.top_cells) for p in chosen])  # (words, layers, heads)
    default = np.array([hit(p.coverage, p.own, p.default_cell) for p in chosen])
    random = np.array([(p.coverage[p.own] > 0).mean() for p in chosen])
    several = [p for p in chosen if p.objects > 1]
    summary = {"words": len(chosen), "default": float(default.mean()),
               "default_se": float(default.std() / np.sqrt(len(default))),
               "per_head": hits.mean(0).round(4).tolist(), "random": float(random.mean())}
    if several:
        right = np.array([right_object(p.coverage, p.own, p.default_cell) for p in several])
        right_random = np.array([np.mean(right_object(p.coverage, p.own, np.arange(p.coverage.shape[1])))
                                 for p in several])
        summary.update(right_object=float(right.mean()), right_object_random=float(right_random.mean()),
                       right_object_words=len(several))
    return summary


@torch.no_grad()
def batch_maps(model, kind: str, batch: list[scenes.Scene]
               ) -> tuple[np.ndarray, np.ndarray, torch.Tensor, torch.Tensor]:
    """Teacher-forced maps of the reference captions: (B, layers, heads, T, cells) float32, plus each layer's head
    mean folded in as an extra "head" (the last one), the logits and the targets."""
    pixels = to_pixels(np.stack([s.image for s in batch]))
    inputs, targets = caption_tensors([s.caption for s in batch])
    logits, maps = architectures.teacher_forced(model, kind, pixels, inputs, attentions=True)
    maps = maps.float()
    with_mean = torch.cat([maps, maps.mean(2, keepdim=True)], 2)  # (B, layers, heads + 1, T, cells)
    return with_mean.numpy(), maps.numpy(), logits, targets


def to_pixels(images: np.ndarray) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> normalised float32 (B, 3, H, W) (mean and std 0.5: [-1, 1])."""
    x = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).float() / 255.0
    return (x - 0.5) / 0.5


def caption_tensors(captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoder inputs ``<bos> w…`` and targets ``w… <eos>`` (B, T), padded with ``<pad>`` / -100."""
    encoded = [vocabulary.encode(c) for c in captions]
    length = max(len(e) for e in encoded) + 1
    inputs = torch.full((len(encoded), length), vocabulary.PAD_ID, dtype=torch.long)
    targets = torch.full((len(encoded), length), -100, dtype=torch.long)
    for i, ids in enumerate(encoded):
        inputs[i, :len(ids) + 1] = torch.tensor([vocabulary.BOS_ID, *ids])
        targets[i, :len(ids) + 1] = torch.tensor([*ids, vocabulary.EOS_ID])
    return inputs, targets


@torch.no_grad()
def greedy(model, kind: str, images: np.ndarray, max_words: int = architectures.MAX_WORDS) -> list[str]:
    """Greedy captions of a batch (uint8 (B, H, W, 3)), by re-running the teacher-forced forward on the prefix."""
    pixels = to_pixels(images)
    inputs = torch.full((len(images), 1), vocabulary.BOS_ID, dtype=torch.long)
    done = torch.zeros(len(images), dtype=torch.bool)
    for _ in range(max_words + 1):
        logits, _ = architectures.teacher_forced(model, kind, pixels, inputs)
        following = logits[:, -1].argmax(-1)
        following[done] = vocabulary.PAD_ID
        inputs = torch.cat([inputs, following[:, None]], 1)
        done |= following == vocabulary.EOS_ID
        if bool(done.all()):
            break
    captions = []
    for row in inputs[:, 1:].tolist():
        words = []
        for token in row:
            if token in (vocabulary.EOS_ID, vocabulary.PAD_ID):
                break
            words.append(vocabulary.WORDS[token])
        captions.append(" ".join(words))
    return captions


def objects_right(caption: str, scene: scenes.Scene) -> int:
    """How many of the scene's objects the caption names with the right colour, shape and position, in place."""
    try:
        said = scenes.parse(caption)
    except (ValueError, IndexError):
        return 0
    truth = [(scenes.COLOURS[o.colour], scenes.SHAPES[o.shape], scenes.position_words(o.cell)) for o in scene.objects]
    return sum(a == b for a, b in zip(said, truth))


def evaluate(model, kind: str, test: list[scenes.Scene], validation: list[scenes.Scene] | None = None,
             batch_size: int = 100) -> dict:
    """Every number of the card for one model (see the module docstring)."""
    model.eval()
    exact, objects, total_objects, by_count = 0, 0, 0, {}
    correct_words = counted_words = 0
    points: list[WordPoint] = []
    layer_points: dict[int, list[WordPoint]] = {}

    def collect(scene_list, into, per_layer):
        nonlocal correct_words, counted_words
        for start in range(0, len(scene_list), batch_size):
            chunk = scene_list[start:start + batch_size]
            with_mean, _, logits, targets = batch_maps(model, kind, chunk)
            real = targets != -100
            correct_words += int(((logits.argmax(-1) == targets) & real).sum())
            counted_words += int(real.sum())
            layers = with_mean.shape[1]
            for maps, scene in zip(with_mean, chunk):
                into += point(maps[:, :-1], scene)  # the heads
                for layer in range(layers):  # each layer's head mean, as a one-"head" map
                    per_layer.setdefault(layer, []).extend(point(maps[layer:layer + 1, -1:], scene))

    validation_layers: dict[int, list[WordPoint]] = {}
    if validation:
        collect(validation, [], validation_layers)
    correct_words = counted_words = 0
    collect(test, points, layer_points)
    for start in range(0, len(test), batch_size):
        chunk = test[start:start + batch_size]
        for caption, scene in zip(greedy(model, kind, np.stack([s.image for s in chunk])), chunk):
            right = objects_right(caption, scene)
            is_exact = caption == scene.caption
            exact += is_exact
            objects += right
            total_objects += len(scene.objects)
            count = by_count.setdefault(str(len(scene.objects)), [0, 0])
            count[0] += is_exact
            count[1] += 1

    pointing = {}
    for role in SCORED_ROLES:
        per_layer = [summarise(layer_points[layer], role)["default"] for layer in sorted(layer_points)]
        best = None
        if validation_layers:
            chosen = [summarise(validation_layers[layer], role)["default"] for layer in sorted(validation_layers)]
            best = int(np.argmax(chosen))
        summary = summarise(points, role)
        summary["per_layer"] = per_layer
        if best is not None:
            summary["best_layer"] = best
            summary["best_layer_test"] = per_layer[best]
        pointing["nouns" if role == "shape" else "colours"] = summary
    return {"test_scenes": len(test), "exact_match": exact / len(test), "objects_correct": objects / total_objects,
            "exact_by_objects": {k: v[0] / v[1] for k, v in sorted(by_count.items())},
            "word_accuracy": correct_words / max(1, counted_words), "pointing": pointing}
