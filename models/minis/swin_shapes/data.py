"""Generated data for the offline mini Swin: one coloured shape per image on a textured background.

Every image is drawn from implicit functions on a pixel grid (no files, no downloads), so the data set is exactly
reproducible from a seed. The class is the shape; colour, size, position, rotation, background colour and texture
are nuisance variables, so a model has to look at outlines (corners, holes, arms) rather than at colour.

Sizes are chosen for Swin's geometry at 64 × 64 px with 4 px patches: a shape spans 23–51 px, i.e. 6–13 of the
first stage's 16 tokens a side, so it always crosses several 4 × 4-token windows and the shifted windows matter.
Backgrounds are a flat colour with pixel noise, half of them with a faint texture (stripes or a checkerboard) that
the model must learn to ignore.
"""
from __future__ import annotations

import numpy as np

CLASSES = ("circle", "ring", "square", "frame", "crescent", "triangle", "cross", "flower")


def _shape_mask(kind: str, u: np.ndarray, v: np.ndarray, radius: float) -> np.ndarray:
    """Boolean mask of one shape in rotated, centred coordinates ``u, v`` (pixels) of the given radius (pixels)."""
    r = np.hypot(u, v)
    if kind == "circle":
        return r <= radius
    if kind == "ring":
        return (r <= radius) & (r >= 0.55 * radius)
    if kind == "square":
        return np.maximum(np.abs(u), np.abs(v)) <= 0.8 * radius
    if kind == "frame":
        box = np.maximum(np.abs(u), np.abs(v))
        return (box <= 0.85 * radius) & (box >= 0.5 * radius)
    if kind == "crescent":  # a disc with a disc bitten out of one side
        return (r <= radius) & (np.hypot(u - 0.45 * radius, v) >= 0.8 * radius)
    if kind == "triangle":  # equilateral, apex up (before rotation): inside three half-planes
        return (v <= 0.5 * radius) & (np.sqrt(3.0) * u - v <= radius) & (-np.sqrt(3.0) * u - v <= radius)
    if kind == "cross":
        arm = 0.3 * radius
        return ((np.abs(u) <= arm) & (np.abs(v) <= radius)) | ((np.abs(v) <= arm) & (np.abs(u) <= radius))
    if kind == "flower":  # five petals: the radius oscillates with the angle
        theta = np.arctan2(v, u)
        return r <= radius * (0.5 + 0.5 * np.abs(np.cos(2.5 * theta)))
    raise ValueError(f"unknown shape {kind!r}; expected one of {CLASSES}")


def _background(rng: np.random.Generator, size: int, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """A flat random colour with pixel noise, half the time with faint stripes or a checkerboard: (size, size, 3)"""
    base = rng.uniform(0.0, 1.0, 3)
    texture = rng.normal(0.0, 0.05, (size, size, 1))
    pattern = rng.integers(0, 4)
    if pattern == 1:
        angle, period = rng.uniform(0, np.pi), rng.uniform(4, 12)
        texture += 0.07 * np.sin(2 * np.pi * (xs * np.cos(angle) + ys * np.sin(angle)) / period)[..., None]
    elif pattern == 2:
        cell = rng.integers(2, 8)
        texture += 0.06 * (((ys // cell + xs // cell) % 2) * 2 - 1)[..., None].astype(float)
    return np.clip(base + texture, 0.0, 1.0)


def make_image(rng: np.random.Generator, label: int, size: int = 64) -> np.ndarray:
    """One image of class ``label``: uint8 ``(size, size, 3)``."""
    ys, xs = np.mgrid[0:size, 0:size].astype(float)
    image = _background(rng, size, ys, xs)
    radius = rng.uniform(0.18, 0.4) * size
    cy, cx = rng.uniform(radius, size - radius, 2)
    angle = rng.uniform(0, 2 * np.pi)
    dy, dx = ys - cy, xs - cx
    u = dx * np.cos(angle) + dy * np.sin(angle)
    v = -dx * np.sin(angle) + dy * np.cos(angle)
    mask = _shape_mask(CLASSES[label], u, v, radius)
    behind = image[mask].mean(axis=0)
    colour = rng.uniform(0.0, 1.0, 3)
    while np.abs(colour - behind).max() < 0.35:  # a shape the colour of its background would be invisible
        colour = rng.uniform(0.0, 1.0, 3)
    image[mask] = colour + rng.normal(0.0, 0.03, (int(mask.sum()), 3))
    return (np.clip(image, 0.0, 1.0) * 255).round().astype(np.uint8)


def make_batch(rng: np.random.Generator, count: int, size: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images with balanced random labels: uint8 ``(count, size, size, 3)`` and int64 ``(count,)``."""
    labels = rng.permutation(np.arange(count) % len(CLASSES)).astype(np.int64)
    images = np.stack([make_image(rng, int(label), size) for label in labels])
    return images, labels


def to_tensor(images: np.ndarray, mean: float = 0.5, std: float = 0.5):
    """uint8 ``(B, H, W, 3)`` -> float32 torch ``(B, 3, H, W)`` normalised as the model's data config says."""
    import torch

    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    return (x - mean) / std
