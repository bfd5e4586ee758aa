"""Every image token of a vision–language model mapped back to the exact pixel region of the user's image it was
computed from, whatever the processor did to the picture.

A processor turns one picture into one or more *frames* the vision encoder sees (the image itself, a centre crop, the
tiles of a grid plus a downscaled thumbnail), each by a chain of whole-image resizes, crops and pads; each frame is a
regular grid of tokens (a patch, or a block of patches that a pixel shuffle or a merge folds into one token). So a
token's region is its cell of its frame's grid, carried back through that chain, which is an affine map of the
coordinates (pixel edges, x1 and y1 exclusive):

- **single frame** (LLaVA-1.5's CLIP: shortest edge resized, centre crop, [CLS] dropped; PaliGemma's SigLIP: resized
  to a square; a ViT encoder; the minis): optional pad to a square (LLaVA's ``do_pad``), resize, optional centre crop,
  then ``patch``-pixel cells.
- **Idefics3 / SmolVLM**: the longest edge resized to ``size``, both sides rounded up to multiples of the tile size
  ``M``, cut into ``rows × cols`` tiles of ``M × M`` (row-major), and a global thumbnail of the whole picture squeezed
  to ``M × M`` after them; in every frame the encoder's ``patch``-pixel patches are folded ``s × s`` into one token by
  the connector's pixel shuffle (token ``k`` = the ``s × s`` block at row ``k // (n/s)``, column ``k % (n/s)``). An
  image that needs no tiling is one frame.
- **Qwen2-VL**: resized ("smart resize") to multiples of ``patch × merge`` (the ``image_grid_thw`` the processor
  returns), patches merged ``2 × 2`` into one token, raster order over the merged grid.

Regions are in pixels of the picture the processor was given (``image_size``); ``scaled`` puts them on a displayed
copy of another size. Tested against each processor's own output with marker images (tests/test_captioning_hub.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

KINDS = ("grid", "idefics3", "qwen2_vl")


@dataclass(frozen=True)
class Frame:
    """One picture the vision encoder saw: what part of the user's image it shows, and its token grid."""

    name: str  # "image", "tile (1, 2)", "global thumbnail"
    box: tuple[float, float, float, float]  # x0, y0, x1, y1 in pixels of the user's image (may reach into padding)
    grid: tuple[int, int]  # token rows, columns


@dataclass(frozen=True)
class TokenRegions:
    """Image token ``i`` (in the order they appear in the model's input) came from ``boxes[i]`` of the user's
    image, in frame ``frame_of[i]``."""

    boxes: np.ndarray  # float32 (tokens, 4): x0, y0, x1, y1 in pixels of the user's image, clipped to it
    frame_of: np.ndarray  # int (tokens,)
    frames: tuple[Frame, ...]
    image_size: tuple[int, int]  # (width, height) of the user's image as the processor got it
    description: str  # what the processor did, in words

    def __post_init__(self):
        self.boxes.setflags(write=False)
        self.frame_of.setflags(write=False)

    @property
    def count(self) -> int:
        return len(self.boxes)

    def scaled(self, width: int, height: int) -> np.ndarray:
        """The boxes on a displayed copy of the image that is ``width × height`` pixels (float32 (tokens, 4))."""
        sx, sy = width / self.image_size[0], height / self.image_size[1]
        return (self.boxes * np.array([sx, sy, sx, sy], dtype=np.float32)).astype(np.float32)

    def frame_tokens(self, frame: int) -> np.ndarray:
        """Indices of the tokens of ``frame``, row-major over its grid."""
        return np.flatnonzero(self.frame_of == frame)

    def areas(self) -> np.ndarray:
        """Each token's region in pixels² of the user's image (0 for a token that only saw padding)."""
        return ((self.boxes[:, 2] - self.boxes[:, 0]) * (self.boxes[:, 3] - self.boxes[:, 1])).astype(np.float32)


def _grid_boxes(box: tuple[float, float, float, float], rows: int, cols: int) -> np.ndarray:
    """The ``rows × cols`` cells of ``box`` (row-major), float64 (rows · cols, 4)."""
    x0, y0, x1, y1 = box
    xs, ys = np.linspace(x0, x1, cols + 1), np.linspace(y0, y1, rows + 1)
    return np.array([(xs[c], ys[r], xs[c + 1], ys[r + 1]) for r in range(rows) for c in range(cols)])


