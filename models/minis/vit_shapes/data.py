"""Generated data for the offline mini ViT: one filled shape pasted on a random crop of a shipped photo.

The class is the shape (``CLASSES``), and each shape also has its own hue band (``HUE_STEP`` apart, ±``HUE_JITTER``):
a from-scratch ViT on one CPU thread learns colour within minutes but shape outlines only after thousands of steps
(probed: with random colours it sat at chance for 1000+ steps), so the class is carried by both, and the card says
so. Size, position, rotation, brightness and the photo crop behind the shape are nuisance variables, so a classifier
still has to find the object among real clutter (the photos contain those hues too). That is what makes its attention and
attribution maps worth looking at: every image comes with the shape's exact pixel mask (``Sample.mask``), so "does
the map point at the object?" has a measurable answer.

Backgrounds are crops of the four CC0 sample photos in ``sample_data/images`` (rescaled 0.3–1×, flipped at random,
blurred by up to 1.5 px and with their contrast scaled by 0.35–1): a mix of easy and hard images, so a from-scratch
ViT gets a learning signal from the first few hundred steps (with raw crops only it sat at chance for 500+ steps,
the shape's few patches drowned among 64 patches of clutter). Shapes are drawn with Pillow at 4× resolution and
downsampled (anti-aliased edges). Reproducible from a seed.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from models.core import images

CLASSES = ("circle", "square", "triangle", "cross", "ring", "star")
HUE_STEP = 360.0 / len(CLASSES)  # degrees between the classes' hue bands
HUE_JITTER = 20.0  # ± degrees within a band
HUE_NAMES = ("red", "yellow", "green", "cyan", "blue", "magenta")  # the band centres 0°, 60°, …, 300°
LABELS = tuple(f"{hue} {shape}" for hue, shape in zip(HUE_NAMES, CLASSES))  # class names the model is saved with
IMAGE_SIZE = 64  # pixels a side: 8 × 8 patches of 8 px
SUPERSAMPLE = 4


@dataclass(frozen=True)
class Sample:
    image: np.ndarray  # uint8 (IMAGE_SIZE, IMAGE_SIZE, 3)
    label: int  # index into CLASSES
    mask: np.ndarray  # bool (IMAGE_SIZE, IMAGE_SIZE): True on the shape


@lru_cache(maxsize=1)
def _photos() -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(images.load_sample(name).image) for name in images.sample_names())


def _background(rng: np.random.Generator) -> np.ndarray:
    photo = _photos()[rng.integers(len(_photos()))]
    height, width = photo.shape[:2]
    side = int(rng.uniform(0.3, 1.0) * min(height, width))
    top, left = rng.integers(0, height - side + 1), rng.integers(0, width - side + 1)
    crop = Image.fromarray(photo[top:top + side, left:left + side]).resize((IMAGE_SIZE, IMAGE_SIZE),
                                                                          Image.Resampling.BILINEAR)
    crop = crop.filter(ImageFilter.GaussianBlur(rng.uniform(0.0, 1.5)))
    pixels = np.asarray(crop, dtype=np.float32)
    mean = pixels.mean(axis=(0, 1), keepdims=True)
    pixels = mean + rng.uniform(0.35, 1.0) * (pixels - mean)  # lower contrast: the shape stands out more
    pixels = np.clip(pixels, 0, 255).astype(np.uint8)
    return pixels[:, ::-1] if rng.random() < 0.5 else pixels


def _polygon(kind: str, radius: float, angle: float) -> list[tuple[float, float]]:
    """Vertices (x, y) around the origin for the polygon shapes, rotated by ``angle`` radians."""
    if kind == "square":
        corners = [(np.pi / 4 + k * np.pi / 2, radius) for k in range(4)]
    elif kind == "triangle":
        corners = [(-np.pi / 2 + k * 2 * np.pi / 3, radius) for k in range(3)]
    elif kind == "star":
        corners = [(-np.pi / 2 + k * np.pi / 5, radius if k % 2 == 0 else 0.45 * radius) for k in range(10)]
    elif kind == "cross":
        arm, width = radius, 0.33 * radius
        points = [(width, arm), (width, width), (arm, width), (arm, -width), (width, -width), (width, -arm),
                  (-width, -arm), (-width, -width), (-arm, -width), (-arm, width), (-width, width), (-width, arm)]
        corners = [(np.arctan2(y, x), np.hypot(x, y)) for x, y in points]
    else:
        raise ValueError(f"{kind!r} is not a polygon shape")
    return [(r * np.cos(a + angle), r * np.sin(a + angle)) for a, r in corners]


def _shape_mask(rng: np.random.Generator, kind: str) -> np.ndarray:
    """Anti-aliased coverage in [0, 1], float (IMAGE_SIZE, IMAGE_SIZE)."""
    big = IMAGE_SIZE * SUPERSAMPLE
    radius = rng.uniform(11, 22) * SUPERSAMPLE
    cx, cy = rng.uniform(radius, big - radius, size=2)
    canvas = Image.new("L", (big, big), 0)
    draw = ImageDraw.Draw(canvas)
    if kind == "circle":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=255)
    elif kind == "ring":
        draw.ellipse([cx - radius, cy - radius, cx + radius, cy + radius], fill=255)
        inner = 0.55 * radius
        draw.ellipse([cx - inner, cy - inner, cx + inner, cy + inner], fill=0)
    else:
        points = [(cx + x, cy + y) for x, y in _polygon(kind, radius, rng.uniform(0, 2 * np.pi))]
        draw.polygon(points, fill=255)
    small = canvas.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX)
    return np.asarray(small, dtype=np.float32) / 255.0


def _plain_background(rng: np.random.Generator) -> np.ndarray:
    """A flat random colour with mild noise: the easy backgrounds of the curriculum's start."""
    colour = rng.uniform(0, 255, 3)
    noise = rng.normal(0, 12, (IMAGE_SIZE, IMAGE_SIZE, 1))
    return np.clip(colour + noise, 0, 255).astype(np.uint8)


