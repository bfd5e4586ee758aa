"""Generated detection data for the offline mini DETR: 1–3 of the mini ViT's coloured shapes per image, each with
its exact box.

The shapes and their class hue bands are the mini ViT's (models/minis/vit_shapes/data.py: circle, square, triangle,
cross, ring, star; the class is carried by outline and colour), drawn smaller (radius ``MIN_RADIUS``–``MAX_RADIUS``)
at random positions that keep any two shapes apart (centres at least ``SEPARATION`` × the sum of their radii), on a
plain background or a crop of the CC0 sample photos. Every box is the tight box of the shape's drawn pixels (coverage
> ½), so it is exactly what a detector should find. Reproducible from a seed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from models.minis.vit_shapes import data as shapes

CLASSES = shapes.CLASSES
LABELS = shapes.LABELS
IMAGE_SIZE = 64  # pixels a side; the backbone's stride 8 makes 8 × 8 image tokens
MIN_RADIUS, MAX_RADIUS = 7.0, 13.0
MAX_OBJECTS = 3
SEPARATION = 0.85  # centre distance ≥ this × (r₁ + r₂): shapes may touch, never hide each other
SUPERSAMPLE = 4


@dataclass(frozen=True)
class Scene:
    image: np.ndarray  # uint8 (IMAGE_SIZE, IMAGE_SIZE, 3)
    labels: np.ndarray  # int64 (n,): indices into CLASSES
    boxes: np.ndarray  # float32 (n, 4): x0, y0, x1, y1 in pixels (x1, y1 exclusive)


def shape_coverage(kind: str, cx: float, cy: float, radius: float, angle: float) -> np.ndarray:
    """Anti-aliased coverage in [0, 1] of one shape, float (IMAGE_SIZE, IMAGE_SIZE); centre and radius in pixels."""
    big = IMAGE_SIZE * SUPERSAMPLE
    cx, cy, radius = cx * SUPERSAMPLE, cy * SUPERSAMPLE, radius * SUPERSAMPLE
    canvas = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(canvas)
    if kind in ("circle", "ring"):
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=255)
        if kind == "ring":
            inner = 0.55 * radius
            draw.ellipse([cx - inner, cy - inner, cx + inner, cy + inner], fill=0)
    else:
        draw.polygon([(cx + x, cy + y) for x, y in shapes._polygon(kind, radius, angle)], fill=255)
    return np.asarray(canvas.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX), dtype=np.float32) / 255.0


def tight_box(inside: np.ndarray) -> np.ndarray:
    """The box x0, y0, x1, y1 (pixels, x1/y1 exclusive) of a bool mask's True pixels."""
    ys, xs = np.nonzero(inside)
    return np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], dtype=np.float32)


def _place(rng: np.random.Generator, count: int) -> list[tuple[float, float, float]]:
    """Up to ``count`` (cx, cy, radius) kept apart; fewer if the image is full after a few tries."""
    placed: list[tuple[float, float, float]] = []
    for _ in range(count * 30):
        if len(placed) == count:
            break
        radius = rng.uniform(MIN_RADIUS, MAX_RADIUS)
        cx, cy = rng.uniform(radius, IMAGE_SIZE - radius, size=2)
        if all(np.hypot(cx - x, cy - y) >= SEPARATION * (radius + r) for x, y, r in placed):
            placed.append((cx, cy, radius))
    return placed


def make_scene(rng: np.random.Generator, clutter: float = 1.0, count: int | None = None) -> Scene:
    """One image with ``count`` (default 1–3 at random) shapes; ``clutter``: probability of a photo background."""
    count = int(rng.integers(1, MAX_OBJECTS + 1)) if count is None else count
    photo = rng.random() < clutter
    pixels = (shapes._background(rng) if photo else shapes._plain_background(rng)).astype(np.float32)
    labels, boxes = [], []
    for cx, cy, radius in _place(rng, count):
        label = int(rng.integers(len(CLASSES)))
        coverage = shape_coverage(CLASSES[label], cx, cy, radius, rng.uniform(0, 2 * np.pi))
        inside = coverage > 0.5
        if not inside.any():
            continue
        local = pixels[inside].mean(axis=0)
        colour = shapes._class_colour(rng, label)
        for _ in range(20):  # keep the shape visible against what lies behind it
            if np.abs(colour - local).sum() >= 120:
                break
            colour = shapes._class_colour(rng, label)
        pixels = pixels * (1 - coverage[..., None]) + colour * coverage[..., None]
        labels.append(label)
        boxes.append(tight_box(inside))
    return Scene(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), np.array(labels, dtype=np.int64),
                 np.array(boxes, dtype=np.float32).reshape(-1, 4))


PAGE_CLUTTER = 0.5  # the DETR page's and the CLI's scenes: half on photo backgrounds, like the test stream


def page_scene(seed: int) -> Scene:
    """The generated scene the DETR page and the CLI (``--image shapes:SEED``) show for ``seed``."""
    if not 0 <= seed <= 9999:
        raise ValueError(f"a scene's seed is between 0 and 9999, not {seed}")
    return make_scene(np.random.default_rng(seed), clutter=PAGE_CLUTTER)


def to_cxcywh(boxes: np.ndarray) -> np.ndarray:
    """x0, y0, x1, y1 pixels -> DETR's normalised centre x, centre y, width, height in [0, 1]."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(-1, 4) / IMAGE_SIZE
    return np.stack([(boxes[:, 0] + boxes[:, 2]) / 2, (boxes[:, 1] + boxes[:, 3]) / 2,
                     boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]], axis=1)


def dihedral(scene: Scene, k: int) -> Scene:
    """One of the square's 8 symmetries (``k`` in 0..7: bit 0 flips left–right, bit 1 top–bottom, bit 2 swaps x and
    y) applied to the image and its boxes exactly. Every class keeps its name: outline and colour survive a flip."""
    image, boxes = scene.image, scene.boxes.copy()
    if k & 4:
        image = image.transpose(1, 0, 2)
        boxes = boxes[:, [1, 0, 3, 2]]
    if k & 1:
        image = image[:, ::-1]
        boxes[:, [0, 2]] = IMAGE_SIZE - boxes[:, [2, 0]]
    if k & 2:
        image = image[::-1]
        boxes[:, [1, 3]] = IMAGE_SIZE - boxes[:, [3, 1]]
    return Scene(np.ascontiguousarray(image), scene.labels, boxes)


class ScenePool:
    """Training scenes for many cheap steps: ``size`` generated scenes, of which ``fresh`` are replaced by new ones at
    each draw (at the caller's current photo-background share), each drawn through a random one of the square's 8
    symmetries. ``make(rng, clutter)`` and ``turn(scene, symmetry)`` default to this module's scenes; the
    captioning mini passes its own."""

    def __init__(self, rng: np.random.Generator, size: int, clutter: float, make=None, turn=None):
        self.make, self.turn = make or make_scene, turn or dihedral
        self.scenes = [self.make(rng, clutter) for _ in range(size)]

    def draw(self, rng: np.random.Generator, count: int, clutter: float, fresh: int) -> list:
        for slot in rng.choice(len(self.scenes), size=fresh, replace=False):
            self.scenes[slot] = self.make(rng, clutter)
        picked = rng.choice(len(self.scenes), size=count, replace=False)
        return [self.turn(self.scenes[i], int(rng.integers(8))) for i in picked]
