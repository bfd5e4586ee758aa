"""Generated scenes for the captioning minis, and the grammar that describes them: every word knows its object.

A scene is a 64 × 64 px image with one to three of the shapes the DETR and ViT minis know (circle, square, triangle,
cross, ring, star; drawn by ``models.minis.detr_shapes.data.shape_coverage``), each in one cell of a 3 × 3 grid
(centre jittered by at most ``JITTER`` px, radius ``MIN_RADIUS``–``MAX_RADIUS``), so that every object has an
unambiguous position word. Unlike the classifier minis, **colour and shape are drawn independently** (six hue names,
``HUE_NAMES``, ± ``HUE_JITTER`` degrees): a caption's colour word and its noun carry different information, and "does
the colour word look at the right object?" has an answer.

The caption is fixed by the scene (``caption``): objects in reading order of their cells (top row first, left to
right), each as ``a <colour> <shape> at the <position>`` (``in the centre`` for the middle cell), joined by ``,`` and
a final ``and``:

    a red circle at the top left , a blue star in the centre and a green ring at the bottom

Each word carries the index of the object it describes (``Word.object``; -1 for articles, prepositions and
punctuation) and its role (``colour``, ``shape``, ``position`` or ``function``), and every object its exact pixel mask
(coverage > ½ of the anti-aliased drawing), so an attention map for a noun can be scored against the mask of the
object the noun names (the pointing game). Backgrounds are a flat desaturated colour with mild noise, or (with
probability ``clutter``) a low-contrast crop of the CC0 sample photos, as the other shapes minis use. Reproducible
from a seed.
"""
from __future__ import annotations

import colorsys
from dataclasses import dataclass

import numpy as np

from models.minis.detr_shapes import data as detr_data
from models.minis.vit_shapes import data as shapes

IMAGE_SIZE = 64  # pixels a side: 8 × 8 patches of 8 px
CELLS = 3  # a 3 × 3 grid of cells, one object per cell at most
CELL = IMAGE_SIZE / CELLS
MIN_RADIUS, MAX_RADIUS = 7.0, 9.5  # pixels; the largest still leaves a gap between neighbouring cells
JITTER = 2.5  # pixels the centre may move from its cell's centre
MAX_OBJECTS = 3
SHAPES = shapes.CLASSES  # circle, square, triangle, cross, ring, star
COLOURS = shapes.HUE_NAMES  # red, yellow, green, cyan, blue, magenta: the band centres 0°, 60°, …, 300°
HUE_JITTER = 15.0  # ± degrees around the band centre
ROWS = ("top", "", "bottom")
COLUMNS = ("left", "", "right")
ROLES = ("colour", "shape", "position", "function")


def position_words(cell: tuple[int, int]) -> tuple[str, ...]:
    """The position phrase's content words of a cell (row, column): ("top", "left"), ("left",), ("centre",)."""
    row, col = cell
    words = tuple(w for w in (ROWS[row], COLUMNS[col]) if w)
    return words or ("centre",)


VOCABULARY = ("a", "at", "the", "in", "and", ",", *COLOURS, *SHAPES, "top", "bottom", "left", "right", "centre")


@dataclass(frozen=True)
class SceneObject:
    colour: int  # index into COLOURS
    shape: int  # index into SHAPES
    cell: tuple[int, int]  # (row, column) in the 3 × 3 grid
    centre: tuple[float, float]  # (x, y) pixels
    radius: float  # pixels
    mask: np.ndarray  # bool (IMAGE_SIZE, IMAGE_SIZE): True where the shape covers more than half a pixel

    @property
    def name(self) -> str:
        return f"{COLOURS[self.colour]} {SHAPES[self.shape]}"


@dataclass(frozen=True)
class Word:
    text: str
    object: int  # index into Scene.objects, or -1 (articles, prepositions, punctuation)
    role: str  # one of ROLES


@dataclass(frozen=True)
class Scene:
    image: np.ndarray  # uint8 (IMAGE_SIZE, IMAGE_SIZE, 3)
    objects: tuple[SceneObject, ...]  # in caption order (reading order of their cells)
    words: tuple[Word, ...]  # the reference caption, word by word

    @property
    def caption(self) -> str:
        return " ".join(word.text for word in self.words)

    def mask_of(self, word_index: int) -> np.ndarray | None:
        """The pixel mask of the object word ``word_index`` names, or None for a function word."""
        found = self.words[word_index].object
        return None if found < 0 else self.objects[found].mask