def from_frames(frames: list[Frame], image_size: tuple[int, int], description: str) -> TokenRegions:
    """Regions of every frame's grid, in frame order, clipped to the image."""
    width, height = image_size
    boxes, frame_of = [], []
    for index, frame in enumerate(frames):
        cells = _grid_boxes(frame.box, *frame.grid)
        boxes.append(cells)
        frame_of += [index] * len(cells)
    stacked = np.concatenate(boxes) if boxes else np.zeros((0, 4))
    stacked[:, [0, 2]] = stacked[:, [0, 2]].clip(0, width)
    stacked[:, [1, 3]] = stacked[:, [1, 3]].clip(0, height)
    return TokenRegions(stacked.astype(np.float32), np.array(frame_of, dtype=np.int64), tuple(frames),
                        (width, height), description)


# --- single frame: pad, resize, centre crop, patches -------------------------------------------------------------

def _size_dict(value) -> dict:
    if value is None:
        return {}
    if isinstance(value, int):
        return {"height": value, "width": value}
    return {k: v for k, v in dict(value).items() if v is not None}


def resized_size(height: int, width: int, size: dict) -> tuple[int, int]:
    """(height, width) after transformers' resize with ``size``: ``{"height", "width"}`` exactly, or
    ``{"shortest_edge": s}`` (the short side becomes s, the long one ``int(s · long / short)``)."""
    if "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    if "shortest_edge" in size and "longest_edge" not in size:
        short, long = (width, height) if width <= height else (height, width)
        new_short, new_long = int(size["shortest_edge"]), int(int(size["shortest_edge"]) * long / short)
        return (new_long, new_short) if width <= height else (new_short, new_long)
    raise ValueError(f"this image processor resizes with {size}, a rule the captioning page does not map back yet")