def _class_colour(rng: np.random.Generator, label: int) -> np.ndarray:
    """RGB (0–255) in the class's hue band, with random saturation and brightness."""
    import colorsys

    hue = (label * HUE_STEP + rng.uniform(-HUE_JITTER, HUE_JITTER)) % 360.0
    red, green, blue = colorsys.hsv_to_rgb(hue / 360.0, rng.uniform(0.55, 1.0), rng.uniform(0.6, 1.0))
    return np.array([red, green, blue]) * 255.0


def make_sample(rng: np.random.Generator, label: int | None = None, clutter: float = 1.0,
                class_hue: bool = True) -> Sample:
    """One image; ``label`` None draws a class uniformly; ``clutter`` is the probability of a photo background
    (else a plain one): 1.0 is the real task, training starts lower (a curriculum). ``class_hue=False`` draws the
    hue at random instead: the probe for whether a model reads outlines or only colour."""
    label = int(rng.integers(len(CLASSES))) if label is None else label
    photo = rng.random() < clutter
    background = (_background(rng) if photo else _plain_background(rng)).astype(np.float32)
    coverage = _shape_mask(rng, CLASSES[label])[..., None]
    inside = coverage[..., 0] > 0.5
    local = background[inside].mean(axis=0) if inside.any() else background.mean(axis=(0, 1))
    def draw_colour() -> np.ndarray:
        return _class_colour(rng, label if class_hue else int(rng.integers(len(CLASSES))))

    colour = draw_colour()
    for _ in range(20):  # keep the shape visible against what lies behind it
        if np.abs(colour - local).sum() >= 120:
            break
        colour = draw_colour()
    pixels = background * (1 - coverage) + colour * coverage
    return Sample(np.clip(np.rint(pixels), 0, 255).astype(np.uint8), label, inside)


def make_batch(rng: np.random.Generator, size: int, clutter: float = 1.0,
               class_hue: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``size`` images uint8 (size, H, W, 3) and labels int64 (size,), classes balanced in expectation."""
    samples = [make_sample(rng, clutter=clutter, class_hue=class_hue) for _ in range(size)]
    return np.stack([s.image for s in samples]), np.array([s.label for s in samples], dtype=np.int64)