def describe(objects: tuple[SceneObject, ...]) -> tuple[Word, ...]:
    """The grammar: the caption of objects already in reading order, every word tagged with its object and role."""
    words: list[Word] = []
    for index, item in enumerate(objects):
        if index > 0:
            words.append(Word("and" if index == len(objects) - 1 else ",", -1, "function"))
        words += [Word("a", -1, "function"), Word(COLOURS[item.colour], index, "colour"),
                  Word(SHAPES[item.shape], index, "shape")]
        place = position_words(item.cell)
        words += [Word("in" if place == ("centre",) else "at", -1, "function"), Word("the", -1, "function")]
        words += [Word(w, index, "position") for w in place]
    return tuple(words)


def parse(caption: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """A caption back into (colour, shape, position words) per object, in order; a ``ValueError`` if the grammar
    cannot read it (the page and the metrics use it to score a model's own caption object by object)."""
    tokens = caption.split()
    found, i = [], 0
    while i < len(tokens):
        if found:
            if tokens[i] not in (",", "and"):
                raise ValueError(f"expected ',' or 'and' at word {i} of {caption!r}")
            i += 1
        if tokens[i:i + 1] != ["a"] or len(tokens) < i + 5:
            raise ValueError(f"expected 'a <colour> <shape> at the …' at word {i} of {caption!r}")
        colour, shape, preposition, article = tokens[i + 1:i + 5]
        if colour not in COLOURS or shape not in SHAPES or preposition not in ("at", "in") or article != "the":
            raise ValueError(f"{' '.join(tokens[i:i + 5])!r} is not 'a <colour> <shape> at the …'")
        i += 5
        place = []
        while i < len(tokens) and tokens[i] in ("top", "bottom", "left", "right", "centre"):
            place.append(tokens[i])
            i += 1
        if not 1 <= len(place) <= 2:
            raise ValueError(f"expected a position after {colour} {shape} in {caption!r}")
        found.append((colour, shape, tuple(place)))
    return found


def _hue_colour(rng: np.random.Generator, colour: int) -> np.ndarray:
    """RGB 0–255 in the hue band of ``COLOURS[colour]``, saturated and bright enough to name."""
    hue = (colour * shapes.HUE_STEP + rng.uniform(-HUE_JITTER, HUE_JITTER)) % 360.0
    red, green, blue = colorsys.hsv_to_rgb(hue / 360.0, rng.uniform(0.65, 1.0), rng.uniform(0.7, 1.0))
    return np.array([red, green, blue]) * 255.0


def _plain_background(rng: np.random.Generator) -> np.ndarray:
    """A flat, nearly grey colour (saturation ≤ 0.15, so no background is mistaken for a colour word) with noise."""
    red, green, blue = colorsys.hsv_to_rgb(rng.uniform(0, 1), rng.uniform(0, 0.15), rng.uniform(0.08, 0.92))
    noise = rng.normal(0, 6, (IMAGE_SIZE, IMAGE_SIZE, 1))
    return np.clip(np.array([red, green, blue]) * 255.0 + noise, 0, 255)


def _photo_background(rng: np.random.Generator) -> np.ndarray:
    """A crop of a sample photo (the ViT mini's backgrounds), desaturated by half so its colours are not nouns."""
    pixels = shapes._background(rng).astype(np.float32)
    grey = pixels.mean(axis=-1, keepdims=True)
    return grey + 0.5 * (pixels - grey)


def make_scene(rng: np.random.Generator, clutter: float = 0.0, count: int | None = None) -> Scene:
    """One scene with ``count`` objects (default 1–3 at random) in distinct cells; ``clutter`` is the probability of
    a photo background."""
    count = int(rng.integers(1, MAX_OBJECTS + 1)) if count is None else count
    if not 1 <= count <= CELLS * CELLS:
        raise ValueError(f"a scene holds 1 to {CELLS * CELLS} objects, not {count}")
    pixels = _photo_background(rng) if rng.random() < clutter else _plain_background(rng)
    cells = sorted(int(c) for c in rng.choice(CELLS * CELLS, size=count, replace=False))  # reading order
    objects = []
    for cell in cells:
        row, col = divmod(cell, CELLS)
        radius = rng.uniform(MIN_RADIUS, MAX_RADIUS)
        cx, cy = (np.array([col, row]) + 0.5) * CELL + rng.uniform(-JITTER, JITTER, size=2)
        shape, colour_index = int(rng.integers(len(SHAPES))), int(rng.integers(len(COLOURS)))
        coverage = detr_data.shape_coverage(SHAPES[shape], cx, cy, radius, rng.uniform(0, 2 * np.pi))
        inside = coverage > 0.5
        local = pixels[inside].mean(axis=0)
        colour = _hue_colour(rng, colour_index)
        for _ in range(20):  # keep the shape visible against what lies behind it
            if np.abs(colour - local).sum() >= 120:
                break
            colour = _hue_colour(rng, colour_index)
        pixels = pixels * (1 - coverage[..., None]) + colour * coverage[..., None]
        objects.append(SceneObject(colour_index, shape, (row, col), (float(cx), float(cy)), float(radius), inside))
    objects = tuple(objects)
    image = np.clip(np.rint(pixels), 0, 255).astype(np.uint8)
    for item in objects:
        item.mask.setflags(write=False)
    return Scene(image, objects, describe(objects))


def scene_from(objects: list[tuple[str, str, tuple[int, int]]], background: float = 0.5, angle: float = 0.0,
               radius: float = 8.5) -> Scene:
    """A hand-built scene: (colour, shape, (row, column)) per object on a flat grey of brightness ``background``
    (0..1), centred in their cells, unrotated: what the tests check masks and pointing against."""
    pixels = np.full((IMAGE_SIZE, IMAGE_SIZE, 3), background * 255.0)
    built = []
    for colour, shape, cell in sorted(objects, key=lambda o: o[2]):
        row, col = cell
        cx, cy = (col + 0.5) * CELL, (row + 0.5) * CELL
        coverage = detr_data.shape_coverage(shape, cx, cy, radius, angle)
        rgb = np.array(colorsys.hsv_to_rgb(COLOURS.index(colour) * shapes.HUE_STEP / 360.0, 1.0, 1.0)) * 255.0
        pixels = pixels * (1 - coverage[..., None]) + rgb * coverage[..., None]
        built.append(SceneObject(COLOURS.index(colour), SHAPES.index(shape), cell, (cx, cy), radius, coverage > 0.5))
    built = tuple(built)
    return Scene(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), built, describe(built))