def single_frame(image_size: tuple[int, int], processor_config: dict, patch: int, name: str = "image",
                 merge: int = 1, pad_to_square: bool = False) -> TokenRegions:
    """One frame made by (optional, ``pad_to_square``: LLaVA's ``do_pad``) padding to a square, ``do_resize`` to
    ``size``, ``do_center_crop`` to ``crop_size``; tokens are ``patch × merge``-pixel cells. ``processor_config``: the
    image processor's settings (``image_processor.to_dict()``)."""
    width, height = image_size
    pad_x = pad_y = 0
    padded_w, padded_h = width, height
    steps = []
    if pad_to_square and width != height:
        side = max(width, height)
        pad_x, pad_y = (side - width) // 2, (side - height) // 2
        padded_w = padded_h = side
        steps.append(f"padded to a {side} × {side} square")
    resized_h, resized_w = padded_h, padded_w
    if processor_config.get("do_resize", True):
        resized_h, resized_w = resized_size(padded_h, padded_w, _size_dict(processor_config.get("size")))
        steps.append(f"resized to {resized_w} × {resized_h}")
    left = top = 0
    frame_w, frame_h = resized_w, resized_h
    if processor_config.get("do_center_crop"):
        crop = _size_dict(processor_config.get("crop_size"))
        frame_h, frame_w = int(crop["height"]), int(crop["width"])
        # transformers' centre crop: pads first when the crop is larger, then int((size − crop) / 2)
        left = int((resized_w - frame_w) / 2.0) if frame_w <= resized_w else -((frame_w - resized_w) // 2)
        top = int((resized_h - frame_h) / 2.0) if frame_h <= resized_h else -((frame_h - resized_h) // 2)
        steps.append(f"centre-cropped to {frame_w} × {frame_h}")
    sx, sy = padded_w / resized_w, padded_h / resized_h
    box = (left * sx - pad_x, top * sy - pad_y, (left + frame_w) * sx - pad_x, (top + frame_h) * sy - pad_y)
    cell = patch * merge
    grid = (frame_h // cell, frame_w // cell)
    described = (", ".join(steps) or "used as it is") + f"; {grid[0]} × {grid[1]} tokens of {cell} px"
    return from_frames([Frame(name, box, grid)], image_size, described)


# --- Idefics3 / SmolVLM: tiles + global thumbnail, pixel shuffle ------------------------------------------------

def _longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """Idefics3's first resize (``_resize_output_size_rescale_to_max_len`` then the 4096 px cap): the longest edge
    becomes ``longest``, the other keeps the aspect ratio, rounded down and made even."""
    aspect = width / height
    if width >= height:
        width = longest
        height = int(width / aspect)
        height += height % 2
    else:
        height = longest
        width = int(height * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    cap, aspect = 4096, width / height
    if width >= height and width > cap:
        width, height = cap, int(cap / aspect)
    elif height > width and height > cap:
        height, width = cap, int(cap * aspect)
    return max(height, 1), max(width, 1)


def _tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """Idefics3's ``resize_for_vision_encoder``: both sides up to multiples of ``tile`` (the long side first)."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def idefics3(image_size: tuple[int, int], processor_config: dict, patch: int, scale_factor: int) -> TokenRegions:
    """Tiles and a global thumbnail (Idefics3, SmolVLM); ``processor_config`` is the image processor's
    ``to_dict()`` (``size.longest_edge``, ``max_image_size.longest_edge``, ``do_image_splitting``, ``do_resize``)."""
    width, height = image_size
    tile = int(_size_dict(processor_config.get("max_image_size"))["longest_edge"])
    tokens_side = tile // patch // scale_factor
    if tokens_side < 1 or (tile // patch) % scale_factor:
        raise ValueError(f"a {tile} px frame of {patch} px patches cannot be pixel-shuffled by {scale_factor}")
    h1, w1 = height, width
    if processor_config.get("do_resize", True):
        h1, w1 = _longest_edge_size(height, width, int(_size_dict(processor_config.get("size"))["longest_edge"]))
    grid = (tokens_side, tokens_side)
    whole = (0.0, 0.0, float(width), float(height))
    shuffle = f"{patch} px patches, {scale_factor} × {scale_factor} pixel shuffle: {tokens_side ** 2} tokens a frame"
    if not processor_config.get("do_image_splitting", True):
        return from_frames([Frame("global thumbnail", whole, grid)], image_size,
                           f"squeezed to {tile} × {tile} px (no tiles); {shuffle}")
    h2, w2 = _tile_multiple_size(h1, w1, tile)
    if h2 <= tile and w2 <= tile:
        return from_frames([Frame("image", whole, grid)], image_size,
                           f"resized to {w2} × {h2} px (one frame, no tiles); {shuffle}")
    rows, cols = h2 // tile, w2 // tile
    sx, sy = width / w2, height / h2
    frames = [Frame(f"tile ({r + 1}, {c + 1})", (c * tile * sx, r * tile * sy, (c + 1) * tile * sx,
                                                 (r + 1) * tile * sy), grid) for r in range(rows) for c in range(cols)]
    frames.append(Frame("global thumbnail", whole, grid))
    return from_frames(frames, image_size, f"resized to {w2} × {h2} px, cut into {rows} × {cols} tiles of {tile} px, "
                                           f"plus the whole image squeezed to a {tile} px thumbnail; {shuffle}")


# --- Qwen2-VL: dynamic resolution, 2 × 2 merges ------------------------------------------------------------------

def qwen2_vl(image_size: tuple[int, int], grid_thw: tuple[int, int, int], patch: int, merge: int) -> TokenRegions:
    """The whole image resized to ``grid_h · patch × grid_w · patch`` (the processor's ``image_grid_thw``), one token
    per ``merge × merge`` block of patches, raster order over the merged grid."""
    frames_t, grid_h, grid_w = (int(g) for g in grid_thw)
    if frames_t != 1:
        raise ValueError(f"a still image has one temporal frame, not {frames_t}")
    if grid_h % merge or grid_w % merge:
        raise ValueError(f"a {grid_h} × {grid_w} patch grid cannot be merged {merge} × {merge}")
    width, height = image_size
    rows, cols = grid_h // merge, grid_w // merge
    return from_frames([Frame("image", (0.0, 0.0, float(width), float(height)), (rows, cols))], image_size,
                       f"resized to {grid_w * patch} × {grid_h * patch} px (multiples of {patch * merge}); "
                       f"{patch} px patches merged {merge} × {merge}: {rows} × {cols} tokens")