PAGE_CLUTTER = 0.25  # the page's and the CLI's scenes (and the test stream): a quarter on photo backgrounds


def page_scene(seed: int) -> Scene:
    """The generated scene the captioning page and the CLI (``--image scene:SEED``) show for ``seed``."""
    if not 0 <= seed <= 9999:
        raise ValueError(f"a scene's seed is between 0 and 9999, not {seed}")
    return make_scene(np.random.default_rng(10_000 + seed), clutter=PAGE_CLUTTER)


def dihedral(scene: Scene, k: int) -> Scene:
    """One of the square's 8 symmetries (``k`` in 0..7: bit 0 flips left–right, bit 1 top–bottom, bit 2 swaps x and
    y) applied to the image and every mask exactly, with the caption said again for the moved objects (a shape keeps
    its name under any flip; cells, positions and the reading order change)."""
    image = scene.image
    moved = []
    for item in scene.objects:
        (row, col), (cx, cy), mask = item.cell, item.centre, item.mask
        if k & 4:
            row, col, cx, cy, mask = col, row, cy, cx, mask.T
        if k & 1:
            col, cx, mask = CELLS - 1 - col, IMAGE_SIZE - cx, mask[:, ::-1]
        if k & 2:
            row, cy, mask = CELLS - 1 - row, IMAGE_SIZE - cy, mask[::-1]
        mask = np.ascontiguousarray(mask)
        mask.setflags(write=False)
        moved.append(SceneObject(item.colour, item.shape, (row, col), (cx, cy), item.radius, mask))
    if k & 4:
        image = image.transpose(1, 0, 2)
    if k & 1:
        image = image[:, ::-1]
    if k & 2:
        image = image[::-1]
    ordered = tuple(sorted(moved, key=lambda o: o.cell))
    return Scene(np.ascontiguousarray(image), ordered, describe(ordered))


def scene_pool(rng: np.random.Generator, size: int, clutter: float) -> detr_data.ScenePool:
    """Training scenes for many cheap steps (a scene costs ~3 ms to draw): the DETR mini's pool of ``size`` scenes,
    ``fresh`` of them replaced every draw, each through a random one of the 8 symmetries (``dihedral``)."""
    return detr_data.ScenePool(rng, size, clutter, make=make_scene, turn=dihedral)
